"""How long ``holmes localize DIR`` spends reading a job's logs as the logger writes them.

Simulates a LLaMA2-70B job (tp8 pp8, 4 iterations, one slowed GPU) and writes each rank's
operators to a file of its own as :class:`holmes_ml.collect.writer.RowSink` does (``--fmt
arrow``, the logger's default: a zstd-compressed Arrow IPC stream, each with only the values
its rank logged; or ``parquet``, as ``holmes bench latency`` writes them), then times
:func:`holmes_ml.pipeline.read_paths` on the directory (read, check, one table), best of
``--repeats``.

Usage: ``.venv/bin/python scripts/rank_logs_read.py --gpus 8192`` (about 2 minutes on 2 cores;
``PYTHONPATH=<checkout>`` times another checkout on the same files with ``--logs DIR``).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from holmes_ml import pipeline


def write_logs(gpus: int, fmt: str, out: Path) -> int:
    """The simulated job's rank logs under ``out``
    (:func:`holmes_ml.bench.latency._logger_files`); returns the operators written."""
    from holmes_ml.bench.latency import _logger_files
    from holmes_ml.simulator import FaultSpec, SimConfig, simulate

    sim = simulate(SimConfig(gpus=gpus, model="llama2-70b", iterations=4, seed=0, faults=(
        FaultSpec.parse("gpu_slow:rank=77,severity=0.5,start=2"),)))
    _logger_files(sim.ops, out, fmt)
    return len(sim.ops)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8192)
    ap.add_argument("--fmt", choices=("arrow", "parquet"), default="arrow")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--logs", type=Path, help="read these logs (written by an earlier run "
                    "with --keep) instead of simulating")
    ap.add_argument("--keep", type=Path, help="write the logs here and keep them")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="holmes-rank-logs-") as tmp:
        logs = args.logs or args.keep or Path(tmp) / "logs"
        if args.logs is None:
            n = write_logs(args.gpus, args.fmt, logs)
            print(f"{n:,} operators in {len(list(logs.iterdir())):,} {args.fmt} rank logs")
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            ops = pipeline.read_paths([logs])
            best = min(best, time.perf_counter() - t0)
        print(f"read_paths: {best:.2f} s (best of {args.repeats}), {len(ops):,} operators")


if __name__ == "__main__":
    main()
