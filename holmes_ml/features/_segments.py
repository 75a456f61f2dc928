"""Vectorized group-by helpers on integer keys: dense codes, sorting and segment arithmetic.

Feature extraction must sustain millions of operators per second per core, so every grouping is
done by sorting integer keys once and working on contiguous segments of the sorted arrays
(numpy ``argsort`` / ``reduceat``), never by calling Python per group.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd

from holmes_ml.features._kernels import (
    float_median_kernel,
    group_median_kernel,
    group_rows_kernel,
    pack_kernel,
    packed_median_kernel,
    places_kernel,
    scatter_reduce_kernel,
)

_LIMIT = np.iinfo(np.int64).max // 2


def dense(key: np.ndarray) -> np.ndarray:
    """Dense int64 codes 0..k-1 for an integer key (order of codes is arbitrary).

    A key whose range is small next to its length is coded in linear time by
    :func:`unique_inverse` (a ``bincount`` over the range, no hashing); others are hashed.
    """
    key = np.asarray(key)
    if len(key) and key.dtype.kind in "iu":
        span = int(key.max()) - int(key.min()) + 1
        if span <= 4 * len(key) + 1024:
            return unique_inverse(key)[1]
    codes, _ = pd.factorize(key, sort=False)
    return codes.astype(np.int64, copy=False)


def unique_inverse(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(key, return_inverse=True)`` for an int key, without sorting when possible.

    When the key's range is at most a few times its length (iteration numbers, packed
    rank x iteration), a ``bincount`` over the range finds the sorted distinct values in
    linear time.
    """
    key = np.asarray(key, dtype=np.int64)
    if len(key) == 0:
        return key.copy(), np.empty(0, dtype=np.int64)
    lo = int(key.min())
    span = int(key.max()) - lo + 1
    if span > 4 * len(key) + 1024:
        uniq, inv = np.unique(key, return_inverse=True)
        return uniq.astype(np.int64, copy=False), inv.astype(np.int64, copy=False).ravel()
    shifted = key - lo
    present = np.bincount(shifted, minlength=span) > 0
    uniq = np.flatnonzero(present).astype(np.int64)
    remap = np.cumsum(present, dtype=np.int64) - 1
    return uniq + lo, remap[shifted]


def combine(*cols: np.ndarray) -> np.ndarray:
    """One non-negative int64 key identifying each distinct tuple of non-negative int columns.

    Columns are packed ``key * span + col``; when the product would overflow, the key built so
    far is replaced by dense codes first (which keeps identity, not order).
    """
    if len(cols[0]) and len(cols) > 1:
        # When every column's span multiplies within the limit no key is ever made dense:
        # packed in one compiled pass, without the loop's fresh arrays and maxima of the key
        spans = [int(np.max(col)) + 1 for col in cols]
        if min(spans) >= 1 and math.prod(spans) <= _LIMIT:
            return pack_kernel(tuple(np.ascontiguousarray(col, dtype=np.int64) for col in cols),
                               np.array(spans, dtype=np.int64))
    key = np.asarray(cols[0], dtype=np.int64)
    for col in cols[1:]:
        col = np.asarray(col, dtype=np.int64)
        if len(col) == 0:
            return key
        span = int(col.max()) + 1
        if (int(key.max()) + 1) > _LIMIT // span:
            key = dense(key)
            if (int(key.max()) + 1) > _LIMIT // span:
                col = dense(col)
                span = int(col.max()) + 1
        key = key * span + col
    return key


def reduce_at(ufunc: np.ufunc, code: np.ndarray, values: np.ndarray, size: int,
              initial: float) -> np.ndarray:
    """Per code ``0 .. size - 1`` of a dense ``code``, ``ufunc`` (``np.minimum``,
    ``np.maximum``, ``np.fmax``) over the ``values`` of its elements, ``initial`` where it has
    none: a group-by's min or max in one pass over the rows, without a sort or its fixed cost
    (compiled: :func:`~holmes_ml.features._kernels.scatter_reduce_kernel`; numpy's
    ``ufunc.at`` was as fast on some calls and up to 15 times slower on others). The result has ``initial``'s type (an int64
    bound for int64 values)."""
    out = np.full(size, initial)
    code, values = np.asarray(code), np.asarray(values)
    op = _SCATTER_OPS.get(ufunc)
    if (op is None or code.dtype.kind not in "iu" or values.dtype.kind not in "iuf"
            or out.dtype.kind not in "if" or (out.dtype.kind == "i" and values.dtype.kind != "i")):
        ufunc.at(out, code, values)  # (what the compiled pass does not cover)
    else:
        scatter_reduce_kernel(out, code, values, op)
    return out


#: scatter_reduce_kernel's op codes
_SCATTER_OPS: dict[np.ufunc, int] = {np.minimum: 0, np.maximum: 1, np.fmax: 2}


def rank_of(values: np.ndarray) -> np.ndarray:
    """Position of each value in an ascending sort (ties broken by position)."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), dtype=np.int64)
    ranks[order] = np.arange(len(values), dtype=np.int64)
    return ranks


def stable_order(key: np.ndarray) -> np.ndarray:
    """``np.argsort(key, kind="stable")`` for a non-negative int64 ``key``.

    Where the key and the row number pack into one int64, sorting the packed values (numpy's
    SIMD sort of values, no indirection) and keeping their row bits is the same permutation:
    on the bench job 18 ms against the stable argsort's 64 ms for the history's key, whose
    runs interleave, and against its 13 ms for the signatures', whose runs it merges cheaply.
    """
    n = len(key)
    row_bits = int(n - 1).bit_length() if n > 1 else 1
    if n < 1024 or int(key.max()).bit_length() + row_bits > 62:
        return np.argsort(key, kind="stable")
    packed = key << row_bits
    packed |= np.arange(n, dtype=np.int64)
    packed.sort()
    packed &= (1 << row_bits) - 1
    return packed


def _float32_bits(m: np.ndarray) -> np.ndarray:
    """The bit patterns (int64) of non-negative floats rounded to float32, which sort as the
    floats do (31 bits: they pack with a key in one int64)."""
    with np.errstate(over="ignore"):  # beyond float32 range -> inf, still the largest
        # + 0: -0.0 (sign bit set: a negative int) becomes 0.0, every other value stays
        return (m.astype(np.float32) + np.float32(0)).view(np.int32).astype(np.int64)


def sort_by(major: np.ndarray, minor: np.ndarray | None = None) -> np.ndarray:
    """Permutation grouping rows by a non-negative ``major`` key, sorted by ``minor`` within
    each group.

    Both keys are packed into one int64 so one ``argsort`` does the work of a two-key
    ``lexsort`` (about twice as fast); ``minor`` may be any orderable array. Groups come in
    ascending ``major`` order unless the key is too wide to pack, in which case it is first
    replaced by dense codes (groups stay contiguous, in arbitrary order); a dense ``major``
    (below the number of rows, which is below 2**30) is never too wide, packed with ``minor``
    or with its rank, so its groups come in code order on every path. A non-negative float
    ``minor`` packs as float32 (near-equal values may tie); one with negative values is put in
    exact order (:func:`_signed_float_order`).
    """
    n = len(major)
    if minor is None:
        return np.argsort(major, kind="stable")
    m = np.asarray(minor)
    if m.dtype.kind in "iu" and len(m):
        lo = int(m.min())
        span = int(m.max()) - lo + 1
        if span > 0 and (int(major.max()) + 1) <= _LIMIT // span:
            return stable_order(major * span + (m.astype(np.int64) - lo))
    if m.dtype.kind == "f" and len(m) and bool((m >= 0).all()):
        # The bit patterns of non-negative IEEE floats sort like the floats; float32 keeps
        # 31 bits, so the pair packs into one int64 (near-equal values may tie: harmless for
        # the order statistics computed downstream, which read the exact values).
        bits = _float32_bits(m)
        if (int(major.max()) + 1) <= _LIMIT // (1 << 31):
            return stable_order(major * (1 << 31) + bits)
    if (m.dtype.kind == "f" and len(m) and (int(major.max()) + 1) <= _LIMIT // (1 << 32)
            and not np.isnan(m).any()):
        return _signed_float_order(major, m)
    if (int(major.max()) + 1) > _LIMIT // max(n, 1):
        major = dense(major)
    r = rank_of(m)
    return np.argsort(major * max(n, 1) + r, kind="stable")


def _signed_float_order(major: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Rows by ``major``, then exactly by float ``m`` (any sign, no NaN), then by position:
    what ranking ``m`` first and sorting on (major, rank) gives, for one sort instead of two.

    ``m`` rounded to float32 keeps its order (rounding is monotone), and its bits, magnitude
    negated for negative values (so that -0.0 and 0.0 tie, as they compare), pack with
    ``major`` into one int64 key. Values that round to the same float32 but differ are then
    put in order among themselves: runs of equal keys whose values are not all equal, few.
    """
    n = len(m)
    with np.errstate(over="ignore"):  # beyond float32's range -> inf: a run, put in order below
        bits = m.astype(np.float32).view(np.int32)
    size = (bits & 0x7FFFFFFF).astype(np.int64)
    key = major.astype(np.int64) * (1 << 32) + (np.where(bits < 0, -size, size) + (1 << 31))
    del bits, size
    order = np.argsort(key, kind="stable")
    key = key[order]
    v = np.asarray(m, dtype=np.float64)[order]
    starts = segment_starts(key)
    fix = np.flatnonzero(np.minimum.reduceat(v, starts) < np.maximum.reduceat(v, starts))
    if len(fix):
        length = np.diff(np.append(starts, n))[fix]
        rows = ranges(starts[fix], length)[0]
        within = np.lexsort((v[rows], np.repeat(np.arange(len(fix)), length)))  # stable
        order[rows] = order[rows[within]]
    return order


def ranges(begin: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The integers ``begin[i] .. begin[i] + size[i] - 1`` for each ``i``, concatenated, and
    where each range starts in them."""
    first = np.cumsum(size) - size
    return np.arange(int(size.sum())) + np.repeat(begin - first, size), first


def segment_starts(sorted_key: np.ndarray) -> np.ndarray:
    """Index of the first element of each run of equal values in a sorted key."""
    if len(sorted_key) == 0:
        return np.empty(0, dtype=np.int64)
    change = np.flatnonzero(sorted_key[1:] != sorted_key[:-1]) + 1
    return np.concatenate([[0], change]).astype(np.int64)


def segment_layout(sorted_key: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For a sorted key: ``(starts, seg_id, pos)`` with per-element segment id and offset."""
    n = len(sorted_key)
    starts = segment_starts(sorted_key)
    lengths = np.diff(np.append(starts, n))
    seg_id = np.repeat(np.arange(len(starts), dtype=np.int64), lengths)
    pos = np.arange(n, dtype=np.int64) - starts[seg_id]
    return starts, seg_id, pos


def sorted_segment_median(v: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Median of each segment of ``v`` (sorted within each segment; segments begin at
    ``starts``), one value per segment."""
    lengths = np.diff(np.append(starts, len(v)))
    return 0.5 * (v[starts + (lengths - 1) // 2] + v[starts + lengths // 2])


def order_key(values: np.ndarray) -> np.ndarray:
    """An int64 key per value that orders the values as :func:`sort_by` orders a float
    ``minor`` (equal keys: by row): non-negative values (all of them) by their float32 rounding,
    others exactly (-0.0 and 0.0 alike, NaN last)."""
    m = np.asarray(values, dtype=np.float64)
    if len(m) and bool((m >= 0).all()):
        return _float32_bits(m)
    bits = (m + 0.0).view(np.int64)  # + 0.0: -0.0 becomes 0.0
    key = np.where(bits < 0, -(bits & np.int64(0x7FFFFFFFFFFFFFFF)), bits)
    key[np.isnan(m)] = np.iinfo(np.int64).max
    return key


def group_layout(code: np.ndarray, size: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(bound, rows)``: the rows of each code of a non-negative ``code`` (at least ``size``
    codes), ascending, at ``rows[bound[c]:bound[c + 1]]``, by a counting sort."""
    code = np.ascontiguousarray(code, dtype=np.int64)
    k = max(int(code.max()) + 1 if len(code) else 0, size)
    return group_rows_kernel(code, k)


def sorting_network(size: int) -> tuple[tuple[int, int], ...]:
    """Batcher odd-even merge-sort comparators for ``size`` elements.

    Built for the next power of two and pruned to ``size``: the missing elements act as
    ``+inf`` padding, for which every comparator touching them is a no-op.
    """
    p = 1
    while p < size:
        p *= 2
    pairs: list[tuple[int, int]] = []
    t = 1
    while t < p:
        k = t
        while k >= 1:
            for j in range(k % t, p - k, 2 * k):
                for i in range(min(k, p - j - k)):
                    if (i + j) // (2 * t) == (i + j + k) // (2 * t) and i + j + k < size:
                        pairs.append((i + j, i + j + k))
            k //= 2
        t *= 2
    return tuple(pairs)


_NETWORK_CLASSES = 7  # groups of up to 1, 2, 4, ..., 64 rows are sorted by a network
_NETWORK_BLOCK = 64  # groups sorted side by side (a 64 x 64 block of int64: 32 KB)


@functools.cache
def _networks() -> tuple[np.ndarray, np.ndarray]:
    """``(pairs, offsets)``: the comparators of the networks for ``2**c`` keys, ``c`` below
    :data:`_NETWORK_CLASSES`, at ``pairs[offsets[c]:offsets[c + 1]]``."""
    nets = [sorting_network(1 << c) for c in range(_NETWORK_CLASSES)]
    offsets = np.cumsum([0] + [len(net) for net in nets]).astype(np.int64)
    pairs = np.array([pair for net in nets for pair in net], dtype=np.int64).reshape(-1, 2)
    return pairs, offsets


def _packs(values: np.ndarray, low: float, finite: bool = False) -> bool:
    """Every value is ``>= 0`` (``low``: their minimum; and finite, if ``finite``), as
    :func:`order_key` then orders them by their float32 bits, and the rows number fewer than
    2**32: each row's bits and row number pack into one int64 (:func:`packed_median_kernel`)."""
    return (0 < len(values) < 2**32 and bool(low >= 0)
            and (not finite or bool(values.max() < np.inf)))


def _minimum(values: np.ndarray) -> float:
    """The smallest value (NaN if any is NaN, or none)."""
    return float(values.min()) if len(values) else np.nan


def _read_only(values: np.ndarray) -> np.ndarray:
    """``values`` as a C-contiguous float64 array marked read-only (a view where it is one
    already): numba compiles a kernel once per argument type, and writable and read-only
    arrays are two types (the median kernels took about 2 s to compile each time)."""
    out = np.ascontiguousarray(values, dtype=np.float64).view()
    out.flags.writeable = False
    return out


def group_median(bound: np.ndarray, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Median of ``values`` per group of :func:`group_layout` (NaN for an empty group), the
    values in the order of :func:`order_key` (ties by row): the median of :func:`sort_by`'s
    order, bit for bit (may reorder ``rows`` within groups).

    Non-negative values are packed with their rows and sorted a block of groups at a time by
    a sorting network (:func:`~holmes_ml.features._kernels.packed_median_kernel`); values
    some of which are negative, none NaN, are sorted as floats so
    (:func:`~holmes_ml.features._kernels.float_median_kernel`); values with NaN are selected
    one group at a time (:func:`~holmes_ml.features._kernels.group_median_kernel`)."""
    values = _read_only(values)
    low = _minimum(values)
    if _packs(values, low):
        return packed_median_kernel(bound, rows, _float32_bits(values), values, *_networks(),
                                    _NETWORK_BLOCK, False)[0]
    if low < 0:  # (and no NaN)
        return float_median_kernel(bound, rows, values, *_networks(), _NETWORK_BLOCK)
    key = order_key(values)
    return group_median_kernel(bound, rows, key, key, values, np.arange(len(bound) - 1))


def group_median_mad(bound: np.ndarray, rows: np.ndarray,
                     values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(median, median absolute deviation)`` of ``values`` per group of
    :func:`group_layout`, as sorting gives them: the median of :func:`group_median`, and the
    median of the absolute deviations from it in the order of :func:`order_key` of the
    deviations, their ties in the order of their values' (as a stable sort of the deviations
    leaves them)."""
    values = _read_only(values)
    if _packs(values, _minimum(values), finite=True):  # (a deviation from inf can be NaN)
        return packed_median_kernel(bound, rows, _float32_bits(values), values, *_networks(),
                                    _NETWORK_BLOCK, True)
    key = order_key(values)
    groups = np.arange(len(bound) - 1)
    med = group_median_kernel(bound, rows, key, key, values, groups)
    centre = np.empty(len(values))
    centre[rows] = np.repeat(med, np.diff(bound))
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, which sorts last
        adev = np.abs(values - centre)
    return med, group_median_kernel(bound, rows, order_key(adev), key, adev, groups)


def places(key: np.ndarray, minor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(place, prev)`` per row for a non-negative int ``key`` and an int ``minor``: the row's
    place among its key's rows in ``minor`` order (equal ones by row) and the row just before
    it there (-1 for the first), as a stable sort by (key, minor) gives them, in linear time
    where the key's rows mostly come in ``minor`` order already
    (:func:`~holmes_ml.features._kernels.places_kernel`)."""
    key = np.asarray(key, dtype=np.int64)
    n = len(key)
    k = int(key.max()) + 1 if n else 0
    if k > n:  # sparse codes (most absent): numbered densely first
        key = dense(key)
        k = int(key.max()) + 1
    return places_kernel(key, k, np.ascontiguousarray(minor, dtype=np.int64))


def segment_median(key: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Median of ``values`` per code of a non-negative ``key`` (index = code; a code with no
    element gets NaN), as sorting each code's values (:func:`sort_by`) and averaging the two
    middle ones would give, found by selection."""
    n = len(key)
    k = int(key.max()) + 1 if n else 0
    if k <= 4 * n + 1024:
        return group_median(*group_layout(key, k), values)
    present, code = np.unique(key, return_inverse=True)  # sparse codes
    out = np.full(k, np.nan)
    out[present] = group_median(*group_layout(code.ravel()), values)
    return out
