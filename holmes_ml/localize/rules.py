"""Graph rules over the sparse abnormal-operator records, and the cross-iteration ranking.

The operator-device graph is kept implicit and compressed by communicator: an operator *instance*
(collective ``(iteration, group, seq)`` or one send/recv pair) is an edge set between the
communicator's ranks, and its network devices come from the communicator's ring
(:class:`holmes_ml.localize.instances.Fabric`). Only abnormal copies are shipped by the nodes, so
the rules read the *absence* of a participant as a normal copy:

* **straggler** — some copies are abnormal, some members absent: the absent (normal) ones arrived
  last; the abnormal copies waited for them.
* **backtracking** — a straggler that itself waited (had abnormal copies) earlier in the same
  iteration is explained by that earlier wait; its evidence is dropped and the origin keeps the
  credit it earns in the instances where *it* was the late one.
* **p2p-chain** — a long receive whose send is normal blames the sender (and vice versa).
* **communication** — every member's copy abnormal: the transfer itself was slow; the network
  devices its ring crosses share the excess, discounted by how many healthy communicators cross
  them (so shared switches are not blamed for being on many paths).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict

import numpy as np
import pandas as pd

from holmes_ml.io.schema import P2P_OPS
from holmes_ml.localize.config import LocalizeConfig
from holmes_ml.localize.instances import Fabric
from holmes_ml.localize.types import Candidate, DeviceKind, Evidence, Verdict, WorkloadFinding
from holmes_ml.topology import Topology

logger = logging.getLogger(__name__)

#: More specific device kinds win ties (a NIC explains what its leaf switch would).
_SPECIFICITY = {"nic": 4, "link": 3, "switch": 2, "host": 1, "gpu": 1}


def parse_members(group_ranks: pd.Series) -> pd.DataFrame:
    """Long table ``group, rank`` from a ``group -> "0 1 2"`` series (vectorised)."""
    s = group_ranks.astype(str).str.split()
    long = s.explode().dropna()
    long = long[long.str.len() > 0]
    return pd.DataFrame(
        {"group": long.index.astype(str), "rank": long.to_numpy().astype(np.int64)}
    )


def _iteration_weights(iterations: pd.DataFrame) -> tuple[pd.Series, float]:
    """Per-iteration weight (1 + relative excess of the iteration time) and the median
    iteration time in microseconds."""
    if iterations is None or len(iterations) == 0:
        return pd.Series(dtype=float), 0.0
    span = iterations.groupby("iteration").agg(start=("start_ns", "min"), end=("end_ns", "max"))
    dur = (span["end"] - span["start"]).astype(np.float64) / 1e3
    med = float(dur.median()) if len(dur) else 0.0
    w = 1.0 + np.clip(dur / med - 1.0, 0.0, 4.0) if med > 0 else dur * 0 + 1.0
    return w, med


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
    if len(abnormal) == 0:
        return Verdict(irregular, tuple(irregular_iterations), (), (), stats)
    it_weight, med_iter_us = _iteration_weights(iterations)
    ab = abnormal.reset_index(drop=True)
    # Only the most recent `window` iterations with abnormal records are analysed.
    its = np.sort(ab["iteration"].unique())[-cfg.window :]
    ab = ab[ab["iteration"].isin(its)].reset_index(drop=True)
    n_its = len(its)
    stats["analysed_iterations"] = float(n_its)
    op = ab["op"].astype(str).to_numpy()
    p2p = np.isin(op, list(P2P_OPS))
    ab = ab.assign(
        op=op,
        group=ab["group"].astype(str).to_numpy(),
        excess_us=np.maximum(ab["excess_us"].to_numpy(dtype=np.float64), 0.0),
    )
    members = parse_members(groups.set_index(groups["group"].astype(str))["group_ranks"])
    size = members.groupby("group").size()

    events = [
        _collective_events(ab[~p2p], members, size, cfg),
        _p2p_events(ab[p2p], cfg),
    ]
    ev = pd.concat([e for e in events if len(e)], ignore_index=True) if any(
        len(e) for e in events
    ) else pd.DataFrame()
    fabric = Fabric(topology)
    rank_cands: list[Candidate] = []
    workload: list[WorkloadFinding] = []
    if len(ev):
        ev = ev.assign(weight=ev["weight"] * ev["iteration"].map(it_weight).fillna(1.0))
        strag = ev[ev["rule"] != "communication"]
        strag = _backtrack(strag, ab, cfg, 0.5 * med_iter_us * 1e3)
        stats["straggler_events"] = float(len(strag))
        floor = cfg.min_weight_fraction * med_iter_us * max(n_its, 1)
        rank_cands, workload, rank_total = _rank_candidates(
            strag, topology, fabric, cfg, n_its, floor)
        comm = ev[ev["rule"] == "communication"]
        stats["communication_events"] = float(len(comm))
        dev_cands = _device_candidates(comm, members, fabric, topology, cfg)
    else:
        dev_cands, rank_total = [], 0.0
    floor = cfg.min_weight_fraction * med_iter_us * max(n_its, 1)
    cands = rank_cands + [c for c in dev_cands if c.score >= floor]
    total = sum(c.score for c in cands if c.kind in (DeviceKind.NIC, DeviceKind.LINK,
                                                     DeviceKind.SWITCH))
    total += rank_total if any(c.kind in (DeviceKind.GPU, DeviceKind.HOST) for c in cands) else 0.0
    cands.sort(key=lambda c: (-c.score, -_SPECIFICITY[c.kind.value], c.device))
    # Two late ranks on one host both read as that host: the host is listed once.
    seen: set[str] = set()
    cands = [c for c in cands if not (c.device in seen or seen.add(c.device))]
    out = []
    # Devices with identical evidence (e.g. every NIC of one slow ring) are indistinguishable;
    # the share test applies to the tied set as a whole.
    ties = Counter(round(c.score, 6) for c in cands)
    for c in cands:
        share = c.score / total if total > 0 else 0.0
        if share * ties[round(c.score, 6)] < cfg.min_share:
            continue
        out.append(_with_score(c, share))
    out = out[: cfg.top_k]
    stats["median_iteration_us"] = med_iter_us
    return Verdict(irregular, tuple(irregular_iterations), tuple(out), tuple(workload), stats)


def _with_score(c: Candidate, score: float) -> Candidate:
    return Candidate(c.kind, c.device, c.ranks, c.hosts, float(score), c.coords, c.evidence)


def _collective_events(
    ab: pd.DataFrame, members: pd.DataFrame, size: pd.Series, cfg: LocalizeConfig
) -> pd.DataFrame:
    """Straggler / communication events of collective instances."""
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
    comm = full.assign(rank=-1, rule="communication", weight=full["excess"])
    if len(partial):
        # Absent members = normal copies = the late arrivals (vectorised anti-join).
        cand = partial.merge(members, on="group", how="inner")
        seen = ab[key + ["rank"]].drop_duplicates().assign(_seen=True)
        cand = cand.merge(seen, on=key + ["rank"], how="left")
        cand = cand[cand["_seen"].isna()].drop(columns="_seen")
        n_absent = cand.groupby(key)["rank"].transform("size")
        strag = cand.assign(rule="straggler", weight=cand["excess"] / n_absent)
    else:
        strag = pd.DataFrame()
    cols = key + ["op", "rank", "rule", "weight", "t"]
    parts = [p[cols] for p in (comm, strag) if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


def _p2p_events(ab: pd.DataFrame, cfg: LocalizeConfig) -> pd.DataFrame:
    """A long receive (send) whose matching send (receive) is normal blames the peer."""
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
    strag: pd.DataFrame, ab: pd.DataFrame, cfg: LocalizeConfig, lookback_ns: float
) -> pd.DataFrame:
    """Drop straggler events whose lateness is explained by the rank's own earlier waiting.

    A rank that waited (abnormal copies) before arriving late was itself held up by someone
    else: the search moves on to whoever it waited for, and that origin already carries its
    own straggler evidence in the instances where it arrived last.
    """
    if len(strag) == 0:
        return strag
    # Waiting is looked up across iteration boundaries: a data-parallel sync at the end of one
    # step makes the rank late at the first collective of the next.
    rows = ab[["rank", "start_ns", "excess_us"]].astype(
        {"rank": np.int64, "start_ns": np.int64}).sort_values("start_ns")
    rows = rows.assign(cum=rows.groupby("rank")["excess_us"].cumsum())
    right = rows.rename(columns={"start_ns": "t"})[["rank", "t", "cum"]]
    ev = strag.assign(rank=strag["rank"].astype(np.int64), t=strag["t"].astype(np.int64))
    ev = ev.sort_values("t").reset_index(drop=True)
    now = pd.merge_asof(ev, right, on="t", by="rank", direction="backward",
                        allow_exact_matches=False)["cum"].fillna(0.0).to_numpy()
    back = ev.assign(t=ev["t"] - np.int64(lookback_ns)).sort_values("t")
    then = pd.merge_asof(back, right, on="t", by="rank", direction="backward")
    then_cum = pd.Series(then["cum"].fillna(0.0).to_numpy(), index=back.index).reindex(
        ev.index).to_numpy()
    waited = now - then_cum
    merged = ev.assign(cum=waited)
    # Lateness blamed on the rank so far in the iteration.
    blamed = merged.groupby(["iteration", "rank"])["weight"].cumsum().to_numpy()
    keep = waited < cfg.follow_fraction * blamed
    return merged[keep].drop(columns="cum").reset_index(drop=True)


def _rank_candidates(
    strag: pd.DataFrame,
    topology: Topology,
    fabric: Fabric,
    cfg: LocalizeConfig,
    n_its: int,
    floor: float,
) -> tuple[list[Candidate], list[WorkloadFinding], float]:
    """GPU / host candidates from straggler evidence, unless the pattern says workload."""
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
    total = float(per_rank["sum"].sum())
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
    if len(sig):
        sig_rank = sig.groupby("rank")["weight"].agg(["sum", "size"]).sort_values(
            "sum", ascending=False)
        sig_top = top_per_it[top_per_it["iteration"].isin(significant)]
        workload = _workload(sig_rank, sig_top, topology, cfg, len(significant),
                             float(sig_rank["sum"].sum()))
    if workload:
        return [], workload, 0.0
    cands = []
    coords = _coords_table(topology)
    # GPU vs host: a host stall is one long pause, i.e. the rank's lateness in an iteration
    # comes almost entirely from a single event; a slow GPU spreads it over many operators.
    # One pause is seen by every partner waiting for the rank at once (its TP peers, the
    # receiver of its next send): events whose waits overlap in time are one pause.
    conc = _pause_concentration(strag)
    # Candidates are built for the heaviest ranks only; the rest still count in ``total``.
    # A candidate must explain, in the iterations where it shows up, a visible share of the
    # iteration time (a one-iteration spike counts against one iteration, not the window).
    per_it_floor = floor / max(n_its, 1)
    ok = (per_rank["size"] >= cfg.min_evidence) & (per_rank["sum"] >= per_it_floor * per_rank[
        "n_it"])
    top_ranks = per_rank[ok].head(3 * cfg.top_k)
    best_ev = strag[strag["rank"].isin(top_ranks.index)].sort_values("weight", ascending=False)
    best_ev = best_ev.groupby("rank").head(5)
    for rank, row in top_ranks.iterrows():
        rank = int(rank)
        ev = best_ev[best_ev["rank"] == rank]
        evidence = tuple(
            Evidence(
                int(e.iteration), str(e.group), int(e.seq), str(e.op), str(e.rule),
                f"rank {rank} arrived last; the other copies waited {e.weight:.0f} us",
                float(e.weight),
            )
            for e in ev.itertuples()
        )
        is_host = conc.get(rank, 0.0) >= cfg.host_concentration
        device = f"host:{fabric.host(rank)}" if is_host else fabric.gpu(rank)
        cands.append(Candidate(
            DeviceKind.HOST if is_host else DeviceKind.GPU, device, (rank,),
            (fabric.host(rank),), float(row["sum"]), coords.get(rank), evidence,
        ))
    return cands, [], total


def _pause_concentration(strag: pd.DataFrame) -> pd.Series:
    """Per rank, the median over iterations of (longest pause / total lateness), where straggler
    events of one rank whose waiting intervals ``[t, t + weight]`` overlap count once (the
    longest of them)."""
    s = strag[["iteration", "rank", "t", "weight"]].astype({"t": np.int64}).sort_values(
        ["iteration", "rank", "t"])
    s = s.assign(end=s["t"] + (s["weight"] * 1e3).astype(np.int64))
    by = [s["iteration"], s["rank"]]
    prev_end = s.groupby(by)["end"].cummax().groupby(by).shift()
    new = (prev_end.isna() | (s["t"] > prev_end)).to_numpy()
    s = s.assign(pause=np.cumsum(new))
    pause = s.groupby(["iteration", "rank", "pause"])["weight"].max()
    per = pause.groupby(level=["iteration", "rank"])
    return (per.max() / per.sum()).groupby(level="rank").median()


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
            return [WorkloadFinding(
                "stage-imbalance", ranks, float(stage_w.max() / total),
                f"pipeline stage {int(best)} is consistently the last to arrive on all of its "
                f"{len(ranks)} ranks: a heavier stage, not a faulty device",
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


def _device_candidates(
    comm: pd.DataFrame,
    members: pd.DataFrame,
    fabric: Fabric,
    topology: Topology,
    cfg: LocalizeConfig,
) -> list[Candidate]:
    """Network devices shared by slow transfers and not by healthy communicators."""
    if len(comm) == 0:
        return []
    ring_of = members.groupby("group", sort=False)["rank"].apply(tuple).to_dict()
    weight: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    slow_groups: dict[str, set[str]] = defaultdict(set)
    iters: dict[str, int] = defaultdict(int)
    evid: dict[str, list[Evidence]] = defaultdict(list)
    # Slow communicators (few) x their devices: a loop over distinct rings, not over rows.
    per_ring = comm.assign(ring=np.where(
        comm["op"] == "send/recv",
        _col(comm, "src").astype(str) + "~" + _col(comm, "peer").astype(str),
        comm["group"].astype(str),
    ))
    agg = per_ring.groupby("ring").agg(w=("weight", "sum"), n=("weight", "size"),
                                       it=("iteration", "first"), seq=("seq", "first"),
                                       n_it=("iteration", "nunique"),
                                       op=("op", "first"), group=("group", "first"))
    for ring, row in agg.iterrows():
        if "~" in str(ring):
            a, b = (int(x) for x in str(ring).split("~"))
            devs = fabric.devices((a, b)) if fabric.known(a) and fabric.known(b) else frozenset()
        else:
            devs = fabric.devices(ring_of.get(ring, ()))
        for d in devs:
            weight[d] += float(row["w"])
            count[d] += int(row["n"])
            iters[d] = max(iters[d], int(row["n_it"]))
            slow_groups[d].add(str(ring))
            evid[d].append(Evidence(
                int(row["it"]), str(row["group"]), int(row["seq"]), str(row["op"]),
                "communication", f"every copy of {row['group']} was slow ({row['n']} instances)",
                float(row["w"]),
            ))
    if not weight:
        return []
    # Healthy discount: communicators crossing the device that never showed a slow transfer.
    crossing: dict[str, int] = defaultdict(int)
    # Only collectives count as healthy witnesses: a send/recv through a slow NIC shows up as a
    # receiver's wait (straggler-shaped), not as a slow transfer, so it cannot clear a device.
    for ring in ring_of.values():
        if len(ring) <= 2:
            continue
        for d in fabric.devices(ring):
            if d in weight:
                crossing[d] += 1
    out = []
    coords_of = _coords_table(topology)
    for d, w in weight.items():
        # One slow transfer in one step is not a device: ask for evidence in several steps.
        if count[d] < cfg.min_evidence or iters[d] < 2:
            continue
        frac = len(slow_groups[d]) / max(crossing[d], len(slow_groups[d]))
        ranks = tuple(topology.ranks_on(d)) if not d.startswith("switch:spine") else ()
        hosts = tuple(sorted({fabric.host(r) for r in ranks}))
        kind = DeviceKind.of(d)
        coords = coords_of.get(ranks[0]) if len(ranks) == 1 else None
        out.append(Candidate(kind, d, ranks, hosts, w * frac**2, coords,
                             tuple(sorted(evid[d], key=lambda e: -e.weight)[:5])))
    return out
