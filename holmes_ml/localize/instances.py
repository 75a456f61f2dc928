"""Operator instances: the CommOps rows of one collective (or one send/recv pair) folded together.

Localization reasons about *instances*, not rows: every participant's copy of collective
``(iteration, group, seq)`` is one instance, and the k-th send from ``a`` to ``b`` in a group with
the k-th matching receive is another. Folding keeps the graph small at any scale (one node per
instance instead of one per rank per op) while keeping what the rules need: who arrived last, how
long the others waited for it, and how long the transfer itself took once everybody was there.

:class:`Fabric` resolves the network devices an instance crosses. It follows
:meth:`holmes_ml.topology.Topology.path` exactly (a test checks it) but precomputes the per-rank
lookups, because the topology's pandas row access is far too slow for thousands of rings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from holmes_ml.io.schema import P2P_OPS
from holmes_ml.topology import Topology, kind_from_group_name, route


class Fabric:
    """Fast, cached network-device resolution over a :class:`Topology`."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        r = topology.ranks
        self._host = dict(zip(r["rank"].astype(int), r["host"].astype(str), strict=True))
        self._gpu = dict(zip(r["rank"].astype(int), r["gpu"].astype(int), strict=True))
        self._pod = dict(zip(r["rank"].astype(int), r["pod"].astype(int), strict=True))
        self._ring: dict[tuple[int, ...], frozenset[str]] = {}

    def known(self, rank: int) -> bool:
        return int(rank) in self._host

    def host(self, rank: int) -> str:
        return self._host[int(rank)]

    def hosts(self, ranks: np.ndarray) -> np.ndarray:
        """:meth:`host` of each of ``ranks`` (one vectorized lookup; KeyError on an unknown
        rank, like :meth:`host`)."""
        out = pd.Series(np.asarray(ranks, dtype=np.int64)).map(self._host)
        if out.isna().any():
            raise KeyError(int(np.asarray(ranks)[out.isna().to_numpy()][0]))
        return out.to_numpy(dtype=object)

    def gpu(self, rank: int) -> str:
        return f"gpu:{self._host[int(rank)]}/{self._gpu[int(rank)]}"

    def nic(self, rank: int) -> str:
        return f"nic:{self._host[int(rank)]}/{self._gpu[int(rank)]}"

    def leaf(self, rank: int) -> str:
        return f"switch:leaf-p{self._pod[int(rank)]}-r{self._gpu[int(rank)]}"

    def path(self, a: int, b: int) -> tuple[str, ...]:
        """Same devices, same order as :meth:`Topology.path` (shares :func:`route`), with
        array lookups instead of table rows."""
        return route(a, b, (self._host[a], self.nic(a), self.leaf(a)),
                     (self._host[b], self.nic(b), self.leaf(b)), self.topology.spines)

    def devices(self, members: Sequence[int]) -> frozenset[str]:
        """Network devices a ring over ``members`` crosses (cached per member tuple)."""
        key = tuple(int(m) for m in members)
        hit = self._ring.get(key)
        if hit is not None:
            return hit
        members = [m for m in key if m in self._host]
        out: set[str] = set()
        if len(members) == 2:
            out.update(self.path(members[0], members[1]))
        elif len(members) > 2:
            for i, a in enumerate(members):
                out.update(self.path(a, members[(i + 1) % len(members)]))
        result = frozenset(out)
        self._ring[key] = result
        return result


@dataclass(frozen=True)
class Instances:
    """Rows and instances of the analysed window as aligned numpy arrays.

    Row arrays (``row_*``) follow the order of the ``rows`` table; instance arrays (``inst_*``)
    are indexed by instance id. Times are microseconds since the window's first arrival.
    """

    rows: pd.DataFrame
    row_inst: np.ndarray
    row_start: np.ndarray
    row_dur: np.ndarray
    row_score: np.ndarray
    row_prev: np.ndarray  # previous row of the same rank in the same iteration, -1 if none
    row_wait: np.ndarray  # how long this copy waited for the last participant
    inst_iteration: np.ndarray
    inst_group: np.ndarray
    inst_seq: np.ndarray
    inst_op: np.ndarray
    inst_kind: np.ndarray
    inst_p2p: np.ndarray
    inst_size: np.ndarray
    inst_last: np.ndarray  # row of the last arrival
    inst_spread: np.ndarray  # last arrival minus the one before it
    inst_transfer: np.ndarray  # the last arrival's own duration
    inst_typical: np.ndarray  # typical transfer of the instance's class
    inst_excess: np.ndarray  # transfer - typical
    inst_max_score: np.ndarray
    inst_ring: np.ndarray  # code into ``rings``
    rings: list[tuple[int, ...]]

    @property
    def n(self) -> int:
        return len(self.inst_iteration)


def _segments_last(keys: np.ndarray) -> np.ndarray:
    """Positions where a sorted key array ends a run."""
    if len(keys) == 0:
        return np.empty(0, dtype=np.int64)
    return np.flatnonzero(np.r_[keys[1:] != keys[:-1], True])


def build_instances(
    ops: pd.DataFrame,
    scores: np.ndarray | None,
    topology: Topology,
    context: pd.DataFrame | None = None,
) -> Instances:
    """Fold the rows of ``ops`` into operator instances.

    Parameters
    ----------
    ops:
        Canonical CommOps rows of the iterations to analyse.
    scores:
        Detector score per row of ``ops`` (``None``: all zero, the physics gate decides).
    topology:
        Group membership (``topology.groups``) completes instances whose participants were not
        all logged.
    context:
        Rows of regular iterations; their instances set the typical transfer time per class
        (``group_kind, op, nbytes``). Without context the analysed instances set it.
    """
    rows = ops.reset_index(drop=True)
    n = len(rows)
    sc = np.zeros(n) if scores is None else np.asarray(scores, dtype=np.float64)
    if len(sc) != n:
        raise ValueError(f"scores: got {len(sc)} values; expected one per operator row ({n})")
    keys = _instance_keys(rows)
    inst = keys.to_numpy()
    t0 = int(rows["start_ns"].min()) if n else 0
    start = (rows["start_ns"].to_numpy(dtype=np.int64) - t0) / 1e3
    dur = rows["duration_us"].to_numpy(dtype=np.float64)

    order = np.lexsort((start, inst))
    ends = _segments_last(inst[order])
    n_inst = int(inst.max()) + 1 if n else 0
    last = order[ends]
    size = np.diff(np.r_[-1, ends])
    second = np.where(size > 1, order[np.maximum(ends - 1, 0)], last)
    inst_ids = inst[last]
    last_by = np.empty(n_inst, dtype=np.int64)
    last_by[inst_ids] = last
    spread = np.zeros(n_inst)
    spread[inst_ids] = start[last] - start[second]
    amax = np.zeros(n_inst)
    amax[inst_ids] = start[last]
    row_wait = amax[inst] - start
    max_score = np.zeros(n_inst)
    np.maximum.at(max_score, inst, sc)
    transfer = dur[last_by]

    it = rows["iteration"].to_numpy(dtype=np.int64)
    rank = rows["rank"].to_numpy(dtype=np.int64)
    porder = np.lexsort((start, rank, it))
    prev = np.full(n, -1, dtype=np.int64)
    same = (it[porder][1:] == it[porder][:-1]) & (rank[porder][1:] == rank[porder][:-1])
    prev[porder[1:][same]] = porder[:-1][same]

    first = rows.iloc[last_by]
    op = first["op"].to_numpy().astype(str)
    group = first["group"].to_numpy().astype(str)
    if "group_kind" in rows.columns:
        gk = first["group_kind"].astype(str).to_numpy()
        gk = np.where(gk == "", [kind_from_group_name(g) for g in group], gk)
    else:
        gk = np.array([kind_from_group_name(g) for g in group], dtype=object)
    p2p = np.isin(op, list(P2P_OPS))
    ring, rings = _members(rows, inst, last_by, p2p, group, topology)

    cls = pd.Series(gk.astype(str)) + "|" + np.where(p2p, "p2p", op) + "|" + first[
        "nbytes"
    ].astype(str).to_numpy()
    typical = _typical(cls, transfer, context, topology)
    return Instances(
        rows=rows,
        row_inst=inst,
        row_start=start,
        row_dur=dur,
        row_score=sc,
        row_prev=prev,
        row_wait=row_wait,
        inst_iteration=it[last_by],
        inst_group=group,
        inst_seq=first["seq"].to_numpy(dtype=np.int64),
        inst_op=op,
        inst_kind=gk.astype(str),
        inst_p2p=p2p,
        inst_size=np.bincount(inst, minlength=n_inst),
        inst_last=last_by,
        inst_spread=spread,
        inst_transfer=transfer,
        inst_typical=typical,
        inst_excess=transfer - typical,
        inst_max_score=max_score,
        inst_ring=ring,
        rings=rings,
    )


def _instance_keys(rows: pd.DataFrame) -> pd.Series:
    """Instance id per row: ``(iteration, group, seq)`` for collectives; for P2P the k-th
    transfer from ``src`` to ``dst`` in a group, so a send meets its receive whatever the
    logger's sequence numbering."""
    is_p2p = rows["op"].isin(list(P2P_OPS)).to_numpy()
    peer = rows["peer"].to_numpy(dtype=np.int64) if "peer" in rows.columns else np.full(len(rows), -1)
    rank = rows["rank"].to_numpy(dtype=np.int64)
    pair = is_p2p & (peer >= 0)
    is_send = (rows["op"] == "send").to_numpy()
    src = np.where(is_send, rank, peer)
    dst = np.where(is_send, peer, rank)
    key = pd.DataFrame(
        {
            "iteration": rows["iteration"].to_numpy(),
            "group": rows["group"].to_numpy(),
            "a": np.where(pair, src, -1),
            "b": np.where(pair, dst, -1),
            "seq": rows["seq"].to_numpy(),
        }
    )
    if pair.any():
        sub = key.loc[pair].assign(rank=rank[pair], start=rows["start_ns"].to_numpy()[pair])
        sub = sub.sort_values(["seq", "start"], kind="stable")
        k = sub.groupby(["iteration", "group", "a", "b", "rank"], sort=False).cumcount()
        key.loc[k.index, "seq"] = k.to_numpy()
    return key.groupby(["iteration", "group", "a", "b", "seq"], sort=False).ngroup()


def _members(
    rows: pd.DataFrame,
    inst: np.ndarray,
    last_by: np.ndarray,
    p2p: np.ndarray,
    group: np.ndarray,
    topology: Topology,
) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """Ring of each instance as a code into a list of member tuples.

    Collectives: the communicator's ranks from the topology when known, else the ranks seen
    logging the group. P2P: the two ends. Rings are shared by many instances, so devices are
    resolved once per ring rather than once per instance.
    """
    rank = rows["rank"].to_numpy(dtype=np.int64)[last_by]
    peer = (
        rows["peer"].to_numpy(dtype=np.int64)[last_by]
        if "peer" in rows.columns
        else np.full(len(last_by), -1)
    )
    lo = np.minimum(rank, np.where(peer >= 0, peer, rank))
    hi = np.maximum(rank, peer)
    ring_name = np.where(p2p, pd.Series(lo).astype(str).to_numpy() + "~" + pd.Series(hi).astype(
        str).to_numpy(), group)
    codes, names = pd.factorize(pd.Series(ring_name), sort=False)
    unknown = [g for g in pd.unique(group[~p2p]) if g not in topology.groups]
    seen: dict[str, tuple[int, ...]] = {}
    if unknown:
        sub = rows.loc[rows["group"].isin(unknown), ["group", "rank"]]
        for g, rs in sub.groupby("group")["rank"]:
            seen[str(g)] = tuple(sorted(int(x) for x in rs.unique()))
    rings: list[tuple[int, ...]] = []
    for name in names:
        name = str(name)
        if name in topology.groups:
            rings.append(tuple(topology.groups[name].ranks))
        elif name in seen:
            rings.append(seen[name])
        else:
            a, _, b = name.partition("~")
            rings.append(tuple(sorted({int(a), int(b)})) if b else ())
    return codes.astype(np.int64), rings


def _typical(
    cls: pd.Series, transfer: np.ndarray, context: pd.DataFrame | None, topology: Topology
) -> np.ndarray:
    """Median transfer time of each instance's class, from context instances when given."""
    if context is not None and len(context):
        ctx = build_instances(context, None, topology, None)
        ccls = (
            pd.Series(ctx.inst_kind)
            + "|"
            + np.where(ctx.inst_p2p, "p2p", ctx.inst_op)
            + "|"
            + ctx.rows["nbytes"].to_numpy()[ctx.inst_last].astype(str)
        )
        ref = pd.Series(ctx.inst_transfer).groupby(ccls.to_numpy()).median()
    else:
        ref = pd.Series(transfer).groupby(cls.to_numpy()).median()
    own = pd.Series(transfer).groupby(cls.to_numpy()).median()
    typical = cls.map(ref).fillna(cls.map(own)).to_numpy(dtype=np.float64)
    return typical
