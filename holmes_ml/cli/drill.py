"""``holmes drill``: run a real gloo job with an injected fault and check the localizer finds it."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from holmes_ml.cli._checks import as_options, check_writable
from holmes_ml.drill.runner import FAULTS


def register(app: typer.Typer) -> None:
    """Add ``holmes drill`` to ``app``."""

    @app.command("drill")
    def drill(
        ranks: int = typer.Option(8, "--ranks", help="World size (= tp * pp * dp)."),
        tp: int = typer.Option(2, "--tp", help="Tensor-parallel size."),
        pp: int = typer.Option(2, "--pp", help="Pipeline stages."),
        dp: int = typer.Option(2, "--dp", help="Data-parallel size."),
        fault: str = typer.Option(
            "straggler", "--fault", help=f"What to inject: {', '.join(FAULTS)}."
        ),
        rank: int = typer.Option(0, "--rank", help="Rank to break."),
        iterations: int = typer.Option(
            20, "--iterations",
            # min_iterations(fault); not called here: it imports the localizer for every command
            help="Training steps: at least 9 with straggler, 6 with stall, 5 with heavy_stage, "
                 "4 otherwise (the fault must come after the 3 regular steps the irregularity "
                 "monitor needs, with healthy ones to compare it with).",
        ),
        compute_s: float = typer.Option(
            0.03, "--compute-s",
            help="Simulated compute (sleep) per microbatch pass of every rank, in seconds.",
        ),
        out: Path = typer.Option(Path("drill-out"), "--out", help="Logs and drill.json go here."),
        timeout: float = typer.Option(300.0, "--timeout", help="Kill the job after N seconds."),
    ) -> None:
        """Launch an N-process gloo job on this machine, break one rank, localize, and judge.

        Faults: straggler (RANK computes 0.03 s more per microbatch from a third of the run
        on: twice as long at the default --compute-s),
        stall (RANK pauses once, 1.5 s, mid-run), bandwidth (root only: every rank in its own
        network namespace, RANK's veth capped with tc tbf), none (must come back healthy),
        heavy_stage (a workload, not a fault: every rank of RANK's pipeline stage computes
        0.03 s more per microbatch from the first step; found when no device is blamed and the
        verdict names that stage).

        Exit codes: 0 found (healthy with --fault none, the stage named with heavy_stage),
        1 missed, 2 the drill cannot run here (no PyTorch, no root for --fault bandwidth, a
        rank crashed, --timeout hit), 3 a no-fault drill blamed a rank that the machine itself
        kept off the CPU (a loaded machine: rerun on a quieter one).

        A setup that cannot be judged is refused before any rank starts (exit 2): one rank (no
        peer), or too few --iterations for the fault to come after the irregularity monitor's
        warm-up.

        Example: holmes drill --ranks 8 --tp 2 --pp 2 --dp 2 --fault straggler --rank 5
        """
        from holmes_ml.drill import DrillConfig, run_drill

        try:
            cfg = DrillConfig(ranks=ranks, tp=tp, pp=pp, dp=dp, fault=fault, rank=rank,
                              iterations=iterations, compute_s=compute_s, out=str(out),
                              timeout_s=timeout)
        except ValueError as exc:  # one `error: --option VALUE: ...` line, exit status 2
            raise ValueError(as_options(str(exc), {
                "compute_s": "--compute-s", "timeout_s": "--timeout", "ranks": "--ranks",
                "rank": "--rank", "fault": "--fault", "iterations": "--iterations",
                "tp": "--tp", "pp": "--pp", "dp": "--dp"})) from exc
        check_writable(out, "--out", directory=True)
        try:
            res = run_drill(cfg)
        except ImportError as exc:  # torch missing: say how to install it
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        except RuntimeError as exc:  # a rank died or the job outlived --timeout
            typer.echo(f"error: the drill job failed: {exc}", err=True)
            raise typer.Exit(2) from exc
        if res.skipped:
            typer.echo(f"drill skipped: {res.skipped}", err=True)
            raise typer.Exit(2)
        if res.ok:
            verdict = {"none": "HEALTHY", "heavy_stage": "WORKLOAD"}.get(fault, "FOUND")
        else:
            verdict = "MACHINE-PAUSED" if res.pause_explained else "MISSED"
        typer.echo(json.dumps({
            "result": verdict, "fault": fault, "rank": rank, "top_ranks": list(res.top_ranks),
            "top_kind": res.top_kind, "localizer": res.localizer,
            "job_seconds": res.job_seconds, "n_ops": res.n_ops, "summary": str(out / "drill.json"),
            "machine_pauses": [list(p) for p in res.machine_pauses[:10]],
            **({"pipeline_error": res.verdict["pipeline_error"]}
               if "pipeline_error" in res.verdict else {}),
        }, indent=2))
        raise typer.Exit(0 if res.ok else (3 if res.pause_explained else 1))
