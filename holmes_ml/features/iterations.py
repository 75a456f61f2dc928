"""Iteration monitor: job-wide iteration times and the delta-irregular iterations among them.

Holmes only starts localizing when the job as a whole slows down: an iteration is *irregular* when
it takes more than ``delta`` times a robust reference built from earlier regular iterations. This
module turns the CommOps table into one row per iteration, flags irregular iterations, groups them
into episodes and names each episode's pattern (spike, fluctuation, persistent).

The number of iterations is small (thousands, not millions), so the sequential reference update
below loops over iterations in Python; everything per operator is vectorized.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from dataclasses import dataclass

import numpy as np
import pandas as pd

from holmes_ml.features._segments import reduce_at, unique_inverse
from holmes_ml.io.schema import SchemaError

logger = logging.getLogger(__name__)

#: Columns of :func:`iteration_table` (indexed by ``iteration``). ``time_us`` is ``duration_s``
#: in microseconds, the unit of every other time in the CommOps schema; ``end_to_end`` says the
#: iteration was timed from the previous one's end (:func:`iteration_times`).
ITERATION_COLUMNS: tuple[str, ...] = (
    "start_ns", "end_ns", "duration_s", "time_us", "n_ops", "end_to_end")
#: Columns :func:`detect_irregular` adds.
IRREGULARITY_COLUMNS: tuple[str, ...] = (
    "reference_s",
    "reference_us",
    "ratio",
    "irregular",
    "episode",
    "pattern",
)
#: Episode patterns :func:`detect_irregular` reports; regular iterations get ``""``.
PATTERNS: tuple[str, ...] = ("", "spike", "fluctuation", "persistent")


def _require(df: pd.DataFrame, columns: tuple[str, ...], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise SchemaError(
            f"{what}: missing column(s) {', '.join(missing)}",
            column=missing[0],
            expected="columns " + ", ".join(columns),
        )


def _empty_table() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "start_ns": np.empty(0, np.int64),
            "end_ns": np.empty(0, np.int64),
            "duration_s": np.empty(0, np.float64),
            "time_us": np.empty(0, np.float64),
            "n_ops": np.empty(0, np.int64),
            "end_to_end": np.empty(0, bool),
        },
        index=pd.Index(np.empty(0, np.int64), name="iteration"),
    )


def iteration_spans(
    it: np.ndarray, start: np.ndarray, dur: np.ndarray,
    codes: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Array core of :func:`iteration_table`: ``(iterations, start_ns, end_ns, n_ops)``.

    Takes int64 ``iteration`` and ``start_ns`` and float ``duration_us`` arrays (already
    checked); feature extraction calls it directly to avoid building a DataFrame, with
    ``codes``, the iterations' ``unique_inverse``, which it has already.
    """
    # An absurd duration (> 30 years) must not overflow int64 nanoseconds.
    end = start + np.rint(np.minimum(dur * 1e3, 1e18)).astype(np.int64)
    # Reductions over dense iteration codes: iterations are few, ops are many.
    uniq, code = unique_inverse(it) if codes is None else codes
    n = len(uniq)
    it_start = reduce_at(np.minimum, code, start, n, np.iinfo(np.int64).max)
    it_end = reduce_at(np.maximum, code, end, n, np.iinfo(np.int64).min)
    n_ops = np.bincount(code, minlength=n).astype(np.int64)
    return uniq.astype(np.int64), it_start, it_end, n_ops


def last_arrivals(it: np.ndarray, rank: np.ndarray, start: np.ndarray,
                  codes: tuple[np.ndarray, np.ndarray] | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Per iteration (increasing): when its last rank arrived, the latest over its ranks of
    each rank's first start (int64 ns); ``(iterations, last_arrival_ns)``. ``codes``: the
    iterations' ``unique_inverse``, if the caller has it.

    >>> last_arrivals(np.array([0, 0, 0, 1]), np.array([0, 1, 1, 0]), np.array([5, 9, 7, 20]))
    (array([0, 1]), array([ 7, 20]))
    """
    uniq, code = unique_inverse(it) if codes is None else codes
    rank = np.asarray(rank, dtype=np.int64)
    if len(rank) and 0 <= int(rank.min()) and int(rank.max()) < 4 * len(rank) + 1024:
        rank_code = rank  # global ranks are codes already (a rank absent is an empty column)
    else:
        rank_code = pd.factorize(rank, sort=False)[0].astype(np.int64)
    n_it, n_rank = len(uniq), (int(rank_code.max()) + 1 if len(rank_code) else 1)
    absent = np.iinfo(np.int64).max
    if n_it * n_rank <= 1 << 26:
        # a dense (iteration x rank) grid: no sort over the rows (iterations and ranks are few)
        first = reduce_at(np.minimum, code * n_rank + rank_code, start, n_it * n_rank, absent)
        grid = first.reshape(n_it, n_rank)
        grid[grid == absent] = np.iinfo(np.int64).min  # a rank not in the iteration
        return uniq.astype(np.int64), grid.max(axis=1)
    keys, inv = np.unique(code * n_rank + rank_code, return_inverse=True)
    first = reduce_at(np.minimum, inv.ravel(), start, len(keys), absent)
    last = reduce_at(np.maximum, keys // n_rank, first, n_it, np.iinfo(np.int64).min)
    return uniq.astype(np.int64), last


#: An iteration whose operators (first start to last end over its ranks) cover less than this
#: share of its step, measured end to end, is timed end to end (:func:`iteration_times`); so is
#: one whose operators from its last rank's arrival on do.
SPAN_FRACTION = 0.5


def iteration_times(
    iterations: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray,
    span_fraction: float = SPAN_FRACTION, last_arrival_ns: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """How long each iteration took, in nanoseconds, and whether it was timed end to end.

    An iteration's time is its *span*, from the first start to the last end of its operators
    over all ranks, unless that span is less than ``span_fraction`` of the time from the
    previous iteration's last end to its own: then it is that end-to-end time. Where operators
    fill the step (tensor or pipeline parallelism: their spans overlap the neighbouring steps),
    the span is the step. Where they come at its end (pure data parallelism: one gradient
    all-reduce after the compute), the span is that all-reduce and its arrival spread, a small
    and noisy part of the step (a healthy 8-rank gloo job: 0.14 of it, 8 of 20 iterations
    10 % "slower" than the ones before), and a slow step shows only end to end.

    Given each iteration's last arrival (:func:`last_arrivals`), an iteration whose operators
    from that arrival on cover less than ``span_fraction`` of its step is timed end to end too:
    in a data-parallel step a straggler's peers wait at the all-reduce for it, and that wait
    alone would stretch the span to half the step, which then timed a step twice as long as
    usual by a span as long as a usual step (a 2x slow GPU of an 8-rank job went unseen).

    Each iteration reads itself and the one before (after missing iterations the end-to-end
    time is shared evenly over the steps in between), so a stream of batches that keeps the
    previous iteration gets the same times. The first iteration is timed by its span.

    Parameters
    ----------
    iterations, start_ns, end_ns:
        Per iteration, increasing: its number, its first start and its last end (int64 ns), as
        :func:`iteration_spans` returns them.
    span_fraction:
        See :data:`SPAN_FRACTION`.
    last_arrival_ns:
        Optional, per iteration: its last rank's first start (:func:`last_arrivals`).

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        Float64 nanoseconds and a bool array: timed end to end.

    Examples
    --------
    >>> import numpy as np
    >>> t, e2e = iteration_times(np.array([0, 1, 2]), np.array([90, 190, 300]),
    ...                          np.array([100, 200, 310]))
    >>> t.tolist(), e2e.tolist()
    ([10.0, 100.0, 110.0], [False, True, True])
    """
    span = (end_ns - start_ns).astype(np.float64)
    if len(span) < 2:
        return span, np.zeros(len(span), dtype=bool)
    steps = np.maximum(np.diff(iterations), 1).astype(np.float64)
    step = np.concatenate([[np.nan], np.diff(end_ns).astype(np.float64) / steps])
    end_to_end = step > 0  # False for the first iteration (NaN)
    covered = span
    if last_arrival_ns is not None:
        covered = np.minimum(span, (end_ns - last_arrival_ns).astype(np.float64))
    end_to_end[end_to_end] = covered[end_to_end] < span_fraction * step[end_to_end]
    return np.where(end_to_end, step, span), end_to_end


def span_times(spans: pd.DataFrame, start: str = "start_ns", end: str = "end_ns",
               last: str | None = None) -> tuple[pd.Series, np.ndarray]:
    """:func:`iteration_times` of a table of iteration spans (indexed by iteration, increasing;
    int64 ns columns ``start`` and ``end``, and optionally ``last``, the last rank's arrival):
    the times in nanoseconds as a Series on the same index, and which were timed end to end."""
    time_ns, end_to_end = iteration_times(
        spans.index.to_numpy(dtype=np.int64), spans[start].to_numpy(dtype=np.int64),
        spans[end].to_numpy(dtype=np.int64),
        last_arrival_ns=spans[last].to_numpy(dtype=np.int64) if last is not None else None)
    return pd.Series(time_ns, index=spans.index), end_to_end


def iteration_table(ops: pd.DataFrame) -> pd.DataFrame:
    """Job-wide timing of every iteration.

    An iteration spans from the earliest start of any operator of any rank to the latest end
    (``start_ns + duration_us``) of any operator of any rank. Ranks missing from an iteration
    (sampled or partial logs) simply do not contribute; an iteration with one logged op is fine.
    Its time (``duration_s``, ``time_us``) is that span, or the time from the previous
    iteration's end to its own where the span is a small part of that
    (:func:`iteration_times`: operators only at the end of each step, as with pure data
    parallelism); ``end_to_end`` says which.

    Parameters
    ----------
    ops:
        Canonical CommOps table (needs ``iteration``, ``start_ns``, ``duration_us``). Row order
        does not matter.

    Returns
    -------
    pandas.DataFrame
        Indexed by ``iteration`` (int64, increasing) with columns ``start_ns``, ``end_ns``
        (int64), ``duration_s`` (the iteration's time in seconds: ``(end_ns - start_ns) / 1e9``
        unless ``end_to_end``), ``time_us`` (the same in microseconds), ``n_ops`` (operators
        logged in the iteration) and ``end_to_end`` (bool: timed from the previous
        iteration's end).

    Raises
    ------
    SchemaError
        When a needed column is missing.

    Examples
    --------
    >>> import pandas as pd
    >>> ops = pd.DataFrame({"iteration": [1, 0, 0, 1], "start_ns": [1000, 0, 500, 1200],
    ...                     "duration_us": [0.1, 0.2, 0.3, 0.5]})
    >>> t = iteration_table(ops)
    >>> t.index.tolist(), t["end_ns"].tolist(), t["n_ops"].tolist()
    ([0, 1], [800, 1700], [2, 2])
    """
    if not isinstance(ops, pd.DataFrame):
        raise SchemaError(
            "iteration_table: not a table", value=type(ops).__name__,
            expected="a canonical CommOps pandas DataFrame",
        )
    _require(ops, ("iteration", "start_ns", "duration_us"), "iteration_table")
    if len(ops) == 0:
        return _empty_table()
    it = ops["iteration"].to_numpy(dtype=np.int64)
    start = ops["start_ns"].to_numpy(dtype=np.int64)
    dur = ops["duration_us"].to_numpy(dtype=np.float64)
    bad = ~np.isfinite(dur)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SchemaError(
            "iteration_table: not a finite duration", column="duration_us", row=i,
            value=float(dur[i]), expected="a finite number of microseconds",
        )
    uniq, it_start, it_end, n_ops = iteration_spans(it, start, dur)
    last = (last_arrivals(it, ops["rank"].to_numpy(dtype=np.int64), start)[1]
            if "rank" in ops.columns else None)
    time_ns, end_to_end = iteration_times(uniq, it_start, it_end, last_arrival_ns=last)
    return pd.DataFrame(
        {
            "start_ns": it_start,
            "end_ns": it_end,
            "duration_s": time_ns / 1e9,
            "time_us": time_ns / 1e3,
            "n_ops": n_ops,
            "end_to_end": end_to_end,
        },
        index=pd.Index(uniq.astype(np.int64), name="iteration"),
    )


@dataclass(frozen=True)
class IrregularityConfig:
    """How :func:`detect_irregular` decides that an iteration is irregular.

    Parameters
    ----------
    delta:
        An iteration is irregular when ``time > delta * reference``. The default 1.1 follows
        Holmes: below about 1.04 ordinary iteration jitter (data-dependent compute, GC, clock
        noise: typically 1-3 %) crosses the threshold often enough that alarms stop meaning
        anything, while real faults usually cost well over 10 %.
    window:
        Number of earlier *regular* iterations whose median is the reference. A rolling median
        follows slow drift (a job getting 10 % slower over hundreds of iterations is not
        flagged) but, because irregular iterations never enter it, a persistent step stays
        flagged from its onset to its end.
    min_history:
        Iterations judged before this many regular iterations exist are never flagged; their
        reference is the median of the iterations so far, themselves included.
    spike_max:
        Longest episode (consecutive irregular iterations) still called a ``spike``.
    persistent_min:
        Episodes at least this long are ``persistent`` whatever surrounds them. An isolated
        episode longer than ``spike_max`` is ``persistent`` too (a sustained slowdown that ended).
    fluctuation_gap:
        Short episodes (fewer than ``persistent_min`` iterations) with another short episode at
        most this many regular iterations away are ``fluctuation``: irregular iterations
        interleaved with normal ones.
    """

    delta: float = 1.1
    window: int = 20
    min_history: int = 3
    spike_max: int = 2
    persistent_min: int = 10
    fluctuation_gap: int = 5

    def __post_init__(self) -> None:
        if not (np.isfinite(self.delta) and self.delta > 1.0):
            raise ValueError(f"IrregularityConfig.delta: got {self.delta!r}; expected a number > 1")
        for name in ("window", "min_history", "spike_max", "persistent_min"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"IrregularityConfig.{name}: got {value!r}; expected an int >= 1")
        if self.fluctuation_gap < 0:
            raise ValueError(
                f"IrregularityConfig.fluctuation_gap: got {self.fluctuation_gap!r}; "
                "expected an int >= 0"
            )
        if self.persistent_min <= self.spike_max:
            raise ValueError(
                f"IrregularityConfig.persistent_min: got {self.persistent_min!r}; expected more "
                f"than spike_max={self.spike_max}"
            )


def _references(times: np.ndarray, config: IrregularityConfig) -> tuple[np.ndarray, np.ndarray]:
    n = len(times)
    reference = np.empty(n, dtype=np.float64)
    irregular = np.zeros(n, dtype=bool)
    history: deque[float] = deque(maxlen=config.window)
    # statistics.median of a few floats: numpy's median of each window costs many times as much
    # (its fixed cost per call; a node's summary pays this every window) for the same value
    for i in range(n):
        if len(history) >= config.min_history:
            ref = statistics.median(history)
            reference[i] = ref
            irregular[i] = times[i] > config.delta * ref
        else:
            # Warm-up: never flagged; the reference is what is known so far (this iteration
            # included) so that no iteration's ratio depends on later ones.
            reference[i] = statistics.median([*history, float(times[i])])
        if not irregular[i]:
            history.append(float(times[i]))
    return reference, irregular


def _episodes(irregular: np.ndarray, config: IrregularityConfig) -> tuple[np.ndarray, np.ndarray]:
    """Episode id and pattern of every iteration (``-1`` / ``""`` for regular ones)."""
    n = len(irregular)
    episode = np.full(n, -1, dtype=np.int64)
    pattern = np.full(n, "", dtype=object)
    if not irregular.any():
        return episode, pattern
    padded = np.concatenate([[False], irregular, [False]]).astype(np.int8)
    edges = np.diff(padded)
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)  # exclusive
    lengths = ends - starts
    short = lengths < config.persistent_min
    gaps = starts[1:] - ends[:-1]
    # A short episode is part of a fluctuation when another short episode is close by.
    near_prev = np.concatenate([[False], (gaps <= config.fluctuation_gap) & short[:-1]])
    near_next = np.concatenate([(gaps <= config.fluctuation_gap) & short[1:], [False]])
    near = short & (near_prev | near_next)
    names = np.where(
        ~short, "persistent",
        np.where(near, "fluctuation", np.where(lengths <= config.spike_max, "spike", "persistent")),
    )
    seg_id = np.cumsum(edges[:-1] == 1) - 1
    episode = np.where(irregular, seg_id, -1).astype(np.int64)
    pattern = np.where(irregular, names[np.maximum(seg_id, 0)], "").astype(object)
    return episode, pattern


def irregular_flags(times: np.ndarray, cfg: IrregularityConfig | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Array core of :func:`detect_irregular`: of iteration times in seconds (in iteration
    order), each one's reference, its ratio to it (1 where undefined) and whether it is
    irregular. The scoring paths call it directly: a node pays the monitor every window, and
    the table around it cost more than the monitor.

    Raises
    ------
    SchemaError
        A non-finite or negative time.
    """
    cfg = cfg or IrregularityConfig()
    bad = ~np.isfinite(times) | (times < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SchemaError(
            "detect_irregular: bad iteration duration", column="duration_s", row=i,
            value=float(times[i]), expected="a finite duration >= 0 in seconds",
        )
    reference, irregular = _references(times, cfg)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(reference > 0, times / reference, 1.0)
    return reference, np.nan_to_num(ratio, nan=1.0, posinf=1.0), irregular


def detect_irregular(
    ops_or_iteration_table: pd.DataFrame, cfg: IrregularityConfig | None = None
) -> pd.DataFrame:
    """Flag delta-irregular iterations, group them into episodes and name their pattern.

    Parameters
    ----------
    ops_or_iteration_table:
        Either a canonical CommOps table (anything with ``duration_us``; it goes through
        :func:`iteration_table` first) or an iteration table (``duration_s`` column, iteration
        as the index or as an ``iteration`` column).
    cfg:
        See :class:`IrregularityConfig`; defaults to ``IrregularityConfig()``.

    Returns
    -------
    pandas.DataFrame
        The iteration table indexed by ``iteration`` (increasing), plus ``reference_s`` (median
        of up to ``window`` earlier *regular* iteration durations), ``reference_us`` (the same in
        microseconds), ``ratio`` (``duration_s / reference_s``, 1 when undefined),
        ``irregular`` (bool), ``episode`` (0, 1, ... per maximal run of irregular iterations,
        -1 for regular ones) and ``pattern``: ``"spike"`` (an isolated run of at most
        ``spike_max`` iterations), ``"fluctuation"`` (short runs interleaved with regular
        iterations), ``"persistent"`` (a long run) or ``""`` for regular iterations.

    Raises
    ------
    SchemaError
        Missing column or a non-finite / negative duration.

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame({"duration_s": [1.0] * 5 + [1.5] + [1.0] * 2})
    >>> out = detect_irregular(t)
    >>> out.index[out["irregular"]].tolist(), out.loc[5, "pattern"]
    ([5], 'spike')
    """
    cfg = cfg or IrregularityConfig()
    if not isinstance(ops_or_iteration_table, pd.DataFrame):
        raise SchemaError(
            "detect_irregular: not a table", value=type(ops_or_iteration_table).__name__,
            expected="a CommOps or iteration-table pandas DataFrame",
        )
    if "duration_s" in ops_or_iteration_table.columns:
        out = ops_or_iteration_table.copy()
        if "iteration" in out.columns:
            out = out.set_index("iteration")
        out.index = pd.Index(out.index.to_numpy(dtype=np.int64), name="iteration")
        out = out.sort_index(kind="stable")
    elif "duration_us" in ops_or_iteration_table.columns:
        out = iteration_table(ops_or_iteration_table)
    else:
        raise SchemaError(
            "detect_irregular: neither an iteration table nor a CommOps table",
            column="duration_s",
            expected="an iteration table with 'duration_s' (see iteration_table) or CommOps "
            "columns iteration, start_ns, duration_us",
        )
    reference, ratio, irregular = irregular_flags(out["duration_s"].to_numpy(dtype=np.float64),
                                                  cfg)
    episode, pattern = _episodes(irregular, cfg)
    out["reference_s"] = np.nan_to_num(reference, nan=0.0)
    out["reference_us"] = out["reference_s"].to_numpy() * 1e6
    out["ratio"] = ratio
    out["irregular"] = irregular
    out["episode"] = episode
    out["pattern"] = pd.Series(pattern, index=out.index, dtype=object).astype(str)
    n_irr = int(irregular.sum())
    if n_irr:
        # debug: feature extraction runs the monitor too, for its iteration-time context;
        # the callers that report irregular iterations log their own summary.
        logger.debug(
            "%d of %d iterations irregular (delta=%.3g) in %d episode(s)",
            n_irr, len(out), cfg.delta, int(episode.max()) + 1,
        )
    return out
