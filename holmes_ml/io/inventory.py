"""What a set of CommOps logs holds, and what localization can make of it (``holmes check``).

A new log source (another logger, a profiler export, a sampled job) is worth checking before
agents are wired to it: whether every rank logged, whether communicator members and hosts are
known, how many iterations there are to compare. :func:`inventory` answers from the validated
table alone, without a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from holmes_ml._text import few, spans
from holmes_ml.io.schema import P2P_OPS

if TYPE_CHECKING:
    from holmes_ml.topology import Topology

#: Parallel coordinates a reader may supply as columns.
_COORDS = ("dp", "pp", "tp", "cp", "ep")


def inventory(ops: pd.DataFrame, topology: Topology | None = None,
              min_history: int | None = None) -> dict[str, Any]:
    """Counts of a validated CommOps table and checks of what localization can use.

    Parameters
    ----------
    ops:
        Canonical CommOps table (:func:`holmes_ml.io.read_ops`).
    topology:
        The job's topology, when one is known (``topology.json``).
    min_history:
        Iterations the irregularity monitor needs before it flags one (default: that of
        :class:`holmes_ml.features.IrregularityConfig`).

    Returns
    -------
    dict
        Plain JSON values: ``ops``, ``ranks`` and ``rank_list`` (the ranks, as integers, like
        every ``_list``), ``listed_not_logged`` (ranks that communicator member lists name but
        that logged nothing), ``iterations``, ``iteration_list``, ``ranks_lacking_iterations``
        (ranks whose rows lack iterations other ranks logged; ``_list``: the first 8, each
        with those it lacks), ``median_iteration_s``, ``hosts`` and
        ``hosts_from`` (``topology``, ``logs`` or ``assumed``), ``communicators`` (by kind,
        and how many list their members), ``op_types``, ``send_recv_without_peer``,
        ``coordinates``, ``compute_times`` (whether each step's compute time per rank was
        logged: what names a heavier pipeline stage), ``reused_key_rows``,
        ``gloo_groups_merged_ranks`` (ranks whose profiler traces could not give gloo
        operations their process groups), ``kineto_renumbered_ranks`` and
        ``kineto_steps_left_out`` (profiler traces started at different steps: ranks whose
        steps were renumbered to match, steps only some traces hold), ``unread_files``
        (Parquet logs without their footer, skipped) and ``checks``: one ``{"ok", "what"}``
        per thing localization relies on.
    """
    from holmes_ml.features import IrregularityConfig, iteration_table
    from holmes_ml.topology import Topology

    history = min_history if min_history is not None else IrregularityConfig().min_history
    ranks = np.sort(ops["rank"].unique()).astype(np.int64)
    # what localization itself would derive from these logs: communicators (members listed,
    # or the ranks that logged them), their kinds, and hosts (logged, or assumed)
    logs = Topology.from_ops(ops)
    with_members = int(ops.loc[ops["group_ranks"].str.len() > 0, "group"].nunique()) \
        if "group_ranks" in ops.columns else 0
    missing = sorted({r for g in logs.groups.values() for r in g.ranks} - set(ranks.tolist()))
    kinds = pd.Series([g.kind for g in logs.groups.values()], dtype=object)
    its = iteration_table(ops)
    gaps = iteration_gaps(ops, its.index.to_numpy())
    long = long_ops(ops)
    mixup = unit_mixup(ops)
    # a profiler's gloo operations, whose member lists the reader filled in as the world's
    merged = int(ops.attrs.get("gloo_groups_merged_ranks", 0))
    p2p = ops["op"].isin(P2P_OPS).to_numpy()
    no_peer = int((p2p & (ops["peer"].to_numpy() < 0)).sum()) if "peer" in ops.columns else \
        int(p2p.sum())
    if topology is not None:
        hosts, hosts_from = int(topology.ranks["host"].nunique()), "topology"
    else:
        hosts = int(logs.ranks["host"].nunique())
        logged = "host" in ops.columns and bool((ops["host"].astype(str).str.len() > 0).all())
        hosts_from = "logs" if logged else "assumed"
    fabric = topology is not None and topology.spines > 0
    out: dict[str, Any] = {
        "ops": len(ops),
        "ranks": len(ranks),
        "rank_list": ranks.tolist(),
        "listed_not_logged": len(missing),
        "listed_not_logged_list": [int(r) for r in missing],
        "iterations": len(its),
        "iteration_list": [int(i) for i in its.index],
        "ranks_lacking_iterations": len(gaps),
        "ranks_lacking_iterations_list": {str(r): [int(i) for i in m]
                                          for r, m in list(gaps.items())[:8]},
        "median_iteration_s": round(float(its["duration_s"].median()), 6) if len(its) else None,
        "hosts": hosts,
        "hosts_from": hosts_from,
        "communicators": len(logs.groups),
        "communicators_by_kind": {str(k): int(n) for k, n in kinds.value_counts().items()},
        "communicators_with_members": with_members,
        "op_types": {str(k): int(n) for k, n in ops["op"].value_counts().items()},
        "send_recv_without_peer": no_peer,
        # as logged, or as the topology places the ranks (on an axis of more than one)
        "coordinates": [c for c in _COORDS if c in ops.columns or (
            topology is not None and c in topology.ranks.columns
            and topology.ranks.loc[topology.ranks[c] >= 0, c].nunique() > 1)],
        "compute_times": "step_compute_us" in ops.columns,
        "reused_key_rows": int(ops.attrs.get("reused_key_rows", 0)),
        "gloo_groups_merged_ranks": int(ops.attrs.get("gloo_groups_merged_ranks", 0)),
        "kineto_renumbered_ranks": int(ops.attrs.get("kineto_renumbered_ranks", 0)),
        "kineto_steps_left_out": int(ops.attrs.get("kineto_steps_left_out", 0)),
        "unread_files": list(ops.attrs.get("unread_files", ())),
    }
    checks = [
        (len(ranks) > 1,
         f"{len(ranks)} ranks logged: peers can be compared" if len(ranks) > 1 else
         "one rank logged: there are no peers to compare it with, so a slow device may go "
         "unnamed"),
        (not missing,
         "every rank the member lists name logged" if not missing else
         f"{len(missing)} rank{'s' * (len(missing) != 1)} named by member lists logged "
         f"nothing ({spans(missing)}): a slow device among them can only show through its "
         "peers"),
        (not gaps,
         "every rank logged every iteration" if not gaps else
         f"{len(gaps)} rank{'s' * (len(gaps) != 1)} lack{'s' * (len(gaps) == 1)} "
         "iterations the others logged ("
         + "; ".join(f"{r}: {spans(m)}" for r, m in list(gaps.items())[:4])
         + (" ..." if len(gaps) > 4 else "") + "): their copies there are unknown, read as "
         "late only where a collective waited for none but them"),
        (long is None,
         "no operator lasts longer than an hour" if long is None else
         f"{long}: a corrupt duration_us, or a hang? Iteration times that include them are "
         "absurd"),
        (mixup is None,
         "durations fit between the operators' starts (duration_us in us, start_ns in ns)"
         if mixup is None else f"{mixup}: every time derived from them is off"),
        (with_members == len(logs.groups) and not merged,
         "every communicator lists its members (group_ranks): rings and pairs are known"
         if with_members == len(logs.groups) and not merged else
         "the gloo communicators' members are not known: read as one of the whole world "
         "(below)" if merged else
         f"{len(logs.groups) - with_members} of {len(logs.groups)} communicators list no "
         "members: taken from the ranks that logged them"),
        (hosts_from != "assumed",
         f"{hosts} hosts, from the {hosts_from}" if hosts_from != "assumed" else
         f"no host column and no topology.json: each {logs.gpus_per_host} consecutive ranks "
         "are assumed to share a host"),
        (fabric,
         "the topology places NICs under leaf and spine switches: links and switches can be "
         "named too" if fabric else
         "no topology.json with switches: GPUs, NICs and hosts can be named, not links or "
         "switches"),
        (len(its) > history,
         f"{len(its)} iterations: enough for the irregularity monitor" if len(its) > history
         else f"{len(its)} iteration{'s' * (len(its) != 1)}: the irregularity monitor flags "
         f"none before {history} regular ones; findings come from abnormal operators alone"
         + (", and with one iteration no operator has a history of its own to look abnormal "
            "against: expect no device named (a Flight Recorder or NCCL Inspector dump, a "
            "trace without ProfilerStep marks: log several steps)" if len(its) == 1 else "")),
    ]
    if p2p.any():
        checks.append((
            no_peer == 0,
            "every send/recv names its peer" if no_peer == 0 else
            f"{no_peer} of {int(p2p.sum())} send/recv rows name no peer: paired by "
            "communicator and seq alone"))
    if out["gloo_groups_merged_ranks"]:
        checks.append((False, f"the gloo operations of {out['gloo_groups_merged_ranks']} "
                       "rank(s) are read as one world communicator: their profiler traces do "
                       "not tell which process group ran each (see the warning above)"))
    if out["kineto_renumbered_ranks"]:
        checks.append((True, f"the profiler traces of {out['kineto_renumbered_ranks']} rank(s) "
                       "number the steps from another start: renumbered to match the others "
                       "(see the warning above)"))
    if out["kineto_steps_left_out"]:
        checks.append((False, f"{out['kineto_steps_left_out']} step(s) are in some ranks' "
                       "profiler traces only (their profilers recorded different windows): left "
                       "out, the steps every trace holds are analysed"))
    if out["unread_files"]:
        checks.append((False, f"{len(out['unread_files'])} Parquet log(s) without their footer "
                       f"not read ({few(out['unread_files'], 4, ', ')}): still being written, or "
                       "their writer was killed; their rows are missing"))
    if out["reused_key_rows"]:
        checks.append((False, f"{out['reused_key_rows']} rows share an operator's identity with "
                       "another row: logs of two runs (or a restarted job) read together?"))
    out["checks"] = [{"ok": bool(ok), "what": what} for ok, what in checks]
    return out


def iteration_gaps(table: pd.DataFrame, iterations: np.ndarray | None = None
                   ) -> dict[int, np.ndarray]:
    """The ranks of ``table`` (rows with ``rank`` and ``iteration``: operators, or iteration
    spans) lacking some of ``iterations`` (default: those any rank has), with the iterations
    each lacks; by rank.

    >>> t = pd.DataFrame({"rank": [0, 0, 0, 1, 1, 2], "iteration": [1, 2, 3, 1, 3, 1]})
    >>> {r: v.tolist() for r, v in iteration_gaps(t).items()}
    {1: [2], 2: [2, 3]}
    """
    pairs = table[["rank", "iteration"]].drop_duplicates()
    if iterations is None:
        iterations = np.unique(pairs["iteration"].to_numpy())
    counts = pairs.groupby("rank").size()
    lacking = counts.index[counts.to_numpy() < len(iterations)]
    return {int(r): np.setdiff1d(iterations, pairs.loc[pairs["rank"] == r, "iteration"])
            for r in lacking}


#: An operator logged as lasting longer than this (an hour; NCCL's watchdog ends a collective
#: that hangs after 10 minutes by default) is a corrupt duration or a hang, no slowdown.
LONG_OP_US = 3600e6


#: A rank's operators in one iteration add up to at most about twice the time between its
#: first and last operator start in every log at hand (asynchronous gloo operations overlap:
#: 2; a job's comms: 0.1-1); a median above this is a unit mix-up, which makes it 1,000x.
BUSY_RATIO_MAX = 20.0


def unit_mixup(ops: pd.DataFrame) -> str | None:
    """What to say when ``ops``' durations and start times cannot be in the units the schema
    says (``duration_us`` in microseconds, ``start_ns`` in nanoseconds): the operators of a
    rank in an iteration add up to more than :data:`BUSY_RATIO_MAX` times the span of their
    starts (median over ranks and iterations of three operators or more), as when durations
    were logged in ns or starts in us or ms; None otherwise.

    >>> t = pd.DataFrame({"rank": 0, "iteration": 0, "start_ns": [0, 1_000_000, 2_000_000],
    ...                   "duration_us": [300.0, 300.0, 300.0]})
    >>> unit_mixup(t) is None, unit_mixup(t.assign(duration_us=t["duration_us"] * 1e3))[:40]
    (True, "a rank's operators add up to 450x the ti")
    """
    if len(ops) < 3:
        return None
    by = ops.assign(_ns=ops["duration_us"].to_numpy(np.float64) * 1e3).groupby(
        ["rank", "iteration"], sort=False, observed=True)
    span = by["start_ns"].agg(["min", "max", "count"])
    busy = by["_ns"].sum()
    ok = ((span["count"] >= 3) & (span["max"] > span["min"])).to_numpy()
    if not ok.any():
        return None
    ratio = float(np.median(busy.to_numpy()[ok] / (span["max"] - span["min"]).to_numpy()[ok]))
    if ratio <= BUSY_RATIO_MAX:
        return None
    return (f"a rank's operators add up to {ratio:,.0f}x the time between its first and last "
            "operator start in an iteration (the median over ranks and iterations; at most "
            "about 2 in any job's logs): duration_us in nanoseconds, or start_ns in "
            "microseconds or milliseconds? (expected duration_us in microseconds, start_ns in "
            "nanoseconds)")


def long_ops(ops: pd.DataFrame) -> str | None:
    """What to say of the operators of ``ops`` lasting longer than :data:`LONG_OP_US` (how
    many, and the longest: its duration, rank and iteration), or None when there are none."""
    d = ops["duration_us"].to_numpy(dtype=np.float64)
    over = d > LONG_OP_US
    if not over.any():
        return None
    i = int(np.argmax(d))
    hours = d[i] / 3600e6
    shown = f"{hours / 24:,.1f} days" if hours >= 48 else f"{hours:,.1f} h"
    return (f"{int(over.sum())} operator(s) logged as lasting longer than an hour (the longest "
            f"{shown}: rank {int(ops['rank'].iloc[i])}, iteration "
            f"{int(ops['iteration'].iloc[i])}, {ops['op'].iloc[i]} in {ops['group'].iloc[i]})")

