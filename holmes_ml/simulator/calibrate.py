"""Trace-driven calibration: fit per-(op, group_kind) duration distributions from a real log.

A log (any format :func:`holmes_ml.io.read_ops` reads: canonical CommOps Parquet, CSV or JSON
Lines, Kineto traces, ...; a file or a directory of them) is reduced to, for every
``(op, group_kind)``, the median duration and the log-normal sigma (robust: from the
inter-quartile range of ``log(duration)``). When the log identifies op instances (``iteration,
group, seq``) the fit uses each instance's shortest duration - the transfer time seen by the
last rank to arrive - so waiting for stragglers is not mistaken for wire time.
The engine then draws that op's transfer time from
the fitted log-normal instead of the alpha-beta model (keeping the model's intra/inter-host and
fault-induced *ratios*), so simulated logs carry the real job's scale and spread. Only the pairs
the job runs apply (``all_reduce``/``tp``, ``send``/``pp``, ...): a Kineto trace's group kinds are
process-group names (``0``, ``default``), which match none, and the engine warns that the
communication stays at its model. When the log has ``iteration`` and ``start_ns``, its median
iteration time rescales compute as well.

Examples
--------
>>> import pandas as pd
>>> log = pd.DataFrame({"op": ["all_reduce"] * 5, "group_kind": ["tp"] * 5,
...                     "duration_us": [100.0, 110.0, 90.0, 100.0, 120.0]})
>>> round(fit_calibration(log).get("all_reduce", "tp").median_us, 6)
100.0
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

logger = logging.getLogger(__name__)

#: log-normal sigma = IQR of log(duration) / (2 * 0.6745)
_IQR_TO_SIGMA = 1.0 / 1.349
_MAX_SIGMA = 1.0


@dataclass(frozen=True)
class OpDistribution:
    """Fitted distribution of one ``(op, group_kind)``: median (us), log-normal sigma, count."""

    median_us: float
    sigma: float
    count: int


@dataclass(frozen=True)
class Calibration:
    """Per-(op, group_kind) duration distributions fitted from a real log."""

    table: dict[tuple[str, str], OpDistribution] = field(default_factory=dict)
    source: str = ""
    #: Median job-wide iteration time of the log (us), when it has iteration/start_ns columns;
    #: the engine scales compute so its healthy iteration time is of that order.
    iteration_us: float | None = None

    def get(self, op: str, kind: str) -> OpDistribution | None:
        """Distribution for ``(op, kind)``; send/recv share theirs; None when not in the log."""
        hit = self.table.get((op, kind))
        if hit is None and op in ("send", "recv"):
            hit = self.table.get(("recv" if op == "send" else "send", kind))
        return hit


def fit_calibration(ops: pd.DataFrame, source: str = "log", min_count: int = 5) -> Calibration:
    """Fit :class:`Calibration` from a table with ``op``, ``duration_us`` and ``group_kind``
    (or ``group``, whose name prefix gives the kind).

    Parameters
    ----------
    ops:
        CommOps rows.
    source:
        Name used in error messages.
    min_count:
        Minimum rows for an ``(op, kind)`` to be fitted; rarer ones fall back to the model.
    """
    for col in ("op", "duration_us"):
        if col not in ops.columns:
            raise ValueError(
                f"{source}: column {col!r} missing; expected a canonical CommOps log with op, "
                "duration_us and group_kind (or group)"
            )
    if "group_kind" in ops.columns:
        kind = ops["group_kind"].astype(str)
    elif "group" in ops.columns:
        kind = ops["group"].astype(str).str.split("-", n=1).str[0].str.lower()
    else:
        raise ValueError(
            f"{source}: column 'group_kind' (or 'group') missing; expected one of them"
        )
    dur = pd.to_numeric(ops["duration_us"], errors="coerce").to_numpy(dtype=float)
    ok = np.isfinite(dur) & (dur > 0)
    if not ok.any():
        raise ValueError(f"{source}: column 'duration_us' has no positive finite value")
    op = ops["op"].astype(str).to_numpy()[ok]
    frame = pd.DataFrame({"op": op, "kind": kind.to_numpy()[ok], "logd": np.log(dur[ok])})
    if {"iteration", "group", "seq"} <= set(ops.columns):
        # Fit the *transfer* time: per op instance the last participant to arrive waits for
        # nobody, so the instance's shortest duration is its transfer (for P2P: the send).
        frame["op"] = np.where(np.isin(op, ("send", "recv")), "send", op)
        keys = [
            ops["iteration"].to_numpy()[ok],
            ops["group"].astype(str).to_numpy()[ok],
            ops["seq"].to_numpy()[ok],
            frame["op"],
            frame["kind"],
        ]
        frame = frame.groupby(keys, observed=True, sort=False)["logd"].min().reset_index()
        frame.columns = ["iteration", "group", "seq", "op", "kind", "logd"]
    stats = frame.groupby(["op", "kind"], observed=True)["logd"].agg(
        median="median",
        q1=lambda x: x.quantile(0.25),
        q3=lambda x: x.quantile(0.75),
        count="size",
    )
    table = {}
    for (op, k), row in stats.iterrows():
        if row["count"] < min_count:
            continue
        sigma = float(min(_MAX_SIGMA, (row["q3"] - row["q1"]) * _IQR_TO_SIGMA))
        table[(str(op), str(k))] = OpDistribution(
            float(np.exp(row["median"])), sigma, int(row["count"])
        )
    iteration_us = None
    if {"iteration", "start_ns"} <= set(ops.columns):
        start = pd.to_numeric(ops["start_ns"], errors="coerce").to_numpy(dtype=float)[ok]
        it = ops["iteration"].to_numpy()[ok]
        spans = pd.DataFrame({"it": it, "s": start, "e": start + dur[ok] * 1000.0}).groupby("it")
        per_iter = (spans["e"].max() - spans["s"].min()) / 1000.0
        if len(per_iter) and float(per_iter.median()) > 0:
            iteration_us = float(per_iter.median())
    logger.info("calibration from %s: %d (op, group_kind) distributions", source, len(table))
    return Calibration(table=table, source=source, iteration_us=iteration_us)


def load_calibration(path: str | Path) -> Calibration:
    """Read a log (a file or a directory of them, in any format
    :func:`holmes_ml.io.read_ops` reads, checked as it checks them) and fit a
    :class:`Calibration`."""
    from holmes_ml.io import read_ops

    p = Path(path)
    if not p.exists():
        raise ValueError(f"calibrate_from: {str(p)!r} does not exist; expected a CommOps log path")
    from holmes_ml.io.readers import UnknownFormatError

    try:
        frame = read_ops(p)
    except UnknownFormatError as exc:
        # the reader's hint (--format) is no option of the simulator's
        raise UnknownFormatError(exc.message, source=exc.source, value=exc.value,
                                 expected="a log of a format holmes reads, told by its content "
                                 "or name (.csv, .jsonl, .parquet, a Kineto .json trace, ...)"
                                 ) from None
    return fit_calibration(frame, source=str(p))
