"""Benchmark ``logger``: the cost :class:`holmes_ml.collect.CommOpsLogger` adds per operator.

A 1-process gloo world all-reduces a 4-element tensor ``n`` times unlogged and ``n`` times
logged, alternating in rounds; the overhead per op is the difference of the best round times
(best-of rounds filters out the other processes sharing the machine). Goal: <= 2 us (Holmes).
"""

from __future__ import annotations

import os
import tempfile
import time

from holmes_ml.bench.record import BenchResult
from holmes_ml.collect.torch_import import import_torch_distributed


def _time_loop(dist, tensor, n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        dist.all_reduce(tensor)
    return (time.perf_counter_ns() - t0) / 1000.0 / n


def run(quick: bool = False) -> BenchResult:
    """Measure µs/op with and without the logger."""
    dist = import_torch_distributed()
    import torch

    from holmes_ml.bench.record import peak_rss_mb  # noqa: I001 - keep torch import first
    from holmes_ml.collect import CommOpsLogger, LoggerConfig

    n, rounds = (2000, 5) if quick else (20000, 9)
    tmp = tempfile.mkdtemp(prefix="holmes-bench-logger-")
    created = not dist.is_initialized()
    if created:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    tensor = torch.zeros(4)
    plain: list[float] = []
    logged: list[float] = []
    rows = 0
    try:
        _time_loop(dist, tensor, n // 10)  # warm up
        for _ in range(rounds):
            plain.append(_time_loop(dist, tensor, n))
            cfg = LoggerConfig(out_dir=tmp, flush_every=4096, timing="wall")
            with CommOpsLogger(cfg) as log:
                logged.append(_time_loop(dist, tensor, n))
            rows += log._sink.rows_written if log._sink else 0
    finally:
        if created:
            dist.destroy_process_group()
    best_plain, best_logged = min(plain), min(logged)
    med = sorted(b - a for a, b in zip(plain, logged, strict=True))[rounds // 2]
    return BenchResult(
        name="logger",
        figures={
            "overhead_us_per_op": round(best_logged - best_plain, 3),
            "overhead_us_per_op_median_round": round(med, 3),
            "unlogged_us_per_op": round(best_plain, 3),
            "logged_us_per_op": round(best_logged, 3),
            "peak_rss_mb": round(peak_rss_mb(), 1),
        },
        config={"ops_per_round": n, "rounds": rounds, "quick": quick, "world_size": 1,
                "backend": "gloo", "tensor_elems": 4, "torch": torch.__version__},
        goals={"overhead_us_per_op": "<= 2"},
        details={"plain_us": plain, "logged_us": logged},
    )
