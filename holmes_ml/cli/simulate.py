"""``holmes simulate``: simulate a job with injected faults and write labelled CommOps logs."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from holmes_ml.cli._checks import as_options, check_not_input, check_seed, check_writable

_EPILOG = (
    "Examples:\n\n"
    "  holmes simulate --gpus 128 --iterations 30 --fault gpu_slow:rank=5,severity=0.5,start=10 "
    "--out sim/\n\n"
    "  holmes simulate --gpus 512 --model llama2-70b --tp 8 --pp 4 "
    "--fault nic_slow:rank=9,severity=2,pattern=fluctuation,probability=0.3 "
    "--fault host_stall:rank=100,severity=0.2,pattern=spike,start=7 --out sim/\n\n"
    "  holmes simulate --gpus 128 --model mixtral-8x7b --tp 2 --pp 2 --ep 4 --cp 2 --out sim/\n\n"
    "  holmes simulate --gpus 8192 --model llama2-70b --tp 8 --pp 8 --iterations 20 "
    "--fault link_slow:severity=1 --out big/   (streams to Parquet row groups)\n\n"
    "Fault syntax: KIND[:key=value,...]; KIND one of gpu_slow, nic_slow, link_slow, "
    "switch_congested, host_stall; keys (each at most once) rank|ranks (3+4; default: drawn "
    "from --seed, for a NIC or link fault where it carries traffic), device (nic:node003/5, "
    "link:leaf-p0-r3~spine-1, switch:leaf-p0-r3; beside a rank it must name the same device), "
    "pattern (persistent|spike|fluctuation; default persistent), severity (default 0.5 = 1.5x "
    "slower, at most 1000; for host_stall the pause as a share of the iteration), start "
    "(default 0), end (default: the last iteration; for pattern=spike start or start+1, drawn "
    "from --seed), probability (fluctuation only; default "
    "0.5)."
)

_HELP = (
    "Simulate a job and write OUT/ops.parquet (labelled), OUT/faults.json, OUT/topology.json "
    "and OUT/config.json (the SimConfig it ran, faults as given: in Python, "
    "`simulate(SimConfig.from_dict(json.load(open('OUT/config.json'))))` simulates the same "
    "job again).\n\n"
    "Collectives complete at the last arrival plus an alpha-beta transfer over the links they "
    "cross, so a straggler's own ops look short and its peers' long; each op is labelled "
    "`affected` when a fault prolongs it (> 15 % + 20 us) against the same seed run without "
    "faults, and `abnormal` when it is affected and also longer than the fault-free copies of "
    "the same step usually are (median + 3 robust std devs): what a log can show. Jobs "
    "above 5M rows stream to Parquet row groups."
)

#: Above this many rows the job is streamed to disk instead of being held in memory.
STREAM_ROWS = 5_000_000


def register(app: typer.Typer) -> None:
    @app.command("simulate", epilog=_EPILOG, help=_HELP)
    def simulate_cmd(
        gpus: int = typer.Option(128, "--gpus", help="World size: 2 to 32,768 GPUs, a multiple of 8 (8-GPU hosts) above 8."),
        model: str = typer.Option(
            "llama2-13b",
            "--model",
            help="llama2-7b, llama2-13b, llama2-70b, gpt3-175b or mixtral-8x7b.",
        ),
        tp: int = typer.Option(None, "--tp", help="Tensor parallel size (default per model)."),
        pp: int = typer.Option(None, "--pp", help="Pipeline stages (default per model)."),
        dp: int = typer.Option(None, "--dp", help="Data parallel size (default: the rest)."),
        ep: int = typer.Option(1, "--ep", help="Expert parallel size (MoE models)."),
        cp: int = typer.Option(1, "--cp", help="Context parallel size."),
        dp_replicate: int = typer.Option(
            1, "--dp-replicate",
            help="HSDP: split data parallel into this many replicas of dp/N sharded ranks "
            "(reduce_scatter/all_gather inside a shard group, all_reduce across replicas).",
        ),
        iterations: int = typer.Option(30, "--iterations", help="Training iterations (at most 100,000)."),
        microbatches: int = typer.Option(None, "--microbatches", help="Per iteration (1F1B)."),
        fault: list[str] = typer.Option(
            [], "--fault", help="Fault KIND[:key=value,...]; repeatable (see examples below)."
        ),
        jitter: float = typer.Option(0.03, "--jitter", help="Log-normal sigma of all timings."),
        drift: float = typer.Option(
            0.0, "--drift", help="Relative compute slow-down over the run (benign)."
        ),
        comm_drift: float = typer.Option(
            0.0, "--comm-drift",
            help="Relative slow-down of every transfer over the run (benign), e.g. 0.3.",
        ),
        stage_weights: str = typer.Option(
            None, "--stage-weights",
            help="Workload, not a fault: each pipeline stage's compute over an even split, "
            "comma-separated, one per stage (1,1,1,1.4: a heavier last stage).",
        ),
        seq_imbalance: float = typer.Option(
            0.0, "--seq-imbalance",
            help="Workload, not a fault: each step, each data-parallel replica computes "
            "1 + X*u times as long (u uniform in [0, 1)), e.g. 0.3.",
        ),
        log_compute: bool = typer.Option(
            False, "--log-compute",
            help="Add each rank's compute time per step (step_compute_us), as the ByteDance "
            "traces have it: names a heavier pipeline stage.",
        ),
        calibrate_from: Path = typer.Option(
            None,
            "--calibrate-from",
            help="Log to fit transfer times from, in any format holmes reads (canonical "
            "CommOps parquet/csv/jsonl, Kineto/PyTorch profiler JSON traces, Flight Recorder "
            "JSON dumps, NCCL Inspector logs, ByteDance what-if traces; a file, directory or "
            "archive). Only (op, group kind) pairs this job runs calibrate its communication "
            "(all_reduce on tp, send on pp, ...; a Kineto trace names process groups, which "
            "match none: a warning says so); the log's iteration time rescales compute.",
        ),
        hardware: str = typer.Option(
            "a100", "--hardware", help="GPU and network generation: a100 or h100 (compute, "
            "NVLink and NIC bandwidths)."),
        hosts_per_pod: int = typer.Option(
            None, "--hosts-per-pod",
            help="Fabric: 8-GPU hosts below one set of rail leaf switches (default 32, but at "
            "least 4 pods for jobs under 128 hosts, so small jobs still cross leaf-spine links)."),
        spines: int = typer.Option(8, "--spines", help="Fabric: spine switches above the leaves."),
        micro_batch_size: int = typer.Option(
            1, "--micro-batch-size", help="Sequences per microbatch (scales compute and "
            "activation transfers)."),
        job: str = typer.Option("sim", "--job", help="Value of the logs' job column (what holmes "
                                "serve and holmes train group runs by)."),
        seed: int = typer.Option(0, "--seed", help="Seed for layout draws, faults and jitter."),
        out: Path = typer.Option(..., "--out", help="Output directory."),
        rank_logs: str = typer.Option(
            None, "--rank-logs", show_default=False,
            help="Also write each rank's log, without labels, as the logger on that rank "
            "would: OUT/logs/HOST/rank-RANK.EXT, EXT one of arrow (.arrows: an Arrow IPC "
            "stream, what the logger writes by default), jsonl, csv, parquet. Try the "
            "deployed path with it: holmes serve, then one holmes agent --follow "
            "OUT/logs/HOST per host."),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar."),
    ) -> None:
        """Simulate a job and write labelled CommOps logs plus ground truth (see --help)."""
        import pandas as pd
        from rich.console import Console
        from rich.table import Table

        from holmes_ml.simulator import FaultSpec, SimConfig, simulate, simulate_to

        console = Console(stderr=False)
        from holmes_ml.simulator.result import RANK_LOG_FORMATS

        if rank_logs is not None and rank_logs not in RANK_LOG_FORMATS:
            raise typer.BadParameter(f"got {rank_logs!r}; expected one of "
                                     f"{', '.join(RANK_LOG_FORMATS)}", param_hint="--rank-logs")
        check_seed(seed)
        check_writable(out, "--out", directory=True)
        if calibrate_from is not None:
            # the log durations are fitted from must not be what the run writes over
            from holmes_ml.simulator.result import CONFIG_FILE, FAULTS_FILE, OPS_FILE, TOPOLOGY_FILE

            for name in (OPS_FILE, FAULTS_FILE, TOPOLOGY_FILE, CONFIG_FILE):
                try:
                    check_not_input(out / name, "--out", [calibrate_from])
                except ValueError:
                    raise typer.BadParameter(
                        f"{out}: would write over {out / name}, which --calibrate-from "
                        f"{calibrate_from} reads; expected another directory",
                        param_hint="--out") from None
        try:
            faults = tuple(FaultSpec.parse(f) for f in fault)
            weights: tuple[float, ...] = ()
            if stage_weights:
                try:
                    weights = tuple(float(w) for w in stage_weights.split(","))
                except ValueError:
                    raise ValueError(f"--stage-weights: got {stage_weights!r}; expected "
                                     "numbers separated by commas, one per stage") from None
            cfg = SimConfig(
                gpus=gpus,
                model=model,
                tp=tp,
                pp=pp,
                dp=dp,
                ep=ep,
                cp=cp,
                dp_replicate=dp_replicate,
                iterations=iterations,
                microbatches=microbatches,
                faults=faults,
                seed=seed,
                jitter=jitter,
                drift=drift,
                comm_drift=comm_drift,
                stage_weights=weights,
                seq_imbalance=seq_imbalance,
                log_compute=log_compute,
                calibrate_from=calibrate_from,
                hardware=hardware,
                hosts_per_pod=hosts_per_pod,
                spines=spines,
                micro_batch_size=micro_batch_size,
                job=job,
            )
        except ValueError as exc:
            raise typer.BadParameter(as_options(str(exc), {
                f: "--" + f.replace("_", "-") for f in (
                    "gpus", "model", "tp", "pp", "dp", "ep", "cp", "dp_replicate", "iterations",
                    "microbatches", "jitter", "drift", "comm_drift", "stage_weights",
                    "seq_imbalance", "seed", "hardware", "hosts_per_pod", "spines",
                    "micro_batch_size", "job")})) from exc
        show = progress and console.is_terminal
        est_rows = _estimate_rows(cfg)
        if est_rows > STREAM_ROWS:
            summary = simulate_to(cfg, out, progress=show)
            rows, abnormal = summary["rows"], summary["abnormal"]
            resolved = [FaultSpec.from_dict(d) for d in summary["faults"]]
            iter_abn = None
            ops = None
        else:
            res = simulate(cfg, progress=show)
            res.write(out)
            rows, abnormal = len(res.ops), int(res.ops["abnormal"].sum())
            resolved = res.faults
            iter_abn = res.ops.groupby("iteration")["abnormal"].any()
            ops = res.ops
        lay = cfg.layout
        console.print(
            f"[bold]{gpus} GPUs[/] {model}: tp={lay.tp} cp={lay.cp} ep={lay.ep} dp={lay.dp}"
            + (f" (= {cfg.dp_replicate} replicas x {lay.dp_shard} shards)"
               if cfg.dp_replicate > 1 else "") + " "
            f"pp={lay.pp}, {lay.microbatches} microbatches, {iterations} iterations"
        )
        console.print(f"{rows:,} ops, {abnormal:,} labelled abnormal -> {out}/ops.parquet")
        if resolved:
            table = Table(title="injected faults (ground truth in faults.json)")
            for col in ("kind", "device", "ranks", "pattern", "severity", "active iterations"):
                table.add_column(col)
            for f in resolved:
                table.add_row(
                    f.kind,
                    ", ".join(f.devices[:2]) + (" ..." if len(f.devices) > 2 else ""),
                    _short(f.ranks),
                    f.pattern,
                    f"{f.severity:g}",
                    _short(f.active_iterations or ()),
                )
            console.print(table)
        else:
            console.print("healthy run (no faults)")
        if cfg.stage_weights or cfg.seq_imbalance:
            said = ([f"stage weights {','.join(f'{w:g}' for w in cfg.stage_weights)}"]
                    if cfg.stage_weights else [])
            said += [f"sequence imbalance {cfg.seq_imbalance:g}"] if cfg.seq_imbalance else []
            console.print(f"workload (not a fault, no labels): {'; '.join(said)}")
        if iter_abn is None:
            iter_abn = (
                pd.read_parquet(out / "ops.parquet", columns=["iteration", "abnormal"])
                .groupby("iteration")["abnormal"]
                .any()
            )
        if rank_logs is not None:
            from holmes_ml.simulator.result import write_rank_logs

            files = write_rank_logs(ops if ops is not None else pd.read_parquet(out / "ops.parquet"),
                                    out / "logs", rank_logs)
            hosts = len({f.parent for f in files})
            console.print(f"{len(files):,} rank logs (no labels) -> {out}/logs/HOST/ on "
                          f"{hosts:,} host(s): one holmes agent --follow {out}/logs/HOST per host")
        bad = [int(i) for i in iter_abn.index[iter_abn.to_numpy()]]
        console.print(f"iterations with abnormal ops (ground truth): {_short(bad) or 'none'}")
        if ops is not None:
            irregular = _irregular(ops)
            if irregular is not None:
                console.print(
                    f"irregular iterations (iteration-time detector): {_short(irregular) or 'none'}"
                )


def _estimate_rows(cfg) -> int:  # noqa: ANN001
    """Upper estimate of the rows a job logs (chunks per microbatch are at most 6)."""
    lay = cfg.layout
    per_micro = 2 * (lay.tp > 1) + 2 * (lay.cp > 1) + 4 * (lay.ep > 1)
    return int(lay.world * cfg.iterations * (lay.microbatches * (per_micro * 6 + 2) + 2))


def _irregular(ops) -> list[int] | None:  # noqa: ANN001
    """Iterations the features layer flags as irregular (None when it is unavailable)."""
    try:
        from holmes_ml.features import detect_irregular
    except ImportError:
        return None
    try:
        table = detect_irregular(ops)
    except Exception as exc:  # noqa: BLE001 - an optional summary line must not fail the run
        logging.getLogger(__name__).warning("irregular-iteration summary skipped: %s", exc)
        return None
    return [int(i) for i in table.index[table["irregular"].to_numpy(dtype=bool)]]


def _short(values) -> str:  # noqa: ANN001
    values = list(values)
    text = ", ".join(str(v) for v in values[:6])
    return text + (f" (+{len(values) - 6})" if len(values) > 6 else "")
