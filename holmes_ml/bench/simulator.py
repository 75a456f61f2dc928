"""``holmes bench simulator``: wall time and peak memory of a large simulated job.

Full mode: 8,192 GPUs, LLaMA2-70B, tp=8 pp=8 dp=128, 20 iterations, one injected straggler,
streamed to Parquet (goal: <= 60 s and <= 4 GB peak on 2 cores). Quick mode: 1,024 GPUs.
The job runs in a child process so that peak RSS is that of the simulation alone.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import queue as queue_mod
import tempfile
import time
from pathlib import Path

from holmes_ml.bench.record import BenchResult


def _job(gpus: int, iterations: int, out: str, queue: mp.Queue) -> None:  # pragma: no cover
    try:
        queue.put(_measure(gpus, iterations, out))
    except Exception as exc:  # report to the parent instead of leaving it waiting
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def _measure(gpus: int, iterations: int, out: str) -> dict:
    from holmes_ml.bench.record import peak_rss_mb
    from holmes_ml.simulator import FaultSpec, SimConfig, simulate_to

    cfg = SimConfig(
        gpus=gpus,
        model="llama2-70b",
        tp=8,
        pp=8,
        iterations=iterations,
        seed=0,
        faults=(FaultSpec.parse(_fault(iterations)),),
    )
    t0 = time.perf_counter()
    summary = simulate_to(cfg, out)
    seconds = time.perf_counter() - t0
    size = (Path(out) / "ops.parquet").stat().st_size
    return {
        "seconds": seconds,
        "peak_rss_mb": peak_rss_mb(),
        "rows": summary["rows"],
        "abnormal": summary["abnormal"],
        "parquet_mb": size / 2**20,
        "layout": cfg.layout.as_dict(),
        "microbatches": cfg.layout.microbatches,
    }


def _fault(iterations: int) -> str:
    return f"gpu_slow:rank=5,severity=0.5,start={min(5, iterations - 1)}"


def _sizes(quick: bool) -> tuple[int, int]:
    """(gpus, iterations) of the benchmark job."""
    return (1024, 20) if quick else (8192, 20)


def run(quick: bool = False) -> BenchResult:
    """Simulate the benchmark job and report seconds, peak RSS and rows per second."""
    gpus, iterations = _sizes(quick)
    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        proc = ctx.Process(target=_job, args=(gpus, iterations, tmp, queue))
        proc.start()
        got = None
        while got is None:
            try:
                got = queue.get(timeout=1.0)
            except queue_mod.Empty:
                if not proc.is_alive() and queue.empty():
                    raise RuntimeError(
                        f"simulator benchmark process died (exit code {proc.exitcode})"
                    ) from None
        proc.join()
    if "error" in got:
        raise RuntimeError(f"simulator benchmark failed: {got['error']}")
    figures = {
        "seconds": round(got["seconds"], 3),
        "peak_rss_mb": round(got["peak_rss_mb"], 1),
        "rows": got["rows"],
        "rows_per_second": round(got["rows"] / got["seconds"], 1),
        "parquet_mb": round(got["parquet_mb"], 1),
        "abnormal_rows": got["abnormal"],
    }
    return BenchResult(
        name="simulator",
        figures=figures,
        config={
            "gpus": gpus,
            "iterations": iterations,
            "model": "llama2-70b",
            "quick": quick,
            "layout": got["layout"],
            "microbatches": got["microbatches"],
            "fault": _fault(iterations),
            "streamed": True,
        },
        goals={} if quick else {"seconds": "<= 60", "peak_rss_mb": "<= 4096"},
        details={"raw": json.loads(json.dumps(got))},
    )
