"""The optimized history features against the previous (float64, one-gather-per-lag)
implementation, copied below verbatim as the reference.

The new ``_history`` sorts windows in float32, computes the order statistics of full windows
from fixed rows and patches the short ones; the results must equal the reference's within
float32 rounding of the durations.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from holmes_ml.bench.features import synthetic_ops
from holmes_ml.features import FEATURE_COLUMNS, FeatureConfig, build, build_features
from holmes_ml.features import _segments as seg
from holmes_ml.features._kernels import PEERS_KERNEL_OUTPUTS
from holmes_ml.features.build import _COL, _EPS_US, TIME_FEATURES

# --------------------------------------------------------------------------- reference
_NETWORK_MAX = 32  # beyond this many lags np.sort beats a comparator network


def _reference_sort_columns(m: np.ndarray, tmp: np.ndarray) -> None:
    """Sort each column of a ``(w, rows)`` matrix in place.

    A sorting network runs ~w log^2 w vectorized min/max passes over contiguous rows, several
    times faster than ``np.sort`` on millions of 10-element rows.
    """
    w = m.shape[0]
    if w > _NETWORK_MAX:
        m.sort(axis=0)
        return
    for i, j in seg.sorting_network(w):
        np.minimum(m[i], m[j], out=tmp)
        np.maximum(m[i], m[j], out=m[j])
        m[i] = tmp


_HISTORY_OUTPUTS_OLD = (
    "history_len", "hist_mean_us", "hist_std_us", "hist_q1_us", "hist_median_us", "hist_q3_us",
    "hist_iqr_us", "hist_z", "hist_iqr_score", "hist_ratio", "arrival_lag_rel", "wait_rel",
    "xfer_hist_ratio", "base_ratio",
)


def _reference_history(
    matrix: np.ndarray,
    values: np.ndarray,
    xfer: np.ndarray,
    wait: np.ndarray,
    sig: np.ndarray,
    iteration: np.ndarray,
    regular: np.ndarray,
    peer_med: np.ndarray,
    lag_us: np.ndarray,
    cfg,
) -> None:
    """History features of every row, written straight into ``matrix`` (features x rows).

    The statistics are over up to ``window`` earlier occurrences of each row's signature in
    rows where ``regular`` is true (see ``FeatureConfig.history_regular_only``). Rows are
    sorted by (signature, iteration) and the history rows compacted in that order, so the
    earlier occurrences of row ``i`` are the ``history_len`` compacted rows just before its
    place; lag ``l`` of a chunk is then one gather. Everything derived from
    the statistics is computed per chunk and scattered into ``matrix``, so no row-sized
    float64 temporaries exist (memory stays ~ chunk x window).

    Without history the op's peers stand in for its past: the history statistics are the peer
    median, ratios become peer ratios and the spread-based scores are neutral (0).
    """
    n = len(values)
    w = int(cfg.window)
    order = seg.sort_by(sig, iteration)
    v = values[order]
    x = xfer[order]
    r = regular[order]
    starts, seg_id, _ = seg.segment_layout(sig[order])

    def window_of(use: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        # Usable rows strictly before each row (sorted order), globally and in its segment.
        if use is None:
            before = np.arange(n, dtype=np.int64)
        else:
            before = np.cumsum(use, dtype=np.int64) - use
        return before, np.minimum(before - before[starts][seg_id], w)

    all_regular = bool(r.all())
    before_h, count_h = window_of(r if cfg.history_regular_only else None)
    # Same window when every iteration is regular (the common case): computed once.
    same_window = all_regular or cfg.history_regular_only
    before_b, count_b = (before_h, count_h) if same_window else window_of(r)
    # lag l of row i is padded[w - 1 + before[i] - l]
    pad = np.zeros(w)
    padded_h = np.concatenate([pad, v[r] if cfg.history_regular_only else v])
    padded_b = np.concatenate([pad, v[r]])
    padded_x = np.concatenate([pad, x[r]])
    del r
    chunk = int(min(cfg.chunk_rows, max(n, 1)))
    lag_idx = np.arange(w, dtype=np.int64)[:, None]
    mat = np.empty((w, chunk))
    tmp = np.empty(chunk)
    rows_of = {name: _COL[name] for name in _HISTORY_OUTPUTS_OLD}
    clip = cfg.clip

    def sorted_window(m, padded, before, c, t):
        """Fill ``m`` with each row's window (inf past its length), sorted per column."""
        k = len(before)
        if before[-1] - before[0] == k - 1:  # consecutive rows: slices, no gather
            lo = int(before[0]) + w - 1
            for lag in range(w):
                m[lag] = padded[lo - lag: lo - lag + k]
        else:
            idx = before + (w - 1)
            for lag in range(w):
                m[lag] = padded[idx - lag]
        invalid = lag_idx >= c[None, :]
        m[invalid] = np.inf
        _reference_sort_columns(m, t)
        return invalid

    def quantile(m, c, cols, frac):
        # numpy's default ("linear") percentile of the c valid values; an empty window reads
        # inf (neutral values replace it below), hence the silenced inf - inf.
        h = np.maximum(c - 1, 0) * frac
        lo = np.floor(h).astype(np.int64)
        hi = np.ceil(h).astype(np.int64)
        vlo = m[lo, cols]
        vhi = m[hi, cols]
        with np.errstate(invalid="ignore"):
            return np.where(hi == lo, vlo, vlo + (vhi - vlo) * (h - lo))

    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        m = mat[:, : b - a]
        t = tmp[: b - a]
        cols = np.arange(b - a)
        where = order[a:b]
        pm = peer_med[where]
        d = v[a:b]

        c = count_h[a:b]
        invalid = sorted_window(m, padded_h, before_h[a:b], c, t)
        valid_m = np.where(invalid, 0.0, m)
        denom = np.maximum(c, 1)
        mu = valid_m.sum(axis=0) / denom
        dev = np.where(invalid, 0.0, valid_m - mu)
        sd = np.sqrt(np.einsum("ij,ij->j", dev, dev) / denom)
        has = c > 0
        q1 = np.where(has, quantile(m, c, cols, 0.25), pm)
        med = np.where(has, quantile(m, c, cols, 0.5), pm)
        q3 = np.where(has, quantile(m, c, cols, 0.75), pm)
        mean = np.where(has, mu, pm)
        sd = np.where(has, sd, 0.0)
        iqr = q3 - q1
        med_safe = np.maximum(med, _EPS_US)
        floor = np.maximum(cfg.min_spread * np.abs(med), _EPS_US)

        # Baseline: regular iterations only, so that it survives a persistent fault.
        cb = count_b[a:b]
        hb = cb > 0
        if same_window:
            base_med = med
        else:
            sorted_window(m, padded_b, before_b[a:b], cb, t)
            base_med = np.where(hb, quantile(m, cb, cols, 0.5), pm)
        # The transfer part of the duration (the wait part moves with every peer's arrival;
        # the transfer is steady), against its own baseline.
        sorted_window(m, padded_x, before_b[a:b], cb, t)
        x_med = np.where(hb, quantile(m, cb, cols, 0.5), 1.0)

        out = {
            "history_len": c,
            "hist_mean_us": mean,
            "hist_std_us": sd,
            "hist_q1_us": q1,
            "hist_median_us": med,
            "hist_q3_us": q3,
            "hist_iqr_us": iqr,
            "hist_z": np.where(has, (d - mean) / np.maximum(sd, floor), 0.0),
            "hist_iqr_score": np.where(has, (d - med) / np.maximum(iqr, floor), 0.0),
            "hist_ratio": d / med_safe,
            "arrival_lag_rel": lag_us[where] / med_safe,
            "wait_rel": wait[where] / med_safe,
            "base_ratio": d / np.maximum(base_med, _EPS_US),
            "xfer_hist_ratio": np.where(hb, x[a:b] / np.maximum(x_med, _EPS_US), 1.0),
        }
        for name, vals in out.items():
            if name in TIME_FEATURES:
                with np.errstate(over="ignore"):  # float32 overflow -> inf, repaired later
                    matrix[rows_of[name], where] = vals
            else:
                matrix[rows_of[name], where] = np.clip(vals, -clip, clip)



# --------------------------------------------------------------------------- tests
_LEVEL = ("level_rise_frac", "level_excess_frac", "level_wait_excess_frac", "level_wait_z")


def _jobs():
    straggler = synthetic_ops(tp=4, pp=2, dp=4, iterations=40, seed=3, slow_rank=5,
                              slow_factor=1.6, slow_iterations=(22, 40))
    rng = np.random.default_rng(7)
    ragged = synthetic_ops(tp=2, pp=2, dp=2, iterations=30, seed=5, jitter=0.1)
    # drop a few rows so that signatures have gaps and short windows mid-run
    ragged = ragged.drop(index=rng.choice(len(ragged), size=len(ragged) // 20, replace=False))
    return {"straggler": straggler, "ragged": ragged.reset_index(drop=True)}


def _compare(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert list(got.columns) == list(want.columns)
    # the reference predates the lowest-level columns (tests/test_features.py checks them)
    got, want = got.drop(columns=list(_LEVEL)), want.drop(columns=list(_LEVEL))
    g = got.to_numpy(np.float64)
    w = want.to_numpy(np.float64)
    # The windows are sorted in float32: values agree to float32 rounding of the durations,
    # i.e. relative to the history median for the absolute (us) statistics.
    scale = np.maximum(np.abs(want["hist_median_us"].to_numpy(np.float64)), 1.0)[:, None]
    ok = np.isclose(g, w, rtol=2e-6, atol=0) | (np.abs(g - w) <= 2e-6 * scale)
    # scores divide by a spread floor of 1 % of the median: 2e-6 of the median is 2e-4 there
    for name in ("hist_z", "hist_iqr_score"):
        i = FEATURE_COLUMNS.index(name)
        ok[:, i] |= np.abs(g[:, i] - w[:, i]) <= 2e-4 * np.maximum(1.0, np.abs(w[:, i]))
    bad = np.argwhere(~ok)
    assert not len(bad), [(FEATURE_COLUMNS[j], g[i, j], w[i, j]) for i, j in bad[:5]]


@pytest.mark.parametrize("job", ["straggler", "ragged"])
@pytest.mark.parametrize("regular_only", [False, True])
def test_history_equals_the_previous_implementation(monkeypatch, job, regular_only):
    ops = _jobs()[job]
    cfg = FeatureConfig(history_regular_only=regular_only, chunk_rows=1000)
    got = build_features(ops, cfg)
    monkeypatch.setattr(build, "_history", _reference_history)
    want = build_features(ops, cfg)
    _compare(got, want)
    # the job exercises what the fast path special-cases
    assert (want["history_len"] < cfg.window).any() and (want["history_len"] == cfg.window).any()


def test_history_equals_the_previous_implementation_on_the_simulator(monkeypatch):
    sim = pytest.importorskip("holmes_ml.simulator")
    fault = sim.FaultSpec.parse("gpu_slow:rank=5,severity=0.5,start=12")
    ops = sim.simulate(sim.SimConfig(seed=2, iterations=24, faults=(fault,))).ops
    cfg = FeatureConfig(window=7)
    got = build_features(ops, cfg)
    monkeypatch.setattr(build, "_history", _reference_history)
    _compare(got, build_features(ops, cfg))


def test_dense_codes_identify_the_same_groups_on_both_paths():
    rng = np.random.default_rng(0)
    small = rng.integers(-5, 50, size=1000)  # range << length: bincount path
    wide = small * 10**12  # range >> length: hashing path
    a, b = seg.dense(small), seg.dense(wide)
    assert a.dtype == np.int64 and a.min() == 0 and a.max() == len(np.unique(small)) - 1
    # the same partition of the rows on both paths, and equal keys share a code
    assert len(set(zip(a.tolist(), b.tolist(), strict=True))) == len(np.unique(small))
    for value in np.unique(small)[:5]:
        assert len(np.unique(a[small == value])) == 1


@pytest.mark.parametrize("scale", [1, 10**17])  # packs into one key / too wide: dense first
@pytest.mark.parametrize("minor_kind", ["int", "float", "signed float"])
def test_sort_by_groups_rows_and_orders_each_group(scale, minor_kind):
    rng = np.random.default_rng(1)
    major = rng.integers(0, 40, size=3000) * scale
    minor = {"int": rng.integers(-10**6, 10**6, size=3000),
             "float": rng.exponential(size=3000),
             "signed float": rng.standard_normal(3000)}[minor_kind]
    order = seg.sort_by(major, minor)
    assert sorted(order.tolist()) == list(range(3000))
    g, m = major[order], minor[order]
    starts = seg.segment_starts(g)
    assert len(starts) == len(np.unique(major))  # each group is one contiguous run
    for a, b in zip(starts, np.append(starts[1:], len(g)), strict=True):
        assert np.all(np.diff(m[a:b]) >= 0)
    if scale == 1:  # packed: groups in ascending key order as well
        assert np.all(np.diff(g) >= 0)


@pytest.mark.parametrize("seed", range(10))
def test_sort_by_puts_signed_floats_in_exact_order(seed):
    # values of both signs, near-ties that float32 cannot tell apart, -0.0 against 0.0 (equal:
    # ties keep the rows' order), values beyond float32's range and infinities: the same
    # permutation as a stable sort on (major, value)
    rng = np.random.default_rng(seed)
    pool = np.concatenate([rng.normal(0, 10, 40), [0.0, -0.0, 1e-9, -1e-9, 1.0, 1.0 + 1e-12,
                                                  1.0 - 1e-12, -5.0, -5.0 - 1e-13, 3e38, 1e39,
                                                  -1e39, np.inf, -np.inf]])
    n = int(rng.integers(50, 2000))
    major = rng.integers(0, int(rng.integers(1, 60)), n)
    minor = rng.choice(pool, n)
    minor[0] = -1.0
    want = np.lexsort((minor, major))  # stable: ties by position
    np.testing.assert_array_equal(seg.sort_by(major, minor), want)


@pytest.mark.parametrize("wide", [False, True])  # codes few (placed by counts) / far apart
def test_segment_median_equals_pandas(wide):
    rng = np.random.default_rng(5)
    for n in (1, 7, 500, 4000):
        key = rng.integers(0, max(n // 3, 1), size=n) * (10**3 if wide else 1)  # codes absent
        values = np.round(rng.standard_normal(n), 1)  # ties, both signs
        got = seg.segment_median(key, values)
        want = pd.Series(values).groupby(key).median()
        np.testing.assert_array_equal(got[want.index.to_numpy()], want.to_numpy())
        absent = np.ones(len(got), dtype=bool)
        absent[want.index.to_numpy()] = False
        assert len(got) == key.max() + 1 and np.isnan(got[absent]).all()


def test_a_negative_zero_stays_in_its_group():
    # -0.0 passes a ">= 0" check, but its sign bit made it the smallest key of all: its row
    # sorted into the group before its own, and that group's median took it
    major = np.array([0, 0, 1, 1, 1])
    minor = np.array([1.0, 2.0, 0.5, -0.0, 3.0])
    np.testing.assert_array_equal(major[seg.sort_by(major, minor)], [0, 0, 1, 1, 1])
    np.testing.assert_array_equal(seg.segment_median(major, minor), [1.5, 0.5])


def test_stage_step_median_and_mad_equal_pandas():
    rng = np.random.default_rng(3)
    key = rng.integers(0, 300, size=20000) * 7919  # sparse keys, groups of mixed sizes
    dur = rng.lognormal(3.0, 0.5, size=20000)
    cols: dict[str, np.ndarray] = {}
    put = cols.__setitem__
    with pytest.raises(ValueError, match="not dense"):  # the crowds are read by code
        build._stage_step(put, key, dur, 0.0)
    build._stage_step(put, seg.dense(key), dur, 0.0)  # as build_features numbers them
    frame = pd.DataFrame({"k": key, "d": dur})
    med = frame.groupby("k")["d"].transform("median").to_numpy()
    mad = (frame["d"] - med).abs().groupby(frame["k"]).transform("median").to_numpy()
    np.testing.assert_allclose(cols["stage_step_ratio"], dur / med, rtol=1e-12)
    sd = np.maximum(1.4826 * mad, _EPS_US)
    np.testing.assert_allclose(cols["stage_step_z"], (dur - med) / sd, rtol=1e-9, atol=1e-9)


def _sorted_median(key: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The median of each dense code's values as sorting gives it: the two middle values of
    the code's rows in ``sort_by``'s order, averaged."""
    v = values[seg.sort_by(key, values)]
    lengths = np.bincount(key)
    starts = np.cumsum(lengths) - lengths
    return 0.5 * (v[starts + (lengths - 1) // 2] + v[starts + lengths // 2])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("signed", [False, True])
def test_selected_median_is_the_sorted_one_bit_for_bit(seed, signed):
    # values that round to one float32 but differ in float64 tie in sort_by's order (rows
    # decide); a selection must take the same rows for the middle, not the float64 order's
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    key = seg.dense(rng.integers(0, max(n // int(rng.integers(1, 70)), 1), n))
    base = rng.choice(np.array([0.0, 1.0, 3.5, 1e3, 7.25]), n)
    values = base * (1 + rng.integers(-3, 4, n) * 1e-12)  # distinct, equal in float32
    if signed:
        values[rng.random(n) < 0.3] *= -1.0
        values[rng.random(n) < 0.05] = -0.0
    assert np.array_equal(seg.segment_median(key, values), _sorted_median(key, values))
    # the crowd's deviations tie too: they keep the order of their values'
    med, sd = build._crowd(key, np.abs(values), 0.0)
    v = np.abs(values)[seg.sort_by(key, np.abs(values))]
    code_sorted = np.repeat(np.arange(key.max() + 1), np.bincount(key))
    adev = np.abs(v - med[code_sorted])
    adev = adev[seg.sort_by(code_sorted, adev)]
    lengths = np.bincount(key)
    starts = np.cumsum(lengths) - lengths
    mad = 0.5 * (adev[starts + (lengths - 1) // 2] + adev[starts + lengths // 2])
    assert np.array_equal(med, _sorted_median(key, np.abs(values)))
    assert np.array_equal(sd, np.maximum(1.4826 * mad, _EPS_US))


@pytest.mark.parametrize("wide", [False, True])
def test_combine_packs_columns_or_keeps_their_identity(wide):
    # columns whose spans multiply within the limit pack as key * span + col in one pass;
    # wider ones go dense on the way and still tell every distinct tuple apart
    rng = np.random.default_rng(7)
    n = 5000
    cols = [rng.integers(0, 40, n), rng.integers(0, 7, n).astype(np.int8),
            rng.integers(0, 1 << 20, n) * ((1 << 30) if wide else 1),
            rng.integers(0, 300, n).astype(np.int32)]
    before = [col.copy() for col in cols]
    key = seg.combine(*cols)
    assert key.dtype == np.int64 and (key >= 0).all()
    for col, was in zip(cols, before, strict=True):  # the inputs are untouched
        np.testing.assert_array_equal(col, was)
    if not wide:
        want = np.zeros(n, dtype=np.int64)
        for col in cols:
            want = want * (int(col.max()) + 1) + col.astype(np.int64)
        np.testing.assert_array_equal(key, want)
    tuples = pd.Series(list(zip(*cols, strict=True)))
    assert len(np.unique(key)) == tuples.nunique()
    same = pd.Series(key).groupby(pd.factorize(tuples)[0]).nunique()
    assert (same == 1).all()  # one key per tuple


@pytest.mark.parametrize("ufunc", [np.minimum, np.maximum, np.fmax])
@pytest.mark.parametrize("kind", ["int64", "int32", "float", "float with NaN", "read-only"])
def test_reduce_at_is_ufunc_at(ufunc, kind):
    # the compiled pass gives what ufunc.at gives: NaN wins a minimum or maximum, loses fmax
    rng = np.random.default_rng(9)
    n, k = 20_000, 700
    code = rng.integers(0, k - 5, n)  # the last codes get nothing: they keep the initial value
    values = rng.integers(-10**12, 10**12, n)
    initial = np.iinfo(np.int64).max if ufunc is np.minimum else np.iinfo(np.int64).min
    if kind == "int32":
        values = values.astype(np.int32) // 7
    if kind.startswith("float"):
        values = values * 1e-3
        initial = np.inf if ufunc is np.minimum else -np.inf
    if kind == "float with NaN":
        values[rng.random(n) < 0.002] = np.nan
    if kind == "read-only":
        values.flags.writeable = False
        code.flags.writeable = False
    want = np.full(k, initial)
    with np.errstate(invalid="ignore"):  # (NaN met)
        ufunc.at(want, code, values)
    got = seg.reduce_at(ufunc, code, values, k, initial)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    with pytest.raises(IndexError):
        seg.reduce_at(ufunc, np.array([0, k]), values[:2], k, initial)


def _sorted_median_mad(code, values, k):
    """Per code ``0 .. k - 1``: the median of its values in the order of (order_key, row), and
    the median of their absolute deviations from it in the order of (the deviations'
    order_key, the values' order_key, row), by sorting each code's rows."""
    key = seg.order_key(values)
    med = np.full(k, np.nan)
    for g in range(k):
        rows = np.flatnonzero(code == g)
        if len(rows):
            v = values[rows[np.lexsort((rows, key[rows]))]]
            med[g] = 0.5 * (v[(len(v) - 1) // 2] + v[len(v) // 2])
    with np.errstate(invalid="ignore"):  # inf - inf
        adev = np.abs(values - med[code])
    adev_key = seg.order_key(adev)
    mad = np.full(k, np.nan)
    for g in range(k):
        rows = np.flatnonzero(code == g)
        if len(rows):
            d = adev[rows[np.lexsort((rows, key[rows], adev_key[rows]))]]
            mad[g] = 0.5 * (d[(len(d) - 1) // 2] + d[len(d) // 2])
    return med, mad


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", ["non-negative", "signed", "zeros", "nan", "inf", "huge"])
def test_every_median_path_is_the_sorted_one_bit_for_bit(seed, kind):
    # group_median and group_median_mad take a network over packed keys (values >= 0), a
    # network over floats (some negative) or a selection per group (NaN); groups from empty to
    # larger than any network (200 rows), values tied in float32, signed zeros on both sides
    rng = np.random.default_rng(seed)
    k = 40
    sizes = rng.choice(np.array([0, 1, 2, 3, 4, 5, 7, 8, 9, 31, 33, 63, 64, 65, 200]), k)
    code = rng.permutation(np.repeat(np.arange(k), sizes))
    n = len(code)
    base = rng.choice(np.array([0.0, 1.0, 3.5, 1e3, 7.25]), n)
    values = base * (1 + rng.integers(-3, 4, n) * 1e-12)  # distinct, equal in float32
    if kind in ("signed", "zeros", "nan"):
        values[rng.random(n) < 0.4] *= -1.0
    if kind == "zeros":  # most middles are zeros of either sign
        values[rng.random(n) < 0.6] = 0.0
        values[rng.random(n) < 0.3] = -0.0
    if kind == "nan":
        values[rng.random(n) < 0.05] = np.nan
    if kind == "inf":
        values[rng.random(n) < 0.3] = np.inf
    if kind == "huge":  # beyond float32's range: their float32 bits are inf's
        values[rng.random(n) < 0.3] *= 1e300
    want_med, want_mad = _sorted_median_mad(code, values, k)
    bound, rows = seg.group_layout(code, k)
    med, mad = seg.group_median_mad(bound, rows, values)
    for got, want in ((seg.group_median(bound, rows, values), want_med), (med, want_med),
                      (mad, want_mad)):
        np.testing.assert_array_equal(got, want)
        known = ~np.isnan(want)
        np.testing.assert_array_equal(np.signbit(got[known]), np.signbit(want[known]))  # -0.0


@pytest.mark.parametrize("kind", ["random", "nearly sorted", "few values", "wide", "small"])
def test_stable_order_is_the_stable_argsort(kind):
    rng = np.random.default_rng(11)
    n = 50 if kind == "small" else 20_000
    key = {"random": rng.integers(0, 10**9, n),
           "nearly sorted": np.sort(rng.integers(0, 10**6, n)) + (rng.random(n) < 0.01),
           "few values": rng.integers(0, 5, n),  # ties: rows keep their order
           "wide": rng.integers(0, 2**60, n),  # too wide to pack with the rows
           "small": rng.integers(0, 7, n)}[kind].astype(np.int64)
    np.testing.assert_array_equal(seg.stable_order(key), np.argsort(key, kind="stable"))


@pytest.mark.parametrize("seed", range(4))
def test_peer_columns_equal_a_group_by(seed):
    # instances of 1 to 80 copies (the big ones rank their arrivals by bisection), arrival
    # times with ties, in any row order
    rng = np.random.default_rng(seed)
    sizes = rng.choice([1, 2, 3, 8, 33, 80], 60)
    inst = rng.permutation(np.repeat(np.arange(len(sizes)) * 7 + 3, sizes))
    n = len(inst)
    start = rng.integers(0, 5, n) * 1_000 + 10**18  # ties: one of five arrival times
    dur = rng.lognormal(3.0, 0.5, n)
    matrix = np.full((len(FEATURE_COLUMNS), n), np.nan, dtype=np.float32)
    written: set[str] = set()
    peer_med, lag_us, wait_us, sid, peer_min, last = build._peers(matrix, written, inst,
                                                                  start, dur, 1e4)
    col = {name: matrix[_COL[name]] for name in written}
    frame = pd.DataFrame({"i": inst, "s": start, "d": dur, "row": np.arange(n)})
    by = frame.groupby("i")
    lag = (frame["s"] - by["s"].transform("min")).to_numpy()
    spread = pd.Series(lag).groupby(inst).transform("max").to_numpy()
    size = by["s"].transform("size").to_numpy()
    ahead = pd.Series(lag).groupby(inst).rank(method="min").to_numpy() - 1
    late = frame.assign(lag=lag).sort_values(["i", "lag", "row"]).groupby("i")["row"].last()
    np.testing.assert_array_equal(lag_us, lag / 1e3)
    np.testing.assert_array_equal(wait_us, np.minimum((spread - lag) / 1e3, dur))
    np.testing.assert_array_equal(last, late.loc[inst].to_numpy())
    np.testing.assert_array_equal(peer_min, by["d"].transform("min").to_numpy())
    np.testing.assert_allclose(peer_med, by["d"].transform("median").to_numpy(), rtol=1e-12)
    np.testing.assert_array_equal(col["peer_count"], size)
    np.testing.assert_array_equal(col["arrived_last"], (lag == spread) & (spread > 0))
    np.testing.assert_array_equal(
        col["arrival_rank"], np.where(size > 1, ahead / np.maximum(size - 1, 1), 0.0)
        .astype(np.float32))
    np.testing.assert_array_equal(
        col["arrival_lag_spread"],
        np.where(spread > 0, lag / np.maximum(spread, 1), 0.0).astype(np.float32))
    np.testing.assert_array_equal(
        col["peer_ratio_max"], (dur / by["d"].transform("max").to_numpy()).astype(np.float32))
    assert len(np.unique(sid)) == len(sizes) and written == set(PEERS_KERNEL_OUTPUTS)


@pytest.mark.parametrize("kind", ["in order", "shuffled", "big groups", "sparse keys"])
def test_places_are_the_stable_sorts(kind):
    # each row's place among its key's rows by minor (ties by row) and the row before it
    rng = np.random.default_rng(13)
    n = 5000
    key = rng.integers(0, {"big groups": 20}.get(kind, 900), n)
    if kind == "sparse keys":
        key = key * 10**7
    minor = rng.integers(0, 50, n)  # ties
    if kind == "in order":
        rows = np.lexsort((minor, key))
        minor = minor[rows]
        key = key[rows][rng.permutation(n)]  # keys interleave; each key's minors ascend
        minor = np.sort(minor)
    order = np.lexsort((np.arange(n), minor, key))
    sorted_key = key[order]
    first = np.r_[True, sorted_key[1:] != sorted_key[:-1]]
    start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    want_place = np.empty(n, dtype=np.int64)
    want_place[order] = np.arange(n) - start
    want_prev = np.empty(n, dtype=np.int64)
    want_prev[order] = np.where(first, -1, np.r_[-1, order[:-1]])
    place, prev = seg.places(key, minor)
    np.testing.assert_array_equal(place, want_place)
    np.testing.assert_array_equal(prev, want_prev)
