"""Irregularity monitor: iteration_table and detect_irregular (holmes_ml.features.iterations)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from holmes_ml.features import (
    IrregularityConfig,
    detect_irregular,
    iteration_table,
    iteration_times,
)
from holmes_ml.io.schema import SchemaError


def _times(values) -> pd.DataFrame:
    """An iteration table from a list of durations in seconds."""
    return pd.DataFrame(
        {"duration_s": np.asarray(values, dtype=np.float64)},
        index=pd.Index(np.arange(len(values)), name="iteration"),
    )


def _ops_from_durations(durations_s, ranks: int = 4, seed: int = 0) -> pd.DataFrame:
    """Ops whose job-wide iteration span is exactly ``durations_s`` (one op per rank)."""
    rng = np.random.default_rng(seed)
    rows = []
    t0 = 0
    for it, d in enumerate(durations_s):
        span_ns = int(round(d * 1e9))
        for r in range(ranks):
            # rank 0 starts at t0 and ends last, defining the span; others sit inside it
            start = t0 if r == 0 else t0 + int(rng.integers(1, span_ns // 4))
            end = t0 + span_ns if r == 0 else start + span_ns // 4
            rows.append((it, r, "all_reduce", "dp-0", it, 1024, start, (end - start) / 1e3))
        t0 += span_ns + 1000
    return pd.DataFrame(rows, columns=["iteration", "rank", "op", "group", "seq", "nbytes",
                                       "start_ns", "duration_us"])


def test_iteration_table_spans_min_start_to_max_end_in_any_row_order():
    ops = _ops_from_durations([1.0, 2.0, 1.5])
    shuffled = ops.sample(frac=1.0, random_state=3)
    t = iteration_table(shuffled)
    assert t.index.name == "iteration"
    assert t.index.tolist() == [0, 1, 2]
    np.testing.assert_allclose(t["duration_s"].to_numpy(), [1.0, 2.0, 1.5], rtol=1e-9)
    np.testing.assert_allclose(t["time_us"].to_numpy(), [1e6, 2e6, 1.5e6], rtol=1e-9)
    assert t["n_ops"].tolist() == [4, 4, 4]
    expected_start = ops.groupby("iteration")["start_ns"].min().to_numpy()
    np.testing.assert_array_equal(t["start_ns"].to_numpy(), expected_start)
    pd.testing.assert_frame_equal(t, iteration_table(ops))


def test_iteration_table_missing_ranks_sparse_iterations_and_single_op():
    ops = _ops_from_durations([1.0, 1.0, 1.0, 1.0])
    # drop rank 2 from iteration 1 and iteration 2 entirely; renumber iteration 3 -> 10**6
    ops = ops[~((ops["iteration"] == 1) & (ops["rank"] == 2)) & (ops["iteration"] != 2)].copy()
    ops.loc[ops["iteration"] == 3, "iteration"] = 10**6
    t = iteration_table(ops)
    assert t.index.tolist() == [0, 1, 10**6]
    assert t["n_ops"].tolist() == [4, 3, 4]
    one = iteration_table(ops.head(1))
    assert len(one) == 1 and one["duration_s"].iloc[0] == pytest.approx(1.0)
    empty = iteration_table(ops.head(0))
    assert len(empty) == 0 and "duration_s" in empty.columns


def test_iteration_table_errors_name_the_column():
    ops = _ops_from_durations([1.0])
    with pytest.raises(SchemaError, match="start_ns"):
        iteration_table(ops.drop(columns="start_ns"))
    bad = ops.copy()
    bad.loc[1, "duration_us"] = np.nan
    with pytest.raises(SchemaError, match="duration_us"):
        iteration_table(bad)


def test_spike_is_flagged_and_classified():
    t = _times([1.0] * 10 + [1.5] + [1.0] * 10)
    out = detect_irregular(t)
    assert out.index[out["irregular"]].tolist() == [10]
    assert out.loc[10, "pattern"] == "spike"
    assert out.loc[10, "episode"] == 0
    assert out.loc[10, "ratio"] == pytest.approx(1.5)
    assert out.loc[10, "reference_s"] == pytest.approx(1.0)
    regular = out[~out["irregular"]]
    assert (regular["pattern"] == "").all() and (regular["episode"] == -1).all()


def test_persistent_step_stays_flagged_because_irregular_iterations_never_enter_reference():
    # 40 slow iterations: more than the 20-iteration window, so a reference that absorbed
    # irregular iterations would stop flagging half-way.
    t = _times([1.0] * 10 + [1.3] * 40 + [1.0] * 5)
    out = detect_irregular(t)
    irr = out.index[out["irregular"]].to_numpy()
    np.testing.assert_array_equal(irr, np.arange(10, 50))
    assert set(out.loc[irr, "pattern"]) == {"persistent"}
    assert out.loc[irr, "episode"].nunique() == 1
    np.testing.assert_allclose(out.loc[irr, "reference_s"].to_numpy(), 1.0)


def test_fluctuation_intermittent_short_episodes():
    d = [1.0] * 10
    for _ in range(4):
        d += [1.4, 1.0, 1.0]
    d += [1.0] * 10
    out = detect_irregular(_times(d))
    irr = out[out["irregular"]]
    assert len(irr) == 4
    assert set(irr["pattern"]) == {"fluctuation"}
    assert irr["episode"].tolist() == [0, 1, 2, 3]


def test_mixed_episodes_get_their_own_patterns():
    d = [1.0] * 10 + [1.5] + [1.0] * 15 + [1.3] * 12 + [1.0] * 5
    out = detect_irregular(_times(d))
    assert out.loc[10, "pattern"] == "spike"
    assert set(out.loc[26:37, "pattern"]) == {"persistent"}
    assert out["episode"].max() == 1


def test_delta_threshold_and_jitter_does_not_alarm():
    rng = np.random.default_rng(7)
    jittery = 1.0 + 0.02 * rng.standard_normal(300)
    assert not detect_irregular(_times(jittery))["irregular"].any()
    # 6 % slower: below the default delta, above a 1.04 delta
    d = [1.0] * 10 + [1.06] + [1.0] * 5
    assert not detect_irregular(_times(d))["irregular"].any()
    out = detect_irregular(_times(d), IrregularityConfig(delta=1.04))
    assert out.index[out["irregular"]].tolist() == [10]


def test_rolling_reference_follows_slow_drift():
    d = np.linspace(1.0, 1.5, 200)  # +0.25 % per iteration: drift, not a fault
    assert not detect_irregular(_times(d))["irregular"].any()


def test_accepts_ops_or_table_with_iteration_column_and_short_inputs():
    durations = [1.0] * 6 + [2.0] + [1.0] * 3
    ops = _ops_from_durations(durations).sample(frac=1.0, random_state=1)
    from_ops = detect_irregular(ops)
    assert from_ops.index[from_ops["irregular"]].tolist() == [6]
    table = iteration_table(ops).reset_index()
    from_col = detect_irregular(table)
    pd.testing.assert_series_equal(from_ops["irregular"], from_col["irregular"])
    one = detect_irregular(_times([3.0]))
    assert len(one) == 1 and not one["irregular"].iloc[0] and one["ratio"].iloc[0] == 1.0
    assert len(detect_irregular(_times([]))) == 0
    # before min_history regular iterations nothing is flagged
    assert not detect_irregular(_times([1.0, 5.0]))["irregular"].any()


def test_detect_irregular_errors():
    with pytest.raises(SchemaError, match="duration_s"):
        detect_irregular(pd.DataFrame({"x": [1.0]}))
    with pytest.raises(SchemaError, match="duration_s"):
        detect_irregular(_times([1.0, -1.0]))
    with pytest.raises(ValueError, match="delta"):
        IrregularityConfig(delta=0.9)
    with pytest.raises(ValueError, match="persistent_min"):
        IrregularityConfig(spike_max=5, persistent_min=3)


@pytest.mark.parametrize("k", [0, 1, 5])
def test_ratio_of_an_iteration_ignores_later_iterations(k):
    rng = np.random.default_rng(k)
    d = 1.0 + 0.02 * rng.standard_normal(20)
    d[8] = 1.6
    base = detect_irregular(_times(d))
    changed = d.copy()
    changed[k + 1:] = rng.uniform(0.5, 3.0, size=len(d) - k - 1)
    out = detect_irregular(_times(changed))
    cols = ["reference_s", "ratio", "irregular"]
    pd.testing.assert_frame_equal(out.loc[:k, cols], base.loc[:k, cols])


def test_published_column_lists_match_the_output_empty_or_not():
    from holmes_ml.features.iterations import (
        IRREGULARITY_COLUMNS,
        ITERATION_COLUMNS,
        PATTERNS,
    )

    ops = _ops_from_durations([1.0] * 6 + [2.0] + [1.0] * 3)
    for t in (iteration_table(ops), iteration_table(ops.head(0))):
        assert tuple(t.columns) == ITERATION_COLUMNS
        out = detect_irregular(t)
        assert tuple(out.columns) == ITERATION_COLUMNS + IRREGULARITY_COLUMNS
        assert set(out["pattern"]) <= set(PATTERNS)


# --------------------------------------------------------------- timed end to end


def _end_of_step_ops(steps: int = 40, ranks: int = 8, pause: tuple[int, int, float] | None = None,
                     seed: int = 0) -> pd.DataFrame:
    """Pure data parallelism: 100 ms of compute per step, then one all-reduce that ends 2 ms
    after the last rank arrives. Ranks arrive up to 10 ms apart, so the all-reduce's span
    (first start to last end) is 2-12 ms: a small, noisy part of the step. ``pause``:
    ``(iteration, rank, seconds)`` that rank spends before that all-reduce."""
    rng = np.random.default_rng(seed)
    rows = []
    t = 0.0
    for it in range(steps):
        arrive = t + 0.1 + rng.uniform(0.0, 0.01, ranks)
        if pause is not None and pause[0] == it:
            arrive[pause[1]] += pause[2]
        end = arrive.max() + 0.002
        for r in range(ranks):
            rows.append((it, r, "all_reduce", "dp-0", it, 1 << 20, int(arrive[r] * 1e9),
                         (end - arrive[r]) * 1e6))
        t = end
    return pd.DataFrame(rows, columns=["iteration", "rank", "op", "group", "seq", "nbytes",
                                       "start_ns", "duration_us"])


def test_operators_at_the_end_of_each_step_are_timed_end_to_end():
    ops = _end_of_step_ops()
    t = iteration_table(ops)
    assert not t["end_to_end"].iloc[0] and t["end_to_end"].iloc[1:].all()
    steps = t["duration_s"].iloc[1:].to_numpy()
    assert ((steps > 0.102) & (steps < 0.113)).all()  # compute + spread + all-reduce
    assert not detect_irregular(t)["irregular"].any()
    # the span alone is mostly arrival spread: the same healthy job would raise alarms
    spans = (t["end_ns"] - t["start_ns"]).to_numpy()
    by_span, _ = iteration_times(t.index.to_numpy(), t["start_ns"].to_numpy(),
                                 t["end_ns"].to_numpy(), span_fraction=0.0)
    np.testing.assert_array_equal(by_span, spans)
    assert detect_irregular(_times(by_span / 1e9))["irregular"].sum() >= 3


def test_a_pause_before_the_all_reduce_flags_its_step_and_only_it():
    ops = _end_of_step_ops(pause=(25, 3, 0.04))
    out = detect_irregular(ops)
    assert out.index[out["irregular"]].tolist() == [25]
    # the step lost 30-40 ms (the pause, less how early rank 3 was), against ~106 ms
    assert out.loc[25, "end_to_end"] and 1.25 < out.loc[25, "ratio"] < 1.45
    # a pause longer than the step makes the span most of it, but the all-reduce from the
    # last arrival on is still a sliver of the step: timed end to end, pause and all
    long = detect_irregular(_end_of_step_ops(pause=(25, 3, 0.5)))
    assert long.index[long["irregular"]].tolist() == [25]
    assert long.loc[25, "end_to_end"] and 5.0 < long.loc[25, "ratio"] < 6.2


@pytest.mark.parametrize("seed", range(4))
def test_a_rank_twice_as_slow_in_every_step_flags_every_step(seed):
    """A straggler that doubles the compute of a data-parallel step from iteration 20 on: its
    peers wait at the all-reduce for it, so the span (first start to last end) is half of the
    now doubled step, and timing the step by it gave the usual step time; no alarm at all."""
    ops = _end_of_step_ops(seed=seed)
    it = ops["iteration"].to_numpy()
    late = it >= 20
    slow = late & (ops["rank"] == 3).to_numpy()
    # each later step starts 100 ms later per slow step before it; in it, rank 3 arrives 100 ms
    # after its peers, which wait that much longer
    ops["start_ns"] += (np.clip(it - 20, 0, None) * 100_000_000).astype(np.int64)
    ops.loc[slow, "start_ns"] += 100_000_000
    ops.loc[late & ~slow, "duration_us"] += 100_000.0
    out = detect_irregular(ops)
    assert out.index[out["irregular"]].tolist() == list(range(20, 40))
    assert out.loc[20:, "end_to_end"].all()
    assert (out.loc[20:, "ratio"] > 1.8).all()


def test_a_gap_in_the_iterations_shares_the_end_to_end_time_over_its_steps():
    ops = _end_of_step_ops()
    ops = ops[~ops["iteration"].isin([10, 11])]
    t = iteration_table(ops)
    assert t.loc[12, "end_to_end"]
    assert t.loc[12, "duration_s"] == pytest.approx(
        (t.loc[12, "end_ns"] - t.loc[9, "end_ns"]) / 3e9)
    assert not detect_irregular(t)["irregular"].any()


def test_summaries_and_features_time_iterations_as_the_table_does():
    from holmes_ml.features import FeatureStream, build_features
    from holmes_ml.pipeline import _rank_spans, irregular_iterations

    ops = _end_of_step_ops(pause=(25, 3, 0.04), seed=1)
    table = detect_irregular(ops)
    # the localizer times iterations from the per-rank spans the node agents send
    assert list(irregular_iterations(_rank_spans(ops))) == table.index[table["irregular"]].tolist()
    whole = build_features(ops)
    np.testing.assert_allclose(
        whole["iter_time_ratio"].to_numpy(),
        table["ratio"].reindex(ops["iteration"]).to_numpy(), rtol=1e-6)
    # a stream that keeps the previous iteration as context times each batch the same way
    stream = FeatureStream()
    parts = [stream.update(ops[ops["iteration"] == k]) for k in range(40)]
    np.testing.assert_array_equal(pd.concat(parts).loc[ops.index].to_numpy(), whole.to_numpy())


@pytest.mark.parametrize("layout", [dict(tp=2, pp=2), dict(tp=1, pp=1)])
def test_simulated_jobs_keep_their_spans_unless_operators_sit_at_the_end(layout):
    from holmes_ml.simulator import SimConfig, simulate

    ops = simulate(SimConfig(gpus=16, model="llama2-7b", iterations=8, seed=3, **layout)).ops
    t = iteration_table(ops)
    if layout["tp"] > 1:  # tensor and pipeline parallel operators fill every step
        assert not t["end_to_end"].any()
        np.testing.assert_array_equal(t["time_us"].to_numpy(),
                                      (t["end_ns"] - t["start_ns"]).to_numpy() / 1e3)
    else:  # pure data parallelism: the gradient all-reduces come after the compute
        assert t["end_to_end"].iloc[1:].all()


def _references_by_numpy(times: np.ndarray, config: IrregularityConfig):
    """The monitor's references as numpy's median of each window gives them."""
    from collections import deque

    reference = np.empty(len(times))
    irregular = np.zeros(len(times), dtype=bool)
    history: deque[float] = deque(maxlen=config.window)
    for i, t in enumerate(times):
        if len(history) >= config.min_history:
            reference[i] = np.median(np.fromiter(history, dtype=np.float64))
            irregular[i] = t > config.delta * reference[i]
        else:
            reference[i] = np.median(np.append(np.fromiter(history, np.float64), t))
        if not irregular[i]:
            history.append(float(t))
    return reference, irregular


@pytest.mark.parametrize("seed", range(5))
def test_monitor_references_are_numpy_medians_to_the_last_bit(seed):
    from holmes_ml.features.iterations import _references

    rng = np.random.default_rng(seed)
    times = rng.lognormal(0.0, 0.05, 200) * np.where(rng.random(200) < 0.1, 1.4, 1.0)
    for config in (IrregularityConfig(), IrregularityConfig(window=7, min_history=4),
                   IrregularityConfig(window=1, min_history=1, delta=1.02)):
        got, flags = _references(times, config)
        want, want_flags = _references_by_numpy(times, config)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(flags, want_flags)
        assert flags.any()


def test_irregular_flags_are_the_monitor_table_columns():
    from holmes_ml.features.iterations import irregular_flags

    rng = np.random.default_rng(7)
    times = rng.lognormal(0.0, 0.03, 60) * np.where(np.arange(60) >= 40, 1.3, 1.0)
    times[[10, 11]] *= 1.5
    times[0] = 0.0  # a zero reference: ratio 1
    table = detect_irregular(_times(times))
    reference, ratio, flags = irregular_flags(times)
    np.testing.assert_array_equal(np.nan_to_num(reference, nan=0.0), table["reference_s"])
    np.testing.assert_array_equal(ratio, table["ratio"])
    np.testing.assert_array_equal(flags, table["irregular"])
    assert flags.any() and not flags.all()
