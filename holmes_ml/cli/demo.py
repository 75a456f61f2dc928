"""``holmes demo``: simulate a job with a fault, localize it, and show the verdict next to the truth."""

from __future__ import annotations

import json
import random
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from holmes_ml.cli._checks import check_seed, check_writable
from holmes_ml.cli._verdict import irregular_line

DEFAULT_FAULT_KINDS = ("gpu_slow", "nic_slow", "host_stall")


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        gpus: int = typer.Option(128, "--gpus", help="Job size in GPUs (8-GPU hosts)."),
        model: str = typer.Option("llama2-13b", "--model", help="Model whose shapes drive the job."),
        fault: str = typer.Option(
            "",
            "--fault",
            help="Fault to inject, in `holmes simulate --fault` syntax "
            "(e.g. 'gpu_slow:rank=37,severity=0.6'). Default: a seeded pick of a GPU, NIC or "
            "host fault on a random rank, persistent from a third of the way into the run.",
        ),
        iterations: int = typer.Option(30, "--iterations", help="Training iterations to simulate."),
        seed: int = typer.Option(7, "--seed", help="Seed for the job, the fault and the jitter."),
        out: Path = typer.Option(Path("demo-out"), "--out", help="Where the simulated logs go."),
    ) -> None:
        """Simulate a faulty job, localize it with the bundled model, show verdict vs truth.

        This is what `make demo` runs. Example: `holmes demo --gpus 256 --fault
        nic_slow:rank=40,severity=1`.
        """
        from holmes_ml.io import without_labels
        from holmes_ml.pipeline import analyze
        from holmes_ml.simulator import FaultSpec, SimConfig, simulate
        from holmes_ml.simulator.cluster import GPUS_PER_HOST

        check_seed(seed)
        check_writable(out, "--out", directory=True)
        console = Console()
        # the job's own checks first (--gpus 0 would otherwise fail in the fault's draw)
        SimConfig(gpus=gpus, model=model, iterations=iterations, seed=seed)
        rng = random.Random(seed)
        if not fault:
            # one host: no traffic leaves it, so a slow NIC could not slow the job
            kinds = DEFAULT_FAULT_KINDS if gpus > GPUS_PER_HOST else tuple(
                k for k in DEFAULT_FAULT_KINDS if k != "nic_slow")
            kind = rng.choice(kinds)
            # A third of the way in: enough healthy history before the onset (10 of the default
            # 30 iterations), and inside the run however short it is.
            start = iterations // 3
            fault = (f"{kind}:rank={rng.randrange(gpus)},severity=0.6,pattern=persistent,"
                     f"start={start}")
        spec = FaultSpec.parse(fault)
        cfg = SimConfig(gpus=gpus, model=model, iterations=iterations, faults=(spec,), seed=seed)
        console.rule("[bold]1. simulate")
        result = simulate(cfg, progress=console.is_terminal)
        result.write(out)
        truth = [f.to_dict() for f in result.faults]
        console.print(
            f"{gpus} GPUs, {model}, layout {result.topology.parallel}, {len(result.ops):,} ops "
            f"written to {out}/ops.parquet"
        )
        console.rule("[bold]2. localize (operator logs only; the truth stays hidden)")
        ops = without_labels(result.ops)
        verdict = analyze(ops, topology=result.topology)
        (out / "verdict.json").write_text(json.dumps(verdict.to_dict(), indent=2))

        table = Table(title="verdict vs ground truth")
        table.add_column("")
        table.add_column("kind")
        table.add_column("device", overflow="fold")
        table.add_column("ranks")
        table.add_column("hosts")
        table.add_column("score", justify="right")
        for f in truth:
            table.add_row(
                "[green]injected", f["kind"], _short(f["devices"]), _short(f["ranks"]),
                _short(f["hosts"]), ""
            )
        for i, c in enumerate(verdict.candidates[:3]):
            d = c.to_dict()
            table.add_row(
                f"suspect #{i + 1}", str(d["kind"]), d["device"], _short(d["ranks"]),
                _short(d["hosts"]), f"{d['score']:.3f}",
            )
        console.print(table)
        top = verdict.candidates[0] if verdict.candidates else None
        if top is not None and top.tied_with:
            what = ("are a slow GPU and a pause of its host, which one late arrival per step "
                    "cannot tell apart" if top.kind.value == "gpu" else "carry the same slow "
                    "flows; the logs cannot tell them apart (their order carries no information)")
            console.print(f"[yellow]tied[/yellow]: suspect #1 and {', '.join(top.tied_with)} "
                          f"{what}, so check each")
        console.print(irregular_line(verdict.to_dict()))
        console.print(_match_line(top, truth[0]))
        console.print(f"verdict JSON: {out / 'verdict.json'}")


def _match_line(top, truth: dict) -> str:
    """How the first suspect compares with the injected fault: the device itself, one it is
    tied with, another device on the fault's ranks, or none of them."""
    injected = set(truth["devices"])
    if top is None:
        return "[bold red]no device blamed: the injected fault is not found"
    if top.device in injected:
        return "[bold green]top suspect matches the injected fault"
    if injected & set(top.tied_with):
        return ("[bold yellow]the injected fault is among the devices tied with the top "
                "suspect (the logs cannot order them)")
    if set(top.ranks) & set(truth["ranks"]):
        return (f"[bold yellow]top suspect {top.device} is on the injected fault's ranks, "
                f"but is not its device ({', '.join(sorted(injected))})")
    return "[bold red]top suspect does not match the injected fault"


def _short(values: list) -> str:
    values = list(values)
    text = ", ".join(str(v) for v in values[:4])
    return text + (f" (+{len(values) - 4})" if len(values) > 4 else "")
