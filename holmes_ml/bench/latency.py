"""``holmes bench latency``: one localization window end to end, against the full-log baseline.

Figures: seconds to localize one window of an 8,192-GPU job (2,048 with ``--quick``) from the
node summaries, seconds for the same rules over every operator copy (no detector pre-filter),
the speed-up, and the bytes nodes ship (abnormal-op summaries) against the raw logs. Then
``holmes localize`` on the Parquet log of a data-parallel job of as many GPUs, whose one
communicator spans every rank (as under FSDP across the whole job; each row lists all members):
seconds from reading the file to the verdict, how far resident memory rose, and the first rank
of the first suspect (the slowed one is rank 77); and the same from a directory of one file per
rank: Parquet files holding the job's whole category lists, as this bench has written them since
``1eb4e40`` (``world_communicator_per_rank_files_*``), and zstd-compressed Arrow IPC streams each
holding only its rank's values, as the logger of :mod:`holmes_ml.collect` writes them by default
(``world_communicator_rank_streams_*``).
"""

from __future__ import annotations

import multiprocessing
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

from holmes_ml.bench.localize import _speed
from holmes_ml.bench.record import BenchResult, rss_rise_mb

#: The rank slowed in the data-parallel job of :func:`_world_communicator`.
_SLOW_RANK = 77


def _world_communicator(gpus: int, per_rank: str | None = None) -> dict[str, float]:
    """Localize the log of a data-parallel job of ``gpus`` GPUs (one communicator of every
    rank) from one Parquet file or, with ``per_rank`` (``"parquet"`` or ``"arrow"``), from a
    directory of one file per rank (:func:`_logger_files`)."""
    from holmes_ml import pipeline
    from holmes_ml.io import without_labels
    from holmes_ml.simulator import FaultSpec, SimConfig, simulate

    sim = simulate(SimConfig(gpus=gpus, tp=1, pp=1, iterations=20, seed=0, faults=(
        FaultSpec.parse(f"gpu_slow:rank={_SLOW_RANK},severity=0.5,start=10"),)))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ops.parquet"
        if per_rank:
            path = Path(tmp) / "logs"
            _logger_files(sim.ops, path, per_rank)
        else:
            without_labels(sim.ops).to_parquet(path)
        del sim

        def localize() -> tuple[object, int]:
            ops = pipeline.read_paths([path])
            summary = pipeline.summarize(ops)
            return pipeline.localize_summaries([summary]), len(ops)

        t0 = time.perf_counter()
        (verdict, n_ops), rise = rss_rise_mb(localize)
        seconds = time.perf_counter() - t0
    top = verdict.candidates[0].ranks[0] if verdict.candidates else -1  # type: ignore[attr-defined]
    name = {None: "world_communicator", "parquet": "world_communicator_per_rank_files",
            "arrow": "world_communicator_rank_streams"}[per_rank]
    return {f"{name}_ops": float(n_ops),
            f"{name}_localize_seconds": seconds,
            f"{name}_rss_rise_mb": float("nan") if rise is None else rise,
            f"{name}_top_rank": float(top)}


def _logger_files(ops: pd.DataFrame, root: Path, fmt: str = "parquet") -> None:
    """``ops`` written by the logger's :class:`~holmes_ml.collect.writer.RowSink`, one file
    per rank under ``root``: Parquet with the job's whole category lists (what this bench has
    measured since ``1eb4e40``), or ``fmt="arrow"``: Arrow IPC streams, each with only its
    rank's values, as the logger writes by default."""
    from holmes_ml.collect.writer import COLUMNS, FORMATS, Coded, RowSink

    text = [c for c in COLUMNS if isinstance(ops[c].dtype, pd.CategoricalDtype)]
    for rank, part in ops.groupby("rank", sort=True):
        if fmt == "arrow":
            part = part.assign(**{c: part[c].cat.remove_unused_categories() for c in text})
        sink = RowSink(root / f"rank-{int(rank):05d}{FORMATS[fmt]}", fmt)
        sink.write({c: Coded(part[c].cat.codes.to_numpy(), list(part[c].cat.categories))
                    if isinstance(part[c].dtype, pd.CategoricalDtype) else part[c].to_numpy()
                    for c in COLUMNS})
        sink.close()


def run(quick: bool = False) -> BenchResult:
    t0 = time.perf_counter()
    figures: dict[str, float] = dict(_speed(quick))
    # in a process of its own: memory the window above left in this one's allocators would
    # hide what localizing this log needs
    for per_rank in (None, "parquet", "arrow"):
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            figures.update(pool.submit(_world_communicator, 2048 if quick else 8192,
                                       per_rank).result())
    figures["bench_seconds"] = round(time.perf_counter() - t0, 1)
    return BenchResult(
        name="latency",
        figures=figures,
        config={"quick": quick, "model": "llama2-70b", "tp": 8, "pp": 8, "iterations": 4,
                "world_communicator": {"tp": 1, "pp": 1, "iterations": 20,
                                       "fault": f"gpu_slow:rank={_SLOW_RANK},severity=0.5,"
                                       "start=10"}},
        goals={"window_localize_seconds": "<= 3", "speedup_vs_full_log": ">= 10",
               "bytes_reduction_pct": ">= 97"},
    )
