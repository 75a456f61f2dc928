"""End-to-end localization: per-node summaries, then one verdict for the job.

``summarize`` runs next to the logs (one node or the whole job): it scores every operator, keeps
only the abnormal copies plus per-``(iteration, rank)`` timing and the communicator membership —
the small record that leaves the node. ``localize_summaries`` merges node summaries and applies
the graph rules (:mod:`holmes_ml.localize.rules`). ``analyze`` is both in one call.

Scoring uses :func:`holmes_ml.models.score_ops` (the bundled default model unless another is
given), united with the rule baseline when ``LocalizeConfig.with_rule`` (default: the shipped
detector under-calls the waits of a straggler's partners). Without a usable model it falls back,
with a warning, to the "3σ + rule without ML" baseline alone: an operator copy is abnormal when its
duration exceeds the median of its class (``op, group_kind, nbytes``; over the regular
iterations when a slowdown has become the class's norm) by more than ``max(min_wait_us, 3 σ,
rel_excess × median)`` (σ from the class's MAD) and than a share of the compute just before it
that grows with the job's own jitter (:func:`rule_scores`). The same median is the reference of each abnormal copy's ``excess_us``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd

from holmes_ml._stats import MAD_TO_SD
from holmes_ml._text import few
from holmes_ml.features import (
    IrregularityConfig,
    detect_irregular,
    iteration_table,
)
from holmes_ml.features import _segments as seg
from holmes_ml.features.iterations import irregular_flags, span_times
from holmes_ml.io.inventory import iteration_gaps
from holmes_ml.io.readers import ARCHIVE_SUFFIXES, warn_reused_keys
from holmes_ml.io.schema import (
    P2P_OPS,
    REQUIRED_COLUMNS,
    SchemaError,
    checked,
    member_ranks,
)
from holmes_ml.localize.config import LocalizeConfig
from holmes_ml.localize.rules import iteration_spans_of, localize_records
from holmes_ml.localize.types import INPUT_NOTES, Verdict
from holmes_ml.topology import (
    GPUS_PER_HOST,
    Group,
    Topology,
    assumed_host,
    kind_from_group_name,
    local_index,
)

logger = logging.getLogger(__name__)

_ABNORMAL_EXTRA = ("peer", "host", "score", "excess_us")


@dataclass(frozen=True)
class NodeSummary:
    """What a node agent ships upstream.

    Parameters
    ----------
    iterations:
        One row per ``(iteration, rank)``: ``start_ns, end_ns, comm_us, n_ops``, and
        ``compute_us`` when the logs carry each step's compute time.
    abnormal:
        Abnormal operator copies only: canonical columns plus ``peer, host, score, excess_us``.
    groups:
        ``group, group_kind, group_ranks`` of the communicators seen.
    ranks:
        ``rank, host`` plus any parallel coordinates (``dp, pp, tp, ...``) known on the node.
    """

    iterations: pd.DataFrame
    abnormal: pd.DataFrame
    groups: pd.DataFrame
    ranks: pd.DataFrame | None = None

    def nbytes(self) -> int:
        """Bytes of the summary as Parquet would hold it (approximate: in-memory size)."""
        frames = [self.iterations, self.abnormal, self.groups]
        if self.ranks is not None:
            frames.append(self.ranks)
        return int(sum(f.memory_usage(deep=True).sum() for f in frames))


# ------------------------------------------------------------------ scoring
def rule_scores(ops: pd.DataFrame, config: LocalizeConfig | None = None) -> np.ndarray:
    """The "3σ + rule without ML" score: 0.5 exactly at the abnormality bar, 1 at twice it.

    The reference of a copy is the median duration of its class (``op, group_kind, nbytes`` and
    position within the iteration) over all ranks and iterations - over the regular iterations
    alone when the window's median is more than ``reference_shift`` x theirs (a slowdown that
    lasted most of the window must not become the normal it is measured against); for
    send/recv, whose waits depend on the pipeline stage, the same class within the rank's stage
    (``pp`` column) when known, else the copy's own history (same rank, group, position). The
    bar is
    ``max(min_wait_us, 3 σ, rel_excess × reference, f × compute gap)`` where the gap is the time
    the rank spent outside communication just before the copy: waits caused by normal compute
    jitter scale with that gap, a fault's wait is a large fraction of it. ``f`` is
    ``gap_fraction``, or ``gap_sigmas`` times the job's own compute jitter
    (:func:`compute_jitter`) when that is larger: on a noisy cluster partners wait longer for
    each other's jitter, and a fixed fraction would call those waits abnormal.

    Parameters
    ----------
    ops:
        Canonical CommOps rows.
    config:
        ``min_wait_us``, ``rel_excess``, ``gap_fraction`` and ``gap_sigmas`` set the bar.

    Returns
    -------
    numpy.ndarray
        float64 score per row, aligned with ``ops``.
    """
    cfg = config or LocalizeConfig()
    classes = _op_classes(ops)
    return _rule_scores(ops, cfg, classes, _class_stats(ops, classes, _regular_rows(ops, cfg)))


def _rule_scores(
    ops: pd.DataFrame, cfg: LocalizeConfig, classes: tuple[np.ndarray, np.ndarray],
    stats: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> np.ndarray:
    """:func:`rule_scores` from the rows' :func:`_op_classes` and :func:`_class_stats`, which
    :func:`summarize` needs as well and computes once."""
    typical, sigma, gap = stats
    excess = ops["duration_us"].to_numpy(dtype=np.float64) - typical
    # A member waits for the latest of its k partners: with jittered compute that wait grows like
    # the maximum of k draws, about sqrt(2 ln k). Scaled so a pair (k = 2) gets the fraction.
    k = _group_sizes(ops)
    spread = np.sqrt(np.log(np.maximum(k, 2.0)) / np.log(2.0))
    fraction = max(cfg.gap_fraction, cfg.gap_sigmas * compute_jitter(ops, gap))
    bar = np.maximum.reduce([
        np.full(len(ops), cfg.min_wait_us), 3.0 * sigma, cfg.rel_excess * typical,
        fraction * spread * gap,
    ])
    score = np.clip(excess / (2.0 * bar), 0.0, 1.0)
    return np.maximum(score, _transfer_scores(ops, cfg, classes[1]))


#: Instances a member of a pair needs before its persistent offset is taken out of the jitter
#: estimate (:func:`compute_jitter`).
_PAIR_OFFSET_MIN = 8


def compute_jitter(ops: pd.DataFrame, gap: np.ndarray | None = None) -> float:
    """The job's compute jitter: the typical relative spread (log-normal sigma) of the compute
    time between two operators, read from the logs.

    The members of one collective instance computed the same segment of the model before it
    (tensor-parallel peers, the same stage of every data-parallel replica), so the spread of
    their compute gaps is jitter, whatever the segment's length. Per instance, the deviations of
    the log gaps from their median (times ``sqrt(k / (k - 1))`` for ``k`` members: the median
    of two is their mean); their median absolute value, times 1.4826, estimates sigma. A slow
    GPU stretches its own gaps only: the median over every copy of the job does not see it -
    except in a pair, whose median is the mean of the two gaps: a member that is late at every
    instance (a straggler on a two-rank job, or in a two-rank group) would read as both members'
    jitter, raise the bar by its own lateness and hide itself. There each member's persistent
    offset (the median of its signed deviations over the pair's instances, when it has
    :data:`_PAIR_OFFSET_MIN` of them) is taken out first; jitter changes sign from step to step
    and keeps its spread.

    Parameters
    ----------
    ops:
        Canonical CommOps rows.
    gap:
        Compute gap before each row in microseconds (from :func:`_class_stats`), when known.

    Returns
    -------
    float
        Estimated sigma (0.0 when no collective has two members with a measurable gap).

    Examples
    --------
    >>> from holmes_ml.simulator import SimConfig, simulate
    >>> ops = simulate(SimConfig(gpus=32, model="llama2-7b", iterations=4, jitter=0.08)).ops
    >>> round(compute_jitter(ops), 2)
    0.08
    """
    if gap is None:
        gap = _class_stats(ops)[2]
    # gaps under 100 us are launch overhead, not compute (positional masks: no index needed)
    coll = ~_is_p2p(ops["op"]) & (gap > 100.0)
    if not coll.any():
        return 0.0
    inst = _combine(_codes(ops["group"])[coll], ops["seq"].to_numpy(dtype=np.int64)[coll],
                    ops["iteration"].to_numpy(dtype=np.int64)[coll])
    log_gap = pd.Series(np.log(gap[coll]))
    by = log_gap.groupby(inst)
    k = by.transform("size").to_numpy(dtype=np.float64)
    signed = (log_gap - by.transform("median")).to_numpy(copy=True)
    two = k == 2
    if two.any():
        member = _combine(_codes(ops["group"])[coll][two],
                          ops["rank"].to_numpy(dtype=np.int64)[coll][two])
        by_member = pd.Series(signed[two]).groupby(member)
        # a median of a few instances takes their spread with it: members seen in fewer than
        # _PAIR_OFFSET_MIN instances keep their deviations
        offset = np.where(by_member.transform("size").to_numpy() >= _PAIR_OFFSET_MIN,
                          by_member.transform("median").to_numpy(), 0.0)
        signed[two] -= offset
    dev = np.abs(signed)
    pair = k >= 2
    if not pair.any():
        return 0.0
    return float(MAD_TO_SD * np.median(dev[pair] * np.sqrt(k[pair] / (k[pair] - 1.0))))


def _transfer_scores(
    ops: pd.DataFrame, cfg: LocalizeConfig, cls: np.ndarray | None = None
) -> np.ndarray:
    """Score every copy of a collective instance by its *shortest* copy.

    The last participant to arrive waits for no one: its copy is the transfer alone. When even
    that copy is long against the shortest copies of the same collective elsewhere (same op,
    group kind, bytes and position), the communication itself was slow and every copy is
    abnormal, whoever waited. Per-copy references cannot see this when a link is slow from the
    first step: waiters and late arrivers make the copies of a class bimodal and its spread
    hides the slow instance. ``cls``: the rows' class keys (:func:`_op_classes`), when already
    computed.
    """
    coll = ~_is_p2p(ops["op"])
    out = np.zeros(len(ops))
    if not coll.any():
        return out
    if cls is None:
        cls = _op_classes(ops)[1]
    # the classes of the whole table, restricted to its collective rows, are the same partition
    # as classes computed on those rows alone (no group mixes collectives and send/recv)
    cls = np.asarray(cls)[coll]
    inst = _combine(_codes(ops["group"])[coll], ops["seq"].to_numpy(dtype=np.int64)[coll])
    dur = ops["duration_us"].to_numpy(dtype=np.float64)[coll]
    # Per instance, from arrays of the collective rows (no frame filtered, no text converted:
    # a node pays this every window): its copies and its shortest copy; then per class, over
    # its instances (one value each, so large groups do not outvote small ones), the median of
    # the shortest copies and their median absolute deviation from it.
    n_inst = int(inst.max()) + 1
    copies = np.bincount(inst, minlength=n_inst)
    shortest = seg.reduce_at(np.minimum, inst, dur, n_inst, np.inf)
    inst_cls = np.empty(n_inst, dtype=np.int64)
    inst_cls[inst] = cls  # an instance's copies share their class
    by = pd.Series(shortest).groupby(inst_cls)
    typical = by.transform("median").to_numpy()
    sigma = MAD_TO_SD * (pd.Series(shortest) - typical).abs().groupby(inst_cls).transform(
        "median").to_numpy()
    bar = np.maximum.reduce([np.full(n_inst, cfg.min_wait_us), 3.0 * sigma,
                             cfg.rel_excess * typical])
    score = np.clip((shortest - typical) / (2.0 * bar), 0.0, 1.0)
    out[coll] = np.where(copies >= 2, score, 0.0)[inst]
    return out


def _group_sizes(ops: pd.DataFrame) -> np.ndarray:
    """Members of each row's communicator (2 for send/recv): from ``group_ranks`` when
    logged, else the ranks seen logging the group."""
    group = _combine(_codes(ops["group"]))  # dense
    pair = _combine(group, ops["rank"].to_numpy(dtype=np.int64))
    # the distinct (group, rank) pairs counted per group: the ranks seen logging it
    group_of_pair = np.empty(int(pair.max()) + 1 if len(pair) else 0, dtype=np.int64)
    group_of_pair[pair] = group
    k = np.bincount(group_of_pair, minlength=int(group.max()) + 1 if len(group) else 0)[
        group].astype(np.float64)
    if "group_ranks" in ops.columns:
        codes, uniq = pd.factorize(ops["group_ranks"], sort=False)
        sizes = np.array([len(str(u).split()) for u in uniq] + [0], dtype=np.float64)
        listed = sizes[codes]  # code -1 (missing) picks the trailing 0
        k = np.where(listed > 0, listed, k)
    return np.where(_is_p2p(ops["op"]), 2.0, k)


def _is_p2p(op: pd.Series) -> np.ndarray:
    """Which rows are a send or a recv (``op.isin(P2P_OPS)``; for a categorical column through
    its few categories, not its rows' text)."""
    if isinstance(op.dtype, pd.CategoricalDtype):
        # per category, and False for a missing op (code -1 picks the appended last entry)
        hit = np.append(op.cat.categories.isin(list(P2P_OPS)), False)
        return hit[op.cat.codes.to_numpy()]
    return op.isin(list(P2P_OPS)).to_numpy()


def _codes(col: pd.Series) -> np.ndarray:
    """Dense integer codes of a column (categorical or not)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.cat.codes.to_numpy().astype(np.int64)
    return pd.factorize(col, sort=False)[0].astype(np.int64)


def _combine(*codes: np.ndarray) -> np.ndarray:
    """One dense int64 key from several code arrays (re-densified at each step: no overflow)."""
    key = np.zeros(len(codes[0]), dtype=np.int64)
    for c in codes:
        c = np.asarray(c, dtype=np.int64)
        c = c - c.min() if len(c) else c
        if len(c) and int(c.max()) >= 1 << 31:  # a wide span (a stray iteration 2**62): codes
            c = pd.factorize(c)[0].astype(np.int64)
        key = pd.factorize(key * (int(c.max()) + 1 if len(c) else 1) + c)[0].astype(np.int64)
    return key


def _op_classes(o: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per row (positional: any index): its position among the rank's copies of its
    group in the iteration, and its class key (``op, group_kind, nbytes`` and that position).
    Integer keys throughout: string concatenation over millions of rows dominates otherwise."""
    it = o["iteration"].to_numpy(dtype=np.int64)
    rank = o["rank"].to_numpy(dtype=np.int64)
    group = _codes(o["group"])
    seq = o["seq"].to_numpy(dtype=np.int64)
    where = _combine(it, group, rank)  # dense: each row's (iteration, group, rank)
    low = seg.reduce_at(np.minimum, where, seq, int(where.max()) + 1 if len(where) else 0,
                        np.iinfo(np.int64).max)
    pos = seq - low[where]
    gk = _codes(o["group_kind"]) if "group_kind" in o.columns else np.zeros(len(o), np.int64)
    return pos, _combine(_codes(o["op"]), gk, _codes(o["nbytes"]), pos)


def _regular_rows(ops: pd.DataFrame, cfg: LocalizeConfig,
                  per: pd.DataFrame | None = None) -> tuple[np.ndarray, float] | None:
    """``(mask, shift)`` for :func:`_class_stats`: per row (positional), is its iteration
    regular (not ``cfg.delta``-irregular), and ``cfg.reference_shift``. ``None`` when the
    switch is off, when every iteration is regular, or when fewer than :data:`_MIN_REGULAR`
    are (too few to be a reference). ``per``: the ``(iteration, rank)`` spans of ``ops``
    (:func:`_rank_spans`) when already computed; the iteration times come from them, else
    from the job-wide iteration table (one row per iteration)."""
    if len(ops) == 0 or cfg.reference_shift == 0:
        return None
    if per is None:
        per = iteration_table(ops).reset_index()
    n_iterations = int(per["iteration"].nunique())
    irregular = _irregular(per, cfg.delta, log=False)
    if not irregular or n_iterations - len(irregular) < _MIN_REGULAR:
        return None
    regular = ~np.isin(ops["iteration"].to_numpy(dtype=np.int64), np.asarray(irregular))
    return regular, cfg.reference_shift


def _rank_spans(ops: pd.DataFrame) -> pd.DataFrame:
    """Per ``(iteration, rank)``: the earliest start, the latest end, the summed operator time
    and how many operators (the ``iterations`` table of a :class:`NodeSummary`), and the
    rank's compute time in the step (``compute_us``) when the logs carry it
    (``step_compute_us``, e.g. the ByteDance what-if traces).

    Rows sorted by ``(iteration, rank)``, as a pandas group-by gives them, and the same values
    to the last bit (the sums are pandas', compensated, in row order), from array reductions
    over dense pair codes: a node's summary pays this at every window, and the group-by's
    fixed cost was most of it.
    """
    it = ops["iteration"].to_numpy(dtype=np.int64)
    rank = ops["rank"].to_numpy(dtype=np.int64)
    start = ops["start_ns"].to_numpy(dtype=np.int64)
    end = start + (ops["duration_us"].to_numpy(dtype=np.float64) * 1e3).astype(np.int64)
    pair, (it_u, rank_u) = _pair_codes(it, rank)
    k = len(it_u)
    out = {"iteration": it_u, "rank": rank_u,
           "start_ns": seg.reduce_at(np.minimum, pair, start, k, np.iinfo(np.int64).max),
           "end_ns": seg.reduce_at(np.maximum, pair, end, k, np.iinfo(np.int64).min),
           "comm_us": ops["duration_us"].groupby(pair).sum().to_numpy(dtype=np.float64),
           "n_ops": np.bincount(pair, minlength=k).astype(np.int64)}
    if "step_compute_us" in ops.columns:
        # the largest compute time logged in the step, NaN where none is (as pandas' max)
        out["compute_us"] = seg.reduce_at(
            np.fmax, pair, ops["step_compute_us"].to_numpy(dtype=np.float64), k, np.nan)
    return pd.DataFrame(out)


def _pair_codes(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Dense codes of the ``(a, b)`` pairs of two int64 arrays, numbered in ``(a, b)`` order,
    and the pairs' ``a`` and ``b`` (one each per code). Linear in the rows: no sort of them."""
    if len(a) == 0:
        return np.empty(0, dtype=np.int64), (a[:0].copy(), b[:0].copy())
    key = seg.combine(a - a.min(), b - b.min())
    _, code = seg.unique_inverse(key)
    k = int(code.max()) + 1
    a_u = np.empty(k, dtype=np.int64)
    b_u = np.empty(k, dtype=np.int64)
    a_u[code] = a
    b_u[code] = b
    # combine() keeps the pairs' order unless they are too wide to pack; sort the few codes
    order = np.lexsort((b_u, a_u))
    renumber = np.empty(k, dtype=np.int64)
    renumber[order] = np.arange(k, dtype=np.int64)
    return renumber[code], (a_u[order], b_u[order])


#: A rank whose operators in an iteration start or end further than this from the other ranks'
#: is no straggler but a broken time: a day (ranks of one job share a clock to within seconds).
_FAR_CLOCK_NS = 86_400 * 10**9


def _warn_far_clocks(per: pd.DataFrame) -> None:
    """Warn about ranks whose operators in an iteration lie days away from the other ranks'
    (a corrupt ``start_ns`` or ``duration_us``, a clock that jumped): their time is used as
    logged, so that iteration's time, and the slowdown quoted, are absurd."""
    if len(np.unique(per["rank"].to_numpy())) < 2:
        return
    far = np.zeros(len(per), dtype=bool)
    off = np.zeros(len(per), dtype=np.float64)
    it = per["iteration"].to_numpy(dtype=np.int64)
    for col in ("start_ns", "end_ns"):
        t = per[col].to_numpy(dtype=np.float64)
        d = t - _medians_by(it, t)
        worse = np.abs(d) > np.abs(off)
        off = np.where(worse, d, off)
        far |= np.abs(d) > _FAR_CLOCK_NS
    if not far.any():
        return
    i = int(np.argmax(np.where(far, np.abs(off), -1.0)))
    row = per.iloc[i]
    days = abs(off[i]) / 86_400e9
    when = f"{days / 365.25:,.0f} years" if days >= 365.25 else f"{days:,.1f} days"
    logger.warning(
        "iteration %d: rank %d's operators lie %s %s the other ranks' (%d rank-iteration(s) "
        "days apart from their peers): a corrupt start_ns or duration_us, or a clock that "
        "jumped? They are used as logged, so such iterations' times are absurd",
        int(row["iteration"]), int(row["rank"]), when, "before" if off[i] < 0 else "after",
        int(far.sum()))


def _medians_by(key: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per row, the median of the ``values`` of the rows sharing its ``key`` (the mean of the
    two middle ones for an even count, as pandas' group-by median), by one sort: for tables
    of a row per rank and iteration, where a group-by's fixed cost dominates."""
    order = np.lexsort((values, key))  # exact: the segments' middle values are read as sorted
    starts, run, _ = seg.segment_layout(key[order])
    out = np.empty(len(key), dtype=np.float64)
    out[order] = seg.sorted_segment_median(values[order], starts)[run]
    return out


#: Regular iterations a window needs, and rows in them a class needs, before they can be its
#: reference.
_MIN_REGULAR = 3


def _median_mad(d: pd.Series, key: np.ndarray, regular: tuple[np.ndarray, float] | None
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the median of its key's durations and their median absolute deviation, over
    the whole window - or over the key's rows in regular iterations, when it has
    :data:`_MIN_REGULAR` of them and the window's median exceeds theirs by more than the shift
    in ``regular`` (``(mask, shift)`` from :func:`_regular_rows`; see
    ``LocalizeConfig.reference_shift``)."""
    med = d.groupby(key).transform("median").to_numpy()
    mad = (d - med).abs().groupby(key).transform("median").to_numpy()
    if regular is None:
        return med, mad
    mask, shift = regular
    kr = key[mask]
    dr = d[mask].reset_index(drop=True)
    by = dr.groupby(kr)
    by_med = by.median()
    by_mad = (dr - by.transform("median")).abs().groupby(kr).median()
    # per key (dense codes; arrays, not a reindexed frame): NaN, no regular reference, where
    # a key has fewer than _MIN_REGULAR rows in regular iterations
    enough = by.size().to_numpy() >= _MIN_REGULAR
    has = by_med.index.to_numpy()[enough]
    ref = np.full((2, int(key.max()) + 1 if len(key) else 0), np.nan)
    ref[0, has] = by_med.to_numpy()[enough]
    ref[1, has] = by_mad.to_numpy()[enough]
    ref_med, ref_mad = ref[0, key], ref[1, key]
    use = med > shift * ref_med  # False where NaN
    return np.where(use, ref_med, med), np.where(use, ref_mad, mad)


def _class_stats(
    ops: pd.DataFrame, classes: tuple[np.ndarray, np.ndarray] | None = None,
    regular: tuple[np.ndarray, float] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reference duration, MAD-based σ and preceding compute gap per row (aligned with ops).
    ``classes``: :func:`_op_classes` of ``ops``, when already computed. ``regular``: from
    :func:`_regular_rows`, for the switch to regular iterations of the classes whose slowdown
    became their norm (``LocalizeConfig.reference_shift``). Every column is read positionally,
    so the index of ``ops`` does not matter (and the frame is not copied)."""
    o = ops
    rank = o["rank"].to_numpy(dtype=np.int64)
    group = _codes(o["group"])
    start = o["start_ns"].to_numpy(dtype=np.int64)
    dur = o["duration_us"].to_numpy(dtype=np.float64)
    pos, cls = _op_classes(o) if classes is None else classes
    op_s = o["op"]
    op = _codes(op_s)
    p2p = _is_p2p(op_s)
    if "pp" in o.columns:
        # Pipeline stage known: compare a send/recv with the same one of the other replicas of
        # its stage (robust even when a fault is present from the first iteration).
        own = _combine(cls, _codes(o["pp"]))
    else:
        own = _combine(op, group, rank, pos)
    key = _combine(p2p.astype(np.int64), np.where(p2p, own, cls))
    d = pd.Series(dur)
    med, mad = _median_mad(d, key, regular)
    if "pp" not in o.columns:
        # A send's duration is its transfer (it does not wait for a stage's compute), so the
        # same send of the other ranks is a fair reference, and the only one that stays clean
        # when a NIC or link is slow from the first iterations on (the rank's own history is
        # then slow throughout). The lower of the two references wins.
        send = (op_s == "send").to_numpy()
        ckey = _combine(p2p.astype(np.int64), cls)
        cmed, cmad = _median_mad(d, ckey, regular)
        use = send & (cmed < med)
        med = np.where(use, cmed, med)
        mad = np.where(use, cmad, mad)
    order = np.lexsort((start, rank))
    end = start + (dur * 1e3).astype(np.int64)
    gap = np.zeros(len(o))
    so, eo, ro = start[order], end[order], rank[order]
    g = np.r_[0.0, (so[1:] - eo[:-1]) / 1e3]
    g[np.r_[True, ro[1:] != ro[:-1]]] = 0.0
    gap[order] = np.maximum(g, 0.0)
    return med, MAD_TO_SD * mad, gap


def _score(
    ops: pd.DataFrame, model: Any, config: LocalizeConfig,
    classes: tuple[np.ndarray, np.ndarray], stats: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> tuple[np.ndarray, float]:
    """Scores and threshold: the ML detector when available, else the rule baseline.

    ``model=None`` means the bundled default model; when it (or the models package) is not
    installed the rule baseline is used and a warning says so. ``model="rule"`` forces it.
    ``classes`` and ``stats`` are the rows' :func:`_op_classes` and :func:`_class_stats`.
    """
    def rule() -> np.ndarray:
        return _rule_scores(ops, config, classes, stats)

    if isinstance(model, str) and model == "rule":
        return rule(), 0.5
    try:
        from holmes_ml.models import score_ops
        from holmes_ml.models.score import _shared_default_model
    except ImportError:
        logger.warning("holmes_ml.models unavailable; using the 3-sigma + rule baseline")
        return rule(), 0.5
    if model is None:
        try:
            model = _shared_default_model()  # read only here: no copy per window
        except Exception as exc:  # noqa: BLE001 - any unusable default falls back, loudly
            logger.warning("default model unusable (%s); using the 3-sigma + rule baseline", exc)
            return rule(), 0.5
    scores = np.asarray(score_ops(ops, model=model), dtype=np.float64)
    thr = config.score_threshold
    if thr is None:
        thr = float(getattr(model, "threshold_", 0.5))
    if config.with_rule:
        # Map both onto "0.5 = at the bar" and keep the larger: a copy is abnormal when the
        # detector or the rule says so (the rule catches waits a detector may under-call).
        ml = np.where(scores >= thr, 0.5 + 0.5 * (scores - thr) / max(1 - thr, 1e-9),
                      0.5 * scores / max(thr, 1e-9))
        return np.maximum(ml, rule()), 0.5
    return scores, thr


# ------------------------------------------------------------------ summaries
def summarize(
    ops: pd.DataFrame, model: Any = None, config: LocalizeConfig | None = None
) -> NodeSummary:
    """Score the operators of one node (or job) and keep only what localization needs.

    Parameters
    ----------
    ops:
        Canonical CommOps table (optionally with ``group_ranks, peer, host, group_kind`` and
        coordinate columns ``dp, pp, tp, cp, ep``).
    model:
        Detector for :func:`holmes_ml.models.score_ops`, or the path of a model file;
        ``None`` uses the default model (or the rule baseline when no model package is
        available); ``"rule"`` forces the baseline.
    config:
        :class:`LocalizeConfig`.

    Returns
    -------
    NodeSummary
    """
    cfg = config or LocalizeConfig()
    ops = checked(ops)
    model = model_from(model)
    ops = ops.reset_index(drop=True)
    classes = _op_classes(ops)
    per = _rank_spans(ops)
    _warn_far_clocks(per)
    if len(ops) and not ops["duration_us"].to_numpy().any():
        logger.warning("every operator's duration_us is 0: the logs carry no timing of the "
                       "operators, so none can look abnormal and only iteration times, from "
                       "their starts, are left (does the logger time the operators?)")
    stats = _class_stats(ops, classes, _regular_rows(ops, cfg, per))
    typical = stats[0]
    scores, thr = _score(ops, model, cfg, classes, stats)
    mask = scores >= thr
    keep = list(REQUIRED_COLUMNS) + [c for c in ("peer", "host") if c in ops.columns]
    if "group_kind" in ops.columns:
        keep.append("group_kind")
    abnormal = ops.loc[mask, keep].copy()
    for c in ("op", "group", "host", "group_kind"):
        if c in abnormal.columns:
            abnormal[c] = abnormal[c].astype(str)
    abnormal["score"] = scores[mask].astype(np.float32)
    abnormal["excess_us"] = (ops["duration_us"].to_numpy()[mask] - typical[mask]).astype(
        np.float32)
    groups = _groups_of(ops)
    rcols = ["rank"] + [c for c in ("host", "dp", "pp", "tp", "cp", "ep") if c in ops.columns]
    ranks = ops[rcols].drop_duplicates("rank").reset_index(drop=True)
    if "host" in ranks.columns:
        ranks["host"] = ranks["host"].astype(str)
    return NodeSummary(per, abnormal.reset_index(drop=True), groups, ranks)


def summarize_per_host(
    ops: pd.DataFrame, model: Any = None, config: LocalizeConfig | None = None
) -> list[NodeSummary]:
    """One :func:`summarize` per host, as the node agents of ``holmes serve`` run it.

    Each host's ranks are scored on their own, so the detector sees only the copies of a
    communicator that the host logged (its peers and stage-mates on other hosts are missing).
    ``localize_summaries`` of the result is what the central service answers; comparing it with
    :func:`analyze` of the whole job shows what the deployment costs in accuracy (``holmes
    bench localize`` scores both).

    Raises
    ------
    ValueError
        When ``ops`` has no ``host`` column.
    """
    model = model_from(model)  # a file is read once, not once per host
    return [summarize(sub, model, config) for _, sub in per_host(ops)]


def model_from(model: Any) -> Any:
    """``model`` as :func:`summarize` takes it: a model file's path (``str`` or ``Path``, as
    ``holmes localize --model`` takes it) is loaded with
    :func:`~holmes_ml.models.load_model`; ``None``, ``"rule"`` and a detector pass as they
    are."""
    if isinstance(model, (str, Path)) and str(model) != "rule":
        from holmes_ml.models import load_model

        return load_model(model)
    return model


def per_host(ops: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """``(host, that host's operators)`` in host order: what each node agent logs and scores.

    Raises
    ------
    ValueError
        When ``ops`` has no ``host`` column.
    """
    if "host" not in ops.columns:
        raise ValueError("ops: no 'host' column; expected the host of every rank to split "
                         "the operators by node")
    return [(str(host), sub) for host, sub in ops.groupby(ops["host"].astype(str), sort=True)]


def _groups_of(ops: pd.DataFrame) -> pd.DataFrame:
    group = ops["group"]
    if not isinstance(group.dtype, pd.CategoricalDtype) or group.isna().any():
        return _groups_by_text(ops)
    # A categorical group column (as checked() makes it): the group-by's table, each group's
    # first known member list and kind, read through the codes (no text conversion of every
    # row, no group-by: a node pays this every window)
    # each row's group, 0 .. len(present) - 1
    present, where = seg.unique_inverse(group.cat.codes.to_numpy())
    names = np.asarray(group.cat.categories[present].astype(str), dtype=object)
    order = np.argsort(names, kind="stable")  # the group-by's order: by name
    index = pd.Index(names[order], name="group").astype(str)

    def first_known(col: str) -> pd.Series:
        values = ops[col]
        known = np.flatnonzero(values.notna().to_numpy())
        got, at = np.unique(where[known], return_index=True)
        out = np.full(len(present), np.nan, dtype=object)
        out[got] = values.iloc[known[at]].astype(object).to_numpy()
        return pd.Series(out[order], index=index).astype(str)

    if "group_ranks" in ops.columns:
        gr = first_known("group_ranks")
        empty = gr.str.len() == 0
    else:
        gr = pd.Series("", index=index)
        empty = pd.Series(True, index=index)
    if empty.any():
        return _groups_by_text(ops)  # the members seen: read off every row
    if "group_kind" in ops.columns:
        gk = first_known("group_kind")
    else:
        gk = pd.Series([kind_from_group_name(n) for n in index], index=index)
    return pd.DataFrame({"group": index, "group_kind": gk.to_numpy(),
                         "group_ranks": gr.to_numpy()})


def _groups_by_text(ops: pd.DataFrame) -> pd.DataFrame:
    """:func:`_groups_of` by a group-by of the group names."""
    g = ops.groupby(ops["group"].astype(str), sort=True)
    if "group_ranks" in ops.columns:
        gr = g["group_ranks"].first().astype(str)
        empty = gr.str.len() == 0
    else:
        gr = pd.Series("", index=g.size().index)
        empty = pd.Series(True, index=gr.index)
    if empty.any():
        seen = g["rank"].unique().map(lambda a: " ".join(str(int(x)) for x in sorted(a)))
        gr = gr.where(~empty, seen)
    if "group_kind" in ops.columns:
        gk = g["group_kind"].first().astype(str)
    else:
        gk = pd.Series([kind_from_group_name(n) for n in gr.index], index=gr.index)
    return pd.DataFrame({"group": gr.index, "group_kind": gk.to_numpy(),
                         "group_ranks": gr.to_numpy()})


def _merge(summaries: Sequence[NodeSummary]) -> NodeSummary:
    if not summaries:
        raise ValueError("summaries: got an empty list; expected at least one NodeSummary")
    its = pd.concat([s.iterations for s in summaries], ignore_index=True)
    ab = pd.concat([s.abnormal for s in summaries], ignore_index=True)
    groups = pd.concat([s.groups for s in summaries], ignore_index=True)
    # A communicator spanning nodes is listed by each node with its full membership when
    # group_ranks is known; otherwise the union of the ranks each node saw.
    groups = groups.drop_duplicates(["group", "group_ranks"])
    many = groups["group"].duplicated(keep=False).to_numpy()
    if many.any():
        # Only communicators listed differently by different nodes need the union (a Python
        # reduction, so it is kept off the common case where every node lists them alike).
        union = groups[many].groupby("group", sort=False).agg(
            group_kind=("group_kind", "first"),
            group_ranks=("group_ranks", lambda s: " ".join(
                str(x) for x in sorted({int(v) for t in s for v in str(t).split()}))),
        ).reset_index()
        groups = pd.concat([groups[~many], union], ignore_index=True)
    groups = groups.sort_values("group", kind="stable").reset_index(drop=True)
    ranks = [s.ranks for s in summaries if s.ranks is not None]
    rk = pd.concat(ranks, ignore_index=True).drop_duplicates("rank") if ranks else None
    return NodeSummary(its, ab, groups, rk)


def topology_from_summary(summary: NodeSummary) -> Topology:
    """Minimal topology (hosts, GPUs, communicators, coordinates; no fabric) of a summary."""
    ranks = np.sort(summary.iterations["rank"].unique()).astype(np.int64)
    r = pd.DataFrame({"rank": ranks})
    if summary.ranks is not None and "host" in summary.ranks.columns:
        hosts = summary.ranks.set_index("rank")["host"].astype(str)
        r["host"] = hosts.reindex(r["rank"]).fillna("").to_numpy()
        r.loc[r["host"] == "", "host"] = [assumed_host(x)[0]
                                          for x in r.loc[r["host"] == "", "rank"]]
        r["gpu"] = local_index(r, GPUS_PER_HOST)
        if "gpu" in summary.ranks.columns:
            # the GPU each agent says its rank runs on, when it says so for every rank and no
            # two ranks of a host share one (else ranks are numbered in order on their host)
            sent = summary.ranks.set_index("rank")["gpu"].reindex(r["rank"])
            if sent.notna().all() and not r.assign(gpu=sent.to_numpy()).duplicated(
                    ["host", "gpu"]).any():
                r["gpu"] = sent.astype(np.int64).to_numpy()
    else:
        r["host"] = [assumed_host(x)[0] for x in ranks]
        r["gpu"] = ranks % GPUS_PER_HOST
    r["pod"] = 0
    for k in ("tp", "cp", "ep", "dp", "pp"):
        if summary.ranks is not None and k in summary.ranks.columns:
            v = summary.ranks.set_index("rank")[k].reindex(r["rank"])
            r[k] = v.fillna(-1).astype(np.int64).to_numpy()
        else:
            r[k] = -1
    groups = {
        str(g.group): Group(str(g.group), str(g.group_kind),
                            member_ranks(g.group_ranks))
        for g in summary.groups.itertuples()
    }
    return Topology(ranks=r, groups=groups, spines=0)


def localize_summaries(
    summaries: Sequence[NodeSummary],
    topology: Topology | None = None,
    config: LocalizeConfig | None = None,
) -> Verdict:
    """Merge node summaries and localize the slowdown.

    Parameters
    ----------
    summaries:
        One :class:`NodeSummary` per node (or one for the whole job).
    topology:
        Job topology (fabric included) when known; else derived from the summaries, and then only
        GPUs, NICs and hosts can be named.
    config:
        :class:`LocalizeConfig`.

    Returns
    -------
    Verdict
    """
    cfg = config or LocalizeConfig()
    s = _merge(list(summaries))
    if topology is not None:
        _check_topology_covers(topology, s.iterations["rank"].unique())
        _check_topology_matches(topology, s)
    topo = topology if topology is not None else topology_from_summary(s)
    irr = _irregular(s.iterations, cfg.delta)
    verdict = localize_records(s.abnormal, s.groups, s.iterations, topo, cfg, irr)
    # What the verdict was computed from, so that "nothing found" and "nothing to look at"
    # read differently.
    verdict.stats.update(
        ops=float(s.iterations["n_ops"].sum()) if "n_ops" in s.iterations else 0.0,
        ranks=float(s.iterations["rank"].nunique()),
        iterations=float(s.iterations["iteration"].nunique()),
        min_history=float(IrregularityConfig().min_history),  # what _irregular monitors with
    )
    silent = _silent_ranks(s, topo, topology is not None)
    return replace(verdict, silent_ranks=silent,
                   lacking_ranks=_lacking_ranks(s.iterations, verdict.stats),
                   silent_hosts=_silent_hosts(topo, silent) if topology is not None else ())


def _silent_hosts(topo: Topology, silent: tuple[int, ...]) -> tuple[str, ...]:
    """Hosts the topology places ranks on, none of which logged anything."""
    if not silent:
        return ()
    r = topo.ranks
    quiet = r["rank"].isin(silent).groupby(r["host"].astype(str)).all()
    return tuple(sorted(quiet.index[quiet.to_numpy()]))


#: The newest iterations a rank may lack without being listed as lacking them: live agents
#: ship a rank's iteration once it logged a later one, so one host's latest lag a little.
_TRAILING_ITERATIONS = 2


def _lacking_ranks(iterations: pd.DataFrame, stats: dict[str, float]) -> tuple[int, ...]:
    """Ranks whose summaries lack iterations of the analysed window (``stats``'
    ``analysed_first`` to ``analysed_last``, else every iteration) that other ranks have: a
    log cut short, an agent that stopped (the :data:`_TRAILING_ITERATIONS` newest aside)."""
    if len(iterations) == 0:
        return ()
    it = iterations["iteration"].to_numpy(np.int64)
    lo, hi = stats.get("analysed_first"), stats.get("analysed_last")
    hi = min(hi if hi is not None else np.inf, float(it.max()) - _TRAILING_ITERATIONS)
    keep = (it >= (lo if lo is not None else -np.inf)) & (it <= hi)
    return tuple(sorted(iteration_gaps(iterations[keep])))


def _silent_ranks(s: NodeSummary, topo: Topology, given: bool) -> tuple[int, ...]:
    """Ranks that the communicators' members (as ``topo`` has them parsed, from the logged
    member lists or the topology) or a ``given`` topology's placement name, and that logged
    nothing."""
    named = {int(r) for g in topo.groups.values() for r in g.ranks}
    if given:
        named.update(int(r) for r in topo.ranks["rank"])
    return tuple(sorted(named - {int(r) for r in s.iterations["rank"].unique()}))


def check_topology(topology: Topology, ops: pd.DataFrame) -> None:
    """Refuse (:class:`SchemaError`) a ``topology`` that does not belong to the job of the
    CommOps table ``ops``, as localizing them together would: one lacking ranks of the logs,
    placing them on other hosts, or giving a communicator other members."""
    _check_topology_covers(topology, ops["rank"].unique())
    groups = (ops.drop_duplicates("group")[["group", "group_ranks"]]
              if "group_ranks" in ops.columns else pd.DataFrame(columns=["group", "group_ranks"]))
    ranks = ops.drop_duplicates("rank")[["rank", "host"]] if "host" in ops.columns else None
    _check_topology_matches(topology, SimpleNamespace(groups=groups, ranks=ranks))


def _check_topology_covers(topology: Topology, ranks: np.ndarray) -> None:
    """A topology that lacks ranks of the logs belongs to another job: refuse it rather than
    name devices from the wrong placement."""
    known = topology.ranks["rank"].to_numpy(dtype=np.int64)
    missing = np.setdiff1d(np.asarray(ranks, dtype=np.int64), known)
    if len(missing):
        shown = ", ".join(str(int(r)) for r in missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise SchemaError(
            f"the logs have {len(missing)} rank(s) the topology does not place ({shown}); it "
            f"places {len(known)} rank(s)",
            source=topology.source, expected="the topology of the job that wrote these logs",
        )


def _check_topology_matches(topology: Topology, summary: NodeSummary | SimpleNamespace
                            ) -> None:
    """A topology that places the logs' ranks differently (a communicator of the same name
    with other members, a rank on another host) belongs to another job of the same size."""
    def refuse(what: str) -> None:
        raise SchemaError(f"the topology disagrees with the logs: {what}",
                          source=topology.source,
                          expected="the topology of the job that wrote these logs")

    # by name: the first one named is the same however the logs were read
    groups = summary.groups.assign(name=summary.groups["group"].astype(str)).sort_values("name")
    for g in groups.itertuples():
        known = topology.groups.get(str(g.group))
        logged = member_ranks(g.group_ranks)
        if known is not None and logged and set(known.ranks) != set(logged):
            only_logs = sorted(set(logged) - set(known.ranks))
            only_topo = sorted(set(known.ranks) - set(logged))
            diff = "; ".join(
                [f"ranks {few(only_logs)} only in the logs"] * bool(only_logs)
                + [f"ranks {few(only_topo)} only in the topology"] * bool(only_topo))
            refuse(f"communicator {g.group!r} has {len(set(logged))} ranks in the logs "
                   f"({few(sorted(set(logged)))}), {len(set(known.ranks))} in the topology "
                   f"({few(sorted(set(known.ranks)))}): {diff}")
    if summary.ranks is None or "host" not in summary.ranks.columns:
        return
    logged_hosts = summary.ranks.set_index("rank")["host"].astype(str)
    placed = topology.ranks.set_index("rank")["host"].astype(str).reindex(logged_hosts.index)
    differ = (logged_hosts != "") & placed.notna() & (logged_hosts != placed)
    if differ.any():
        r = int(differ.idxmax())
        refuse(f"rank {r} ran on host {logged_hosts[r]!r} by the logs, {placed[r]!r} by the "
               f"topology ({int(differ.sum())} rank(s) placed on other hosts)")


def irregular_iterations(iterations: pd.DataFrame, config: LocalizeConfig | None = None
                         ) -> tuple[int, ...]:
    """The iterations :func:`localize_summaries` finds ``config.delta``-irregular in a span
    table (the ``iterations`` of a :class:`NodeSummary`)."""
    return _irregular(iterations, (config or LocalizeConfig()).delta, log=False)


def iteration_monitor(iterations: pd.DataFrame, delta: float = 1.1
                      ) -> tuple[pd.DataFrame, bool]:
    """The irregularity monitor's table (:func:`~holmes_ml.features.detect_irregular`) of a
    span table (``iteration``, ``start_ns``, ``end_ns``; e.g. the ``iterations`` of a
    :class:`NodeSummary`), each step timed as :func:`localize_summaries` times it, and whether
    some step was timed end to end (its operators come at its end)."""
    span = iteration_spans_of(iterations)
    seconds, end_to_end = span_times(span, "start", "end", "last")
    table = pd.DataFrame({"duration_s": seconds / 1e9}, index=span.index)
    table.index.name = "iteration"
    return (detect_irregular(table, IrregularityConfig(delta=delta)),
            bool(np.asarray(end_to_end).any()))


def _irregular(iterations: pd.DataFrame, delta: float = 1.1, log: bool = True
               ) -> tuple[int, ...]:
    """The ``delta``-irregular iterations of a span table (``iteration``, ``start_ns``,
    ``end_ns``; e.g. the ``iterations`` of a :class:`NodeSummary`), logged unless ``log`` is
    false."""
    if len(iterations) == 0:
        return ()
    # iteration_monitor's flags without its table (a node pays this every window)
    span = iteration_spans_of(iterations)
    seconds, _ = span_times(span, "start", "end", "last")
    _, _, flags = irregular_flags(seconds.to_numpy(dtype=np.float64) / 1e9,
                                  IrregularityConfig(delta=delta))
    irregular = tuple(int(i) for i in span.index[flags])
    if log:
        logger.info("%d of %d iterations irregular (delta=%.3g)", len(irregular), len(span),
                    delta)
    return irregular


def analyze(
    ops: pd.DataFrame,
    topology: Topology | None = None,
    model: Any = None,
    config: LocalizeConfig | None = None,
) -> Verdict:
    """Localize the device slowing a job from its CommOps table.

    Equivalent to ``localize_summaries([summarize(ops, model, config)], topology, config)``.

    Examples
    --------
    >>> from holmes_ml.simulator import FaultSpec, SimConfig, simulate
    >>> res = simulate(SimConfig(gpus=32, model="llama2-7b", iterations=8, seed=0,
    ...     faults=(FaultSpec.parse("gpu_slow:rank=5,severity=0.5"),)))
    >>> analyze(res.ops, res.topology, model="rule").candidates[0].ranks
    (5,)
    """
    cfg = config or LocalizeConfig()
    ops = checked(ops)
    if len(ops) == 0:
        raise SchemaError("no operator rows", source="ops",
                          expected="the CommOps rows of a job: at least one collective or "
                          "send/recv")
    if topology is not None and not isinstance(topology, Topology):
        raise TypeError(f"topology: got {type(topology).__name__}; expected a holmes_ml "
                        "Topology (Topology.from_json(path) reads a topology.json) or None")
    if ops.attrs.get("key_checked_rows") != len(ops):  # not as read (pd.concat of two runs?)
        ops = ops.copy(deep=False)
        ops.attrs["reused_key_rows"] = warn_reused_keys(ops, "ops")
    return note_input(localize_summaries([summarize(ops, model, cfg)], topology, cfg), ops)


def only_iterations(ops: pd.DataFrame, first: int | None, last: int | None) -> pd.DataFrame:
    """The rows of ``ops`` in iterations ``first`` to ``last`` (both included; ``None`` leaves
    that side open). Raises ``ValueError`` naming the iterations the logs hold when none is in
    the range."""
    it = ops["iteration"].to_numpy(dtype=np.int64)
    keep = np.ones(len(it), dtype=bool)
    if first is not None:
        keep &= it >= first
    if last is not None:
        keep &= it <= last
    if not keep.any():
        held = f"{it.min()}-{it.max()}" if len(it) else "none"
        asked = f"{'' if first is None else first}:{'' if last is None else last}"
        raise ValueError(f"--iterations {asked}: no operator of the logs is in that range; "
                         f"expected a range within the iterations they hold ({held})")
    out = ops[keep].reset_index(drop=True)
    out.attrs = dict(ops.attrs)
    return out


def note_input(verdict: Verdict, ops: pd.DataFrame) -> Verdict:
    """Carry what the reader noticed about ``ops`` into the verdict (its :attr:`Verdict.note`):
    rows that share an op's identity but differ (two runs read together), and profiler traces
    whose gloo operations were read as one world group or whose steps were renumbered or left
    out (profilers started at different steps), and log files left unread (Parquet without
    its footer)."""
    for key in INPUT_NOTES:
        # unread_files: the files' names; the others a count
        n = len(ops.attrs.get(key, ())) if key == "unread_files" else int(ops.attrs.get(key, 0))
        if n:
            verdict.stats[key] = float(n)
    return verdict


def analyze_paths(
    paths: Sequence[str | Path],
    format: str = "auto",
    model: Any = None,
    topology: Topology | None = None,
    config: LocalizeConfig | None = None,
) -> Verdict:
    """Read logs (any supported format) and :func:`analyze` them.

    A simulator output directory (``ops.parquet`` + ``topology.json``) brings its own topology.
    """
    files, topology = resolve_paths(paths, topology)
    return analyze(read_paths(files, format), topology, model, config)


def resolve_paths(
    paths: Sequence[str | Path], topology: Topology | None = None
) -> tuple[list[Path], Topology | None]:
    """Expand simulator output directories into their ``ops.parquet``, and pick up the
    ``topology.json`` beside the first log file or inside the first directory that has one
    (what ``holmes simulate`` writes) when no topology is given."""
    files: list[Path] = []
    found: Path | None = None
    for p in (Path(x) for x in paths):
        if p.is_dir() and (p / "ops.parquet").exists():
            files.append(p / "ops.parquet")
            near = p / "topology.json"
            _say_unread_beside(p)
        else:
            files.append(p)
            near = p / "topology.json" if p.is_dir() else p.parent / "topology.json"
        if topology is None and found is None and near.is_file():
            found = near
        if topology is None and found is None and p.is_file() and p.name.lower().endswith(
                ARCHIVE_SUFFIXES):
            topology = _topology_in_archive(p)
    if found is not None:
        logger.info("topology from %s", found)
        topology = Topology.from_json(found)
    return files, topology


def _topology_in_archive(archive: Path) -> Topology | None:
    """The ``topology.json`` a tar archive of a ``holmes simulate`` directory holds (the
    shallowest one), read as the directory's would be; None when it holds none or cannot be
    opened (the reader then says why)."""
    import tarfile

    try:
        with tarfile.open(archive) as tf:
            named = sorted((m for m in tf.getmembers()
                            if m.isfile() and Path(m.name).name == "topology.json"),
                           key=lambda m: len(Path(m.name).parts))
            if not named:
                return None
            handle = tf.extractfile(named[0])
            raw = handle.read() if handle is not None else b""
    except (tarfile.TarError, OSError, EOFError):
        return None
    source = f"{archive}:{named[0].name.removeprefix('./')}"
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise SchemaError(f"not valid JSON ({exc})", source=source,
                          expected="a topology.json as holmes simulate writes it") from None
    logger.info("topology from %s", source)
    return Topology.from_dict(data, source=source)


#: What a ``holmes simulate --out`` directory holds beside its ops.parquet (and what ``holmes
#: detect``, ``--plot`` and ``holmes demo``, its verdict.json, may have written there): not logs.
_SIMULATE_DIR_FILES = frozenset({"faults.json", "topology.json", "config.json", "verdict.json"})
_NOT_LOGS = (".png", ".md", ".txt", ".yaml", ".yml", ".db", ".lock", ".holmes", ".iterations.csv")


def _say_unread_beside(directory: Path) -> None:
    """Warn about files that look like logs beside a simulate directory's ops.parquet: the
    directory is read as that file alone (another rank's log split off beside it would be
    missing from the verdict without a word)."""
    others = sorted(
        f.name for f in directory.iterdir()
        if f.is_file() and not f.name.startswith(".") and f.name != "ops.parquet"
        and f.name not in _SIMULATE_DIR_FILES and not f.name.lower().endswith(_NOT_LOGS)
        and not f.name.startswith("scores"))
    if others:
        logger.warning(
            "%s holds ops.parquet, read alone as a `holmes simulate` output; %d other file(s) "
            "beside it not read: %s (to read them, give each as a PATH, e.g. %s)",
            directory, len(others), ", ".join(others[:3]) + (" ..." if len(others) > 3 else ""),
            " ".join(str(directory / f) for f in ["ops.parquet", *others[:2]]))


def read_paths(files: Sequence[Path], format: str = "auto", progress: bool = False,
               trust_pickle: bool = False, warn: bool = True) -> pd.DataFrame:
    """Read log files into one validated CommOps table (readers from :mod:`holmes_ml.io`;
    ``progress``: a progress bar over the files on stderr; ``trust_pickle``: unpickle
    Flight Recorder dumps, see :func:`holmes_ml.io.read_ops`; ``warn``: of operators that
    last longer than an hour, which ``holmes check`` lists among its checks instead)."""
    from holmes_ml.io import read_ops

    ops = read_ops([str(f) for f in files], format=format, progress=progress,
                   trust_pickle=trust_pickle)
    if len(ops) == 0:
        raise SchemaError(
            "no operator rows in " + ", ".join(str(f) for f in files),
            expected="logs with at least one collective or send/recv of the job",
        )
    if warn:
        _warn_long_ops(ops)
    return ops


def _warn_long_ops(ops: pd.DataFrame) -> None:
    """Warn about operators logged as lasting longer than :data:`LONG_OP_US` (a corrupt
    ``duration_us``, or a hang): used as logged, they make their iteration's time absurd; and
    about durations and starts in other units than the schema's (:func:`unit_mixup`)."""
    from holmes_ml.io.inventory import long_ops, unit_mixup

    found = long_ops(ops)
    if found is not None:
        logger.warning("%s: a corrupt duration_us, or a hang? They are used as logged, so "
                       "their iterations' times (and a slowdown quoted) are absurd", found)
    mixup = unit_mixup(ops)
    if mixup is not None:
        logger.warning("%s: they are used as logged, so the abnormal operators and the "
                       "suspects found from them may be wrong", mixup)
