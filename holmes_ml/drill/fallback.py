"""A minimal arrival-order localizer, used only when :mod:`holmes_ml.pipeline` is not installed.

For every collective instance (same ``group`` and ``seq``) the rank that *arrived* last (latest
``start_ns``) is blamed for the wait it imposed (its start minus the median start of the
instance), but only as far as its own time outside communication since its previous operator
explains it: a rank that is late because it waited for someone else upstream is not blamed. A rank is a suspect when it carries most of the blamed wait, at least ``dominance``
times the next rank, and that wait is a noticeable share of the job's wall time. It returns the
``Verdict.to_dict()`` shape so the drill reads both localizers the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def arrival_localize(
    ops: pd.DataFrame, dominance: float = 3.0, min_share: float = 0.05
) -> dict[str, Any]:
    """Blame late arrivals at collectives; return a ``Verdict.to_dict()``-shaped dict."""
    ops = ops.sort_values(["rank", "start_ns"], kind="stable")
    end = ops["start_ns"].to_numpy(np.float64) + ops["duration_us"].to_numpy(np.float64) * 1e3
    prev_end = pd.Series(end, index=ops.index).groupby(ops["rank"].to_numpy()).shift(1)
    gap = (ops["start_ns"].astype(np.float64) - prev_end).fillna(0.0).clip(lower=0.0)
    is_coll = ops["peer"].to_numpy() < 0 if "peer" in ops.columns else np.ones(len(ops), bool)
    coll = ops[is_coll]
    gap = gap[is_coll]
    empty = {"irregular": False, "irregular_iterations": [], "candidates": [], "workload": None,
             "localizer": "fallback-arrival"}
    if coll.empty:
        return empty
    key = [coll["group"].astype(str), coll["seq"]]
    start = coll["start_ns"].astype(np.float64)
    latest = start.groupby(key).transform("max")
    median = start.groupby(key).transform("median")
    size = start.groupby(key).transform("size")
    is_last = (start == latest) & (size > 1)
    blame = np.minimum(start - median, gap).where(is_last, 0.0) / 1e3  # microseconds
    per_rank = blame.groupby(coll["rank"]).sum().sort_values(ascending=False)
    wall_us = (ops["start_ns"].max() - ops["start_ns"].min()) / 1e3 + 1.0
    total = float(per_rank.sum())
    top, top_us = int(per_rank.index[0]), float(per_rank.iloc[0])
    second = float(per_rank.iloc[1]) if len(per_rank) > 1 else 0.0
    found = top_us >= dominance * max(second, 1.0) and top_us >= min_share * wall_us
    if not found:
        return empty
    late_iters = coll.loc[is_last & (coll["rank"] == top), "iteration"].unique()
    hosts = sorted(ops.loc[ops["rank"] == top, "host"].astype(str).unique()) if "host" in ops else []
    cand = {"kind": "gpu", "ranks": [top], "hosts": hosts, "score": top_us / max(total, 1.0),
            "coords": None, "evidence": [{"rule": "straggler", "weight": round(top_us, 3)}]}
    return {**empty, "irregular": True, "irregular_iterations": sorted(int(i) for i in late_iters),
            "candidates": [cand]}
