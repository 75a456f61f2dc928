"""``holmes bench latency``: one localization window end to end, against the full-log baseline.

Figures: seconds to localize one window of an 8,192-GPU job (2,048 with ``--quick``) from the
node summaries, seconds for the same rules over every operator copy (no detector pre-filter),
the speed-up, and the bytes nodes ship (abnormal-op summaries) against the raw logs.
"""

from __future__ import annotations

import time

from holmes_ml.bench.localize import _speed
from holmes_ml.bench.record import BenchResult


def run(quick: bool = False) -> BenchResult:
    t0 = time.perf_counter()
    figures: dict[str, float] = dict(_speed(quick))
    figures["bench_seconds"] = round(time.perf_counter() - t0, 1)
    return BenchResult(
        name="latency",
        figures=figures,
        config={"quick": quick, "model": "llama2-70b", "tp": 8, "pp": 8, "iterations": 4},
        goals={"window_localize_seconds": "<= 3", "speedup_vs_full_log": ">= 10",
               "bytes_reduction_pct": ">= 97"},
    )
