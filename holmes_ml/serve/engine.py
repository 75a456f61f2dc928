"""Turn what a job has accumulated in the :class:`~holmes_ml.serve.store.Store` into a verdict.

Agent jobs are rebuilt into one ``NodeSummary`` and localized with
:func:`holmes_ml.pipeline.localize_summaries`; raw jobs are localized with
:func:`holmes_ml.pipeline.analyze`. The two pipeline entry points are reached through
:class:`Analyzers`, so a caller (a test, a deployment with a custom localizer) can substitute them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from holmes_ml.io.schema import SchemaError
from holmes_ml.serve.store import Store
from holmes_ml.topology import Topology

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Analyzers:
    """The pipeline functions the service calls.

    Parameters
    ----------
    localize_summaries:
        ``(summaries, topology=None) -> Verdict`` (anything with ``to_dict()``, or a dict).
    analyze:
        ``(ops, topology=None, model=None) -> Verdict``.
    node_summary:
        ``(iterations=, abnormal=, groups=) -> NodeSummary``.
    abnormal_window:
        ``localize_summaries`` looks at the abnormal operators of this many most recent
        iterations that have any, and no others; only those are read from the store. ``None``:
        all of the verdict's window.
    last_irregular:
        ``(iterations) -> int | None``: the last irregular iteration of the iteration
        summaries, where the localizer's window reaches back to when the most recent
        iterations with abnormal operators all come after it (read from the store too).
    """

    localize_summaries: Callable[..., Any]
    analyze: Callable[..., Any]
    node_summary: Callable[..., Any]
    abnormal_window: int | None = None
    last_irregular: Callable[[pd.DataFrame], int | None] | None = None


def pipeline_analyzers() -> Analyzers:
    """The real pipeline (:mod:`holmes_ml.pipeline`)."""
    from holmes_ml import pipeline
    from holmes_ml.localize import LocalizeConfig

    return Analyzers(
        localize_summaries=pipeline.localize_summaries,
        analyze=pipeline.analyze,
        node_summary=pipeline.NodeSummary,
        abnormal_window=LocalizeConfig().window,
        last_irregular=lambda it: max(pipeline.irregular_iterations(it), default=None),
    )


def min_analyze_last() -> int:
    """Fewest most recent iterations a verdict may read (``holmes serve --analyze-last``; 0,
    every stored iteration, aside): the localizer's window
    (:attr:`~holmes_ml.localize.LocalizeConfig.window`, 50 iterations) and, before it, the
    irregularity monitor's reference (:attr:`~holmes_ml.features.IrregularityConfig.window`,
    the 20 regular iterations each one is judged against). The monitor is run over the
    iterations the verdict reads, and the first ones of those have a partial reference or none
    (it flags nothing before ``min_history`` regular ones): a verdict of 10 iterations of a job
    whose 10 latest had all slowed down took them as their own reference and flagged none.
    With this many, a slowdown as long as the localizer's window is flagged, each of its
    iterations judged against a full reference."""
    from holmes_ml.features.iterations import IrregularityConfig
    from holmes_ml.localize.config import LocalizeConfig

    return LocalizeConfig().window + IrregularityConfig().window


def _verdict_dict(verdict: Any) -> dict:
    body = verdict.to_dict() if hasattr(verdict, "to_dict") else dict(verdict)
    body.setdefault("irregular", False)
    body.setdefault("irregular_iterations", [])
    body.setdefault("candidates", [])
    return body


def groups_frame(groups: dict[str, tuple[str, tuple[int, ...]]]) -> pd.DataFrame:
    """``{name: (kind, ranks)}`` as the ``NodeSummary.groups`` table."""
    return pd.DataFrame(
        {
            "group": list(groups),
            "group_kind": [k for k, _ in groups.values()],
            "group_ranks": [" ".join(map(str, r)) for _, r in groups.values()],
        },
        columns=["group", "group_kind", "group_ranks"],
    )


def agent_summary_frames(data: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """Store rows of an agent job as the three ``NodeSummary`` tables."""
    groups = groups_frame(data["groups"])
    ab = data["abnormal"].copy()
    if len(groups):
        # The members stay in the groups table: a copy of an 8,192-rank member list on each
        # abnormal row of a world-size communicator would take gigabytes.
        kinds = ab["group"].map(groups.set_index("group")["group_kind"]).fillna("").astype(str)
        ab["group_kind"] = ab["group_kind"].where(ab["group_kind"] != "", kinds)
    ranks = data["ranks"]
    if len(ranks) and "host" in ab.columns:
        hosts = ranks.set_index("rank")["host"]
        missing = ab["host"].astype(str).str.len() == 0
        ab.loc[missing, "host"] = ab.loc[missing, "rank"].map(hosts).fillna("").astype(str)
    ranks = ranks.drop(columns=[c for c in ranks.columns if (ranks[c] == -1).all()])
    if len(ranks) and ranks.duplicated(["host", "gpu"]).any():
        # Two agents on one host (or an older agent whose late ranks restarted at GPU 0) gave
        # two ranks the same GPU: number the host's GPUs by rank order instead, as one agent
        # seeing them all would, rather than name two ranks' faults as one device.
        clash = ranks.groupby("host")["gpu"].transform(lambda g: g.duplicated().any())
        renumbered = ranks.sort_values("rank").groupby("host").cumcount()
        ranks = ranks.assign(gpu=ranks["gpu"].where(~clash, renumbered.reindex(ranks.index)))
    return {"iterations": data["iterations"], "abnormal": ab, "groups": groups,
            "ranks": ranks if len(ranks) else None}


def topology_of(store: Store, job: str) -> Topology | None:
    """``job``'s stored topology; ``None`` when it has none, or when the stored one no longer
    passes the checks it would meet today (a database from before a check was added: two ranks
    on one GPU): then the job is read without it, with a warning, rather than fail every
    verdict until a new topology is put."""
    raw = store.topology(job)
    if raw is None:
        return None
    try:
        return Topology.from_dict(raw, source=f"topology of job {job!r}")
    except SchemaError as exc:
        logger.warning("%s; analysing job %r without it (PUT a corrected topology)", exc, job)
        return None


def compute_verdict(
    store: Store, job: str, analyzers: Analyzers, model: Any = None, last: int | None = None
) -> dict:
    """Localize what ``job`` has accumulated - with ``last``, over its ``last`` most recent
    iterations, so that a verdict costs the same after a week as after a minute; returns the
    verdict's JSON dict."""
    info = store.job(job)
    topology = topology_of(store, job)
    if info["mode"] == "raw":
        ops = store.raw_ops(job, last)
        verdict = analyzers.analyze(ops, topology=topology, model=model)
    elif info["mode"] == "agent":
        frames = agent_summary_frames(store.agent_data(job, last, analyzers.abnormal_window,
                                                       analyzers.last_irregular))
        summary = analyzers.node_summary(**frames)
        verdict = analyzers.localize_summaries([summary], topology=topology)
    else:
        return {"irregular": False, "irregular_iterations": [], "candidates": []}
    return _verdict_dict(verdict)


def iteration_rows(store: Store, job: str, last: int | None = None,
                   window: int | None = None) -> pd.DataFrame:
    """Job-wide iteration times with the irregularity monitor's columns, of the ``last`` most
    recent iterations when given (``None`` or 0: of every stored one).

    The monitor judges each iteration against the regular ones before it, so it is not run on
    the ``last`` alone (the first of them would have no reference: a job whose 10 latest
    iterations had all slowed down showed them regular with ``last=10``). It is run over the
    ``window`` most recent iterations (a verdict's, ``holmes serve --analyze-last``), or over
    the ``last`` when they are more, or over every stored one when ``window`` is ``None`` or
    0; and the ``last`` most recent rows of that are returned. So a ``last`` up to ``window``
    gives the rows the whole window gives, judged over the iterations the verdict reads, for
    what reading those costs; a longer ``last`` reads that many, judged as over a verdict's
    window of that many.

    Built from agent iteration summaries (one pseudo-operator per rank and iteration spanning
    its window) or from raw records, then passed to :func:`holmes_ml.features.detect_irregular`.
    """
    from holmes_ml.features import detect_irregular, iteration_table

    read = max(last, window) if last and window else None
    info = store.job(job)
    if info["mode"] == "raw":
        ops = store.raw_ops(job, read)
    elif info["mode"] == "agent":
        it = store.iteration_summaries(job, read)
        ops = pd.DataFrame(
            {
                "iteration": it["iteration"].astype(np.int64),
                "rank": it["rank"].astype(np.int64),
                "start_ns": it["start_ns"].astype(np.int64),
                "duration_us": (it["end_ns"] - it["start_ns"]).astype(np.float64) / 1e3,
            }
        )
    else:
        ops = pd.DataFrame()
    if ops.empty:
        return pd.DataFrame(
            columns=["iteration", "time_us", "reference_us", "ratio", "irregular", "pattern"]
        )
    rows = detect_irregular(iteration_table(ops))
    if last:
        rows = rows.iloc[-last:]
    return rows.reset_index(drop="iteration" in rows.columns)
