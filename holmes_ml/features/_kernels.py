"""Loops compiled with numba, for the steps of feature extraction that numpy can only express as
many passes over every row.

* :func:`replay_gain_kernel`: the replay passes each copy's gain to the copies that waited for
  it, a sweep at a time, until nothing moves; in numpy every sweep was a dozen passes, each a
  fresh array, in a loop it is one walk over what moved.
* :func:`history_kernel`: each row's window of earlier copies sorted in cache, a block of rows
  at a time, and every statistic, ratio and lowest level written in one pass.
* :func:`peers_kernel`: each collective instance's copies walked once for arrival order, lags
  and duration spread.
* :func:`group_rows_kernel`: rows grouped by a counting sort; each group's median (and median
  absolute deviation) found without a sort of every row: :func:`packed_median_kernel` and
  :func:`float_median_kernel` sort a block of small groups at a time with a sorting network,
  branch-free, :func:`group_median_kernel` selects in one group at a time;
  :func:`places_kernel`: each row's place in its group (a rank's timeline).
* :func:`chain_max_kernel`: the chain of waits' binary lifting, a row's columns side by side;
  :func:`compute_gaps_kernel` and :func:`replay_excess_kernel`: the replay's inputs.

Each computes exactly what the vectorized numpy it replaced computed (the same float operations
in the same order), so the features are the same bit for bit; the tests compare them with pandas
and sort-based references. Kernels are compiled on their first call and cached next to this file
(``cache=True``; numba falls back to a per-user cache directory where the package is read-only):
the first call on a machine pays about 10 s for all of them, later processes load them in about
a quarter of a second.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import literal_unroll

_F32_MAX = float(np.finfo(np.float32).max)

__all__ = ["HISTORY_KERNEL_OUTPUTS", "PEERS_KERNEL_OUTPUTS", "chain_max_kernel",
           "compute_gaps_kernel", "float_median_kernel", "group_median_kernel",
           "group_rows_kernel", "history_kernel", "pack_kernel", "packed_median_kernel",
           "peers_kernel", "places_kernel", "replay_excess_kernel", "replay_gain_kernel",
           "scatter_reduce_kernel"]


@numba.njit(cache=True, nogil=True)
def replay_gain_kernel(inst, start_ns, prev_op, dur, excess, gap_excess, sweeps):
    """:func:`holmes_ml.features.build.replay_gain` (see its docstring for the rule), on int64
    ``inst`` (non-negative), ``start_ns`` and ``prev_op`` and float64 ``dur``, ``excess`` and
    ``gap_excess``, all contiguous and of one length.

    The copies that ended before their instance's latest arrival get a twin: an extra copy
    alone in an instance of its own, with the copy's arrival and previous op, which the next op
    of its rank follows instead of the copy. The work then runs on the copies and the twins in
    instance order, each instance's copies contiguous, and each instance's followers (the
    copies whose previous op is one of its copies) contiguous with what their update reads. A
    sweep recomputes only the instances one of whose followers' previous instance moved in the
    sweep before: the result of full sweeps (Jacobi: every sweep reads the shifts of the one
    before), bit for bit.
    """
    n = len(dur)
    out = np.empty(n)
    if n == 0:
        return out
    k = 0
    for i in range(n):
        k = max(k, inst[i] + 1)
    latest_ns = np.full(k, np.iinfo(np.int64).min)
    first_ns = start_ns[0]
    for i in range(n):
        latest_ns[inst[i]] = max(latest_ns[inst[i]], start_ns[i])
        first_ns = min(first_ns, start_ns[i])
    # Rows 0..n-1 are the copies, rows n.. their twins. src: the copy a row stands for; ix: its
    # instance; pv: the row of its previous op (a twin where the previous op has one), -1: none.
    twin = np.full(n, -1, np.int64)
    rows = n
    for i in range(n):
        # int64 difference, exact; the duration in ns rounds only beyond 2**53 ns
        if (latest_ns[inst[i]] - start_ns[i]) > dur[i] * 1e3:
            twin[i] = rows
            rows += 1
    src = np.empty(rows, np.int64)
    ix = np.empty(rows, np.int64)
    pv = np.empty(rows, np.int64)
    for i in range(n):
        p = prev_op[i]
        if p >= 0 and twin[p] >= 0:
            p = twin[p]
        src[i], ix[i], pv[i] = i, inst[i], p
        t = twin[i]
        if t >= 0:
            src[t], ix[t], pv[t] = i, k + (t - n), p
    n_inst = k + (rows - n)
    # Each row's place in instance order: the copies of instance j at bound[j]..bound[j + 1].
    bound = np.zeros(n_inst + 1, np.int64)
    for t in range(rows):
        bound[ix[t] + 1] += 1
    for j in range(n_inst):
        bound[j + 1] += bound[j]
    place = np.empty(rows, np.int64)
    free = bound[:-1].copy()
    for t in range(rows):
        place[t] = free[ix[t]]
        free[ix[t]] += 1
    # Arrivals from the earliest start (microseconds; int64 first: epoch nanoseconds in float64
    # microseconds would keep only a quarter of a microsecond). ``slack`` is each row's arrival
    # as replayed, ``latest`` each instance's latest arrival as logged.
    arrive = np.empty(rows)
    slack = np.empty(rows)
    latest = np.full(n_inst, -np.inf)
    top = np.full(n_inst, -np.inf)  # each instance's latest arrival as replayed
    lead = np.zeros(n_inst + 1, np.int64)  # followers per instance, then their bounds
    for t in range(rows):
        s = src[t]
        a = (start_ns[s] - first_ns) / 1e3
        p = pv[t]
        # (the previous op's excess times 0 or 1, as numpy multiplied it by a mask)
        if p >= 0:
            sl = a - (excess[src[p]] * 1.0 + gap_excess[s])
            lead[ix[p] + 1] += 1
        else:
            sl = a - (excess[0] * 0.0 + gap_excess[s])
        arrive[place[t]] = a
        slack[place[t]] = sl
        j = ix[t]
        latest[j] = max(latest[j], a)
        top[j] = max(top[j], sl)
    for j in range(n_inst):
        lead[j + 1] += lead[j]
    # The followers of instance j at lead[j]..lead[j + 1]: their place, what their update
    # reads (arrival, gap's excess, their previous op's own excess) and their instance.
    n_follow = lead[n_inst]
    f_place = np.empty(n_follow, np.int64)
    f_arrive = np.empty(n_follow)
    f_gap = np.empty(n_follow)
    f_own = np.empty(n_follow)
    f_inst = np.empty(n_follow, np.int64)
    free = lead[:-1].copy()
    for t in range(rows):
        p = pv[t]
        if p >= 0:
            r = free[ix[p]]
            free[ix[p]] += 1
            f_place[r] = place[t]
            f_arrive[r] = arrive[place[t]]
            f_gap[r] = gap_excess[src[t]]
            f_own[r] = excess[src[p]]
            f_inst[r] = ix[t]
    # An instance's copies all end earlier by its shift (how much its latest arrival moves)
    # plus their own transfer's excess.
    shift = np.zeros(n_inst)
    changed = np.empty(n_inst, np.int64)
    n_changed = 0
    if sweeps >= 1:
        for j in range(n_inst):
            moved = latest[j] - top[j]
            if moved != 0.0:
                changed[n_changed] = j
                n_changed += 1
            shift[j] = moved
    seen = np.zeros(n_inst, np.bool_)
    visit = np.empty(n_inst, np.int64)
    again = np.empty(n_inst, np.int64)
    moves = np.empty(n_inst)
    for _ in range(sweeps - 1):
        if n_changed == 0:
            break
        n_visit = 0
        for u in range(n_changed):
            j = changed[u]
            sh = shift[j]
            for r in range(lead[j], lead[j + 1]):
                slack[f_place[r]] = f_arrive[r] - ((sh + f_own[r]) + f_gap[r])
                g = f_inst[r]
                if not seen[g]:
                    seen[g] = True
                    visit[n_visit] = g
                    n_visit += 1
        for u in range(n_visit):  # every move from the shifts of the sweep before
            g = visit[u]
            seen[g] = False
            high = -np.inf
            for q in range(bound[g], bound[g + 1]):
                high = max(high, slack[q])
            moves[u] = latest[g] - high
        n_changed = 0
        for u in range(n_visit):
            g = visit[u]
            if moves[u] != shift[g]:
                again[n_changed] = g
                n_changed += 1
                shift[g] = moves[u]
        changed, again = again, changed
    # A copy is shorter by its end's gain less its arrival's, between 0 and its duration; an
    # early copy's gain is its twin's.
    for t in range(rows):
        if t < n and twin[t] >= 0:
            continue
        s = src[t]
        end = shift[ix[t]] + excess[s]
        p = pv[t]
        if p >= 0:
            arrival = (shift[ix[p]] + excess[src[p]]) * 1.0 + gap_excess[s]
        else:
            arrival = (shift[ix[0]] + excess[0]) * 0.0 + gap_excess[s]
        out[s] = min(max(end - arrival, 0.0), dur[s])
    return out


@numba.njit(cache=True, nogil=True)
def _sort_windows(m, padded, before, count, first, at, size, w, pairs, column, moments, mean,
                  std):
    """Fill ``m[:, :size]`` with the windows of rows ``at[:size]`` (rows ``first ..
    first + size - 1`` if ``at`` is empty) and sort each column.

    Row ``i``'s window is its ``count[i]`` (at most ``w``) earlier values, lag ``l`` (0: the
    latest) at ``padded[w - 1 + before[i] - l]`` (float32); missing lags sort last (inf). With
    ``moments``, ``mean[b]`` and ``std[b]`` are over the window with its missing lags filled
    with the valid values' mean (computed in float32, as numpy summed it), so that they are the
    valid values' own, the standard deviation's denominator being the count. The comparators
    ``pairs`` of a sorting network sort the columns together (branch-free min/max over the
    block, in cache); with no ``pairs`` each column is sorted on its own (long windows).
    """
    inf32 = np.float32(np.inf)
    zero32 = np.float32(0.0)
    indexed = len(at) > 0
    for lag in range(w):
        back = w - 1 - lag
        if indexed:
            for b in range(size):
                m[lag, b] = padded[before[at[b]] + back]
        else:
            for b in range(size):
                m[lag, b] = padded[before[first + b] + back]
    for b in range(size):
        c = count[at[b]] if indexed else count[first + b]
        if moments:
            fill = zero32
            if c < w:  # the valid lags' mean, summed in float32
                total = m[0, b] if c > 0 else zero32
                for lag in range(1, w):
                    total = total + (m[lag, b] if lag < c else zero32)
                fill = np.float32(np.float64(total) / max(c, 1))
            s = np.float64(m[0, b] if c > 0 else fill)
            for lag in range(1, w):
                s += np.float64(m[lag, b] if lag < c else fill)
            mu = s / w
            mu32 = np.float32(mu)
            squares = 0.0
            for lag in range(w):
                d = np.float64((m[lag, b] if lag < c else fill) - mu32)
                squares += d * d
            mean[b] = mu
            std[b] = np.sqrt(squares / max(c, 1))
        for lag in range(c, w):
            m[lag, b] = inf32
    if len(pairs):
        for p in range(len(pairs)):
            i, j = pairs[p, 0], pairs[p, 1]
            for b in range(size):
                x, y = m[i, b], m[j, b]
                m[i, b] = min(x, y)
                m[j, b] = max(x, y)
    else:
        for b in range(size):
            for lag in range(w):
                column[lag] = m[lag, b]
            column.sort()
            for lag in range(w):
                m[lag, b] = column[lag]


@numba.njit(cache=True, nogil=True)
def _quantiles(out, m, count, first, at, size, w, f):
    """``out[b]``: numpy's default ("linear") percentile ``f`` of the valid values of sorted
    column ``b`` of ``m`` (:func:`_sort_windows`'s rows; inf for an empty window), for
    ``b < size``: a full window's ranks and weight are fixed, a short one's follow its
    count."""
    h = (w - 1) * f
    lo, hi = int(np.floor(h)), int(np.ceil(h))
    indexed = len(at) > 0
    for b in range(size):
        c = count[at[b]] if indexed else count[first + b]
        if c >= w:
            v = np.float64(m[lo, b])
            if hi != lo:
                v = v + (np.float64(m[hi, b]) - v) * (h - lo)
        else:
            hs = max(c - 1, 0) * f
            below = np.floor(hs)
            los, his = int(below), int(np.ceil(hs))
            v = np.float64(m[los, b])
            if his != los:
                v = v + (np.float64(m[his, b]) - v) * (hs - below)
        out[b] = v


@numba.njit(inline="always")
def _maximum(a, b):
    """``np.maximum`` of two floats (NaN wins; a tie keeps ``a``)."""
    return a if (a >= b or a != a) else b


@numba.njit(inline="always")
def _minimum(a, b):
    """``np.minimum`` of two floats (NaN wins; a tie keeps ``a``)."""
    return a if (a <= b or a != a) else b


@numba.njit(inline="always")
def _clip(v, lo, hi):
    """``np.clip`` of a float (NaN stays NaN)."""
    return _minimum(_maximum(v, lo), hi)


#: the history kernel's outputs, in the order of its ``out_rows`` argument
HISTORY_KERNEL_OUTPUTS = (
    "history_len", "hist_mean_us", "hist_std_us", "hist_q1_us", "hist_median_us", "hist_q3_us",
    "hist_iqr_us", "hist_z", "hist_iqr_score", "base_ratio", "xfer_hist_ratio",
    "level_rise_frac", "level_excess_frac", "level_wait_excess_frac", "level_wait_z",
)


@numba.njit(cache=True, nogil=True)
def history_kernel(v, x, regular, sig, order, peer_med, w, pairs, regular_only, memory,
                   min_spread, clip, eps, level_floor, level_min, matrix, out_rows, block):
    """The history features of rows sorted by (signature, iteration), in that order.

    ``v`` (duration), ``x`` (transfer), ``regular`` and ``sig`` are in sorted order, ``order``
    maps a sorted place to its row (for ``peer_med``, in row order). Writes the columns
    :data:`HISTORY_KERNEL_OUTPUTS` into ``matrix[out_rows[k], place]`` (float32) and returns
    each row's history median floored at ``eps`` (float64, sorted order). What it computes is
    what :func:`holmes_ml.features.build._history` documents, with the same float operations
    as its vectorized numpy had, in the same order: the same features, bit for bit.

    The windows: the plain one (every earlier copy, or the regular ones if ``regular_only``),
    the baseline (regular copies), and the transfer's over the baseline and over the plain
    window (its level). Rows are taken ``block`` at a time (see :func:`_sort_windows`); the
    levels (:data:`~holmes_ml.features.build.FeatureConfig.level_memory`) read the medians of
    the rows before, already computed.
    """
    n = len(v)
    # Per sorted row: usable rows before it (plain ``before_h``, regular ``before_b``), in all
    # and in its signature's copies (at most ``w``), and its place among those copies.
    before_h = np.empty(n, np.int64)
    before_b = np.empty(n, np.int64)
    count_h = np.empty(n, np.int64)
    count_b = np.empty(n, np.int64)
    place = np.empty(n, np.int64)
    n_regular = 0
    for j in range(n):
        if regular[j]:
            n_regular += 1
    all_regular = n_regular == n
    same_window = all_regular or regular_only
    seen = 0
    first = 0
    for j in range(n):
        if j == 0 or sig[j] != sig[j - 1]:
            first = j
        place[j] = j - first
        before_b[j] = seen
        before_h[j] = seen if regular_only else j
        if regular[j]:
            seen += 1
        count_b[j] = min(before_b[j] - before_b[first], w)
        count_h[j] = min(before_h[j] - before_h[first], w)
    # The compacted values each window reads, after ``w`` zeros: float32 (absurd but finite
    # times stay finite).
    big = _F32_MAX
    padded_h = np.zeros(w + (n_regular if regular_only else n), np.float32)
    padded_b = np.zeros(w + n_regular, np.float32)
    padded_x = np.zeros(w + n_regular, np.float32)
    padded_xa = np.zeros(w + (n_regular if same_window else n), np.float32)
    k_r = w
    for j in range(n):
        v32 = np.float32(min(max(v[j], -big), big) if v[j] == v[j] else v[j])
        x32 = np.float32(min(max(x[j], -big), big) if x[j] == x[j] else x[j])
        if not regular_only:
            padded_h[w + j] = v32
        if not same_window:
            padded_xa[w + j] = x32
        if regular[j]:
            if regular_only:
                padded_h[k_r] = v32
            padded_b[k_r] = v32
            padded_x[k_r] = x32
            if same_window:
                padded_xa[k_r] = x32
            k_r += 1
    med_row = np.empty(n)
    low_in = np.empty(n, np.float32)  # the median where it is a level, else inf
    x_level = np.empty(n, np.float32)
    tail_low = np.empty(n, np.float32)  # minimums to the end of their run (see below)
    tail_x = np.empty(n, np.float32)
    run_low = run_x = np.float32(np.inf)
    m = np.empty((w, block), np.float32)
    column = np.empty(w, np.float32)
    none = np.empty(0, np.int64)  # (rows a .. a + size - 1)
    sel = np.empty(block, np.int64)
    mean = np.empty(block)
    std = np.empty(block)
    dummy = np.empty(block)
    q1 = np.empty(block)
    med = np.empty(block)
    q3 = np.empty(block)
    xm = np.empty(block)
    bm = np.full(block, np.nan)
    xa = np.full(block, np.nan)
    picked = np.zeros(block, np.bool_)
    inf32 = np.float32(np.inf)
    spread_floor = np.float32(eps)
    ms32 = np.float32(min_spread)
    rows = out_rows
    for a in range(0, n, block):
        size = min(block, n - a)
        _sort_windows(m, padded_h, before_h, count_h, a, none, size, w, pairs, column, True,
                      mean, std)
        _quantiles(q1, m, count_h, a, none, size, w, 0.25)
        _quantiles(med, m, count_h, a, none, size, w, 0.5)
        _quantiles(q3, m, count_h, a, none, size, w, 0.75)
        _sort_windows(m, padded_x, before_b, count_b, a, none, size, w, pairs, column, False,
                      dummy, dummy)
        _quantiles(xm, m, count_b, a, none, size, w, 0.5)
        # Rows with an irregular copy inside their plain window have another baseline window
        # (regular copies only) and another transfer level window (the plain one).
        n_sel = 0
        if not same_window:
            for b in range(size):
                j = a + b
                c = count_h[j]
                # irregular rows before j and before j - c differ
                picked[b] = (j - before_b[j]) != (j - c - before_b[j - c])
                if picked[b]:
                    sel[n_sel] = j
                    n_sel += 1
            if n_sel:
                _sort_windows(m, padded_b, before_b, count_b, a, sel, n_sel, w, pairs, column,
                              False, dummy, dummy)
                _quantiles(dummy, m, count_b, a, sel, n_sel, w, 0.5)
                for u in range(n_sel):
                    bm[sel[u] - a] = dummy[u]
                _sort_windows(m, padded_xa, before_h, count_h, a, sel, n_sel, w, pairs, column,
                              False, dummy, dummy)
                _quantiles(dummy, m, count_h, a, sel, n_sel, w, 0.5)
                for u in range(n_sel):
                    xa[sel[u] - a] = dummy[u]
        for b in range(size):
            j = a + b
            c = count_h[j]
            cb = count_b[j]
            d = v[j]
            has, hb = c > 0, cb > 0
            mu, sd, lo_q, md, hi_q = mean[b], std[b], q1[b], med[b], q3[b]
            if not has:  # a signature's first copy: its peers stand in for its past
                pm = peer_med[order[j]]
                lo_q, md, hi_q, mu, sd = pm, pm, pm, pm, 0.0
            iqr = hi_q - lo_q
            med_row[j] = _maximum(md, eps)
            floor = _maximum(min_spread * abs(md), eps)
            base = md
            x_plain = xm[b]
            if n_sel and picked[b]:
                base = bm[b] if hb else peer_med[order[j]]
                x_plain = xa[b]
            x_med = xm[b] if hb else 1.0
            x_level[j] = np.float32(x_plain if c >= level_min else np.inf)
            z = (d - mu) / _maximum(sd, floor) if has else 0.0
            iqr_score = (d - md) / _maximum(iqr, floor) if has else 0.0
            xfer_ratio = x[j] / _maximum(x_med, eps) if hb else 1.0
            matrix[rows[0], j] = np.float32(min(c, clip))
            matrix[rows[1], j] = np.float32(mu)
            matrix[rows[2], j] = np.float32(sd)
            matrix[rows[3], j] = np.float32(lo_q)
            matrix[rows[4], j] = np.float32(md)
            matrix[rows[5], j] = np.float32(hi_q)
            matrix[rows[6], j] = np.float32(iqr)
            matrix[rows[7], j] = np.float32(_clip(z, -clip, clip))
            matrix[rows[8], j] = np.float32(_clip(iqr_score, -clip, clip))
            matrix[rows[9], j] = np.float32(_clip(d / _maximum(base, eps), -clip, clip))
            matrix[rows[10], j] = np.float32(_clip(xfer_ratio, -clip, clip))
            # The lowest level: the lowest history median (of enough copies) among the last
            # ``memory`` copies, this one included; the transfer's alike.
            # (van Herk's running minimum: the signature's copies in runs of ``memory``, the
            # minimum from the run's start to each copy and, once a run is over, from each of
            # its copies to its end; a window spans the end of one run and the start of the
            # next)
            md32 = np.float32(md)
            low_in[j] = md32 if c >= level_min else inf32
            p = place[j]
            r = p % memory
            if r == 0:
                run_low, run_x = low_in[j], x_level[j]
                if p >= memory:  # the run before is over: its minimums to its end
                    end_low, end_x = low_in[j - 1], x_level[j - 1]
                    for k in range(j - 1, j - memory - 1, -1):
                        end_low = _minimum(low_in[k], end_low)
                        end_x = _minimum(x_level[k], end_x)
                        tail_low[k], tail_x[k] = end_low, end_x
            else:
                run_low = _minimum(run_low, low_in[j])
                run_x = _minimum(run_x, x_level[j])
            lowest, x_low = run_low, run_x
            if p >= memory and r != memory - 1:
                lowest = _minimum(tail_low[j - memory + 1], lowest)
                x_low = _minimum(tail_x[j - memory + 1], x_low)
            unknown = not np.isfinite(lowest)
            if unknown:
                lowest = np.float32(0.0)
            neither = unknown or not np.isfinite(x_low)
            if neither:
                x_low = np.float32(0.0)
            denom = _maximum(d, level_floor)
            rise = _maximum(md32 - lowest, np.float32(0.0))
            excess = d - np.float64(lowest)
            wait = _maximum(excess - _maximum(x[j] - np.float64(x_low), 0.0), 0.0)
            spread = _maximum(_maximum(np.float32(abs(md32)) * ms32, np.float32(sd)),
                              spread_floor)
            matrix[rows[11], j] = np.float32(
                0.0 if unknown else _clip(np.float64(rise) / denom, 0.0, clip))
            matrix[rows[12], j] = np.float32(
                0.0 if unknown else _clip(_maximum(excess, 0.0) / denom, 0.0, clip))
            matrix[rows[13], j] = np.float32(0.0 if neither else _clip(wait / denom, 0.0, clip))
            matrix[rows[14], j] = np.float32(
                0.0 if neither else _clip(wait / np.float64(spread), 0.0, clip))
    return med_row


@numba.njit(cache=True, nogil=True)
def scatter_reduce_kernel(out, code, values, op):
    """``out[code[i]] = f(out[code[i]], values[i])`` for every ``i``, in place: ``np.minimum``
    (``op`` 0), ``np.maximum`` (1), both with NaN winning, or ``np.fmax`` (2, NaN losing): what
    ``ufunc.at`` computes, in one compiled pass (4 ms for the same step's minimum over the
    bench job's 2.0 M rows into 555 k instances, where numpy's ``at`` took from 5 to 63 ms
    from one process to another)."""
    for i in range(len(code)):
        c = code[i]
        if c < 0 or c >= len(out):
            raise IndexError("scatter_reduce_kernel: a code outside the output")
        v = values[i]
        o = out[c]
        if op == 0:
            if v < o or v != v:
                out[c] = v
        elif op == 1:
            if v > o or v != v:
                out[c] = v
        elif v > o or o != o:
            out[c] = v


@numba.njit(cache=True, nogil=True)
def pack_kernel(cols, spans):
    """``((cols[0] * spans[1] + cols[1]) * spans[2] + cols[2]) ...`` per row (int64): the key of
    :func:`~holmes_ml.features._segments.combine` in one pass over its columns."""
    n = len(cols[0])
    key = np.empty(n, np.int64)
    for i in range(n):
        k = 0
        j = 0
        for col in literal_unroll(cols):  # (columns may differ in type: read-only ones)
            k = k * spans[j] + col[i]
            j += 1
        key[i] = k
    return key


@numba.njit(cache=True, nogil=True)
def group_rows_kernel(code, k):
    """``(bound, rows)``: the rows of each code ``0 .. k - 1`` of a non-negative ``code``,
    ascending, at ``rows[bound[c]:bound[c + 1]]`` (a counting sort: no comparison)."""
    bound = np.zeros(k + 1, np.int64)
    for i in range(len(code)):
        bound[code[i] + 1] += 1
    for c in range(k):
        bound[c + 1] += bound[c]
    rows = np.empty(len(code), np.int64)
    free = bound[:-1].copy()
    for i in range(len(code)):
        rows[free[code[i]]] = i
        free[code[i]] += 1
    return bound, rows


@numba.njit(inline="always")
def _before(r, s, key1, key2):
    """Row ``r`` comes before row ``s``: by ``key1``, then ``key2``, then row."""
    if key1[r] != key1[s]:
        return key1[r] < key1[s]
    if key2[r] != key2[s]:
        return key2[r] < key2[s]
    return r < s


@numba.njit(cache=True, nogil=True)
def group_median_kernel(bound, rows, key1, key2, values, groups):
    """Per group of :func:`group_rows_kernel`'s layout listed in ``groups`` (the others: NaN),
    the median of ``values`` (``0.5 * (lower middle + upper middle)``, NaN for an empty group)
    in the order of ``(key1, key2, row)``: the rows numpy's stable sort of such keys puts in
    the middle, found by selection. Each group's rows are reordered in place: still the group's rows after, in
    another order, so the layout serves the next median (whose result does not depend on it)."""
    out = np.full(len(bound) - 1, np.nan)
    for g in groups:
        a, b = bound[g], bound[g + 1]
        size = b - a
        if size == 0:
            continue
        lo = a + (size - 1) // 2
        # quickselect: rows[lo] becomes the row of rank lo - a, smaller ones before it
        left, right = a, b - 1
        while right > left:
            if right - left < 16:  # insertion sort of what is left
                for i in range(left + 1, right + 1):
                    r = rows[i]
                    j = i - 1
                    while j >= left and _before(r, rows[j], key1, key2):
                        rows[j + 1] = rows[j]
                        j -= 1
                    rows[j + 1] = r
                break
            mid = (left + right) // 2  # median of three as the pivot, moved to the right end
            if _before(rows[mid], rows[left], key1, key2):
                rows[mid], rows[left] = rows[left], rows[mid]
            if _before(rows[right], rows[left], key1, key2):
                rows[right], rows[left] = rows[left], rows[right]
            if _before(rows[mid], rows[right], key1, key2):
                rows[mid], rows[right] = rows[right], rows[mid]
            pivot = rows[right]
            store = left
            for i in range(left, right):
                if _before(rows[i], pivot, key1, key2):
                    rows[i], rows[store] = rows[store], rows[i]
                    store += 1
            rows[store], rows[right] = rows[right], rows[store]
            if store == lo:
                break
            if store < lo:
                left = store + 1
            else:
                right = store - 1
        upper = rows[lo]
        if size % 2 == 0:  # the upper middle: the first row after the lower one
            upper = rows[lo + 1]
            for i in range(lo + 2, b):
                if _before(rows[i], upper, key1, key2):
                    upper = rows[i]
        out[g] = 0.5 * (values[rows[lo]] + values[upper])
    return out


@numba.njit(inline="always")
def _sort_columns(m, pairs, first, last, size):
    """Apply the comparators ``pairs[first:last]`` to columns ``0 .. size - 1`` of ``m``
    together (branch-free min/max over the block)."""
    for p in range(first, last):
        i, j = pairs[p, 0], pairs[p, 1]
        for b in range(size):
            x, y = m[i, b], m[j, b]
            m[i, b] = min(x, y)
            m[j, b] = max(x, y)


@numba.njit
def _by_size_class(bound, classes):
    """``(by_class, start, largest)``: the groups of a layout by size class (class ``c`` below
    ``classes``: at most ``2**c`` rows; class ``classes``: more), at
    ``by_class[start[c]:start[c + 1]]`` in group order; and the largest group's size."""
    k = len(bound) - 1
    cls = np.empty(k, np.int64)
    start = np.zeros(classes + 2, np.int64)
    largest = 0
    for g in range(k):
        size = bound[g + 1] - bound[g]
        largest = max(largest, size)
        c = 0
        while c < classes and (1 << c) < size:
            c += 1
        cls[g] = c
        start[c + 1] += 1
    for c in range(classes + 1):
        start[c + 1] += start[c]
    by_class = np.empty(k, np.int64)
    free = start[:-1].copy()
    for g in range(k):
        by_class[free[cls[g]]] = g
        free[cls[g]] += 1
    return by_class, start, largest


@numba.njit(cache=True, nogil=True)
def float_median_kernel(bound, rows, values, pairs, offsets, block):
    """Per group of :func:`group_rows_kernel`'s layout, the median of ``values`` (no NaN) in
    the exact order of :func:`~holmes_ml.features._segments.order_key`, ties by row, as
    :func:`group_median_kernel` selects it (NaN for an empty group), bit for bit.

    Equal floats other than zeros are the same bits, so the floats are sorted as they are: the
    groups of up to ``2**(len(offsets) - 2)`` rows ``block`` at a time by the networks of
    :func:`packed_median_kernel`, larger ones one by one; where a middle is a zero, which of
    -0.0 and 0.0 it is follows the zeros' rows (:func:`_float_middle`).
    """
    k = len(bound) - 1
    classes = len(offsets) - 1
    by_class, start, largest = _by_size_class(bound, classes)
    med = np.full(k, np.nan)
    m = np.empty((1 << (classes - 1), block))
    zeros = np.empty(max(largest, 1), np.int64)
    inf = np.inf
    for c in range(classes):
        for first in range(start[c], start[c + 1], block):
            count = min(block, start[c + 1] - first)
            for b in range(count):
                g = by_class[first + b]
                a, size = bound[g], bound[g + 1] - bound[g]
                for p in range(1 << c):
                    m[p, b] = values[rows[a + p]] if p < size else inf
            _sort_columns(m, pairs, offsets[c], offsets[c + 1], count)
            for b in range(count):
                g = by_class[first + b]
                med[g] = _float_middle(m[:, b], bound[g], bound[g + 1] - bound[g], rows, values,
                                       zeros)
    one = np.empty(largest)
    for g in by_class[start[classes]:]:
        a, size = bound[g], bound[g + 1] - bound[g]
        for p in range(size):
            one[p] = values[rows[a + p]]
        one[:size].sort()
        med[g] = _float_middle(one, a, size, rows, values, zeros)
    return med


@numba.njit(inline="always")
def _float_middle(col, a, size, rows, values, zeros):
    """The median of the ``size`` floats sorted in ``col``, the values of the group's rows
    ``rows[a:a + size]`` (NaN for none). A zero in the middle is the one of the group's zeros
    (-0.0 or 0.0) at that place in the order of their rows."""
    if size == 0:
        return np.nan
    lo = (size - 1) // 2
    up = lo + 1 if size % 2 == 0 else lo
    x, y = col[lo], col[up]
    if x == 0.0 or y == 0.0:
        first = lo if x == 0.0 else up  # the zeros' first place
        while first > 0 and col[first - 1] == 0.0:
            first -= 1
        count = 0
        for i in range(size):
            if values[rows[a + i]] == 0.0:
                zeros[count] = rows[a + i]
                count += 1
        ordered = np.sort(zeros[:count])
        if x == 0.0:
            x = values[ordered[lo - first]]
        if y == 0.0:
            y = values[ordered[up - first]]
    return 0.5 * (x + y)


@numba.njit(cache=True, nogil=True)
def packed_median_kernel(bound, rows, key, values, pairs, offsets, block, with_mad):
    """``(med, mad)`` per group of :func:`group_rows_kernel`'s layout: the median of
    ``values`` in the order of ``(key, row)`` (NaN for an empty group), and with ``with_mad``
    the median of the absolute deviations from it in the order of (their float32 rounding,
    ``key``, row); else ``mad`` is all NaN. What :func:`group_median_kernel` gives with
    ``key = then`` and then on the deviations with their float32 bits and ``key``, bit for bit,
    for a ``key`` in ``[0, 2**31)`` (float32 bits of non-negative values) and finite values.

    Each row is one int64, ``key << 32 | row``, and a deviation ``bits << 32 | place``
    (``place``: its value's rank in the group's first order, which decides the ties as ``key``
    and row did); equal keys cannot occur, so any sort gives the same middle. Groups of up to
    ``2**c`` rows, ``c`` below ``len(offsets) - 1``, are sorted ``block`` at a time by the
    comparators ``pairs[offsets[c]:offsets[c + 1]]`` of a network for ``2**c`` keys (padding
    sorts last), branch-free across the block; larger groups by a sort of their own.
    """
    k = len(bound) - 1
    classes = len(offsets) - 1
    by_class, start, largest = _by_size_class(bound, classes)
    med = np.full(k, np.nan)
    mad = np.full(k, np.nan)
    pad = np.int64(0x7FFFFFFFFFFFFFFF)
    height = 1 << (classes - 1)
    m = np.empty((height, block), np.int64)
    dev = np.empty((height, block))
    bits = np.empty(height, np.float32)
    for c in range(classes):
        for first in range(start[c], start[c + 1], block):
            count = min(block, start[c + 1] - first)
            for b in range(count):
                g = by_class[first + b]
                a, size = bound[g], bound[g + 1] - bound[g]
                for p in range(1 << c):
                    m[p, b] = (key[rows[a + p]] << 32) | rows[a + p] if p < size else pad
            _sort_columns(m, pairs, offsets[c], offsets[c + 1], count)
            for b in range(count):
                g = by_class[first + b]
                med[g] = _packed_middle(m[:, b], bound[g + 1] - bound[g], values)
            if not with_mad:
                continue
            for b in range(count):
                g = by_class[first + b]
                size = bound[g + 1] - bound[g]
                _deviations(m[:, b], dev[:, b], size, 1 << c, values, med[g], bits, pad)
            _sort_columns(m, pairs, offsets[c], offsets[c + 1], count)
            for b in range(count):
                g = by_class[first + b]
                mad[g] = _packed_middle(m[:, b], bound[g + 1] - bound[g], dev[:, b])
    # the groups too large for a network: one sort each
    one = np.empty(largest, np.int64)
    one_dev = np.empty(largest)
    bits = np.empty(largest, np.float32)
    for g in by_class[start[classes]:]:
        a, size = bound[g], bound[g + 1] - bound[g]
        for p in range(size):
            one[p] = (key[rows[a + p]] << 32) | rows[a + p]
        one[:size].sort()
        med[g] = _packed_middle(one, size, values)
        if with_mad:
            _deviations(one, one_dev, size, size, values, med[g], bits, pad)
            one[:size].sort()
            mad[g] = _packed_middle(one, size, one_dev)
    return med, mad


@numba.njit(inline="always")
def _packed_middle(sorted_keys, size, values):
    """The median of ``size`` sorted packed keys: the mean of the ``values`` their low 32 bits
    index at the lower and upper middle (NaN for none)."""
    if size == 0:
        return np.nan
    lo = (size - 1) // 2
    up = lo + 1 if size % 2 == 0 else lo
    mask = np.int64(0xFFFFFFFF)
    return 0.5 * (values[sorted_keys[lo] & mask] + values[sorted_keys[up] & mask])


@numba.njit(inline="always")
def _deviations(keys, dev, size, height, values, centre, bits, pad):
    """Replace ``size`` sorted packed keys (``key << 32 | row``, padded to ``height``) by their
    rows' absolute deviations from ``centre`` packed as ``float32 bits << 32 | place`` (the
    place in the sorted keys), the deviations themselves in ``dev[place]``."""
    mask = np.int64(0xFFFFFFFF)
    for p in range(size):
        d = abs(values[keys[p] & mask] - centre)
        dev[p] = d
        bits[p] = np.float32(d) + np.float32(0.0)  # (+ 0: -0.0 is 0.0)
    as_int = bits.view(np.int32)
    for p in range(height):
        keys[p] = (np.int64(as_int[p]) << 32) | p if p < size else pad


#: the peers kernel's columns, in the order of its ``out_rows`` argument; the first two are
#: microsecond columns (cast as they are), the others are clipped
PEERS_KERNEL_OUTPUTS = (
    "arrival_lag_us", "peer_median_us", "peer_count", "arrived_last", "arrival_lag_spread",
    "arrival_rank", "peer_ratio_min", "peer_ratio_max", "peer_ratio_median",
)


@numba.njit(cache=True, nogil=True)
def peers_kernel(bound, rows, start, dur, peer_med, eps, clip, matrix, out_rows):
    """Arrival order and duration spread of each row within its instance (the groups of
    :func:`group_rows_kernel`'s layout ``bound``, ``rows``, in any order within a group;
    ``peer_med``: each instance's median duration): writes the columns
    :data:`PEERS_KERNEL_OUTPUTS` into ``matrix[out_rows[k]]`` (float32, row order) and returns
    ``(peer_med, lag_us, wait_us, peer_min, last)`` per row, ``last`` the row that arrived last in its instance (the largest lag; of
    equal ones, the highest row). The same values as the numpy of
    :func:`holmes_ml.features.build._peers` gave, bit for bit.
    """
    n = len(start)
    med_row = np.empty(n)
    lag_us = np.empty(n)
    wait_us = np.empty(n)
    peer_min = np.empty(n)
    last = np.empty(n, np.int64)
    lags = np.empty(0, np.int64)
    for g in range(len(bound) - 1):
        a, b = bound[g], bound[g + 1]
        size = b - a
        if size == 0:
            continue
        first = start[rows[a]]
        low, high = dur[rows[a]], dur[rows[a]]
        for q in range(a, b):
            i = rows[q]
            first = min(first, start[i])
            low = _minimum(low, dur[i])
            high = _maximum(high, dur[i])
        spread = np.int64(0)
        late = rows[a]
        for q in range(a, b):  # of equal lags, the highest row
            i = rows[q]
            lag = start[i] - first
            if lag > spread or (lag == spread and i > late):
                spread = lag
                late = i
        if size > 32:  # a big instance: its lags sorted, each row's rank by bisection
            if len(lags) < size:
                lags = np.empty(size, np.int64)
            for q in range(a, b):
                lags[q - a] = start[rows[q]] - first
            lags[:size].sort()
        med = peer_med[g]
        for q in range(a, b):
            i = rows[q]
            lag = start[i] - first
            d = dur[i]
            if size > 32:
                ahead = np.searchsorted(lags[:size], lag)
            else:
                ahead = 0  # copies that arrived strictly earlier
                for u in range(a, b):
                    if start[rows[u]] - first < lag:
                        ahead += 1
            med_row[i] = med
            lag_us[i] = lag / 1e3
            wait_us[i] = _minimum((spread - lag) / 1e3, d)
            peer_min[i] = low
            last[i] = late
            matrix[out_rows[0], i] = np.float32(lag / 1e3)
            matrix[out_rows[1], i] = np.float32(med)
            matrix[out_rows[2], i] = np.float32(_clip(np.float64(size), -clip, clip))
            matrix[out_rows[3], i] = np.float32(
                _clip(1.0 if (lag == spread and spread > 0) else 0.0, -clip, clip))
            matrix[out_rows[4], i] = np.float32(
                _clip(lag / max(spread, 1), -clip, clip) if spread > 0 else 0.0)
            matrix[out_rows[5], i] = np.float32(
                _clip(ahead / max(size - 1, 1), -clip, clip) if size > 1 else 0.0)
            matrix[out_rows[6], i] = np.float32(_clip(d / _maximum(low, eps), -clip, clip))
            matrix[out_rows[7], i] = np.float32(_clip(d / _maximum(high, eps), -clip, clip))
            matrix[out_rows[8], i] = np.float32(_clip(d / _maximum(med, eps), -clip, clip))
    return med_row, lag_us, wait_us, peer_min, last


@numba.njit(cache=True, nogil=True)
def places_kernel(code, k, minor):
    """``(place, prev)`` per row: its place among the rows of its code (``0 .. k - 1``) in
    ``minor`` order (equal ones by row), and the row just before it there (-1 for the first):
    what a stable sort by (code, minor) gives. The codes' rows come from a counting sort, in
    row order; a group already in ``minor`` order (rows logged in time order) is left as it
    is, a small one is put in order by insertion, a large one by a merge sort."""
    n = len(code)
    bound, rows = group_rows_kernel(code, k)
    place = np.empty(n, np.int64)
    prev = np.empty(n, np.int64)
    for g in range(k):
        a, b = bound[g], bound[g + 1]
        in_order = True
        for q in range(a + 1, b):
            if minor[rows[q]] < minor[rows[q - 1]]:
                in_order = False
                break
        if not in_order:
            if b - a <= 64:
                for q in range(a + 1, b):
                    r = rows[q]
                    j = q - 1
                    while j >= a and minor[rows[j]] > minor[r]:
                        rows[j + 1] = rows[j]
                        j -= 1
                    rows[j + 1] = r
            else:
                keys = np.empty(b - a, np.int64)
                for q in range(a, b):
                    keys[q - a] = minor[rows[q]]
                by = np.argsort(keys, kind="mergesort")
                group = rows[a:b].copy()
                for q in range(b - a):
                    rows[a + q] = group[by[q]]
        for q in range(a, b):
            place[rows[q]] = q - a
            prev[rows[q]] = rows[q - 1] if q > a else -1
    return place, prev


@numba.njit(cache=True, nogil=True)
def chain_max_kernel(hop, table, sources, out, targets, hops):
    """:func:`holmes_ml.features.build._chain_max` of the rows ``sources`` of ``table``,
    written into the rows ``targets`` of ``out`` (which may be ``table``): per row and column,
    the largest value over the first ``hops`` rows of the chain ``row -> hop[row] -> ...`` (-1
    ends a chain; 0 where none, or where the largest is not finite), in ``table``'s dtype.
    Binary lifting with each row's columns side by side, so that a hop reads one cache line
    for all of them."""
    n = len(hop)
    m = len(sources)
    # row n is a sentinel that hops to itself and holds -inf: it ends every chain
    step = np.empty(n + 1, np.int64)
    for i in range(n):
        step[i] = hop[i] if hop[i] >= 0 else n
    step[n] = n
    ninf = -np.inf
    span = np.empty((n + 1, m), table.dtype)  # the largest over the next 2^k hops
    for i in range(n + 1):
        s = step[i]
        for c in range(m):
            span[i, c] = table[sources[c], s] if s < n else ninf
    best = np.full((n + 1, m), ninf, table.dtype)
    at = np.arange(n + 1)  # the row reached after the hops joined so far
    moved = False  # (at is the identity until a set bit has been joined)
    spare = np.empty((n + 1, m), table.dtype)
    spare_step = np.empty(n + 1, np.int64)
    k = hops
    while True:
        if k & 1:
            for i in range(n + 1):
                j = at[i] if moved else i
                for c in range(m):
                    best[i, c] = _maximum(best[i, c], span[j, c])
            if k > 1:  # more hops to join from there
                for i in range(n + 1):
                    at[i] = step[at[i]] if moved else step[i]
                moved = True
        k >>= 1
        if not k:
            break
        for i in range(n + 1):
            j = step[i]
            for c in range(m):
                spare[i, c] = _maximum(span[i, c], span[j, c])
        span, spare = spare, span
        if k > 1:  # the doubled hop is needed beyond this doubling
            for i in range(n + 1):
                spare_step[i] = step[step[i]]
            step, spare_step = spare_step, step
    for c in range(m):
        row = targets[c]
        for i in range(n):
            v = best[i, c]
            out[row, i] = v if np.isfinite(v) else 0.0


@numba.njit(cache=True, nogil=True)
def compute_gaps_kernel(start_ns, prev_op, dur):
    """Per row, the gap (us) between its rank's previous op's end and its start (its rank's
    compute; 0 without a previous op)."""
    gap = np.empty(len(dur))
    for i in range(len(dur)):
        p = prev_op[i]
        gap[i] = (start_ns[i] - start_ns[p]) / 1e3 - dur[p] if p >= 0 else 0.0
    return gap


@numba.njit(cache=True, nogil=True)
def replay_excess_kernel(xfer, xfer_ratio, ratio_ceiling, gap, usual, gap_ceiling, code,
                         prev_op):
    """``(excess, gap_excess)`` per row: for a transfer whose ratio to its step's typical one
    (``xfer_ratio``) is over its stage step's ceiling (``ratio_ceiling[code]``), the part over
    that typical one, and, for a compute gap over its stage step's ceiling
    (``gap_ceiling[code]``), the part over the step's median gap (``usual[code]``), as
    :func:`holmes_ml.features.build._replay` documents."""
    n = len(xfer)
    excess = np.empty(n)
    gap_excess = np.empty(n)
    for i in range(n):
        r = xfer_ratio[i]
        excess[i] = xfer[i] - xfer[i] / _maximum(r, 1.0) if r > ratio_ceiling[code[i]] else 0.0
        u = usual[code[i]]
        g = gap[i]
        gap_excess[i] = g - u if (prev_op[i] >= 0 and u > 0 and g > gap_ceiling[code[i]]) else 0.0
    return excess, gap_excess
