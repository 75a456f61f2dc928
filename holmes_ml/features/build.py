"""Per-operator features: the detector's view of one CommOps row.

Six families, computed with sorted-array arithmetic (no Python per row), and loops compiled
with numba where a step is a chain of dependent updates (:mod:`holmes_ml.features._kernels`):

* **history** of the operator's own signature (rank, group, op, position within the iteration,
  bytes) over the ``window`` previous occurrences, which excludes the current iteration so a fault
  cannot hide itself inside its own reference;
* **peers** within one collective instance (group, seq, iteration) or one send/recv pair: how this
  copy compares with the other participants' copies, when this rank arrived, and how its
  duration splits into *waiting* for the last participant (someone else's fault) and the
  *transfer* after it (whose history ratio exposes a slow link, NIC or switch);
* **same step** in the other groups of the same kind (iteration, group kind, op, seq, bytes):
  a slow link prolongs every copy of the groups crossing it, so their peers and, once it
  persists, their history look alike - the groups that do not cross it still set the norm;
  and the same step on the ranks of its pipeline stage (read off the communicators) that reach
  it at the same place of their iteration, whose copies wait alike unless a fault passes a delay
  on;
* **the late arrival's cause**: the op the instance's last arrival ran just before it, which
  tells a wait passed on by a slow transfer from a wait on jitter, and the worst of the ops
  along the chain of such waits behind the copy (a fault several hops upstream);
* **fixed** facts: op type, message size, group size and kind;
* **context**: how slow the whole iteration is, and the rank's recent average latency.

Scale-free columns (ratios, z-scores, ranks) are what lets one model serve jobs of different
size and speed; the microsecond-valued columns are listed in :data:`TIME_FEATURES` so that a drift
adjuster can rescale or drop them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from holmes_ml._stats import MAD_TO_SD
from holmes_ml.features import _segments as seg
from holmes_ml.features._kernels import (
    HISTORY_KERNEL_OUTPUTS,
    PEERS_KERNEL_OUTPUTS,
    chain_max_kernel,
    compute_gaps_kernel,
    history_kernel,
    peers_kernel,
    replay_excess_kernel,
    replay_gain_kernel,
)
from holmes_ml.features.iterations import (
    IrregularityConfig,
    irregular_flags,
    iteration_spans,
    iteration_times,
    last_arrivals,
)
from holmes_ml.io.schema import OP_TYPES, SchemaError

logger = logging.getLogger(__name__)

#: Columns measured in microseconds (everything else is scale-free).
TIME_FEATURES: tuple[str, ...] = (
    "duration_us",
    "hist_mean_us",
    "hist_std_us",
    "hist_q1_us",
    "hist_median_us",
    "hist_q3_us",
    "hist_iqr_us",
    "peer_median_us",
    "arrival_lag_us",
    "rank_window_mean_us",
    "wait_us",
    "xfer_us",
)

#: The model's feature schema, in a stable order. Append new columns at the end only.
FEATURE_COLUMNS: tuple[str, ...] = (
    "duration_us",
    # history of this op's own signature over earlier iterations
    "history_len",
    "hist_mean_us",
    "hist_std_us",
    "hist_q1_us",
    "hist_median_us",
    "hist_q3_us",
    "hist_iqr_us",
    "hist_z",
    "hist_iqr_score",
    "hist_ratio",
    # peers in the same collective instance / send-recv pair
    "peer_count",
    "peer_median_us",
    "peer_ratio_median",
    "peer_ratio_min",
    "peer_ratio_max",
    "arrival_lag_us",
    "arrival_lag_rel",
    "arrived_last",
    "arrival_rank",
    # fixed
    "op_code",
    "is_p2p",
    "log2_bytes",
    "group_size",
    "group_kind_code",
    # context
    "iter_time_ratio",
    "rank_window_mean_us",
    "rank_latency_ratio",
    # appended after the first schema
    "arrival_lag_spread",
    # this copy split into waiting for the last participant and the transfer after it
    "wait_us",
    "wait_rel",
    "xfer_us",
    "xfer_hist_ratio",
    # duration over its median in regular iterations only (survives a persistent fault)
    "base_ratio",
    # the same op step (iteration, group kind, op, seq, bytes) in every group of that kind:
    # this copy's duration, its transfer part and its instance's median over the step's
    # typical instance (needs no history, so a persistent fault does not fade into it)
    "step_ratio",
    "step_xfer_ratio",
    "step_peer_ratio",
    # the same op step on the ranks of one pipeline stage (the ranks its tensor-, data-, expert-
    # and context-parallel groups join) that reach it at the same place of their iteration:
    # this copy over the copies' median, and in robust standard deviations
    "stage_step_ratio",
    "stage_step_z",
    # the op the instance's last arrival ran just before it: was that rank late because its
    # own previous op was slow (a wait passed on by a fault) or by chance (jitter)?
    "late_prev_stage_ratio",
    "late_prev_xfer_ratio",
    "late_prev_xfer_hist_ratio",
    # the signature's level against its lowest level over its last ``level_memory`` copies
    # (the lowest history median): a persistent fault's rise survives the history absorbing it
    "level_rise_frac",
    "level_excess_frac",
    # the part of that excess not in the transfer (its own lowest level): the wait a slow
    # peer's persistent fault adds, which transfer drift does not
    "level_wait_excess_frac",
    # that wait in the op's own history's standard deviations, and how widely the copies of
    # this op step spread in its stage (robust std / median): how noisy the cluster is
    "level_wait_z",
    "stage_step_spread",
    # the largest of a few columns over the chain of waits behind this copy: its instance's
    # last arrival's previous op, that op's instance's last arrival's previous op, and so on
    # (``FeatureConfig.chain_hops`` hops, within the iteration): a persistent fault several
    # pipeline or ring hops upstream, which the one-hop ``late_prev_*`` columns miss
    "chain_stage_ratio",
    "chain_stage_z",
    "chain_xfer_ratio",
    "chain_xfer_hist_ratio",
    # the iteration replayed without its slow transfers and slow compute gaps (each more than
    # 15 % and 3 robust std devs over its step's usual one taken back to it, the delays they
    # passed on through every wait recomputed): the share of this copy's duration they added,
    # and this copy against its stage step's copies as replayed (robust z): what a log can say
    # of the fault-free twin
    "replay_share",
    "replay_stage_z",
)

#: Ordinal code of each group kind (``group_kind_code``); anything else is ``other``.
GROUP_KIND_CODES: dict[str, int] = {"tp": 0, "dp": 1, "pp": 2, "ep": 3, "cp": 4, "other": 5}
#: Ordinal code of each op type (``op_code``): its index in :data:`holmes_ml.io.schema.OP_TYPES`.
OP_CODES: dict[str, int] = {op: i for i, op in enumerate(OP_TYPES)}

_REQUIRED = ("iteration", "rank", "op", "group", "seq", "nbytes", "start_ns", "duration_us")
_EPS_US = 1e-3  # 1 ns: denominators in microseconds never go below this
_COL = {name: i for i, name in enumerate(FEATURE_COLUMNS)}


@dataclass(frozen=True)
class FeatureConfig:
    """Knobs of :func:`build_features`.

    Parameters
    ----------
    window:
        Number of earlier occurrences of the same operator signature (normally one per
        iteration) whose statistics form the history features.
    min_spread:
        Floor of the standard deviation and IQR used as z-score / IQR-score denominators, as a
        fraction of the history median: a perfectly steady history would otherwise turn a 0.1 %
        wobble into an enormous score.
    clip:
        Scale-free features are clipped to ``[-clip, clip]`` so that a single absurd value
        (clock glitch) cannot dominate a model's split points or a drift statistic.
    history_regular_only:
        Build the ``hist_*`` features from regular iterations only (those the irregularity
        monitor does not flag). ``base_ratio`` and ``xfer_hist_ratio`` always are: under a
        persistent fault they keep comparing with the pre-fault baseline, while the plain
        history absorbs the slowdown after ``window`` iterations. Rows of irregular
        iterations still *get* history features either way.
    irregularity:
        How the iteration-time ratio's reference and the regular iterations are built (see
        :class:`~holmes_ml.features.iterations.IrregularityConfig`).
    chunk_rows:
        Rows whose history windows are sorted together (a ``chunk_rows x window`` float32
        matrix that stays in cache; speed, not results, depends on it).
    level_memory:
        Copies of a signature over which its *lowest level* is kept: the lowest history median
        (of at least 3 earlier copies) among its last ``level_memory`` copies, this one
        included. ``level_rise_frac`` is the history median's rise over that level and
        ``level_excess_frac`` this copy's excess over it, each as a fraction of this copy's
        duration; ``level_wait_excess_frac`` is the part of that excess not in the copy's
        transfer (which has its own lowest level, of its history medians alike): the wait a
        slow peer adds, where transfer drift raises the transfer; ``level_wait_z`` is that
        wait in the history's standard deviations. A persistent fault that lengthens every
        copy of an op alike is absorbed by the history after ``window / 2`` iterations, and
        by the lowest level only after ``level_memory + window / 2``. Streams need
        ``window + level_memory - 1`` iterations of context
        (:class:`~holmes_ml.features.FeatureStream`).
    chain_hops:
        How far the ``chain_*`` columns follow the waits behind a copy: the copy waited for
        its instance's last arrival, which came from that rank's previous op in the
        iteration, which waited for its own instance's last arrival, and so on; each column
        is the largest value of its source column over the first ``chain_hops`` such ops (0
        when the first has none). The bundled model learnt them at 16.
    stage_min_instances:
        The ``stage_step_*`` columns compare a copy with its op step on the ranks of its own
        pipeline stage when that stage holds at least this many instances of the step
        (collectives, or send/recv pairs); with fewer (two data-parallel replicas of eight
        tensor-parallel ranks: two all-reduces whose copies wait alike) a median and its
        absolute deviation say nothing, and the step is compared across every stage that
        reaches it at the same place, as before the stage was read off the communicators.
    replay_sweeps:
        How far down the chains of waits (within the iteration) the ``replay_*`` columns pass
        the time a slow transfer or a slow compute gap cost: one op per sweep, stopping once
        nothing moves. The iteration replayed without them is what a log can say of the job
        without its fault. An iteration's chains end, so this only bounds the work: the
        default is far beyond the longest chain of the simulator's jobs (a slow GPU's delay
        reaches the last data-parallel reduce-scatter of a 1,024-GPU LLaMA2-70B job some 100
        ops down; 64, the earlier default, stopped short of it).
    """

    window: int = 10
    min_spread: float = 0.01
    clip: float = 1e4
    history_regular_only: bool = False
    irregularity: IrregularityConfig = field(default_factory=IrregularityConfig)
    chunk_rows: int = 256
    level_memory: int = 20
    chain_hops: int = 16
    stage_min_instances: int = 4
    replay_sweeps: int = 4096

    def __post_init__(self) -> None:
        for name in ("window", "level_memory", "chain_hops", "stage_min_instances",
                     "replay_sweeps"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"FeatureConfig.{name}: got {value!r}; expected an int >= 1")
        if not (self.min_spread >= 0 and np.isfinite(self.min_spread)):
            raise ValueError(
                f"FeatureConfig.min_spread: got {self.min_spread!r}; expected a finite value >= 0"
            )
        if not self.clip > 0:
            raise ValueError(f"FeatureConfig.clip: got {self.clip!r}; expected a value > 0")
        if self.chunk_rows < 1:
            raise ValueError(
                f"FeatureConfig.chunk_rows: got {self.chunk_rows!r}; expected an int >= 1"
            )


# --------------------------------------------------------------------------- input
def _check_columns(ops: pd.DataFrame) -> None:
    if not isinstance(ops, pd.DataFrame):
        raise SchemaError(
            "build_features: not a table", value=type(ops).__name__,
            expected="a canonical CommOps pandas DataFrame",
        )
    missing = [c for c in _REQUIRED if c not in ops.columns]
    if missing:
        raise SchemaError(
            f"build_features: missing required column(s) {', '.join(missing)}",
            column=missing[0],
            expected="the canonical CommOps columns " + ", ".join(_REQUIRED)
            + " (run holmes_ml.io.schema.validate first)",
        )


def _op_codes(op: pd.Series) -> np.ndarray:
    # Factorize (cheap on categoricals and object columns alike), then map the few distinct
    # names; an unknown or missing name maps to -1.
    local, names = pd.factorize(op, sort=False, use_na_sentinel=True)
    table = np.array([OP_CODES.get(str(name), -1) for name in names] + [-1], dtype=np.int64)
    codes = table[local]  # the NA sentinel -1 reads the trailing -1
    if (codes < 0).any():
        i = int(np.flatnonzero(codes < 0)[0])
        raise SchemaError(
            "build_features: unknown op type", column="op", row=i, value=op.iloc[i],
            expected="one of " + ", ".join(OP_TYPES),
        )
    return codes


def _int_col(ops: pd.DataFrame, name: str) -> np.ndarray:
    col = ops[name]
    if isinstance(col.dtype, np.dtype) and col.dtype.kind == "f":
        # a cast would truncate 3.5 to 3 and turn NaN into -2**63 without a word
        v = col.to_numpy()
        bad = ~np.isfinite(v) | (v != np.round(v))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise SchemaError("build_features: not an integer", column=name, row=i,
                              value=float(v[i]),
                              expected="int64 values (run holmes_ml.io.schema.validate first)")
    try:
        return col.to_numpy(dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise SchemaError(
            f"build_features: column is not integer ({exc})", column=name,
            expected="int64 values (run holmes_ml.io.schema.validate first)",
        ) from exc


# --------------------------------------------------------------------------- history
_NETWORK_MAX = 32  # beyond this many lags sorting each window beats a comparator network


# computed after the others, in row order: (lag, wait, duration) over the history median
_ROW_ORDER_OUTPUTS = ("arrival_lag_rel", "wait_rel", "hist_ratio")
_HISTORY_OUTPUTS = HISTORY_KERNEL_OUTPUTS + _ROW_ORDER_OUTPUTS
_LEVEL_MIN_COPIES = 3  # a history median of fewer earlier copies is no level yet
_LEVEL_FLOOR_US = 1.0  # denominator floor of the level fractions: sub-us ops are noise


def _history(
    matrix: np.ndarray,
    values: np.ndarray,
    xfer: np.ndarray,
    wait: np.ndarray,
    sig: np.ndarray,
    iteration: np.ndarray,
    regular: np.ndarray,
    peer_med: np.ndarray,
    lag_us: np.ndarray,
    cfg: FeatureConfig,
) -> None:
    """History features of every row, written straight into ``matrix`` (features x rows).

    The statistics are over up to ``window`` earlier occurrences of each row's signature in
    rows where ``regular`` is true (see ``FeatureConfig.history_regular_only``). Rows are
    sorted by (signature, iteration) and the history rows compacted in that order, so the
    earlier occurrences of row ``i`` are the ``history_len`` compacted rows just before its
    place. A compiled loop (:func:`~holmes_ml.features._kernels.history_kernel`) sorts each
    window in float32 (the precision of the output) with a sorting network, a block of rows at
    a time, and writes every statistic, ratio and level into ``matrix`` in that order; they are
    then put in row order one feature row at a time. The one row-sized float64 kept is the
    median, by which the row-ordered lag, wait and duration are divided at the end.

    Without history the op's peers stand in for its past: the history statistics are the peer
    median, ratios become peer ratios and the spread-based scores are neutral (0).
    """
    n = len(values)
    w = int(cfg.window)
    order = seg.sort_by(sig, iteration)
    pairs = np.array(seg.sorting_network(w) if w <= _NETWORK_MAX else (), dtype=np.int64)
    out_rows = np.array([_COL[name] for name in HISTORY_KERNEL_OUTPUTS], dtype=np.int64)
    med_row = history_kernel(
        values[order], xfer[order], regular[order], sig[order], order, peer_med, w,
        pairs.reshape(-1, 2), bool(cfg.history_regular_only), int(cfg.level_memory),
        float(cfg.min_spread), float(cfg.clip), _EPS_US, _LEVEL_FLOOR_US, _LEVEL_MIN_COPIES,
        matrix, out_rows, int(cfg.chunk_rows))
    # One gather per feature row (order[j] is the row of sorted position j) beats a scatter
    # per feature; the temporary is a single row.
    back = np.empty(n, dtype=np.int64)
    back[order] = np.arange(n, dtype=np.int64)
    # (mode="clip", which never clips a permutation, gathers without numpy's bounds check and
    # into one reused row: 0.07 s for the 15 rows instead of 0.11 s)
    gathered = np.empty(n, dtype=matrix.dtype)
    for name in HISTORY_KERNEL_OUTPUTS:
        row = matrix[_COL[name]]
        np.take(row, back, out=gathered, mode="clip")
        row[:] = gathered
    del gathered
    # Ratios of row-ordered columns to the median: divided in row order, after one gather of
    # the medians, instead of in sorted order and each result permuted back.
    med_row = np.take(med_row, back, mode="clip")
    for name, col in zip(_ROW_ORDER_OUTPUTS, (lag_us, wait, values), strict=True):
        np.clip(np.divide(col, med_row), -cfg.clip, cfg.clip, out=matrix[_COL[name]],
                casting="same_kind")


# --------------------------------------------------------------------------- peers
def _peers(matrix: np.ndarray, written: set[str], instance: np.ndarray, start: np.ndarray,
           dur: np.ndarray, clip: float
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Arrival order and duration spread within each collective instance / P2P pair.

    Writes the peer columns (:data:`~holmes_ml.features._kernels.PEERS_KERNEL_OUTPUTS`) into
    ``matrix`` and returns ``(peer_median_us, arrival_lag_us, wait_us, instance, peer_min_us,
    last)`` (dense instance ids, the instance's shortest copy and the row of its last arrival,
    per row), which later features reuse. An instance's lags are from its earliest arrival;
    the wait is the time spent waiting for its last participant (someone else's fault), the
    rest of the duration the transfer itself; equal arrival times share the rank of the first
    of them, so that the result does not depend on row order. The instances are grouped by a
    counting sort and walked in a compiled loop
    (:func:`~holmes_ml.features._kernels.peers_kernel`).
    """
    sid = seg.dense(instance)  # dense instance ids by hashing (no sort)
    bound, rows = seg.group_layout(sid)
    median = seg.group_median(bound, rows, dur)
    out_rows = np.array([_COL[name] for name in PEERS_KERNEL_OUTPUTS], dtype=np.int64)
    peer_med, lag_us, wait_us, peer_min, last = peers_kernel(
        bound, rows, np.ascontiguousarray(start, dtype=np.int64),
        np.ascontiguousarray(dur, dtype=np.float64), median, _EPS_US, float(clip), matrix,
        out_rows)
    written.update(PEERS_KERNEL_OUTPUTS)
    return peer_med, lag_us, wait_us, sid, peer_min, last


def _same_step(
    put, step: np.ndarray, instance: np.ndarray, dur: np.ndarray, xfer: np.ndarray,
    peer_med: np.ndarray, peer_min: np.ndarray,
) -> None:
    """This copy against the same op step in the other groups of its kind.

    ``step`` identifies (iteration, group kind, op, seq, bytes): groups of one kind run the
    same sequence of ops, so e.g. every data-parallel reduce-scatter of one iteration's
    optimizer step shares it. The step's typical instance has the median of the instances'
    median durations (``step_ratio``, ``step_peer_ratio`` divide by it) and the median of
    their shortest copies - the one that waited least, i.e. about the transfer time
    (``step_xfer_ratio`` divides the copy's transfer part by it). A slow NIC or link prolongs
    every copy of the groups crossing it and no other group's: their history absorbs a
    persistent slowdown, and their peers are all slow alike, but the other groups of the same
    step are not. Medians are over instances (not copies), so one sort of the instances does.
    """
    n_inst = int(instance.max()) + 1 if len(instance) else 0
    # An instance's step is its rows' smallest step key (a send/recv pair holds two ops; the
    # order of rows must not matter); its peer median and shortest copy are the same on
    # every one of its rows.
    inst_step = seg.reduce_at(np.minimum, instance, step, n_inst, np.iinfo(np.int64).max)
    rep = np.empty(n_inst, dtype=np.int64)  # any one row of each instance
    rep[instance] = np.arange(len(instance), dtype=np.int64)
    step_of = seg.dense(inst_step)
    layout = seg.group_layout(step_of)  # (both medians')
    typical = seg.group_median(*layout, peer_med[rep])[step_of][instance]
    typical_xfer = seg.group_median(*layout, peer_min[rep])[step_of][instance]
    del rep, step_of, inst_step, layout
    typical = np.maximum(typical, _EPS_US)
    put("step_ratio", dur / typical)
    put("step_peer_ratio", peer_med / typical)
    put("step_xfer_ratio", xfer / np.maximum(typical_xfer, _EPS_US))


def _rank_timeline(
    it0: np.ndarray, rank0: np.ndarray, since_iter_ns: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per row: its place among its rank's ops of the iteration in start order, and the row of
    the op the rank started just before it (-1 for its first op of the iteration).

    ``since_iter_ns`` is the start relative to the iteration's start, small enough to pack with
    the (iteration, rank) code into one sort key.
    """
    return seg.places(seg.combine(it0, rank0), since_iter_ns)  # (it, rank): compact already


#: Group kinds whose members all run one pipeline stage's program (:func:`_stage_of`).
_STAGE_KINDS = np.array([GROUP_KIND_CODES[k] for k in ("tp", "dp", "ep", "cp")], dtype=np.int64)


def _stage_of(rank0: np.ndarray, gcode: np.ndarray, kind_code: np.ndarray) -> np.ndarray:
    """Per row, a code of its rank's pipeline stage, read off the communicators.

    Tensor-, data-, expert- and context-parallel groups never cross a pipeline stage (only the
    pipeline's sends and receives do), so the ranks they join, group by group, are one stage:
    the connected components of the rank-group graph over those groups. Ranks in no such group
    (a log without group kinds, or one rank per stage) share code 0, where only the place in
    the iteration separates stages. A job without pipeline parallelism is one component.
    """
    inner = np.isin(kind_code, _STAGE_KINDS)
    stage = np.zeros(len(rank0), dtype=np.int64)
    if not inner.any():
        return stage
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n_ranks = int(rank0.max()) + 1
    n_groups = int(gcode.max()) + 1
    pairs = pd.unique(rank0[inner] * n_groups + gcode[inner])  # one edge per (rank, group)
    nodes = n_ranks + n_groups
    ranks = pairs // n_groups
    graph = coo_matrix((np.ones(len(pairs), dtype=np.int8), (ranks, n_ranks + pairs % n_groups)),
                       shape=(nodes, nodes))
    _, label = connected_components(graph, directed=False)
    member = np.zeros(n_ranks, dtype=bool)
    member[ranks] = True
    per_rank = np.where(member, label[:n_ranks] + 1, 0)
    return per_rank[rank0]


def _crowded(key: np.ndarray, stage: np.ndarray, copies: np.ndarray, least: int) -> np.ndarray:
    """``stage``, 0 where the row's stage-step segment (``key``) holds fewer than ``least``
    instances: its rows over the copies one instance has there (``copies``: the group size of
    a collective, whose group lies within the stage; 1 for a send or receive)."""
    code = seg.dense(key)
    rows = np.bincount(code)[code]
    return np.where(rows >= least * np.maximum(copies, 1.0), stage, 0)


def _crowd(code: np.ndarray, values: np.ndarray, min_spread: float,
           layout: tuple[np.ndarray, np.ndarray] | None = None
           ) -> tuple[np.ndarray, np.ndarray]:
    """``(med, sd)`` per code of a dense ``code`` (every code 0 .. k-1 present): the median of
    its rows' ``values`` and their robust standard deviation (1.4826 x the median absolute
    deviation, floored at ``min_spread`` of the median and at 1 ns). ``layout``: the code's
    :func:`~holmes_ml.features._segments.group_layout`, if the caller has it."""
    bound, rows = seg.group_layout(code) if layout is None else layout
    if (bound[1:] == bound[:-1]).any():
        raise ValueError("_crowd: the codes are not dense")  # a programming error
    med, mad = seg.group_median_mad(bound, rows, values)
    sd = np.maximum(np.maximum(MAD_TO_SD * mad, min_spread * np.abs(med)), _EPS_US)
    return med, sd


def _stage_step(put, key: np.ndarray, dur: np.ndarray, min_spread: float,
                layout: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """This copy against every copy of the same op step on the ranks of its pipeline stage.

    ``key`` codes (op step, place in the rank's iteration, stage from :func:`_stage_of`)
    densely (every code 0 .. k-1 present: each row reads its crowd by its code). Ranks
    that run the same program - the ranks of one pipeline stage - hold an op step at the same
    place; other stages mostly hold it at other places (1F1B warm-up, different sends and
    receives), but not always (two middle stages can reach a tensor-parallel all-reduce at the
    same place), so the stage the communicators show is part of the key too. Their copies wait
    alike except where a fault passes a delay on; the ratio to the median and the robust
    z-score (1.4826 x the median absolute deviation as the standard deviation, floored at
    ``min_spread`` of the median) show how far outside that crowd a copy lies.
    """
    med, sd = _crowd(key, dur, min_spread, layout)
    put("stage_step_z", (dur - med[key]) / sd[key])
    put("stage_step_spread", (sd / np.maximum(np.abs(med), _EPS_US))[key])
    put("stage_step_ratio", dur / np.maximum(med, _EPS_US)[key])


#: a transfer or a compute gap more than this many times its step's usual one counts as slowed
#: (:func:`_replay`) ...
_REPLAY_SLOW = 1.15
#: ... when it is also this many robust standard deviations above its stage step's usual one
#: (the label's spread, ``holmes_ml.simulator.engine.ABNORMAL_SPREAD``): at 10 % jitter, 15 %
#: alone took a fifth of a healthy job's copies for slowed (``replay_share`` over 0.1)
_REPLAY_SPREAD = 3.0


def replay_gain(inst: np.ndarray, start_ns: np.ndarray, prev_op: np.ndarray,
                dur: np.ndarray, excess: np.ndarray, gap_excess: np.ndarray,
                sweeps: int) -> np.ndarray:
    """Per copy, how much shorter (us, 0 to its duration) it would have been had its
    iteration run without some transfers' and compute gaps' excess.

    ``inst`` is each copy's instance (non-negative codes: a collective, or a send and its
    receive), ``prev_op`` the row of the op its rank ran just before it (-1: none), ``excess``
    the part of each copy's transfer to take back and ``gap_excess`` the part of the gap between
    the previous op's end and this copy's start (its rank's compute). A rank reaches a copy
    earlier by as much as its previous op ended earlier plus the gap's excess; an instance
    starts at its latest arrival, so it starts earlier by how much that latest arrival moves;
    each copy ends earlier by that plus its own transfer's excess, and is shorter by its end's
    gain less its arrival's. Each sweep passes the gains one more op down the chains of waits;
    ``sweeps`` bounds them (they stop early once nothing moves).

    A copy that ended before its instance's latest arrival (a send that left before its
    receiver came) did not wait for it: its end moves with its own arrival (plus its own
    excess), not with its instance's start, while the others still wait for its arrival. So it
    is replayed twice: in its instance, and as a twin alone in an instance of its own (its
    arrival, its previous op), whose end the next op on its rank follows and whose gain is the
    copy's. The loop is compiled (:func:`~holmes_ml.features._kernels.replay_gain_kernel`).
    """
    def ints(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a, dtype=np.int64)

    def floats(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a, dtype=np.float64)

    return replay_gain_kernel(ints(inst), ints(start_ns), ints(prev_op), floats(dur),
                              floats(excess), floats(gap_excess), int(sweeps))


def _replay(put, inst: np.ndarray, start_ns: np.ndarray, prev_op: np.ndarray, dur: np.ndarray,
            xfer: np.ndarray, xfer_ratio: np.ndarray, code: np.ndarray, cfg: FeatureConfig,
            layout: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """The iteration as it would have run without its slow transfers and slow compute.

    A transfer more than :data:`_REPLAY_SLOW` times its step's typical one (``xfer_ratio``,
    ``step_xfer_ratio``) loses the excess, and so does a gap between a rank's previous op and
    this one (its compute) more than that over the median gap of its stage step (``code``, as
    :func:`_stage_step`), each only when it is also :data:`_REPLAY_SPREAD` robust standard
    deviations above its stage step's median (of the ratios, of the gaps): in a noisy cluster
    jitter alone passes 15 %, and the replay took a healthy job's jitter for slowdowns it then
    passed down every wait. :func:`replay_gain` passes the gains down the chains of waits
    (``FeatureConfig.replay_sweeps`` ops deep). ``replay_share`` is how much shorter the copy
    would have been, over its duration; ``replay_stage_z`` is the copy against its stage
    step's copies as replayed, in robust standard deviations. ``layout``: ``code``'s
    :func:`~holmes_ml.features._segments.group_layout`, if the caller has it."""
    layout = seg.group_layout(code) if layout is None else layout
    gap = compute_gaps_kernel(start_ns, prev_op, dur)
    # a gap or a transfer ratio is slowed past its stage step's ceiling: 15 % over the step's
    # usual value, and outside the spread jitter gives the step's copies
    usual, mad = seg.group_median_mad(*layout, gap)
    gap_ceiling = np.maximum(_REPLAY_SLOW * usual, usual + _REPLAY_SPREAD * MAD_TO_SD * mad)
    ratio_usual, ratio_mad = seg.group_median_mad(*layout, xfer_ratio)
    ratio_ceiling = np.maximum(_REPLAY_SLOW, ratio_usual + _REPLAY_SPREAD * MAD_TO_SD * ratio_mad)
    del mad, ratio_usual, ratio_mad
    excess, gap_excess = replay_excess_kernel(xfer, xfer_ratio, ratio_ceiling, gap, usual,
                                              gap_ceiling, code, prev_op)
    del gap, usual, gap_ceiling, ratio_ceiling
    gain = replay_gain(inst, start_ns, prev_op, dur, excess, gap_excess, cfg.replay_sweeps)
    del excess, gap_excess
    put("replay_share", gain / np.maximum(dur, _EPS_US))
    # in float32, as the sort reads it: near-equal values then tie exactly, and the crowd's
    # median does not depend on the rows' order
    fair = (dur - gain).astype(np.float32).astype(np.float64)
    med, sd = _crowd(code, fair, cfg.min_spread, layout)
    put("replay_stage_z", (dur - med[code]) / sd[code])


#: late_prev_* column <- the column of the last arrival's previous op it copies
_LATE_CAUSE_SOURCES = {"late_prev_stage_ratio": "stage_step_ratio",
                       "late_prev_xfer_ratio": "step_xfer_ratio",
                       "late_prev_xfer_hist_ratio": "xfer_hist_ratio"}


def _late_cause(hop: np.ndarray, matrix: np.ndarray, written: set[str]) -> None:
    """Features of the op that the instance's last arrival ran just before it (``hop``: its
    row, -1 for none).

    A copy waits for its instance's last arrival. Whether that rank came late by chance or
    because its own previous op was slow (a slow transfer, a receive that waited on a stage
    before it) is what separates a wait passed on by a fault from ordinary jitter - the
    localizer's backtracking, one hop deep, as features. A rank with no earlier op in the
    iteration gets neutral values (1).
    """
    none = hop < 0
    src = np.where(none, 0, hop)
    for name, source in _LATE_CAUSE_SOURCES.items():
        row = matrix[_COL[name]]  # the sources are clipped already: copied as they are
        matrix[_COL[source]].take(src, out=row)
        row[none] = 1.0
    written.update(_LATE_CAUSE_SOURCES)


#: chain_* column <- the column whose largest value along the chain of waits it holds
_CHAIN_SOURCES = {"chain_stage_ratio": "stage_step_ratio",
                  "chain_stage_z": "stage_step_z",
                  "chain_xfer_ratio": "step_xfer_ratio",
                  "chain_xfer_hist_ratio": "xfer_hist_ratio"}


def _chain_max(hop: np.ndarray, columns: list[np.ndarray], hops: int) -> list[np.ndarray]:
    """Per row and column, the largest value over the first ``hops`` rows of the chain
    ``row -> hop[row] -> hop[hop[row]] -> ...`` (``hop`` -1 ends a chain; 0 where the first
    hop already does, or where the largest is not finite), in the columns' common dtype
    (:func:`~holmes_ml.features._kernels.chain_max_kernel`; ``scripts/chain_context.py``
    reads other columns and depths with it)."""
    table = np.stack(columns)
    out = np.empty_like(table)
    rows = np.arange(len(columns), dtype=np.int64)
    chain_max_kernel(np.ascontiguousarray(hop, dtype=np.int64), table, rows, out, rows,
                     int(hops))
    return list(out)


def _wait_chain(hop: np.ndarray, matrix: np.ndarray, hops: int, written: set[str]) -> None:
    """Largest value of each source column over the first ``hops`` ops of the chain of waits
    behind every row (:data:`_CHAIN_SOURCES`, ``FeatureConfig.chain_hops``; 0 for none).

    One hop goes from a row to the op its instance's last arrival ran just before it
    (``hop``, the source of the ``late_prev_*`` columns). A persistent slow NIC or link makes
    a pipeline receive or a ring's all-reduce late several hops before the copy that waits,
    and its wait then looks like any other; the chain reaches back to the slow transfer.
    Hops stay within the iteration. Binary lifting: the largest value over 2^k hops and the
    row 2^k hops away are doubled k times and the set bits of ``hops`` joined, so the work is
    log2(hops) passes however long the chains
    (:func:`~holmes_ml.features._kernels.chain_max_kernel`).
    """
    # (straight from and into the matrix rows: no stacked copy of them)
    chain_max_kernel(np.ascontiguousarray(hop, dtype=np.int64), matrix,
                     np.array([_COL[s] for s in _CHAIN_SOURCES.values()], dtype=np.int64),
                     matrix, np.array([_COL[name] for name in _CHAIN_SOURCES], dtype=np.int64),
                     int(hops))
    written.update(_CHAIN_SOURCES)


# --------------------------------------------------------------------------- fixed facts
def _group_facts(ops: pd.DataFrame, gcode: np.ndarray, gnames: pd.Index, rank: np.ndarray):
    """Group size and kind code per row, computed once per distinct group."""
    n_groups = len(gnames)
    n = len(gcode)
    first = seg.reduce_at(np.minimum, gcode, np.arange(n, dtype=np.int64), n_groups, n)
    sizes = np.zeros(n_groups, dtype=np.float64)
    if "group_ranks" in ops.columns:
        # one member list per group, counted in Python: a few dozen strings on a node's
        # window, where a vectorised regex's fixed cost was most of this function's time
        listed = _first_text(ops["group_ranks"], first)
        sizes = np.array([len(t.split()) for t in listed], dtype=np.float64)
    if (sizes == 0).any():
        # No member list: count the distinct ranks seen logging the group.
        pairs = np.unique(seg.combine(gcode, rank))
        span = int(rank.max()) + 1
        seen = np.bincount(pairs // span, minlength=n_groups).astype(np.float64)
        if len(seen) != n_groups:  # combine() fell back to dense codes; recount directly
            seen = pd.Series(rank).groupby(gcode).nunique().reindex(
                range(n_groups), fill_value=0).to_numpy(dtype=np.float64)
        sizes = np.where(sizes > 0, sizes, seen)
    if "group_kind" in ops.columns:
        kinds = np.array([t.lower() for t in _first_text(ops["group_kind"], first)], dtype=object)
    else:
        kinds = np.full(n_groups, "", dtype=object)
    from holmes_ml.topology import kind_from_group_name

    codes = np.empty(n_groups, dtype=np.float64)
    for i, (kind, name) in enumerate(zip(kinds, gnames, strict=True)):
        k = kind if kind else kind_from_group_name(str(name))
        codes[i] = GROUP_KIND_CODES.get(k, GROUP_KIND_CODES["other"])
    return sizes[gcode], codes[gcode]


def _first_text(col: pd.Series, rows: np.ndarray) -> list[str]:
    """``col.iloc[rows].fillna("").astype(str)`` as a list (a categorical through its
    categories; a missing value is "")."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        cats = col.cat.categories
        return ["" if c < 0 else str(cats[c]) for c in col.cat.codes.to_numpy()[rows]]
    return [str(v) for v in col.iloc[rows].fillna("")]


# --------------------------------------------------------------------------- context
def _iteration_context(
    iteration: np.ndarray, rank: np.ndarray, start: np.ndarray, dur: np.ndarray,
    cfg: FeatureConfig,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: job-wide iteration time (:func:`iteration_times`) over its reference (only
    earlier iterations shape it), whether the row's iteration is regular, and when the
    iteration started (ns)."""
    codes = seg.unique_inverse(iteration)  # each row's place in uniq, without a search
    uniq, it_start, it_end, _ = iteration_spans(iteration, start, dur, codes)
    time_ns, _ = iteration_times(
        uniq, it_start, it_end, last_arrival_ns=last_arrivals(iteration, rank, start, codes)[1])
    # (uniq is increasing: the iteration order the monitor reads the times in)
    _, ratio, irregular = irregular_flags(np.asarray(time_ns / 1e9, dtype=np.float64),
                                          cfg.irregularity)
    where = codes[1]
    return ratio[where], ~irregular[where], it_start[where]


def _rank_latency(
    rank: np.ndarray, iteration: np.ndarray, dur: np.ndarray, window: int
) -> tuple[np.ndarray, np.ndarray]:
    """Mean op latency of this rank over its ``window`` previous iterations, and the ratio of
    the current iteration's mean to it."""
    key = seg.combine(rank - rank.min(), iteration - iteration.min())
    uniq, inv = seg.unique_inverse(key)  # sorted: by rank, then iteration
    total = np.bincount(inv, weights=dur, minlength=len(uniq))
    count = np.bincount(inv, minlength=len(uniq))
    per_iter = total / np.maximum(count, 1)
    ranks_u = np.empty(len(uniq), dtype=np.int64)
    ranks_u[inv] = rank
    _, _, pos = seg.segment_layout(ranks_u)
    csum = np.concatenate([[0.0], np.cumsum(per_iter)])
    k = np.minimum(pos, window)
    idx = np.arange(len(uniq))
    window_sum = csum[idx] - csum[idx - k]
    window_mean = np.where(k > 0, window_sum / np.maximum(k, 1), per_iter)
    ratio = per_iter / np.maximum(window_mean, _EPS_US)
    return window_mean[inv], ratio[inv]


# --------------------------------------------------------------------------- public
def _signature(it0: np.ndarray, rank0: np.ndarray, gcode: np.ndarray, opcode: np.ndarray,
               seq: np.ndarray, size_code: np.ndarray) -> np.ndarray:
    """Each op's signature: the same op of the same rank on the same communicator, at the same
    position among that rank's ops on it in the iteration (by sequence number), of the same
    size, in every iteration. Only grouped and sorted on (never used as an array index), so the
    packed key need not be dense unless it is too wide to pack with the iteration in one sort
    key (:func:`signature_codes` numbers it densely)."""
    irg = seg.combine(it0, rank0, gcode)  # only grouped on: need not be dense
    order = seg.sort_by(irg, seq)
    _, _, p = seg.segment_layout(irg[order])
    pos = np.empty(len(seq), dtype=np.int64)
    pos[order] = p
    del irg, order, p
    sig = seg.combine(rank0, gcode, opcode, pos, size_code)
    if int(sig.min()) < 0 or int(sig.max()) >= 1 << 40:
        sig = seg.dense(sig)
    return sig


def signature_codes(ops: pd.DataFrame) -> np.ndarray:
    """Each row's op signature as :func:`build_features` keys its history (rank, communicator,
    op, position among the rank's ops on that communicator in the iteration, size), numbered
    0 .. signatures - 1: for analyses that follow an op from iteration to iteration."""
    if not len(ops):
        return np.zeros(0, dtype=np.int64)
    iteration, rank = _int_col(ops, "iteration"), _int_col(ops, "rank")
    gcode = pd.factorize(ops["group"], sort=False)[0].astype(np.int64)
    return seg.dense(_signature(iteration - iteration.min(), rank - min(int(rank.min()), 0),
                                gcode, _op_codes(ops["op"]), _int_col(ops, "seq"),
                                seg.dense(_int_col(ops, "nbytes"))))


def build_features(ops: pd.DataFrame, cfg: FeatureConfig | None = None) -> pd.DataFrame:
    """Feature matrix of a canonical CommOps table, one row per operator.

    Parameters
    ----------
    ops:
        Canonical CommOps table (see :mod:`holmes_ml.io.schema`; run ``validate`` on foreign
        input first). Optional ``peer``, ``group_ranks`` and ``group_kind`` columns are used
        when present. Label columns are ignored.
    cfg:
        See :class:`FeatureConfig`; defaults to ``FeatureConfig()``.

    Returns
    -------
    pandas.DataFrame
        ``float32`` columns :data:`FEATURE_COLUMNS` (in that order) with the same index as
        ``ops``; never NaN or infinite. Rows without history (first occurrence of a signature)
        have ``history_len = 0``, history statistics equal to the peer median, zero scores and
        ``xfer_hist_ratio = 1``. Features of iteration ``k`` only read iterations ``<= k``.

    Raises
    ------
    SchemaError
        Missing required column, non-integer key column or unknown op type.

    Examples
    --------
    >>> import pandas as pd
    >>> ops = pd.DataFrame({"iteration": [0, 0], "rank": [0, 1], "op": ["all_reduce"] * 2,
    ...                     "group": ["dp-0"] * 2, "seq": [0, 0], "nbytes": [1024] * 2,
    ...                     "start_ns": [0, 4000], "duration_us": [5.0, 1.0]})
    >>> f = build_features(ops)
    >>> f["arrived_last"].tolist(), f["arrival_lag_us"].tolist()
    ([0.0, 1.0], [0.0, 4.0])
    """
    cfg = cfg or FeatureConfig()
    _check_columns(ops)
    n = len(ops)
    # Column-major storage: each feature fills one contiguous row of ``matrix`` and pandas
    # takes ``matrix.T`` as its single float32 block without copying. Every row is written
    # whole (``written`` checks that each was), so the memory is not zeroed first.
    matrix = np.empty((len(FEATURE_COLUMNS), n), dtype=np.float32)
    if n == 0:
        return pd.DataFrame(matrix.T, columns=list(FEATURE_COLUMNS), index=ops.index)

    iteration = _int_col(ops, "iteration")
    rank = _int_col(ops, "rank")
    seq = _int_col(ops, "seq")
    nbytes = _int_col(ops, "nbytes")
    start = _int_col(ops, "start_ns")
    dur = ops["duration_us"].to_numpy(dtype=np.float64)
    bad = ~np.isfinite(dur)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SchemaError(
            "build_features: not a finite duration", column="duration_us", row=i,
            value=float(dur[i]), expected="a finite number of microseconds",
        )
    opcode = _op_codes(ops["op"])
    gcode_raw, gnames = pd.factorize(ops["group"], sort=False)
    gcode = gcode_raw.astype(np.int64)
    peer = _int_col(ops, "peer") if "peer" in ops.columns else np.full(n, -1, dtype=np.int64)
    is_p2p = opcode >= OP_CODES["send"]
    it0 = iteration - iteration.min()
    rank0 = rank - min(int(rank.min()), 0)

    size_code = seg.dense(nbytes)
    sig = _signature(it0, rank0, gcode, opcode, seq, size_code)
    time_cols = frozenset(TIME_FEATURES)
    written: set[str] = set()

    def put(name: str, values: np.ndarray) -> None:
        written.add(name)
        # Each column goes into the float32 matrix as soon as it exists, so that float64
        # temporaries do not pile up (peak memory, and page faults, scale with them).
        if name in time_cols:
            with np.errstate(over="ignore"):  # float32 overflow -> inf, repaired at the end
                matrix[_COL[name]] = values
        else:  # clipped straight into the matrix row: no float64 temporary
            np.clip(values, -cfg.clip, cfg.clip, out=matrix[_COL[name]], casting="same_kind")

    put("duration_us", dur)
    put("op_code", opcode)
    put("is_p2p", is_p2p)
    put("log2_bytes", np.log2(nbytes.astype(np.float64) + 1.0))
    sizes, kinds = _group_facts(ops, gcode, gnames, rank)
    put("group_size", sizes)
    put("group_kind_code", kinds)
    kind_code = kinds.astype(np.int64)
    del sizes, kinds
    ratio, regular, it_start = _iteration_context(iteration, rank, start, dur, cfg)
    put("iter_time_ratio", ratio)
    del ratio
    place, prev_op = _rank_timeline(it0, rank0, start - it_start)
    del it_start
    rank_mean, rank_ratio = _rank_latency(rank, iteration, dur, int(cfg.window))
    put("rank_window_mean_us", rank_mean)
    put("rank_latency_ratio", rank_ratio)
    del rank_mean, rank_ratio

    # Collective instance, or a send and its matching recv (directional src -> dst pair).
    is_send = opcode == OP_CODES["send"]
    # A P2P op whose peer is unknown (-1) pairs by (group, seq) alone: src = dst = 0.
    known = is_p2p & (peer >= 0)
    src = np.where(known, np.where(is_send, rank, peer) + 1, 0)
    dst = np.where(known, np.where(is_send, peer, rank) + 1, 0)
    del known
    instance = seg.combine(it0, gcode, seq - seq.min(), src, dst)
    del src, dst, is_send
    peer_med, lag_us, wait_us, inst, peer_min, last = _peers(matrix, written, instance, start,
                                                             dur, cfg.clip)
    del instance
    xfer_us = dur - wait_us
    put("wait_us", wait_us)
    put("xfer_us", xfer_us)
    step = seg.combine(it0, kind_code, opcode, seq - seq.min(), size_code)
    _same_step(put, step, inst, dur, xfer_us, peer_med, peer_min)
    del peer_min
    at = seg.combine(step, place)
    del step, place, size_code
    stage = _stage_of(rank0, gcode, kind_code)
    copies = np.where(is_p2p, 1.0, matrix[_COL["group_size"]])  # per instance, on one stage
    stage = _crowded(seg.combine(at, stage), stage, copies, cfg.stage_min_instances)
    step_code = seg.dense(seg.combine(at, stage))
    layout = seg.group_layout(step_code)  # (the crowds of both, and the replay's gaps)
    _stage_step(put, step_code, dur, cfg.min_spread, layout)
    _replay(put, inst, start, prev_op, dur, xfer_us, matrix[_COL["step_xfer_ratio"]].astype(
        np.float64), step_code, cfg, layout)
    del step_code, inst, at, stage, copies, layout

    _history(matrix, dur, xfer_us, wait_us, sig, it0, regular, peer_med, lag_us, cfg)
    written.update(_HISTORY_OUTPUTS)
    hop = prev_op.take(last)  # the op each copy's wait goes back to (-1: none)
    del last, prev_op
    _late_cause(hop, matrix, written)
    _wait_chain(hop, matrix, int(cfg.chain_hops), written)
    del hop
    if len(written) != len(FEATURE_COLUMNS):  # a programming error, not bad input
        raise RuntimeError(f"features not computed: {set(FEATURE_COLUMNS) - written}")
    # Belt and braces: a float32 overflow of an absurd raw time must not leak inf downstream.
    # (A sum is non-finite if any value is, and several times cheaper to take than isfinite;
    # a finite matrix whose float32 sum overflows merely runs the no-op repair.)
    with np.errstate(over="ignore", invalid="ignore"):
        total = matrix.sum()
    if not np.isfinite(total):
        big = float(np.finfo(np.float32).max)
        np.nan_to_num(matrix, copy=False, nan=0.0, posinf=big, neginf=-big)
    return pd.DataFrame(matrix.T, columns=list(FEATURE_COLUMNS), index=ops.index, copy=False)
