"""Graph rules over the sparse abnormal-operator records, and the cross-iteration ranking.

The operator-device graph is kept implicit and compressed by communicator: an operator *instance*
(collective ``(iteration, group, seq)`` or one send/recv pair) is an edge set between the
communicator's ranks, and its network devices come from the communicator's ring
(:class:`holmes_ml.localize.fabric.Fabric`). Only abnormal copies are shipped by the nodes, so
the rules read the *absence* of a participant as a normal copy:

* **straggler** — some copies are abnormal, some members absent: the absent (normal) ones arrived
  last; the abnormal copies waited for them. A member whose log lacks the instance (its log
  lacks the iteration, or stops in it before the others began the instance) is unknown, not
  normal: read as the late one only where no other absent member logged it, and not named for
  that when, in two or more irregular steps its log holds, it had no lateness left (it waited
  with the others; its log was cut short, or its agent is behind). Also, in an instance of three
  members or more with every copy abnormal, the member that arrived after all the others by at
  least ``late_fraction`` of their median excess (its own copy slow too, say on a loaded
  machine).
* **backtracking** — a straggler that itself waited (had abnormal copies) shortly before and
  while its partners waited for it is explained by that wait; its evidence is dropped and the
  origin keeps the credit it earns in the instances where *it* was the late one.
* **p2p-chain** — a long receive whose send is normal blames the sender (and vice versa).
* **echoes** — a late rank that spent as much of the step communicating as the partners that
  waited for it was itself waiting (the other stages of a slowed replica, every replica's
  pipeline fill after a slow data-parallel sync): its lateness is dropped; a long send whose
  receiver was not late that way is a slow transfer (communication evidence), unless the
  receiver had itself been waiting in its other flows just before (a stage behind the slowed
  one: the delay passed down the pipeline).
* **released together** — late ranks on different hosts whose lateness ends at one instant were
  let go by one shared event (a collective or a wait the logs do not show); none of them is
  singled out in that step, nor in any step when that is how the rank is late in most.
* **communication** — every member's copy abnormal, and no straggler among them: the transfer
  itself was slow. A *flow* is a
  communicator's ring or the traffic of one rank pair (send/recv); a network device is scored by
  the excess of the slow flows crossing it, times the squared share of slow flows among all the
  flows crossing it (healthy flows clear a device: shared switches are not blamed for being on
  many paths, the other NICs of a slow ring are cleared by their own healthy send/recv), times
  the root of the share of slow flows it explains (one device explains them all). Where no
  switch is known (NICs only) and no step is irregular, a NIC also needs one of its flows slow
  in ``quiet_persistence`` of the steps.

* **comm-gap** (fallback, when the records name no one) — a rank whose communication time per
  iteration (the iteration summaries every node ships) fell far below its host-mates', beyond
  its usual gap (from regular iterations, or from its replicas on other hosts when no iteration
  is irregular), made them wait: the same rule read off per-rank totals. It finds the slow GPU of a
  host that holds one whole tensor-parallel group, which that host's agent, with no other group
  to compare with, barely flags.

* **heavier stage** (a workload finding; never changes the suspects) — every rank of one
  pipeline stage, in two or more replicas, computes ``delta`` x the other stages' median in most
  steps: read from logged compute times, or else from each rank's time outside communication
  (its stages and replicas from the send/recv pairs and dp groups when the logs carry no
  coordinates).

Per-rank evidence is measured above the background every rank collects from pipeline bubbles
and jitter (the median rank's); workload findings need lateness in most analysed iterations, so a
single long pause (a host stall) is a host candidate, not a rank imbalance.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace

import networkx as nx
import numpy as np
import pandas as pd

from holmes_ml._text import duration
from holmes_ml.features._segments import reduce_at, unique_inverse
from holmes_ml.features.iterations import IrregularityConfig, span_times
from holmes_ml.io.schema import P2P_OPS
from holmes_ml.localize.config import LocalizeConfig
from holmes_ml.localize.fabric import Fabric
from holmes_ml.localize.types import Candidate, DeviceKind, Evidence, Verdict, WorkloadFinding
from holmes_ml.topology import Topology

logger = logging.getLogger(__name__)

#: More specific device kinds win ties (a NIC explains what its leaf switch would).
_SPECIFICITY = {"nic": 4, "link": 3, "switch": 2, "host": 1, "gpu": 1}
_NETWORK = (DeviceKind.NIC, DeviceKind.LINK, DeviceKind.SWITCH)


def parse_members(group_ranks: pd.Series) -> pd.DataFrame:
    """Long table ``group, rank`` from a ``group -> "0 1 2"`` series (vectorised)."""
    s = group_ranks.astype(str).str.split()
    long = s.explode().dropna()
    long = long[long.str.len() > 0]
    return pd.DataFrame(
        {"group": long.index.astype(str), "rank": long.to_numpy().astype(np.int64)}
    )


def iteration_spans_of(iterations: pd.DataFrame) -> pd.DataFrame:
    """Per iteration (index, increasing) of a per-rank span table (a summary's ``iterations``):
    its first start, last end and last rank's arrival over its ranks (``start``, ``end``,
    ``last``; ns), what :func:`~holmes_ml.features.iteration_times` reads."""
    if iterations is None or len(iterations) == 0:
        return pd.DataFrame({"start": pd.Series(dtype=np.int64),
                             "end": pd.Series(dtype=np.int64),
                             "last": pd.Series(dtype=np.int64)})
    # (one row per rank and iteration: the latest start is the last rank's arrival)
    cols = iterations[["iteration", "start_ns", "end_ns"]]
    if not all(t == np.dtype(np.int64) for t in cols.dtypes):
        # other dtypes (a float column with gaps, nullable integers) keep pandas' rules
        return cols.groupby("iteration").agg(start=("start_ns", "min"), end=("end_ns", "max"),
                                             last=("start_ns", "max"))
    # int64 throughout (a node's own table, or merged ones): reductions over the iterations'
    # codes, the group-by's table without its fixed cost, which a node pays every window
    iteration, code = unique_inverse(cols["iteration"].to_numpy())
    start, k = cols["start_ns"].to_numpy(), len(iteration)
    low, high = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    return pd.DataFrame({"start": reduce_at(np.minimum, code, start, k, high),
                         "end": reduce_at(np.maximum, code, cols["end_ns"].to_numpy(), k, low),
                         "last": reduce_at(np.maximum, code, start, k, low)},
                        index=pd.Index(iteration, name="iteration"))


def _iteration_times_us(spans: pd.DataFrame) -> pd.Series:
    """Each iteration's time in microseconds (:func:`~holmes_ml.features.iteration_times`: its
    span, first start to last end over its ranks, or end to end where the span is a small part
    of the step), from its :func:`iteration_spans_of`."""
    return span_times(spans, "start", "end", "last")[0] / 1e3


def _usual_step_us(spans: pd.DataFrame) -> float:
    """How long a step usually lasts, in microseconds: the median time from one iteration's
    last end to the next one's (consecutive iterations only), or the median span (first start
    to last end, of its :func:`iteration_spans_of`) when that is longer. The span of a step whose
    operators come at its end (one gradient all-reduce after the compute: pure data
    parallelism) is a small part of the step; end to end it is all there."""
    span_us = (spans["end"] - spans["start"]).astype(np.float64) / 1e3
    usual = float(span_us.median()) if len(span_us) else 0.0
    step = np.diff(spans.index.to_numpy(dtype=np.int64))
    gap = np.diff(spans["end"].to_numpy(dtype=np.int64)) / 1e3
    period = gap[step == 1]
    return max(usual, float(np.median(period))) if len(period) else usual


def _lag_us(events: pd.DataFrame) -> pd.Series:
    """How long each event kept someone waiting, in microseconds before any iteration
    weighting (``lag_us``; ``weight`` for events that were never weighted)."""
    return events["lag_us"] if "lag_us" in events.columns else events["weight"]


def _iteration_weights(dur: pd.Series) -> tuple[pd.Series, float]:
    """Per-iteration weight (1 + relative excess of the iteration time) and the median
    iteration time in microseconds, from the iteration times (:func:`_iteration_times_us`)."""
    if len(dur) == 0:
        return pd.Series(dtype=float), 0.0
    med = float(dur.median())
    w = 1.0 + np.clip(dur / med - 1.0, 0.0, 4.0) if med > 0 else dur * 0 + 1.0
    return w, med


def _slowdown(times: pd.Series, irregular: tuple[int, ...],
              usual_us: float | None = None) -> dict[str, float]:
    """``usual_iteration_us`` (:func:`_usual_iteration_us`, or ``usual_us`` when the caller
    has it) and, when some iterations are irregular, ``slowdown``: the slowest irregular
    iteration's time over it; from the :func:`_iteration_times_us`."""
    usual = _usual_iteration_us(times, irregular) if usual_us is None else usual_us
    if not usual > 0:
        return {}
    out = {"usual_iteration_us": usual}
    flagged = times.index.isin(list(irregular))
    if flagged.any():
        out["slowdown"] = float(times[flagged].max()) / usual
    return out


def localize_records(
    abnormal: pd.DataFrame,
    groups: pd.DataFrame,
    iterations: pd.DataFrame,
    topology: Topology,
    config: LocalizeConfig | None = None,
    irregular_iterations: tuple[int, ...] = (),
) -> Verdict:
    """Apply the rules to abnormal-operator records and rank suspect devices.

    Parameters
    ----------
    abnormal:
        Abnormal operator copies: canonical columns plus ``excess_us`` (duration minus the typical
        duration of the operator's class).
    groups:
        ``group, group_kind, group_ranks`` of every communicator of the job.
    iterations:
        Per ``(iteration, rank)``: ``start_ns, end_ns, comm_us, n_ops``.
    topology:
        Placement of ranks (hosts, GPUs, NICs, switches) for device ids and coordinates.
    config:
        :class:`LocalizeConfig`.
    irregular_iterations:
        Reported in the verdict as is.

    Returns
    -------
    Verdict
    """
    cfg = config or LocalizeConfig()
    irregular = bool(irregular_iterations)
    stats: dict[str, float] = {"abnormal_rows": float(len(abnormal))}
    spans = iteration_spans_of(iterations)
    times = _iteration_times_us(spans)
    it_weight, med_iter_us = _iteration_weights(times)
    usual_us = _usual_iteration_us(times, irregular_iterations)
    stats.update(_slowdown(times, irregular_iterations, usual_us))
    if len(abnormal) == 0:
        return _with_stage_compute(
            _with_comm_gap(Verdict(irregular, tuple(irregular_iterations), (), (), stats),
                           iterations, topology, cfg), iterations, topology, cfg, usual_us)
    ab = abnormal.reset_index(drop=True)
    with_records = np.sort(ab["iteration"].unique())
    its = _window(with_records, irregular_iterations, cfg.window)
    ab = ab[ab["iteration"].isin(its)].reset_index(drop=True)
    n_its = len(its)
    stats.update(analysed_iterations=float(n_its), analysed_first=float(its[0]),
                 analysed_last=float(its[-1]),
                 later_iterations=float((with_records > its[-1]).sum()))
    # irregular iterations whose abnormal operators the window left out (an earlier episode)
    left = np.intersect1d(with_records[with_records < its[0]], np.asarray(irregular_iterations))
    if len(left):
        # a slice that starts at the episode has no regular iterations before it to measure the
        # episode against: the range suggested reaches back a monitor's reference window
        known = np.sort(np.asarray(times.index, dtype=np.int64))
        back = known[max(0, int(np.searchsorted(known, left[0])) - IrregularityConfig().window)]
        stats.update(left_out_irregular=float(len(left)), left_out_first=float(left[0]),
                     left_out_last=float(left[-1]), left_out_from=float(back))
    op = ab["op"].astype(str).to_numpy()
    p2p = np.isin(op, list(P2P_OPS))
    ab = ab.assign(
        op=op,
        group=ab["group"].astype(str).to_numpy(),
        excess_us=np.maximum(ab["excess_us"].to_numpy(dtype=np.float64), 0.0),
    )
    members = parse_members(groups.set_index(groups["group"].astype(str))["group_ranks"])
    size = members.groupby("group").size()
    kind = (pd.Series(groups["group_kind"].astype(str).to_numpy(),
                      index=groups["group"].astype(str).to_numpy())
            if "group_kind" in groups.columns else pd.Series(dtype=str))

    events = [
        _collective_events(ab[~p2p], members, size, cfg, kind, iterations),
        _p2p_events(ab[p2p], cfg, iterations),
    ]
    ev = pd.concat([e for e in events if len(e)], ignore_index=True) if any(
        len(e) for e in events
    ) else pd.DataFrame()
    fabric = Fabric(topology)
    rank_cands: list[Candidate] = []
    workload: list[WorkloadFinding] = []
    strag = pd.DataFrame(columns=["rank", "weight"])
    if len(ev):
        ev = ev.assign(lag_us=ev["weight"],
                       weight=ev["weight"] * ev["iteration"].map(it_weight).fillna(1.0))
        strag = ev[ev["rule"] != "communication"]
        strag, echo_sends = _drop_echoes(strag, iterations, members, cfg)
        lookback_ns = 0.5 * med_iter_us * 1e3
        strag = _backtrack(strag, ab, cfg, lookback_ns)
        slow_sends = _slow_transfers(echo_sends, ab, cfg, lookback_ns)
        stats["straggler_events"] = float(len(strag))
        floor = cfg.min_weight_fraction * med_iter_us * max(n_its, 1)
        # The user asked to hear about steps delta x slower than usual: a rank behind such a
        # step held it back by about (delta - 1) x the usual iteration time. Lateness far below
        # that is jitter (OS scheduling, data loading, a slowdown every rank shares such as
        # drift), whatever the per-op detector says; with no delta-irregular step it is how a
        # slowdown older than the window, which the reference has absorbed, still shows.
        step_us = (cfg.delta - 1.0) * usual_us
        rank_cands, workload, rank_total = _rank_candidates(
            strag, topology, fabric, cfg, n_its, floor, cfg.min_step_share * step_us,
            lambda ranks: _ops_per_iteration(iterations, its, ranks),
            _usual_step_us(spans),
            _waited_where_logged(strag, iterations, irregular_iterations, its))
        comm = pd.concat([ev[ev["rule"] == "communication"], slow_sends], ignore_index=True)
        stats["communication_events"] = float(len(comm))
        # with no irregular step and no switch known, a NIC must have slowed flows step
        # after step (see LocalizeConfig.quiet_persistence)
        quiet = not irregular and topology.spines == 0
        min_steps = int(np.ceil(cfg.quiet_persistence * n_its)) if quiet else 0
        dev_cands, net_total = _device_candidates(comm, members, fabric, topology, cfg,
                                                  cfg.min_weight_fraction * med_iter_us,
                                                  cfg.min_device_step_share * step_us,
                                                  min_steps)
    else:
        dev_cands, rank_total, net_total = [], 0.0, 0.0
    cands = rank_cands + dev_cands
    # Network devices are alternative explanations of the same slow flows, not shares of them:
    # their part of the slowdown is the excess of the slow flows, each counted once.
    total = net_total if any(c.kind in _NETWORK for c in cands) else 0.0
    total += rank_total if any(c.kind in (DeviceKind.GPU, DeviceKind.HOST) for c in cands) else 0.0
    # Devices with identical network evidence (the two NICs of one slow send/recv pair) are
    # ordered by the lateness of the ranks behind them: when only one direction is slow (a
    # capped egress), the rank whose own transfers crawl arrives late at its next collective.
    # Their scores stay equal, so the verdict marks them tied (the order may be a coin flip).
    late = strag.groupby("rank")["weight"].sum() if len(strag) else pd.Series(dtype=float)
    cands.sort(key=lambda c: (-c.score, -_SPECIFICITY[c.kind.value],
                              -float(late.reindex(list(c.ranks)).fillna(0.0).sum()), c.device))
    # Two late ranks on one host both read as that host: the host is listed once.
    first: dict[str, Candidate] = {}
    for c in cands:
        first.setdefault(c.device, c)
    cands = list(first.values())
    out = []
    for c in cands:
        share = c.score / total if total > 0 else 0.0
        if share < cfg.min_share:
            continue
        out.append(_with_score(c, share))
    out = _mark_ties(out)[: cfg.top_k]
    return _with_stage_compute(_with_comm_gap(
        Verdict(irregular, tuple(irregular_iterations), tuple(out), tuple(workload), stats),
        iterations, topology, cfg, fabric), iterations, topology, cfg, usual_us)


def _window(its: np.ndarray, irregular: tuple[int, ...], size: int) -> np.ndarray:
    """The iterations analysed, of ``its`` (sorted, those with abnormal records): the ``size``
    most recent, unless the last irregular iteration would fall before them (a long log whose
    slow episode is over, later steps holding a few abnormal operators of their own): then the
    ``size`` most recent up to that iteration, so that the verdict speaks of the steps the
    monitor flagged."""
    recent = its[-size:]
    if not irregular or len(recent) == 0 or max(irregular) >= recent[0]:
        return recent
    upto = its[its <= max(irregular)][-size:]
    return upto if len(upto) else recent


def _with_comm_gap(verdict: Verdict, iterations: pd.DataFrame, topology: Topology,
                   cfg: LocalizeConfig, fabric: Fabric | None = None) -> Verdict:
    """``verdict``, or - when it names neither a device nor a workload cause - the candidates
    of :func:`_comm_gap_candidates` (over its irregular iterations; over every iteration when
    none is irregular, since a fault present from the first step makes none irregular).
    ``fabric``: the topology's :class:`Fabric`, when the caller already built it."""
    if (not cfg.comm_gap_fallback or verdict.candidates
            or verdict.workload_findings or iterations is None or len(iterations) == 0):
        return verdict
    cands = _comm_gap_candidates(iterations, topology, verdict.irregular_iterations, cfg,
                                 fabric)
    if not cands:
        return verdict
    stats = {**verdict.stats, "comm_gap_candidates": float(len(cands))}
    return replace(verdict, candidates=tuple(cands[: cfg.top_k]), stats=stats)


def _with_stage_compute(verdict: Verdict, iterations: pd.DataFrame, topology: Topology,
                        cfg: LocalizeConfig, usual_us: float) -> Verdict:
    """``verdict`` with :func:`_stage_compute_finding` added to its workload findings (after
    any found from the waits, unless one of those already names the same stage). It never
    changes the suspects: a heavier stage and a faulty device can slow one job together."""
    found = _stage_compute_finding(iterations, topology, cfg, usual_us)
    if found is None or any(w.kind == found.kind and w.coords == found.coords
                            for w in verdict.workload_findings):
        return verdict
    return replace(verdict, workload_findings=(*verdict.workload_findings, found))


def step_compute(iterations: pd.DataFrame) -> tuple[pd.DataFrame, str] | None:
    """Each rank's compute time per step: ``(iteration, rank, compute_us)`` and its basis.

    ``"compute"`` where the logs carry it (``compute_us`` of the iteration summaries, e.g. the
    ByteDance what-if traces). Otherwise ``"gaps"``: the time the rank spent outside
    communication from the start of its first operator of a step to that of the next step
    minus the summed durations of its operators in between (a blocking logger's waits for
    partners are inside those durations, so what is left is its compute, plus host work
    such as data loading). Only steps followed by the next one on the same rank are measured;
    ``None`` when neither can be read."""
    if "compute_us" in iterations.columns and iterations["compute_us"].notna().any():
        return iterations[["iteration", "rank", "compute_us"]].dropna(), "compute"
    if not {"start_ns", "comm_us"} <= set(iterations.columns):
        return None
    it = iterations[["iteration", "rank", "start_ns", "comm_us"]].sort_values(
        ["rank", "iteration"])
    by = it.groupby("rank", sort=False)
    follows = (by["iteration"].shift(-1) == it["iteration"] + 1).to_numpy()
    cycle_us = (by["start_ns"].shift(-1) - it["start_ns"]).to_numpy(dtype=np.float64) / 1e3
    compute = np.where(follows, cycle_us - it["comm_us"].to_numpy(dtype=np.float64), np.nan)
    return it[["iteration", "rank"]].assign(compute_us=compute).dropna(), "gaps"


def _pipeline_places(topology: Topology) -> pd.DataFrame | None:
    """Per rank (index): its pipeline stage ``pp``, data-parallel replica ``dp`` and ``host``.

    From the topology's coordinates when it has them; else read off the communicators, as
    for logs that carry no coordinates (the CommOps logger's): the send/recv pair groups
    (kind ``pp``) chain each pipeline's ranks, and a rank's stage is its place along its chain,
    counted from the end that holds the chain's lowest rank; its replica is its place in its
    data-parallel group (kind ``dp``), or its chain where there is none. ``None`` when neither
    gives stages: no pair groups, or pairs that do not form chains of one length."""
    r = topology.ranks
    if {"pp", "dp"} <= set(r.columns) and (r["pp"] >= 0).any() and (r["dp"] >= 0).any():
        return r.set_index("rank")[["pp", "dp", "host"]]
    chain = nx.Graph()
    for g in topology.groups.values():
        if g.kind == "pp" and len(set(g.ranks)) == 2:
            chain.add_edge(*sorted(set(g.ranks)))
    place: dict[int, tuple[int, int]] = {}
    lengths = set()
    for i, comp in enumerate(sorted(nx.connected_components(chain), key=min)):
        sub = chain.subgraph(comp)
        ends = [n for n, d in sub.degree() if d == 1]
        if len(ends) != 2 or sub.number_of_edges() != len(comp) - 1:
            return None  # a ring or a tree: not a pipeline
        path = nx.shortest_path(sub, min(ends), max(ends))
        lengths.add(len(path))
        place.update({int(rank): (stage, i) for stage, rank in enumerate(path)})
    if len(lengths) != 1:
        return None
    replica = {int(rank): pos for g in topology.groups.values() if g.kind == "dp"
               for pos, rank in enumerate(g.ranks)}
    out = r.set_index("rank")[["host"]].copy()
    out["pp"] = [place.get(int(x), (-1, -1))[0] for x in out.index]
    out["dp"] = [replica.get(int(x), place.get(int(x), (-1, -1))[1]) for x in out.index]
    return out


def _others_median_floor(c: pd.DataFrame) -> pd.Series:
    """Per iteration, a value no stage's "other stages" median falls below: with ``n`` ranks
    in the iteration and at most ``k`` in one stage, the ``(n - k - 1) // 2``-th smallest of
    them all (leaving values out only raises the j-th smallest of the rest). One sort of the
    rows instead of a median per stage: a stage whose lightest rank is not ``delta`` times
    that is not heavier, and most are not."""
    it = c["iteration"].to_numpy(dtype=np.int64)
    val = c["compute_us"].to_numpy(dtype=np.float64)
    uniq, code = np.unique(it, return_inverse=True)
    order = np.lexsort((val, code))
    n = np.bincount(code, minlength=len(uniq))
    first = np.concatenate([[0], np.cumsum(n)[:-1]])
    k = c.groupby(["iteration", "pp"]).size().groupby(level=0).max().reindex(uniq).to_numpy()
    at = first + np.maximum((n - k - 1) // 2, 0)
    return pd.Series(val[order][at], index=uniq)


def _stage_compute_finding(iterations: pd.DataFrame | None, topology: Topology,
                           cfg: LocalizeConfig, usual_us: float) -> WorkloadFinding | None:
    """A pipeline stage that computes more than the others in every data-parallel replica.

    Read from each rank's compute time per step (:func:`step_compute`: logged, or the time
    outside communication between its operators), not from the operators: a stage heavier
    from the first step makes no operator abnormal against its own history, and the stages
    around it just wait a little at every microbatch. The stage is named when every one of
    its ranks, in at least ``cfg.workload_persistence`` of the iterations, computes at least
    ``cfg.delta`` times the median rank of the other stages, and its ranks sit in two or more
    data-parallel replicas: with one replica a slow GPU would look the same, and a slow GPU in
    one replica leaves the stage's other replicas at the usual time (the stage's smallest
    rank decides). Nor is it named when the other stages' ranks on the same hosts are that
    much slower as well: then the hosts are slow, not the stage (a host holding a whole
    stage and more of the job); and, read from the gaps, which also hold the host's own work
    (data loading, pauses), not when the whole stage sits alone on one host.
    """
    if iterations is None:
        return None
    place = _pipeline_places(topology)
    read = step_compute(iterations)
    if place is None or read is None:
        return None
    c, basis = read
    c = c[c["compute_us"] > 0]
    c = c.join(place, on="rank", how="inner")
    c = c[(c["pp"] >= 0) & (c["dp"] >= 0)]
    n_its = c["iteration"].nunique()
    if n_its < cfg.workload_min_iterations or c["pp"].nunique() < 2:
        return None

    def persistent(ratio: pd.Series) -> bool:
        ratio = ratio.dropna()
        return len(ratio) > 0 and (ratio >= cfg.delta).mean() >= cfg.workload_persistence

    best: tuple[float, int] | None = None
    bound = _others_median_floor(c)
    for stage, mine in c.groupby("pp"):
        if mine["dp"].nunique() < 2:
            continue
        least = mine.groupby("iteration")["compute_us"].min()
        if not persistent(least / bound.reindex(least.index)):
            continue  # not even against the floor of the others' median: the usual case
        rest = c[c["pp"] != stage]
        others = rest.groupby("iteration")["compute_us"].median()
        ratio = least / others.reindex(least.index)
        if not persistent(ratio):
            continue
        hosts = mine["host"].unique()
        mates = rest[rest["host"].isin(hosts)]
        if len(mates) == 0 and len(hosts) == 1 and basis == "gaps":
            continue  # a host of its own: its gaps hold the host's own pauses as well
        if len(mates) and persistent(
                mates.groupby("iteration")["compute_us"].median() / others):
            continue
        if best is None or ratio.median() > best[0]:
            best = (float(ratio.median()), int(stage))
    if best is None:
        return None
    stage = best[1]
    mine = c[c["pp"] == stage]
    per_rank = mine.groupby("rank")["compute_us"].median()
    heavy = float(per_rank.median())
    usual = float(c[c["pp"] != stage].groupby("rank")["compute_us"].median().median())
    extra = heavy - usual
    share = min(max(extra / usual_us, 0.0), 1.0) if usual_us > 0 else 0.0
    read_as = ("" if basis == "compute" else
               " (compute read as each rank's time outside communication between its operators)")
    return WorkloadFinding(
        "stage-imbalance", tuple(int(x) for x in per_rank.index), share,
        f"pipeline stage {stage} computes {heavy / usual:.2f}x as long per step as the other "
        f"stages ({duration(heavy)} against {duration(usual)}, median ranks: {duration(extra)} "
        f"more, {share:.0%} of a usual step), on every one of its {len(per_rank)} ranks in "
        f"{mine['dp'].nunique()} data-parallel replicas: a heavier stage, not a faulty "
        f"device{read_as}",
        {"pp": stage}, basis=basis,
    )


#: A host needs this many reporting ranks for its median communication time to stand for "the
#: others" (with two, either rank is the odd one out).
_COMM_GAP_MIN_RANKS = 3


def _comm_gap_candidates(iterations: pd.DataFrame, topology: Topology,
                         irregular: tuple[int, ...], cfg: LocalizeConfig,
                         fabric: Fabric | None = None) -> list[Candidate]:
    """The normal one is the straggler, read off the per-iteration summaries every node ships.

    Used when the operator records name no one. Each node's summary gives, per iteration and
    rank, the time the rank spent in communication (``comm_us``). Ranks that wait for a slow
    partner spend that wait communicating; the slow rank, arriving last, does not. So when, in
    the irregular iterations, one rank's communication time falls below the median of the other
    ranks on its host by at least ``min_step_share`` x ``(delta - 1)`` x the usual iteration
    time - more than it did in the regular iterations, and as the only rank of its host to do so
    - its host-mates waited that long for it. A rank singled out this way in at least half of the
    irregular iterations is a GPU candidate, scored by the waits it caused.

    With no irregular iteration (``irregular`` empty: a fault present from the first step slows
    every iteration alike) every iteration is analysed, and a rank's usual gap is what the
    ranks of the same role (the same GPU of their host and the same coordinates but ``dp``: the
    same program in another data-parallel replica) show on the other hosts in that iteration:
    their median, which one slow GPU among dozens of replicas does not move.

    This is what localizes a slow GPU when a node agent scores a host holding exactly one
    tensor-parallel group (tp8 on 8-GPU hosts): the partners' waits are then the only copies of
    those collectives the host has, there is no other group to compare them with, and the
    detector flags almost none of them; their communication time still rises by the wait.
    """
    irr = [int(i) for i in irregular]
    known = topology.ranks["rank"].to_numpy()
    it = iterations[iterations["rank"].isin(known)]
    if len(it) == 0:
        return []
    if fabric is None:
        fabric = Fabric(topology)
    rank = it["rank"].to_numpy(dtype=np.int64)
    frame = pd.DataFrame({"iteration": it["iteration"].to_numpy(dtype=np.int64), "rank": rank,
                          "host": fabric.hosts(rank),
                          "comm_us": it["comm_us"].to_numpy(dtype=np.float64)})
    by = frame.groupby(["iteration", "host"], sort=False)["comm_us"]
    frame = frame.assign(gap=by.transform("median") - frame["comm_us"],
                         n=by.transform("size"))
    frame = frame[frame["n"] >= _COMM_GAP_MIN_RANKS]
    if len(frame) == 0:
        return []
    # a rank's usual gap (its stage, its place in the ring) is not a wait it caused
    if irr:
        is_irr = frame["iteration"].isin(irr).to_numpy()
        usual = frame[~is_irr].groupby("rank")["gap"].median()
        frame = frame[is_irr]
        excess = frame["gap"].to_numpy() - usual.reindex(frame["rank"]).fillna(0.0).to_numpy()
        frame = frame.assign(excess=excess)
        analysed = len(irr)
        beyond = "beyond its usual gap"
    else:
        frame = _excess_over_replicas(frame, topology)
        analysed = int(frame["iteration"].nunique())
        beyond = "beyond what the same GPU of the other replicas shows"
    if len(frame) == 0:
        return []
    times = _iteration_times_us(iteration_spans_of(iterations))
    step_floor = cfg.min_step_share * (cfg.delta - 1.0) * _usual_iteration_us(times, tuple(irr))
    if step_floor <= 0:
        return []
    excess = frame["excess"].to_numpy()
    # not in an iteration where ranks on many hosts show such a gap: a cause they shared, as
    # for the records' stragglers
    alone = _singled_out(pd.Series(excess, index=pd.MultiIndex.from_frame(
        frame[["iteration", "rank"]])), step_floor, fabric, cfg.max_step_hosts,
        cfg.step_peer_share * step_floor)
    hits = frame[(excess >= step_floor) & alone]
    # the only rank of its host singled out in that iteration (two slow GPUs on one host, or a
    # host-wide pause, do not make one rank the origin)
    hits = hits[hits.groupby(["iteration", "host"])["rank"].transform("size") == 1]
    if len(hits) == 0:
        return []
    per_rank = hits.groupby("rank").agg(sum=("excess", "sum"), n_it=("iteration", "nunique"))
    per_rank = per_rank[per_rank["n_it"] >= max(1, int(np.ceil(0.5 * analysed)))]
    if len(per_rank) == 0:
        return []
    per_rank = per_rank.sort_values("sum", ascending=False)
    total = float(per_rank["sum"].sum())
    coords = _coords_table(topology)
    cands = []
    for r, row in per_rank.iterrows():
        r = int(r)
        host = fabric.host(r)
        rows = hits[hits["rank"] == r].sort_values("excess", ascending=False).head(5)
        evidence = tuple(
            Evidence(int(e.iteration), f"host:{host}", -1, "", "comm-gap",
                     f"rank {r} spent {duration(e.excess)} less communicating than the other "
                     f"ranks of {host} ({beyond}): they waited for it",
                     float(e.excess))
            for e in rows.itertuples()
        )
        # a step's communication time shows that the rank was late, not how: a slow GPU and
        # a pause of its process or host look alike (as one late arrival per step does)
        cands.append(Candidate(DeviceKind.GPU, fabric.gpu(r), (r,), (host,),
                               float(row["sum"]) / total, coords.get(r), evidence,
                               (f"host:{host}",)))
    return cands


#: Coordinates that, with the GPU's place on its host, give a rank's role: ranks of one role
#: run the same program in different data-parallel replicas.
_ROLE_COORDS = ("gpu", "pp", "tp", "cp", "ep")


def _excess_over_replicas(frame: pd.DataFrame, topology: Topology) -> pd.DataFrame:
    """``frame`` (iteration, rank, gap) with ``excess``: the gap minus the median gap of the
    ranks of the same role (:data:`_ROLE_COORDS`) in that iteration; roles held by fewer than
    :data:`_COMM_GAP_MIN_RANKS` reporting ranks have no reference and are dropped."""
    coords = [c for c in _ROLE_COORDS if c in topology.ranks.columns]
    if not coords:
        return frame.iloc[:0].assign(excess=np.zeros(0))
    role = pd.Series(pd.factorize(pd.MultiIndex.from_frame(topology.ranks[coords]))[0],
                     index=topology.ranks["rank"].to_numpy())
    frame = frame.assign(role=role.reindex(frame["rank"].to_numpy()).to_numpy())
    by = frame.groupby(["iteration", "role"], sort=False)["gap"]
    frame = frame.assign(excess=frame["gap"] - by.transform("median"),
                         peers=by.transform("size"))
    return frame[frame["peers"] >= _COMM_GAP_MIN_RANKS]


def _usual_iteration_us(times: pd.Series, irregular: tuple[int, ...]) -> float:
    """Median of the regular iterations' times (of all of them when none is regular): the
    usual step a delta-irregular one is measured against, not inflated by a persistent fault."""
    regular = times[~times.index.isin(list(irregular))]
    use = regular if len(regular) else times
    return float(use.median()) if len(use) else 0.0


def _with_score(c: Candidate, score: float) -> Candidate:
    return replace(c, score=float(score))


def _ops_per_iteration(iterations: pd.DataFrame, its: np.ndarray, ranks: pd.Index
                       ) -> pd.Series | None:
    """Per rank of ``ranks``, the median number of operators it took part in per iteration,
    over the iterations ``its`` (all of them if the summaries hold none of those); ``None``
    without an ``n_ops`` column."""
    if "n_ops" not in iterations.columns or len(iterations) == 0:
        return None
    rows = iterations[iterations["rank"].isin(ranks)]
    within = rows[rows["iteration"].isin(its)]
    return (within if len(within) else rows).groupby("rank")["n_ops"].median()


def _mark_ties(cands: list[Candidate]) -> list[Candidate]:
    """Fill ``tied_with``: network candidates with the same score (to 1e-9) are devices the
    evidence cannot separate; the verdict says so instead of implying an order. Kinds mix: a
    NIC and the leaf-spine link above it that carry exactly the same flows are as tied as two
    NICs (the order puts the NIC first, a prior, not evidence)."""
    out = []
    for c in cands:
        net = c.kind in _NETWORK
        ties = tuple(o.device for o in cands if net and o is not c and o.kind in _NETWORK
                     and abs(o.score - c.score) <= 1e-9 * max(abs(c.score), 1.0))
        out.append(replace(c, tied_with=ties) if ties else c)
    return out


def _collective_events(
    ab: pd.DataFrame, members: pd.DataFrame, size: pd.Series, cfg: LocalizeConfig,
    kind: pd.Series | None = None, iterations: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Straggler / communication events of collective instances. ``kind``: each
    communicator's kind (``tp``, ``dp``, ...), by name; ``iterations``: the per-rank iteration
    summaries, which say whose logs hold each iteration: a member absent from an instance is
    read as a normal copy, the late arrival, only where its log holds that iteration (a rank
    whose log lacks it, cut or not shipped yet, says nothing of when it arrived; where no
    absent member's log holds it, the unknown ones are read so, marked ``unlogged`` for
    :func:`_waited_where_logged`); a rank that logged nothing at all (its log lost, the topology
    placing it) still is, as the verdict's note says."""
    if len(ab) == 0:
        return pd.DataFrame()
    key = ["iteration", "group", "seq"]
    inst = ab.groupby(key, sort=False).agg(
        op=("op", "first"),
        present=("rank", "nunique"),
        excess=("excess_us", "median"),
        t=("start_ns", "min"),
    ).reset_index()
    inst["size"] = inst["group"].map(size).fillna(0).astype(np.int64)
    inst = inst[(inst["size"] >= 2) & (inst["excess"] >= cfg.min_wait_us)]
    full = inst[inst["present"] >= inst["size"]]
    partial = inst[(inst["present"] < inst["size"]) & (inst["present"] * 2 >= inst["size"])]
    same_stage = (full["group"].map(kind).isin(list(_SAME_STAGE_KINDS)) if kind is not None
                  else pd.Series(False, index=full.index))
    late = _late_in_full(ab, full[(full["size"] >= 3) | same_stage.to_numpy()], key, cfg)
    comm = full[~full.set_index(key).index.isin(late.set_index(key).index)]
    comm = comm.assign(rank=-1, rule="communication", weight=comm["excess"])
    # the late arrival's own copy was long too: after it came, the transfer itself was slow
    # (timed from its arrival: the transfer began when the last member came)
    xfer = late[late["own"] >= cfg.min_wait_us]
    xfer = xfer.assign(rank=-1, rule="communication", weight=xfer["own"], t=xfer["own_t"])
    if len(partial):
        # Absent members = normal copies = the late arrivals (vectorised anti-join).
        cand = partial.merge(members, on="group", how="inner")
        seen = ab[key + ["rank"]].drop_duplicates().assign(_seen=True)
        cand = cand.merge(seen, on=key + ["rank"], how="left")
        cand = cand[cand["_seen"].isna()].drop(columns="_seen")
        # An absent member whose log lacks the iteration is unknown, not normal: where the
        # instance has absent members whose logs hold it (normal copies), they are its late
        # arrivals; only where none has are the unknown ones read so (the others waited for
        # one of them: an agent that stopped on the slow host). (A rank that logged nothing at
        # all, placed by a topology, is read so as before.)
        unknown = _unlogged(cand["iteration"].to_numpy(), cand["rank"].to_numpy(), iterations,
                            cand["t"].to_numpy())
        known = pd.Series(~unknown, index=cand.index).groupby(
            [cand[k] for k in key]).transform("any").to_numpy()
        kept = ~(unknown & known)
        cand = cand[kept]
        n_absent = cand.groupby(key)["rank"].transform("size")
        strag = cand.assign(rule="straggler", weight=cand["excess"] / n_absent,
                            unlogged=unknown[kept])
    else:
        strag = pd.DataFrame()
    cols = key + ["op", "rank", "rule", "weight", "t", "unlogged"]
    # (``unlogged``: the late arrival is a member whose log lacks the iteration, read as late)
    parts = [p.assign(unlogged=p["unlogged"] if "unlogged" in p.columns else False)[cols]
             for p in (comm, strag, late, xfer) if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


#: Communicator kinds whose members sit in one pipeline stage and compute the same segment of
#: the model before they meet, so that even of two the later arrival is out of step.
_SAME_STAGE_KINDS = ("tp", "dp", "cp", "ep")


def _late_in_full(ab: pd.DataFrame, full: pd.DataFrame, key: list[str],
                  cfg: LocalizeConfig) -> pd.DataFrame:
    """Straggler events of the instances in ``full`` (every copy abnormal) that one member
    held up: it arrived after all the others by at least ``cfg.late_fraction`` of their
    median excess. The others' waits are its lateness, not a slow link: on a slow link the
    members arrive together and every copy is long. Its own copy was flagged too: it did not
    wait, so that copy is the transfer alone, and a long one is slow communication as well
    (a rank behind a capped NIC arrives late at its data-parallel all-reduce, because its
    other transfers crawled, and then crawls through this one): ``own`` is its duration, which
    the caller counts as a communication event of the instance from ``own_t``, its start.
    Instances of three members or more, or pairs of one pipeline stage
    (:data:`_SAME_STAGE_KINDS`, who do the same work before they meet: a two-rank
    data-parallel job): of two, one always arrives last, and a pair across stages is late by
    the job's shape (the embedding all-reduce between the first and the last pipeline stage,
    which the last reaches after the pipeline drained: ByteDance trace-AR) and would be read as
    a straggler whenever a slower step made both copies abnormal. The caller passes only the
    instances that qualify."""
    cols = key + ["op", "rank", "rule", "weight", "t", "own", "own_t"]
    if len(full) == 0 or cfg.late_fraction <= 0:
        return pd.DataFrame(columns=cols)
    r = ab[key + ["rank", "start_ns", "excess_us", "duration_us"]].merge(full[key], on=key)
    r = r.sort_values("start_ns", kind="stable")
    r["pos"] = r.groupby(key, sort=False).cumcount(ascending=False)  # 0: the last arrival
    last = r[r["pos"] == 0].set_index(key)
    second = r[r["pos"] == 1].set_index(key)["start_ns"].reindex(last.index)
    others = r[r["pos"] > 0].groupby(key)["excess_us"].median().reindex(last.index)
    lag_us = (last["start_ns"] - second) / 1e3
    held = (lag_us >= cfg.min_wait_us) & (lag_us >= cfg.late_fraction * others)
    if not held.any():
        return pd.DataFrame(columns=cols)
    out = full.set_index(key).loc[last.index[held.to_numpy()]].reset_index()
    return out.assign(rank=last["rank"][held].to_numpy(), rule="straggler",
                      weight=others[held].to_numpy(),
                      own=last["duration_us"][held].to_numpy(),
                      own_t=last["start_ns"][held].to_numpy())[cols]


#: Irregular iterations of the window a rank's log must hold, none of them showing it late,
#: before its lateness where its log lacks the iteration is no ground to name it
#: (:func:`_waited_where_logged`).
_KNOWN_IRREGULAR = 2


def _waited_where_logged(strag: pd.DataFrame, iterations: pd.DataFrame,
                         irregular: Sequence[int], window: np.ndarray) -> np.ndarray:
    """The ranks read as late where their logs lack the iteration (``unlogged`` events of
    ``strag``: their partners waited for no one else) that, in at least
    :data:`_KNOWN_IRREGULAR` irregular iterations of the ``window`` their logs do hold, have
    no lateness left (none, or explained by their own waits): seen in the episode waiting
    with the others, not holding them up, they are no more known to be late where their logs
    stop (cut short, or their agents behind), and are not named for it. Their events stay,
    as the context of the others' (who was late together in a step). A rank whose log stops
    before the episode, or that was late where it logged, is not among them (an agent that
    stopped on the slow host)."""
    none = np.empty(0, dtype=np.int64)
    if len(strag) == 0 or "unlogged" not in strag.columns or len(iterations) == 0:
        return none
    unknown = strag["unlogged"].fillna(False).to_numpy(dtype=bool)
    if not unknown.any():
        return none
    seen = np.intersect1d(np.asarray(list(irregular), dtype=np.int64),
                          np.asarray(window, dtype=np.int64))
    ranks = strag["rank"].to_numpy()
    held = iterations[iterations["iteration"].isin(seen)
                      & iterations["rank"].isin(np.unique(ranks[unknown]))]
    logged = held.groupby("rank")["iteration"].nunique()
    late = np.unique(ranks[~unknown & np.isin(strag["iteration"].to_numpy(), seen)])
    return logged.index[(logged.to_numpy() >= _KNOWN_IRREGULAR)
                        & ~logged.index.isin(late)].to_numpy(dtype=np.int64)


def _unlogged(iteration: np.ndarray, rank: np.ndarray, iterations: pd.DataFrame | None,
              t: np.ndarray | None = None) -> np.ndarray:
    """Per (iteration, rank) pair: whether that rank's log lacks that iteration although it
    logged others (the iteration summaries say whose logs hold which iterations), or, given
    ``t`` (when the pair's partners began the operation), stops in it before ``t``: a log cut
    short (or shipped) in mid-iteration holds none of the operations the rank met after its
    last one, whose copies would otherwise read as normal. (A logged copy ends after its
    partners began it.) A rank that logged nothing at all is not counted here (a topology may
    place it; the verdict's note names it)."""
    if iterations is None or len(iterations) == 0 or len(rank) == 0:
        return np.zeros(len(rank), dtype=bool)
    rows = iterations[iterations["iteration"].isin(np.unique(iteration))]
    held = pd.MultiIndex.from_arrays([rows["iteration"].to_numpy(np.int64),
                                      rows["rank"].to_numpy(np.int64)])
    pairs = pd.MultiIndex.from_arrays([np.asarray(iteration, np.int64),
                                       np.asarray(rank, np.int64)])
    logged_some = np.isin(rank, iterations["rank"].unique())
    out = ~pairs.isin(held)
    if t is not None and "end_ns" in rows.columns:
        end = pd.Series(rows["end_ns"].to_numpy(np.float64), index=held).groupby(
            level=[0, 1]).max().reindex(pairs).to_numpy()
        out |= np.asarray(t, dtype=np.float64) > end  # (NaN, not held: False)
    return logged_some & out


def _p2p_events(ab: pd.DataFrame, cfg: LocalizeConfig,
                iterations: pd.DataFrame | None = None) -> pd.DataFrame:
    """A long receive (send) whose matching send (receive) is normal blames the peer; not
    when the peer's log lacks that iteration (``iterations``: the per-rank summaries): its
    copy is unknown, not normal (the collectives it missed still point at its host, when
    none of their absent members logged the iteration)."""
    cols = ["iteration", "group", "seq", "op", "rank", "rule", "weight", "t", "peer"]
    if len(ab) == 0 or "peer" not in ab.columns:
        return pd.DataFrame(columns=cols)
    ab = ab[(ab["peer"] >= 0) & (ab["excess_us"] >= cfg.min_wait_us)]
    if len(ab) == 0:
        return pd.DataFrame(columns=cols)
    # Pair key: the same transfer seen from both ends has (src, dst) swapped.
    is_send = (ab["op"] == "send").to_numpy()
    src = np.where(is_send, ab["rank"], ab["peer"])
    dst = np.where(is_send, ab["peer"], ab["rank"])
    k = ab.assign(src=src, dst=dst)
    k = k.assign(nth=k.sort_values("start_ns").groupby(
        ["iteration", "group", "src", "dst", "op"]).cumcount())
    both = k.groupby(["iteration", "group", "src", "dst", "nth"])["op"].transform("nunique") > 1
    one = k[~both.to_numpy()]
    one = one[~_unlogged(one["iteration"].to_numpy(), one["peer"].to_numpy(), iterations,
                         one["start_ns"].to_numpy())]
    pair = k[both.to_numpy()]
    out = []
    if len(one):
        out.append(pd.DataFrame({
            "iteration": one["iteration"], "group": one["group"], "seq": one["seq"],
            "op": one["op"], "rank": one["peer"].astype(np.int64), "rule": "p2p-chain",
            "weight": one["excess_us"], "t": one["start_ns"], "peer": one["rank"],
        }))
    if len(pair):
        sends = pair[pair["op"] == "send"]
        out.append(pd.DataFrame({
            "iteration": sends["iteration"], "group": sends["group"], "seq": sends["seq"],
            "op": "send/recv", "rank": -1, "rule": "communication",
            "weight": sends["excess_us"], "t": sends["start_ns"],
            "peer": sends["peer"].astype(np.int64), "src": sends["rank"],
        }))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=cols)


def _backtrack(
    strag: pd.DataFrame, ab: pd.DataFrame, cfg: LocalizeConfig, lookback_ns: float,
    other_flows: bool = False,
) -> pd.DataFrame:
    """Drop straggler events whose lateness is explained by the rank's own earlier waiting.

    A rank that waited (abnormal copies) before arriving late was itself held up by someone
    else: the search moves on to whoever it waited for, and that origin already carries its
    own straggler evidence in the instances where it arrived last.

    ``other_flows``: count only the rank's waits outside the event's flow (for a send/recv
    event, the traffic between its two ranks in either direction): the earlier slow copies of
    a slow flow are that flow's symptom, not a wait upstream of it.
    """
    if len(strag) == 0:
        return strag
    # Waiting is looked up across iteration boundaries: a data-parallel sync at the end of one
    # step makes the rank late at the first collective of the next. Only the copies of the
    # ranks the events blame are read (each rank's waits are looked up on their own).
    ab = ab[ab["rank"].isin(strag["rank"].unique())]
    rows = pd.DataFrame({"rank": ab["rank"].to_numpy(dtype=np.int64),
                         "t": ab["start_ns"].to_numpy(dtype=np.int64),
                         "excess_us": ab["excess_us"].to_numpy(dtype=np.float64)})
    if other_flows:
        rows = rows.assign(flow=pd.array(_flow_of(ab), dtype="string"))
    rows = rows.sort_values("t")
    ev = strag.assign(rank=strag["rank"].astype(np.int64), t=strag["t"].astype(np.int64))
    if other_flows:
        ev = ev.assign(flow=pd.array(_flow_of(ev), dtype="string"))
    # The late rank's own waits count from ``lookback`` before its partners started waiting
    # (``t``) until it arrived (about ``t + weight``): a pipeline stage held up by its upstream
    # stage waits *while* its downstream partner already waits for it.
    ev = ev.assign(t0=ev["t"], t=ev["t"] + (ev["weight"] * 1e3).astype(np.int64))
    ev = ev.sort_values("t").reset_index(drop=True)
    back = ev.assign(t=ev["t0"] - np.int64(lookback_ns)).sort_values("t")

    def waited(by: list[str]) -> np.ndarray:
        right = rows.assign(cum=rows.groupby(by)["excess_us"].cumsum())[by + ["t", "cum"]]
        now = pd.merge_asof(ev, right, on="t", by=by, direction="backward",
                            allow_exact_matches=False)["cum"].fillna(0.0).to_numpy()
        then = pd.merge_asof(back, right, on="t", by=by, direction="backward")
        then_cum = pd.Series(then["cum"].fillna(0.0).to_numpy(), index=back.index).reindex(
            ev.index).to_numpy()
        return now - then_cum

    wait = waited(["rank"])
    if other_flows:
        wait = wait - waited(["rank", "flow"])
    # Compare with this event's own lateness: partners that see one late arrival of the rank
    # (its TP peer and its pipeline receiver) each report the same lateness, not a sum of them.
    keep = wait < cfg.follow_fraction * ev["weight"].to_numpy()
    out = ev[keep].drop(columns=[c for c in ("t", "flow") if c in ev.columns])
    return out.rename(columns={"t0": "t"}).reset_index(drop=True)


def _flow_of(rows: pd.DataFrame) -> np.ndarray:
    """Per row, its flow: the two ranks of a send/recv (``rank`` and ``peer``, either
    direction), else the group."""
    group = rows["group"].astype(str).to_numpy()
    if "peer" not in rows.columns:
        return group
    peer = rows["peer"].fillna(-1).to_numpy(dtype=np.int64)
    p2p = peer >= 0
    out = group.astype(object)
    if p2p.any():
        out[p2p] = _pair_key(rows["rank"].to_numpy(dtype=np.int64)[p2p], peer[p2p])
    return out


def _drop_echoes(
    strag: pd.DataFrame, iterations: pd.DataFrame, members: pd.DataFrame, cfg: LocalizeConfig
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Drop lateness that the late rank spent waiting for someone else in the same step.

    In a synchronous job a delay is waited for by everyone downstream of it: when one GPU of a
    pipeline replica is slow, every stage of that replica reaches the data-parallel collective
    late, and the next step's pipeline fill starts late on every replica; each of those ranks
    looks like a straggler to the partners that waited for it. What tells the origin from its
    echoes is the step's communication time: whoever waited for a late rank spent that time
    communicating, and so did the late rank if it had itself been waiting. An event blaming
    rank ``r`` is kept when ``r``'s communication time in that iteration is below the waiting
    side's by at least ``follow_fraction`` of the lateness ``r`` caused there (``lag_us``, in
    microseconds before any iteration weighting):

    * collective straggler in group ``G``: the waiting side is the median member of ``G`` (the
      members of one communicator play the same role, so their times are comparable), the
      other member of a pair;
    * p2p-chain (a long receive and a normal send, or the reverse): the waiting side is the
      peer whose copy was long (neighbouring pipeline stages communicate about as long in a
      healthy step).

    Ranks without a communication time (missing from the summaries) keep their events.

    Returns the kept events and the dropped p2p-chain events of long sends: their receiver was
    not late after all, see :func:`_slow_transfers`.
    """
    none = strag.iloc[:0]
    if len(strag) == 0 or len(iterations) == 0 or "comm_us" not in iterations.columns:
        return strag, none
    comm = iterations.set_index(["iteration", "rank"])["comm_us"]

    def lookup(it: pd.Series | np.ndarray, rank: pd.Series | np.ndarray) -> np.ndarray:
        idx = pd.MultiIndex.from_arrays([np.asarray(it), np.asarray(rank, dtype=np.int64)])
        return comm.reindex(idx).to_numpy(dtype=np.float64)

    waiting = np.full(len(strag), np.nan)
    coll = (strag["rule"] == "straggler").to_numpy()
    if coll.any():
        ev = strag[coll]
        keys = ev[["iteration", "group"]].drop_duplicates()
        mem = keys.merge(members, on="group", how="inner")
        mem = mem.assign(comm=lookup(mem["iteration"], mem["rank"]))
        by = mem.groupby(["iteration", "group"])["comm"]
        grp = pd.MultiIndex.from_arrays([ev["iteration"].to_numpy(), ev["group"].to_numpy()])
        waiting[coll] = by.median().reindex(grp).to_numpy()
        # of two members the median is their mean, half the late one's own time: the side
        # that waited is the other member
        pair = (by.size().reindex(grp) == 2).to_numpy()
        if pair.any():
            other = (by.sum().reindex(grp).to_numpy()
                     - lookup(ev["iteration"], ev["rank"]))
            waiting[np.flatnonzero(coll)[pair]] = other[pair]
    chain = (strag["rule"] == "p2p-chain").to_numpy()
    if chain.any() and "peer" in strag.columns:
        ev = strag[chain]
        waiting[chain] = lookup(ev["iteration"], ev["peer"].fillna(-1))
    other = strag["peer"].fillna(-1) if "peer" in strag.columns else pd.Series(-1, strag.index)
    side = np.where(chain, other.to_numpy(), -2)  # collectives: one waiting side per group
    lag = _lag_us(strag)
    caused = strag.assign(_lag=lag, _side=side).groupby(["iteration", "group", "rank", "_side"])[
        "_lag"].transform("sum").to_numpy()
    deficit = waiting - lookup(strag["iteration"], strag["rank"])
    echo = np.nan_to_num(deficit, nan=np.inf) < cfg.follow_fraction * caused
    sends = strag[echo & chain & (strag["op"] == "send").to_numpy()]
    return strag[~echo].reset_index(drop=True), sends.reset_index(drop=True)


def _slow_transfers(
    echo_sends: pd.DataFrame, ab: pd.DataFrame, cfg: LocalizeConfig, lookback_ns: float
) -> pd.DataFrame:
    """Communication events from long sends whose receiver was not late after all.

    The receiver of such a send communicated as long as the sender in that step
    (:func:`_drop_echoes`), for one of two reasons. It waited in its receive for the transfer
    itself (normal for a pipeline receive, so only the send was shipped): a send that long with
    nobody late is a slow transfer. Or it was held up upstream, waiting in abnormal copies of
    its other flows just before (a pipeline stage behind a slow stage): then the send waited
    for a delay passed down the pipeline, and the origin carries that evidence. The second
    kind is told by the test that backtracks stragglers (:func:`_backtrack`) and dropped.
    """
    if len(echo_sends) == 0:
        return echo_sends
    return _as_transfers(_backtrack(echo_sends, ab, cfg, lookback_ns, other_flows=True))


def _as_transfers(sends: pd.DataFrame) -> pd.DataFrame:
    """p2p-chain events of long sends (``rank`` the receiver, ``peer`` the sender) as
    communication events of their send/recv pair."""
    return sends.assign(op="send/recv", rule="communication", src=sends["peer"],
                        peer=sends["rank"], rank=-1)


def _rank_candidates(
    strag: pd.DataFrame,
    topology: Topology,
    fabric: Fabric,
    cfg: LocalizeConfig,
    n_its: int,
    floor: float,
    step_floor: float = 0.0,
    ops_per_it: Callable[[pd.Index], pd.Series | None] | None = None,
    pause_us: float = np.inf,
    excused: np.ndarray | None = None,
) -> tuple[list[Candidate], list[WorkloadFinding], float]:
    """GPU / host candidates from straggler evidence, unless the pattern says workload.

    ``step_floor``: a candidate must have held its partners back that long in at least one
    iteration. ``ops_per_it``: given ranks, their operators per iteration (see
    :attr:`LocalizeConfig.kind_min_ops`), asked for the few candidates only; unknown ranks are
    taken to meet their peers often. ``pause_us``: a rank with fewer operator instances than
    :attr:`LocalizeConfig.min_evidence` still counts when one of them kept its partners waiting
    at least this long (a usual step, :func:`_usual_step_us`: that step took twice as long or
    more, a pause no jitter makes; in a pure data-parallel job a one-off pause is one
    instance). ``excused``: ranks not to be named (:func:`_waited_where_logged`), whose
    lateness still counts as the others' context.
    """
    if len(strag) == 0:
        return [], [], 0.0
    strag = strag[strag["rank"].isin(topology.ranks["rank"].to_numpy())]
    if len(strag) == 0:
        return [], [], 0.0
    per_rank = strag.groupby("rank").agg(
        sum=("weight", "sum"), size=("weight", "size"), n_it=("iteration", "nunique")
    ).sort_values("sum", ascending=False)
    per_it = strag.groupby(["iteration", "rank"])["weight"].sum().reset_index()
    top_per_it = per_it.sort_values("weight", ascending=False).drop_duplicates("iteration")
    # Background: pipeline bubbles and compute jitter make every rank arrive last now and then.
    # What the median rank collects that way explains nothing; a straggler stands above it.
    all_ranks = topology.ranks["rank"].to_numpy()
    background = float(per_rank["sum"].reindex(all_ranks, fill_value=0.0).median())
    per_rank = per_rank.assign(sum=per_rank["sum"] - background).sort_values(
        "sum", ascending=False)
    total = float(per_rank["sum"].clip(lower=0.0).sum())
    if total < floor:
        return [], [], 0.0
    # Workload claims look only at iterations with a slowdown well above jitter (5x the
    # per-iteration floor): a fault active in a few steps must not read as a rotating late rank
    # because the noise of the quiet steps names other ranks.
    it_top = per_it.groupby("iteration")["weight"].max()
    logger.debug("per-iteration top straggler weight: %s", it_top.round().to_dict())
    significant = it_top.index[it_top >= 5 * floor / max(n_its, 1)]
    sig = strag[strag["iteration"].isin(significant)]
    workload: list[WorkloadFinding] = []
    if len(sig) and _persistent(per_it, n_its, cfg):
        sig_rank = sig.groupby("rank")["weight"].agg(["sum", "size"]).sort_values(
            "sum", ascending=False)
        sig_top = top_per_it[top_per_it["iteration"].isin(significant)]
        workload = _workload(sig_rank, sig_top, topology, cfg, len(significant),
                             float(sig_rank["sum"].sum()))
    if workload:
        return [], workload, 0.0
    cands = []
    coords = _coords_table(topology)
    # Candidates are built for the heaviest ranks only; the rest still count in ``total``.
    # A candidate must explain, in the iterations where it shows up, a visible share of the
    # iteration time (a one-iteration spike counts against one iteration, not the window).
    per_it_floor = floor / max(n_its, 1)
    lag = _lag_us(strag)
    longest = lag.groupby(strag["rank"]).max().reindex(per_rank.index)
    ok = ((per_rank["size"] >= cfg.min_evidence) | (longest >= pause_us)) & (
        per_rank["sum"] >= per_it_floor * per_rank["n_it"])
    if step_floor > 0:
        # the most it held the others back in one step (a slow GPU's lateness accumulates over
        # the microbatches of a step; a host pause comes at once), over the steps that single
        # out a few hosts, leaving out the ranks that something they shared let go at once
        peer_floor = cfg.step_peer_share * step_floor
        held = _fell_behind(strag, peer_floor)
        # ranks let go together still count toward the hosts late in their step
        single = _singled_out(held, step_floor, fabric, cfg.max_step_hosts, peer_floor)
        single &= ~_released_together(strag, held, fabric, cfg.together_fraction, peer_floor)
        worst = held[single].groupby(level="rank").max().reindex(per_rank.index,
                                                                  fill_value=0.0)
        ok &= worst >= step_floor
    if excused is not None and len(excused):
        ok &= ~per_rank.index.isin(excused)
    top_ranks = per_rank[ok].head(3 * cfg.top_k)
    # GPU vs host: a host stall is one long pause, i.e. the rank fell behind in an iteration
    # almost entirely at once; a slow GPU falls behind piece by piece. One pause is waited for
    # by every partner that meets the rank afterwards (its TP peers, the receiver of its next
    # send) without putting it further behind.
    conc = _pause_concentration(strag, top_ranks.index)
    best_ev = strag[strag["rank"].isin(top_ranks.index)].sort_values("weight", ascending=False)
    best_ev = best_ev.groupby("rank").head(5)
    # Where one late arrival per step cannot tell a GPU from a pause (kind_min_ops), several
    # late ranks of one host still can: a pause of the whole host holds them back together.
    # ``together`` holds the ranks that meet their peers too rarely, and whether they do
    per_op = ops_per_it(top_ranks.index) if ops_per_it is not None else None
    rare = top_ranks.index[:0] if per_op is None else top_ranks.index[
        per_op.reindex(top_ranks.index).fillna(np.inf).to_numpy() < cfg.kind_min_ops]
    together = _late_with_host_mates(per_it, rare, fabric)
    for rank, row in top_ranks.iterrows():
        rank = int(rank)
        ev = best_ev[best_ev["rank"] == rank]
        # (ordered by weight, which counts a wait more in a slower step; told in plain time)
        waited = _lag_us(ev)
        unlogged = (ev["unlogged"].fillna(False).to_numpy(dtype=bool) if "unlogged" in ev
                    else np.zeros(len(ev), dtype=bool))
        evidence = tuple(
            Evidence(
                int(e.iteration), str(e.group), int(e.seq), str(e.op), str(e.rule),
                f"rank {rank} logged none of iteration {int(e.iteration)} (its log lacks it); "
                f"the other copies waited {duration(w)}, read as its late arrival" if gone else
                f"rank {rank} arrived last; the other copies waited {duration(w)}", float(w),
            )
            for e, w, gone in zip(ev.itertuples(), waited, unlogged, strict=True)
        )
        host = fabric.host(rank)
        told_apart = rank not in together or together[rank]
        is_host = told_apart and conc.get(rank, 0.0) >= cfg.host_concentration
        device = f"host:{host}" if is_host else fabric.gpu(rank)
        cands.append(Candidate(
            DeviceKind.HOST if is_host else DeviceKind.GPU, device, (rank,),
            (host,), float(row["sum"]), coords.get(rank), evidence,
            () if told_apart else (f"host:{host}",),
        ))
    # The slowdown the ranks explain, for the candidates' shares: one delay that every rank of
    # a replica (or every first pipeline stage) passes on is waited for once per step, not once
    # per rank that relayed it, so each iteration counts its largest lateness only.
    explained = float(per_it.groupby("iteration")["weight"].max().sum())
    return cands, [], min(total, explained)


def _late_with_host_mates(per_it: pd.DataFrame, ranks: pd.Index, fabric: Fabric
                          ) -> dict[int, bool]:
    """Per rank of ``ranks``: in the iteration it was latest in (``per_it``: ``iteration,
    rank, weight``), was another rank of its host at least half as late?"""
    out = {}
    for rank in ranks:  # the few candidate ranks, not every rank
        mine = per_it[per_it["rank"] == rank]
        if len(mine) == 0:
            out[int(rank)] = False
            continue
        worst = mine.loc[mine["weight"].idxmax()]
        step = per_it[(per_it["iteration"] == worst["iteration"]) & (per_it["rank"] != rank)
                      & (per_it["weight"] >= 0.5 * worst["weight"])]
        host = fabric.host(int(rank))
        out[int(rank)] = any(fabric.host(int(r)) == host for r in step["rank"])
    return out


def _fell_behind(events: pd.DataFrame, floor: float = 0.0) -> pd.Series:
    """Per ``(iteration, rank)`` of straggler events, how far behind the rank fell in the step,
    in microseconds, as its partners saw it.

    A rank's partners wait for all the lateness it gathered since they last met it: in a
    collective they then leave together, so the next wait in that group is new lateness only.
    Partners it had not met in the step yet (its pipeline receiver, a data-parallel ring at the
    end) wait for everything it gathered so far. So one pause that its TP peers, then its
    pipeline receiver, then its gradient ring each wait for is one pause, while a slow GPU that
    falls behind a little at each TP all-reduce gathers the sum of those waits. Walking a
    rank's events of a step in time order, with ``met[p]`` how far behind it was when its
    partners ``p`` (a group; for send/recv the group and the waiting peer) last waited for it::

        behind = max(behind, met[p] + wait);  met[p] = behind

    and at most the union of the waits' intervals (:func:`_held_back`): the time anyone was
    waiting for it. Steps whose union stays below ``floor``, or that hold one event, keep the
    union: it is the answer there or it cannot reach the floor either way (the walk is Python,
    and most steps of a large job are such).

    Adding the waits of every group instead (each group's waits are one after the other, so a
    union of their intervals adds them up) counted a pause once per group that met the rank
    afterwards: a 17 ms pause of a healthy 8-rank gloo job, waited for by its TP peer and then
    its pipeline receiver, read as 32 ms against a 24 ms floor and named its host.
    """
    union = _held_back(events, "rank")
    its = events["iteration"].to_numpy(dtype=np.int64)
    ranks = events["rank"].to_numpy(dtype=np.int64)
    count = events.groupby(["iteration", "rank"]).size().reindex(union.index)
    walk = union.index[(union.to_numpy() >= floor) & (count.to_numpy() > 1)]
    if len(walk) == 0:
        return union
    sel = pd.MultiIndex.from_arrays([its, ranks]).isin(walk)
    behind, _ = _walk_behind(events, sel)
    walked = pd.Series(list(behind.values()), dtype=np.float64,
                       index=pd.MultiIndex.from_tuples(list(behind)))
    out = union.copy()
    # never more than the time someone was waiting for it (two waits of the same partners at
    # once, such as both halves of a fused send/recv with one peer, are one wait)
    out.loc[walked.index] = np.minimum(walked.to_numpy(), union.loc[walked.index].to_numpy())
    return out


def _walk_behind(events: pd.DataFrame, sel: np.ndarray
                 ) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], float]]:
    """The walk of :func:`_fell_behind` over the straggler events ``events[sel]``: per
    ``(iteration, rank)``, how far behind the rank fell, and the largest single step by which
    that grew (one jump: a pause; many small ones: a slow GPU). Python, so only for the few
    steps or ranks that need it."""
    its = events["iteration"].to_numpy(dtype=np.int64)[sel]
    ranks = events["rank"].to_numpy(dtype=np.int64)[sel]
    lag = _lag_us(events).to_numpy(dtype=np.float64)[sel]
    group = events["group"].astype(str).to_numpy(dtype=object)[sel]
    peer = (events["peer"].fillna(-1).to_numpy(dtype=np.int64)[sel] if "peer" in events.columns
            else np.full(len(its), -1, dtype=np.int64))
    order = np.lexsort((events["t"].to_numpy(dtype=np.float64)[sel], ranks, its))
    behind: dict[tuple[int, int], float] = {}
    jump: dict[tuple[int, int], float] = {}
    met: dict[tuple[str, int], float] = {}
    last = None
    for i in order.tolist():
        step = (int(its[i]), int(ranks[i]))
        if step != last:
            met, last = {}, step
        key = (group[i], int(peer[i]))
        was = behind.get(step, 0.0)
        now = max(was, met.get(key, 0.0) + float(lag[i]))
        behind[step] = met[key] = now
        jump[step] = max(jump.get(step, 0.0), now - was)
    return behind, jump


def _held_back(events: pd.DataFrame, by: str) -> pd.Series:
    """Per ``(iteration, by)``, how long the events of each ``by`` value kept someone waiting,
    in microseconds: the length of the union of their intervals ``[t, t + lag_us]``.

    For a network device: the slow transfers of the flows crossing it, where transfers of
    different rings at the same time count once. (Ranks: :func:`_fell_behind`.)
    """
    lag = _lag_us(events)
    start = events["t"].to_numpy(dtype=np.float64)
    iv = pd.DataFrame({"iteration": events["iteration"].to_numpy(),
                       by: events[by].to_numpy(), "start": start,
                       "end": start + lag.to_numpy(dtype=np.float64) * 1e3})
    iv = iv.sort_values(["iteration", by, "start"], kind="stable")
    keys = [iv["iteration"], iv[by]]
    # the furthest any earlier interval of the same step and key reached
    reach = iv.groupby(keys, sort=False)["end"].cummax().groupby(keys, sort=False).shift()
    begin = np.maximum(iv["start"].to_numpy(), reach.fillna(-np.inf).to_numpy())
    new = np.clip(iv["end"].to_numpy() - begin, 0.0, None) / 1e3
    return pd.Series(new, index=pd.MultiIndex.from_frame(iv[["iteration", by]])).groupby(
        level=["iteration", by]).sum()


def _released_together(strag: pd.DataFrame, held: pd.Series, fabric: Fabric, fraction: float,
                       peer_floor: float) -> np.ndarray:
    """Mask over ``held`` (per ``(iteration, rank)``, from :func:`_fell_behind`): True for the late
    ranks (``held >= peer_floor``) of a step that arrived at the same instant as a late rank on
    another host.

    Independent stragglers arrive when their own work is done, at instants that have nothing
    to do with each other. Ranks on different hosts whose longest lateness of the step ends at
    the same moment (within ``fraction`` of the shorter lateness) were let go together by one
    event: a collective or a wait the logs do not show (the stages of the healthy replicas
    idling until a slowed replica catches up). The cause is upstream of all of them, so none
    of them is the origin. A fault on one host (a host pause) releases its ranks together too;
    those stay. A rank let go together with others in at least half of the steps it was late
    in is masked in all of them.
    """
    out = np.zeros(len(held), dtype=bool)
    if fraction <= 0 or len(held) == 0 or len(strag) == 0:
        return out
    lag = _lag_us(strag)
    ev = pd.DataFrame({"iteration": strag["iteration"].to_numpy(),
                       "rank": strag["rank"].to_numpy(dtype=np.int64),
                       "lag": lag.to_numpy(dtype=np.float64)})
    ev["end"] = strag["t"].to_numpy(dtype=np.float64) / 1e3 + ev["lag"]  # microseconds
    is_late = held.to_numpy() >= peer_floor
    ev = ev.set_index(["iteration", "rank"])
    ev = ev[ev.index.isin(held.index[is_late])].reset_index()
    if len(ev) < 2:
        return out
    # each late rank's longest lateness in the step, ordered by when it ended
    big = ev.sort_values("lag").groupby(["iteration", "rank"]).tail(1)
    big = big.sort_values(["iteration", "end"]).reset_index(drop=True)
    same_it = big["iteration"].eq(big["iteration"].shift())
    gap = big["end"].diff()
    near = fraction * np.minimum(big["lag"], big["lag"].shift())
    cluster = (~(same_it & (gap <= near))).cumsum()
    hosts = pd.Series(fabric.hosts(big["rank"].to_numpy()), index=big.index)
    shared = hosts.groupby(cluster).transform("nunique").to_numpy() > 1
    together = held.index.isin(pd.MultiIndex.from_frame(big.loc[shared, ["iteration", "rank"]]))
    # A rank let go with others in most of the steps it was late in is waiting on that shared
    # cause throughout; the steps where the detector flagged its partners' waits alone (a
    # persistent wait looks normal in the partners' own history) do not single it out either.
    rank = held.index.get_level_values("rank")
    per_rank = pd.DataFrame({"rank": rank[is_late], "together": together[is_late]}).groupby(
        "rank")["together"].mean()
    habitual = per_rank.index[per_rank.to_numpy() >= 0.5]
    return together | rank.isin(habitual)


def _singled_out(held: pd.Series, step_floor: float, fabric: Fabric, max_hosts: int,
                 peer_floor: float | None = None) -> np.ndarray:
    """Mask over ``held`` (per ``(iteration, rank)``, from :func:`_fell_behind`): False in the
    steps where ranks on more than ``max_hosts`` hosts each held their partners back by
    ``peer_floor`` (default ``step_floor``) or more.

    One faulty device makes the ranks of one host late; when ranks on many hosts are each late
    enough to explain the whole slowdown of the same step, they were late together, from a
    cause they shared (a collective that ties a pipeline stage of every replica to its slowest
    member, jitter in a step that drift has already lengthened), and none of them is the origin.
    """
    if len(held) == 0:
        return np.zeros(0, dtype=bool)
    bar = step_floor if peer_floor is None else peer_floor
    late_rows = held[held.to_numpy() >= bar]
    late = pd.Series(fabric.hosts(late_rows.index.get_level_values("rank").to_numpy()),
                     index=late_rows.index)
    n_hosts = late.groupby(level="iteration").nunique()
    shared = n_hosts.index[n_hosts.to_numpy() > max_hosts]
    return ~held.index.get_level_values("iteration").isin(shared)


def _persistent(per_it: pd.DataFrame, n_its: int, cfg: LocalizeConfig) -> bool:
    """Is the lateness a property of the workload (present in most steps) rather than one
    episode? True when at least ``cfg.workload_persistence`` of the analysed iterations each
    carry a quarter or more of the mean lateness per iteration. A host pause or a fault spike
    puts nearly all of it into one or two steps, whatever the jitter of the others."""
    lateness = per_it.groupby("iteration")["weight"].sum()
    if len(lateness) == 0 or n_its == 0:
        return False
    heavy = int((lateness >= 0.25 * float(lateness.sum()) / n_its).sum())
    return heavy >= cfg.workload_persistence * n_its


def _pause_concentration(strag: pd.DataFrame, ranks: pd.Index) -> pd.Series:
    """Per rank of ``ranks``, how much of its lateness came at once rather than piece by piece:
    the smaller of two shares, each 1 for a single pause.

    A paused host makes the rank a full pause late at once: every partner that meets it later
    in the step waits about that long (its TP peer, its pipeline receiver, its data-parallel
    ring), nobody waits a little, and none of those waits puts it further behind. A slow GPU
    falls behind a little at every operator its peers share with it, or by a microbatch's
    extra compute at each pipeline send, and each of those waits adds to how far behind it is.
    Per ``(iteration, rank)``:

    * the *wait* share ``m / (m + small)``, with ``m`` the largest wait it caused and ``small``
      the sum of the waits below ``m / 2`` (iterations weighted by ``m``);
    * the *jump* share ``jump / behind``, with ``behind`` how far it fell
      (:func:`_fell_behind`'s walk) and ``jump`` the largest single step by which that grew
      (iterations weighted by ``behind``).

    Either alone is fooled by some slow GPUs. The waits a slow pipeline stage causes are as
    large as one another (one microbatch's extra compute each), so none is "small": a real
    8-rank gloo drill (tp2 pp4) named its slowed rank a host on the wait share alone (0.94;
    jump share 0.47). Where the pipeline's bubbles hide those waits, the data-parallel
    all-reduce at the end waits for the sum at once: one jump (a tp1 pp4 dp2 drill: jump
    share 0.78, wait share 0.57). A pause is one jump by both. In the quiet iterations one
    tiny wait trivially is "all of it"; they weigh little.
    """
    s = strag[strag["rank"].isin(ranks)]
    if len(s) == 0:
        return pd.Series(dtype=np.float64)
    m = s.groupby(["iteration", "rank"])["weight"].transform("max")
    small = s["weight"].where(s["weight"] < 0.5 * m, 0.0)
    per = pd.DataFrame({"iteration": s["iteration"], "rank": s["rank"], "m": m,
                        "small": small}).groupby(["iteration", "rank"]).agg(
        m=("m", "first"), small=("small", "sum"))
    by_rank = per.groupby(level="rank")
    waits = by_rank["m"].sum() / (by_rank["m"].sum() + by_rank["small"].sum())
    behind, jump = _walk_behind(s, np.ones(len(s), dtype=bool))
    steps = pd.MultiIndex.from_tuples(list(behind), names=["iteration", "rank"])
    walked = pd.DataFrame({"behind": list(behind.values()),
                           "jump": [jump[k] for k in behind]}, index=steps)
    sums = walked.groupby(level="rank").sum()
    jumps = sums["jump"] / sums["behind"].where(sums["behind"] > 0)
    return np.minimum(waits, jumps.reindex(waits.index).fillna(waits))


def _coords_table(topology: Topology) -> dict[int, dict[str, int]]:
    r = topology.ranks
    cols = [c for c in ("dp", "pp", "tp", "cp", "ep") if c in r.columns]
    out: dict[int, dict[str, int]] = {}
    if not cols:
        return out
    sub = r[["rank"] + cols].astype(np.int64)
    for rec in sub.to_dict("records"):
        c = {k: int(rec[k]) for k in cols if rec[k] >= 0}
        if c:
            out[int(rec["rank"])] = c
    return out


def _workload(
    per_rank: pd.DataFrame,
    top_per_it: pd.DataFrame,
    topology: Topology,
    cfg: LocalizeConfig,
    n_its: int,
    total: float,
) -> list[WorkloadFinding]:
    """Workload causes: the late rank rotates between steps, or a whole PP stage is late."""
    if n_its < cfg.workload_min_iterations or total <= 0:
        return []
    top = int(per_rank.index[0])
    top_share = float(per_rank["sum"].iloc[0]) / total
    consistency = float((top_per_it["rank"] == top).mean())
    ranks = tuple(int(r) for r in per_rank.index[per_rank["sum"] >= 0.05 * total])
    r = topology.ranks.set_index("rank")
    if "pp" in r.columns and len(ranks) > 2:
        stages = r["pp"].reindex(list(ranks))
        stage_w = per_rank["sum"].groupby(r["pp"].reindex(per_rank.index).to_numpy()).sum()
        best = stage_w.idxmax()
        if best >= 0 and stage_w.max() / total >= 0.8 and top_share < 0.5 and (stages == best).all():
            # a stage that fills one host: a pause of that host makes the same waits
            hosts = r.loc[r["pp"] == best, "host"].unique() if "host" in r.columns else []
            alone = len(hosts) == 1 and (r["host"] == hosts[0]).sum() == (r["pp"] == best).sum()
            return [WorkloadFinding(
                "stage-imbalance", ranks, float(stage_w.max() / total),
                f"pipeline stage {int(best)} is consistently the last to arrive on all of its "
                f"{len(ranks)} ranks: a heavier stage, not a faulty device" + (
                    f" - unless it is its host {hosts[0]}, which holds that stage and nothing "
                    "else: a slow or pausing host would look the same in these logs"
                    if alone else ""),
                {"pp": int(best)},
            )]
    if consistency < 0.5 and top_share < 0.5:
        late = tuple(int(x) for x in top_per_it["rank"].unique())
        return [WorkloadFinding(
            "rank-imbalance", late, 1.0 - top_share,
            f"the late rank changes between steps ({len(late)} different ranks over {n_its} "
            "iterations): data/sequence-length imbalance, not a faulty device",
        )]
    return []


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    if name not in df.columns:
        return pd.Series(-1, index=df.index, dtype=np.int64)
    return df[name].fillna(-1).astype(np.int64)


def _pair_key(a: np.ndarray | pd.Series, b: np.ndarray | pd.Series) -> np.ndarray:
    """``"lo~hi"`` per pair: both directions of a send/recv (and a two-member group) are one
    flow between the same two NICs."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    lo = pd.Series(np.minimum(a, b)).astype(str).to_numpy()
    hi = pd.Series(np.maximum(a, b)).astype(str).to_numpy()
    return np.asarray(lo + "~" + hi, dtype=object)


def _repeated_peak(per_iteration: dict[int, int]) -> int:
    """The most flows a device had slow at once in at least two iterations; 0 when that is
    fewer than two flows (one flow is slow alike on every device it crosses: it tells none of
    them apart) or when it had them in one iteration only."""
    counts = sorted(per_iteration.values(), reverse=True)
    peak = counts[1] if len(counts) > 1 else 0
    return peak if peak >= 2 else 0


def _slow_flow_detail(row: pd.Series) -> str:
    """What a slow flow's evidence says: how many of its instances were slow and over which
    iterations (its weight is their sum), and the slowest one (the evidence's instance)."""
    n, first, last = int(row["n"]), int(row["first"]), int(row["last"])
    its = f"iteration {first}" if first == last else f"iterations {first}-{last}"
    if n == 1:
        return f"every copy of {row['group']} was slow in {its}"
    return (f"every copy of {row['group']} was slow in {n} instances over {its} (summed; the "
            f"slowest, in iteration {int(row['it'])}, {duration(float(row['one']))})")


def _device_candidates(
    comm: pd.DataFrame,
    members: pd.DataFrame,
    fabric: Fabric,
    topology: Topology,
    cfg: LocalizeConfig,
    per_it_floor: float = 0.0,
    step_floor: float = 0.0,
    min_steps: int = 0,
) -> tuple[list[Candidate], float]:
    """Network devices shared by slow transfers and not by healthy flows, and the total excess
    of the slow flows.

    A *flow* is a collective communicator's ring (groups of three or more ranks) or the
    traffic between two ranks (a send/recv pair in either direction, or a two-member group).
    A slow device slows every flow that crosses it, so a device's score is the excess of the
    slow flows crossing it times the squared share of slow flows among all the flows of the job
    that cross it, counted in the iteration where it slowed most of them (at once: flows that
    jitter made slow in different iterations do not add up to a slow device). The second
    factor is what tells the NICs of one slow data-parallel ring apart (each of them is also
    crossed by its own pipeline send/recv, healthy except at the faulty NIC) and a leaf-spine
    link from its leaf and spine (crossed by flows routed to other spines, which stay
    healthy). Parsimony scales both the gate and that share: the slow flows a device crosses
    against the most any device crosses, or (whichever is larger) the flows it had slow as a
    whole (``min_evidence`` slow transfers in the step) at once in two steps or more, against
    the most any device had so.

    ``per_it_floor``: a device must explain this much per iteration it shows up in.
    ``step_floor``: in at least one iteration, the slow transfers of the flows crossing a device
    must add up to this (overlapping ones counted once).
    ``min_steps``: one of the flows crossing a device must have been slow in at least this many
    iterations (a faulty device slows the same flows step after step, jitter one here, another
    there).
    """
    if len(comm) == 0:
        return [], 0.0
    size = members.groupby("group", sort=False)["rank"].transform("size")
    # Every flow of the job: rings by group name, pairs by their two ends.
    ring_m = members[size > 2]
    pair_m = members[size == 2]
    flows: dict[str, tuple[int, ...]] = ring_m.groupby("group", sort=False)["rank"].apply(
        tuple).to_dict()
    if len(pair_m):
        ends = pair_m.groupby("group", sort=False)["rank"].agg(["min", "max"])
        for key, lo, hi in zip(_pair_key(ends["min"], ends["max"]), ends["min"], ends["max"],
                               strict=True):
            flows[str(key)] = (int(lo), int(hi))
    is_p2p = (comm["op"] == "send/recv").to_numpy()
    gsize = comm["group"].astype(str).map(members.groupby("group").size()).fillna(0).to_numpy()
    if "src" in comm.columns:
        src = _col(comm, "src").to_numpy()
        dst = _col(comm, "peer").to_numpy()
    else:
        src = dst = np.full(len(comm), -1)
    two = gsize == 2
    if two.any():
        # A two-member collective is one flow between its members.
        pairs = members[members["group"].isin(comm.loc[two, "group"].astype(str).unique())]
        ends = pairs.groupby("group")["rank"].agg(["min", "max"])
        g = comm["group"].astype(str)
        src = np.where(two, g.map(ends["min"]).fillna(-1).to_numpy(), src)
        dst = np.where(two, g.map(ends["max"]).fillna(-1).to_numpy(), dst)
    flow = np.where(is_p2p | two, _pair_key(src, dst), comm["group"].astype(str).to_numpy())
    for key, a, b in zip(flow[is_p2p | two], src[is_p2p | two], dst[is_p2p | two], strict=True):
        flows.setdefault(str(key), (int(a), int(b)))
    by_flow = comm.assign(flow=flow, lag=_lag_us(comm))
    # Per flow, the iterations where it was slow, and those where it was slow as a whole: at
    # least min_evidence of its transfers there (a faulty device slows every transfer of its
    # flows in a step, jitter one here and there).
    steps = by_flow.groupby(["flow", "iteration"]).size().reset_index(name="n")
    iters_of = steps.groupby("flow")["iteration"].unique()
    whole_iters = steps[steps["n"] >= cfg.min_evidence].groupby("flow")["iteration"].unique()
    per_flow = by_flow.groupby("flow").agg(
        w=("weight", "sum"), n=("weight", "size"), first=("iteration", "min"),
        last=("iteration", "max"), op=("op", "first"), group=("group", "first"),
        lag=("lag", "sum"))
    # the instance a flow's evidence points at: its slowest one (the first in the window may
    # come before the slowdown shows in the iteration time)
    heaviest = by_flow.loc[by_flow.groupby("flow")["lag"].idxmax()].set_index("flow")
    per_flow = per_flow.assign(it=heaviest["iteration"], seq=heaviest["seq"],
                               one=heaviest["lag"])
    net_total = float(per_flow["w"].sum())
    # A flow jitter stretched by a trifle is not a slow flow: it would be one more flow for a
    # device on its path to explain, and one healthy witness fewer (``min_flow_share``).
    light = per_flow["w"] < cfg.min_flow_share * float(per_flow["w"].max())
    if light.any():
        logger.debug("%d flows below %g of the heaviest slow flow's excess (%.0f), counted as "
                     "healthy; the heaviest of them: %s", int(light.sum()), cfg.min_flow_share,
                     float(per_flow["w"].max()),
                     per_flow.loc[light, "w"].nlargest(5).round().to_dict())
        per_flow = per_flow[~light]

    weight: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    slow: dict[str, int] = defaultdict(int)
    evid: dict[str, list[Evidence]] = defaultdict(list)
    slow_at: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))  # per iteration
    whole_at: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    crossing: list[tuple[str, str]] = []  # (slow flow, device it crosses)
    repeated: dict[str, int] = defaultdict(int)  # the most steps one of its flows was slow in
    # Slow flows (few) x their devices: a loop over distinct flows, not over rows.
    for key, row in per_flow.iterrows():
        ring = tuple(r for r in flows.get(str(key), ()) if fabric.known(r))
        slow_its, whole_its = iters_of[key], whole_iters.get(key, ())
        for d in fabric.devices(ring):
            crossing.append((str(key), d))
            weight[d] += float(row["w"])
            count[d] += int(row["n"])
            slow[d] += 1
            repeated[d] = max(repeated[d], len(slow_its))
            for i in slow_its:
                slow_at[d][int(i)] += 1
            for i in whole_its:
                whole_at[d][int(i)] += 1
            evid[d].append(Evidence(
                int(row["it"]), str(row["group"]), int(row["seq"]), str(row["op"]),
                "communication", _slow_flow_detail(row), float(row["lag"]),
            ))
    # Parsimony: one faulty device explains every slow flow. A link crossed by the slow ring
    # alone explains less than the NIC that the ring *and* its pipeline pair cross.
    # Counted over the window, a noisy job lets a spine crossed by hundreds of flows collect
    # more "slow" flows (jitter slows a transfer here and there) than a faulty NIC ever
    # carries, and the NIC would fail the test. A fault slows its flows as a whole, together,
    # step after step: so a device also explains as many flows as it had slow as a whole at
    # once in two steps or more, against the most any device did so. Either count serves.
    most = max(slow.values(), default=1)
    together = {d: _repeated_peak(at) for d, at in whole_at.items()}
    most_together = max(together.values(), default=0)
    share = {d: max(slow[d] / most, together.get(d, 0) / most_together if most_together
                    else 0.0) for d in slow}
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("slow flows crossing each device over the window (the most: %d), with its "
                     "excess and the floor it must reach: %s", most,
                     {d: (slow[d], round(weight[d]), round(per_it_floor * len(slow_at[d])))
                      for d in sorted(slow, key=lambda d: -slow[d])[:8]})
        logger.debug("flows slow as a whole at once, per iteration, where two steps or more "
                     "had some (the most in two steps: %d): %s", most_together,
                     {d: dict(at) for d, at in whole_at.items() if together.get(d, 0) > 0})
    # One slow transfer is not a device: ask for several slow instances. Devices that miss the
    # floor even with no healthy witness are dropped before the witnesses are counted.
    suspects = {d for d, w in weight.items() if count[d] >= cfg.min_evidence
                and repeated[d] >= min_steps
                and w * share[d] >= per_it_floor * len(slow_at[d])}
    if not suspects:
        return [], net_total
    # The most each suspect held the job back in one step: the union of the slow transfers
    # of the flows crossing it (transfers of different rings at the same time count once).
    pairs = pd.DataFrame(crossing, columns=["flow", "device"])
    pairs = pairs[pairs["device"].isin(suspects)]
    timed = comm.assign(flow=flow.astype(str))[["flow", "iteration", "t"] + [
        c for c in ("lag_us", "weight") if c in comm.columns]].merge(pairs, on="flow")
    worst = _held_back(timed, "device").groupby(level="device").max()
    logger.debug("network suspects, most held back in one step (us; floor %.0f): %s",
                 step_floor, worst.round().to_dict())
    suspects = {d for d in suspects if worst.get(d, 0.0) >= step_floor}
    if not suspects:
        return [], net_total
    # Healthy witnesses: flows crossing a suspect device that never showed a slow transfer.
    healthy: dict[str, int] = defaultdict(int)
    slow_flows = set(per_flow.index.astype(str))
    known = set(int(r) for r in topology.ranks["rank"])
    for key, ring in flows.items():
        if key in slow_flows or not known.issuperset(ring):
            continue
        for d in fabric.devices(ring):
            if d in suspects:
                healthy[d] += 1
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("suspects' slow flows and healthy witnesses: %s",
                     {d: (sorted(f for f, dd in crossing if dd == d), healthy[d])
                      for d in suspects})
    out = []
    coords_of = _coords_table(topology)
    for d in sorted(suspects):
        w = weight[d]
        # the most flows it slowed in one iteration: a slow device slows the flows crossing
        # it together, jitter slows a few here and there (pooled over the window, a noisy job
        # would make every flow of a spine switch look slow)
        frac = max(slow_at[d].values()) / (slow[d] + healthy[d]) * np.sqrt(share[d])
        # Like a straggler, a device must explain a visible share of the iteration time in the
        # iterations where it shows up (a one-step spike counts against one step).
        if w * frac**2 < per_it_floor * len(slow_at[d]):
            continue
        ranks = tuple(topology.ranks_on(d)) if not d.startswith("switch:spine") else ()
        hosts = tuple(sorted({fabric.host(r) for r in ranks}))
        kind = DeviceKind.of(d)
        coords = coords_of.get(ranks[0]) if len(ranks) == 1 else None
        out.append(Candidate(kind, d, ranks, hosts, w * frac**2, coords,
                             tuple(sorted(evid[d], key=lambda e: -e.weight)[:5])))
    return out, net_total
