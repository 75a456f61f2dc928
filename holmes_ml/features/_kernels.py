"""Loops compiled with numba, for the steps of feature extraction that numpy can only express as
many passes over every row.

The replay (:func:`replay_gain_kernel`) passes each copy's gain to the copies that waited for
it, a sweep at a time, until nothing moves: in numpy every sweep was a dozen passes and every
pass a fresh array, in a loop it is one walk over what moved. Each kernel computes exactly what
the vectorized numpy it replaced computed (the same float operations in the same order), so the
features are the same bit for bit; the tests compare them with pandas references.

Kernels are compiled on their first call and cached next to this file (``cache=True``; numba
falls back to a per-user cache directory where the package is read-only), so only the first
call on a machine pays the compilation (about a second each).
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["group_median_kernel", "group_rows_kernel", "replay_gain_kernel", "window_stats_kernel"]


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
def window_stats_kernel(padded, before, count, w, pairs, fracs, moments, block):
    """The order statistics ``fracs`` of each row's window, and its mean and standard deviation
    if ``moments``: ``(q (len(fracs), rows) float64, mean, std)`` (empty without ``moments``).

    Row ``i``'s window is its ``count[i]`` (at most ``w``) earlier values, lag ``l`` (0: the
    latest) at ``padded[w - 1 + before[i] - l]`` (float32). Quantiles are numpy's default
    ("linear") percentiles of the valid values; the mean and standard deviation are over the
    window with its missing lags filled with the valid values' mean (computed in float32, as
    numpy summed them), so that they are the valid values' own, and the standard deviation's
    denominator is the count. Rows are taken ``block`` at a time: the window of every row of a
    block is one ``(w, block)`` float32 matrix that stays in cache and that the comparators
    ``pairs`` of a sorting network sort column-wise (branch-free min/max over the block); with
    no ``pairs`` each column is sorted on its own (long windows).
    """
    n = len(before)
    n_q = len(fracs)
    q = np.empty((n_q, n))
    mean = np.empty(n if moments else 0)
    std = np.empty(n if moments else 0)
    m = np.empty((w, block), np.float32)
    column = np.empty(w, np.float32)
    inf32 = np.float32(np.inf)
    zero32 = np.float32(0.0)
    for a in range(0, n, block):
        size = min(block, n - a)
        for lag in range(w):
            back = w - 1 - lag
            for b in range(size):
                m[lag, b] = padded[before[a + b] + back]
        for b in range(size):
            c = count[a + b]
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
                mean[a + b] = mu
                std[a + b] = np.sqrt(squares / max(c, 1))
            for lag in range(c, w):  # missing lags sort last
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
        for k in range(n_q):
            f = fracs[k]
            # a full window's ranks and weight are fixed; a short one's follow its count
            h = (w - 1) * f
            lo, hi = int(np.floor(h)), int(np.ceil(h))
            for b in range(size):
                c = count[a + b]
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
                q[k, a + b] = v
    return q, mean, std


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
def group_median_kernel(bound, rows, key1, key2, values):
    """Per group of :func:`group_rows_kernel`'s layout, the median of ``values``
    (``0.5 * (lower middle + upper middle)``, NaN for an empty group) in the order of
    ``(key1, key2, row)``: the rows numpy's stable sort of such keys puts in the middle, found
    by selection (each group's rows are reordered in place, ``rows`` is scratch after)."""
    k = len(bound) - 1
    out = np.full(k, np.nan)
    for g in range(k):
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
