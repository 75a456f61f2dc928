"""Per-operator features (holmes_ml.features.build_features)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from holmes_ml.bench.features import synthetic_ops
from holmes_ml.features import (
    FEATURE_COLUMNS,
    GROUP_KIND_CODES,
    OP_CODES,
    TIME_FEATURES,
    FeatureConfig,
    build_features,
    detect_irregular,
)
from holmes_ml.features.build import _stage_of, replay_gain
from holmes_ml.io.schema import OP_TYPES, SchemaError
from holmes_ml.simulator import FaultSpec, SimConfig, simulate
from holmes_ml.simulator.cluster import Cluster


@pytest.fixture(scope="module")
def ops() -> pd.DataFrame:
    """16 ranks (tp=4, pp=2, dp=2), 20 iterations, rank 5 a 1.6x straggler in 12..15."""
    return synthetic_ops(tp=4, pp=2, dp=2, iterations=20, seed=11, slow_rank=5,
                         slow_factor=1.6, slow_iterations=(12, 16))


@pytest.fixture(scope="module")
def feats(ops) -> pd.DataFrame:
    return build_features(ops)


def test_schema_dtype_and_finiteness(ops, feats):
    assert list(feats.columns) == list(FEATURE_COLUMNS)
    assert set(TIME_FEATURES) <= set(FEATURE_COLUMNS)
    assert (feats.dtypes == np.float32).all()
    assert feats.index.equals(ops.index)
    assert np.isfinite(feats.to_numpy()).all()
    assert set(OP_CODES) == set(OP_TYPES)
    assert set(feats["op_code"].unique()) == {OP_CODES[o] for o in ops["op"].unique()}
    assert set(feats["group_kind_code"].unique()) == {
        GROUP_KIND_CODES[k] for k in ops["group_kind"].unique()
    }


def test_row_alignment_with_shuffled_input_and_foreign_index(ops, feats):
    shuffled = ops.sample(frac=1.0, random_state=5)
    shuffled.index = shuffled.index * 7 + 3  # a non-range index must be carried through
    got = build_features(shuffled)
    assert got.index.equals(shuffled.index)
    expected = feats.loc[(shuffled.index - 3) // 7].to_numpy()
    np.testing.assert_allclose(got.to_numpy(), expected, rtol=1e-6, atol=1e-6)


def test_tied_arrivals_do_not_depend_on_row_order():
    base = pd.DataFrame({
        "iteration": [0] * 4, "rank": [0, 1, 2, 3], "op": ["all_gather"] * 4,
        "group": ["tp-0"] * 4, "seq": [7] * 4, "nbytes": [1 << 20] * 4,
        "start_ns": [100, 100, 100, 500], "duration_us": [3.0, 2.0, 2.5, 1.0],
    })
    f = build_features(base)
    g = build_features(base.iloc[::-1]).loc[base.index]
    np.testing.assert_array_equal(f.to_numpy(), g.to_numpy())
    np.testing.assert_array_equal(f["arrival_rank"], [0, 0, 0, 1])


def test_categorical_string_columns_give_identical_features(ops, feats):
    cat = ops.copy()
    for c in ("op", "group", "group_ranks", "group_kind"):
        cat[c] = cat[c].astype("category")
    np.testing.assert_array_equal(build_features(cat).to_numpy(), feats.to_numpy())


@pytest.mark.parametrize("k", [0, 2, 9])
def test_no_leakage_from_later_iterations(ops, feats, k):
    changed = ops.copy()
    later = changed["iteration"] > k
    rng = np.random.default_rng(0)
    changed.loc[later, "duration_us"] *= rng.uniform(0.2, 5.0, size=int(later.sum()))
    changed.loc[later, "start_ns"] += 10**9
    got = build_features(changed)
    early = ~later.to_numpy()
    np.testing.assert_array_equal(got.to_numpy()[early], feats.to_numpy()[early])
    # and the change is visible where it should be
    assert not np.array_equal(got.to_numpy()[~early], feats.to_numpy()[~early])


@pytest.mark.parametrize("regular_only", [True, False])
def test_history_statistics_match_a_direct_computation(ops, regular_only):
    cfg = FeatureConfig(history_regular_only=regular_only)
    feats = build_features(ops, cfg)
    w = cfg.window
    flagged = detect_irregular(ops)
    irregular = set(flagged.index[flagged["irregular"]])
    assert irregular == {12, 13, 14, 15}  # the straggler's iterations
    sig = ops[(ops["rank"] == 3) & (ops["group"] == "tp-0-0")]
    first_seq = sig.groupby("iteration")["seq"].transform("min")
    one = sig[sig["seq"] == first_seq].sort_values("iteration")
    durations = one["duration_us"].to_numpy()
    usable = ~one["iteration"].isin(irregular).to_numpy() if regular_only else np.ones(20, bool)
    for i in (0, 1, 4, 13, 17):
        row = feats.loc[one.index[i]]
        past = durations[:i][usable[:i]][-w:]
        assert row["history_len"] == len(past)
        if len(past) == 0:
            assert row["hist_z"] == 0 and row["hist_iqr_score"] == 0
            continue
        assert row["hist_mean_us"] == pytest.approx(past.mean(), rel=1e-5)
        assert row["hist_std_us"] == pytest.approx(past.std(), rel=1e-4, abs=1e-3)
        assert row["hist_median_us"] == pytest.approx(np.median(past), rel=1e-5)
        q1, q3 = np.percentile(past, [25, 75])
        assert row["hist_q1_us"] == pytest.approx(q1, rel=1e-5)
        assert row["hist_iqr_us"] == pytest.approx(q3 - q1, rel=1e-4, abs=1e-3)
        assert row["hist_ratio"] == pytest.approx(durations[i] / np.median(past), rel=1e-5)


def test_peer_features_known_answer():
    rows = {
        "iteration": [0] * 6, "rank": [0, 1, 2, 3, 0, 1],
        "op": ["all_reduce"] * 4 + ["send", "recv"], "group": ["dp-0"] * 4 + ["pp-0"] * 2,
        "seq": [0, 0, 0, 0, 0, 0], "nbytes": [4096] * 4 + [64] * 2,
        "start_ns": [1000, 3000, 2000, 9000, 20000, 15000],
        "duration_us": [10.0, 8.0, 9.0, 2.0, 1.0, 6.0], "peer": [-1, -1, -1, -1, 1, 0],
    }
    f = build_features(pd.DataFrame(rows))
    np.testing.assert_array_equal(f["peer_count"], [4, 4, 4, 4, 2, 2])
    np.testing.assert_array_equal(f["arrived_last"], [0, 0, 0, 1, 1, 0])
    np.testing.assert_allclose(f["arrival_lag_us"], [0, 2, 1, 8, 5, 0])
    np.testing.assert_allclose(f["peer_median_us"][:4], 8.5)
    np.testing.assert_allclose(f["peer_ratio_min"][:4], [5, 4, 4.5, 1])
    np.testing.assert_allclose(f["peer_ratio_max"][:4], [1, 0.8, 0.9, 0.2])
    np.testing.assert_allclose(f["arrival_rank"][:4], [0, 2 / 3, 1 / 3, 1])
    np.testing.assert_allclose(f["arrival_lag_spread"], [0, 0.25, 0.125, 1, 1, 0])
    # waiting for the last arrival vs the transfer after it (all finish together here)
    np.testing.assert_allclose(f["wait_us"], [8, 6, 7, 0, 0, 5])
    np.testing.assert_allclose(f["xfer_us"], [2, 2, 2, 2, 1, 1])
    np.testing.assert_array_equal(f["xfer_hist_ratio"], 1.0)
    np.testing.assert_array_equal(f["is_p2p"], [0, 0, 0, 0, 1, 1])
    np.testing.assert_array_equal(f["group_size"], [4, 4, 4, 4, 2, 2])
    np.testing.assert_allclose(f["log2_bytes"][0], np.log2(4097), rtol=1e-6)
    # one iteration only: no history, neutral values, nothing NaN
    assert (f["history_len"] == 0).all() and (f["hist_z"] == 0).all()
    np.testing.assert_allclose(f["iter_time_ratio"], 1.0)


def test_same_step_features_known_answer():
    # One data-parallel reduce-scatter step, three groups of two ranks (they all run seq 0
    # with the same bytes): dp-2 crosses a slow link, so both its copies take 3x as long.
    # A tensor-parallel op of the same seq is another step and does not move the norm.
    rows = {
        "iteration": [0] * 8, "rank": [0, 1, 2, 3, 4, 5, 0, 2],
        "op": ["reduce_scatter"] * 6 + ["all_reduce"] * 2,
        "group": ["dp-0", "dp-0", "dp-1", "dp-1", "dp-2", "dp-2", "tp-0", "tp-0"],
        "group_kind": ["dp"] * 6 + ["tp"] * 2,
        "seq": [0] * 8, "nbytes": [4096] * 6 + [64] * 2,
        "start_ns": [0, 1000, 0, 2000, 0, 1000, 50_000, 50_000],
        "duration_us": [11.0, 10.0, 12.0, 10.0, 31.0, 30.0, 100.0, 100.0],
    }
    f = build_features(pd.DataFrame(rows))
    # instance medians 10.5, 11, 30.5 -> the step's typical instance 11; shortest copies (the
    # transfer after the last arrival) 10, 10, 30 -> typical transfer 10
    np.testing.assert_allclose(f["step_ratio"][:6], np.array([11, 10, 12, 10, 31, 30]) / 11,
                               rtol=1e-6)
    np.testing.assert_allclose(f["step_peer_ratio"][:6],
                               np.array([10.5, 10.5, 11, 11, 30.5, 30.5]) / 11, rtol=1e-6)
    np.testing.assert_allclose(f["step_xfer_ratio"][:6], [1, 1, 1, 1, 3, 3], rtol=1e-6)
    np.testing.assert_allclose(f[["step_ratio", "step_peer_ratio", "step_xfer_ratio"]][6:], 1.0)


def test_stage_step_and_late_cause_known_answer():
    # Stage A (ranks 0-3) receives from an earlier stage, then runs tensor-parallel all-reduce
    # seq 0; stage B (ranks 4-7) runs the same all-reduce step first thing. Rank 3's receive is
    # 3x slower than the other receives, so rank 3 reaches its all-reduce late and rank 2, its
    # partner, waits: 30 us where the stage's copies take 10. A data-parallel all-reduce ends
    # each stage's iteration (its groups join a stage's tensor-parallel groups into one stage).
    recv_dur = [5.0, 5.0, 5.0, 15.0]
    rows = {
        "iteration": [0] * 20,
        "rank": [0, 1, 2, 3] + [0, 1, 2, 3] + [4, 5, 6, 7] + list(range(8)),
        "op": ["recv"] * 4 + ["all_reduce"] * 16,
        "group": ["pp-0", "pp-1", "pp-2", "pp-3", "tp-0", "tp-0", "tp-1", "tp-1",
                  "tp-2", "tp-2", "tp-3", "tp-3",
                  "dp-0", "dp-1", "dp-0", "dp-1", "dp-2", "dp-3", "dp-2", "dp-3"],
        "seq": [0] * 20, "nbytes": [64] * 4 + [4096] * 8 + [512] * 8,
        "peer": [8, 9, 10, 11] + [-1] * 16,
        "start_ns": [0, 0, 0, 0, 6000, 7000, 6000, 16_000, 0, 0, 0, 0] + [50_000] * 8,
        "duration_us": recv_dur + [10.0, 10.0, 30.0, 10.0] + [100.0] * 4 + [5.0] * 8,
    }
    f = build_features(pd.DataFrame(rows)).iloc[:12]
    # stage A's copies: median 10, median absolute deviation 0 -> the spread floor, 1 % of the
    # median; stage B's copies are a crowd of their own (mixing the stages would put the
    # median at 65)
    np.testing.assert_allclose(f["stage_step_ratio"][4:], [1, 1, 3, 1, 1, 1, 1, 1], rtol=1e-6)
    np.testing.assert_allclose(f["stage_step_z"][4:8], [0, 0, 20 / 0.1, 0], rtol=1e-5)
    np.testing.assert_allclose(f["stage_step_z"][8:], 0.0)
    np.testing.assert_allclose(f["stage_step_ratio"][:4], [1, 1, 1, 3], rtol=1e-6)
    # tp-1's last arrival (rank 3) came from a receive 3x the step's typical transfer; tp-0's
    # last arrival (rank 1) from an ordinary one; stage B's ranks have no earlier op
    np.testing.assert_allclose(f["late_prev_xfer_ratio"][4:], [1, 1, 3, 3, 1, 1, 1, 1],
                               rtol=1e-6)
    np.testing.assert_allclose(f["late_prev_stage_ratio"][4:], [1, 1, 3, 3, 1, 1, 1, 1],
                               rtol=1e-6)
    np.testing.assert_allclose(f["late_prev_xfer_hist_ratio"], 1.0)  # no history yet
    # a receive is its own last arrival with no earlier op: neutral
    np.testing.assert_allclose(f["late_prev_xfer_ratio"][:4], 1.0)
    # the chain behind each all-reduce is that one receive (it waited on nobody before it);
    # an op with no op behind it has 0 there, not the neutral 1
    np.testing.assert_allclose(f["chain_xfer_ratio"], [0] * 4 + [1, 1, 3, 3] + [0] * 4,
                               rtol=1e-6)
    np.testing.assert_allclose(f["chain_stage_ratio"], [0] * 4 + [1, 1, 3, 3] + [0] * 4,
                               rtol=1e-6)


def test_stage_step_keeps_stages_apart_by_their_communicators():
    # Two pipeline stages, ranks 0-3 and 4-7, each open their iteration with a tensor-parallel
    # all-reduce of the same seq and bytes: one op step at one place, which only the
    # communicators tell apart (tensor- and data-parallel groups stay within a stage; the
    # data-parallel all-reduce at the end joins the stage's two tensor-parallel groups).
    # Stage B's copies take 10x stage A's, and rank 3's copy is 20 % longer than its stage's.
    rows = {
        "iteration": [0] * 16, "rank": list(range(8)) * 2,
        "op": ["all_reduce"] * 16,
        "group": ["tp-0", "tp-0", "tp-1", "tp-1", "tp-2", "tp-2", "tp-3", "tp-3",
                  "dp-0", "dp-1", "dp-0", "dp-1", "dp-2", "dp-3", "dp-2", "dp-3"],
        "seq": [0] * 16, "nbytes": [4096] * 16, "start_ns": [0] * 8 + [10**6] * 8,
        "duration_us": [10.0, 10.0, 10.0, 12.0] + [100.0] * 4 + [50.0] * 8,
    }
    # two instances per stage are a crowd once stage_min_instances allows it
    f = build_features(pd.DataFrame(rows), FeatureConfig(stage_min_instances=2))
    # each stage its own crowd: stage A's median 10 (MAD 0: the floor, 1 % of it), stage B's 100
    np.testing.assert_allclose(f["stage_step_ratio"][:8], [1, 1, 1, 1.2, 1, 1, 1, 1], rtol=1e-6)
    np.testing.assert_allclose(f["stage_step_z"][:8], [0, 0, 0, 2 / 0.1, 0, 0, 0, 0], rtol=1e-5)
    np.testing.assert_allclose(f["stage_step_ratio"][8:], 1.0)
    # groups of no known kind say nothing of stages, and two instances are too few by default:
    # either way one crowd by place, median (12 + 100) / 2
    merged = [10 / 56] * 3 + [12 / 56] + [100 / 56] * 4
    unknown = pd.DataFrame({**rows, "group": [f"g{g}" for g in rows["group"]]})
    for f in (build_features(unknown, FeatureConfig(stage_min_instances=2)),
              build_features(pd.DataFrame(rows))):
        np.testing.assert_allclose(f["stage_step_ratio"][:8], merged, rtol=1e-6)
    # three instances in stage A, two in stage B: only stage A keeps its own crowd
    more = pd.DataFrame(rows).iloc[:8]
    more = pd.concat([more, pd.DataFrame({**{k: v[:2] for k, v in rows.items()},
                                          "rank": [8, 9], "group": ["tp-4", "tp-4"]}),
                      pd.DataFrame({**{k: v[:2] for k, v in rows.items()},
                                    "rank": [8, 9], "group": ["dp-0", "dp-1"],
                                    "start_ns": [10**6] * 2, "duration_us": [50.0] * 2}),
                      pd.DataFrame(rows).iloc[8:]], ignore_index=True)
    f = build_features(more, FeatureConfig(stage_min_instances=3))
    np.testing.assert_allclose(f["stage_step_ratio"][:4], [1, 1, 1, 1.2], rtol=1e-6)
    np.testing.assert_allclose(f["stage_step_ratio"][4:8], 1.0)  # stage B alone, by place


@pytest.mark.parametrize("layout", [dict(), dict(gpus=64, model="mixtral-8x7b", ep=2, pp=2),
                                    dict(gpus=32, tp=2, cp=2, pp=2), dict(gpus=64, pp=1)])
def test_stages_read_off_the_communicators_are_the_pipeline_stages(layout):
    cfg = SimConfig(seed=3, iterations=2, **layout)
    ops = simulate(cfg).ops
    rank = ops["rank"].to_numpy()
    gcode = pd.factorize(ops["group"])[0].astype(np.int64)
    kind = ops["group_kind"].astype(str).map(GROUP_KIND_CODES).to_numpy(dtype=np.int64)
    got = _stage_of(rank, gcode, kind)
    grid = Cluster(cfg.layout, cfg.pod_hosts, cfg.spines).rank_grid
    want = np.empty(cfg.gpus, dtype=np.int64)
    for s in range(cfg.layout.pp):
        want[grid[s].ravel()] = s
    # one code per stage and one stage per code (the codes' own numbering is arbitrary)
    pairs = pd.DataFrame({"got": got, "want": want[rank]}).drop_duplicates()
    assert len(pairs) == cfg.layout.pp == pairs["got"].nunique() == pairs["want"].nunique()
    assert (got > 0).all()  # every rank is in some tensor- or data-parallel group


def _waits_one_hop_back(ops: pd.DataFrame) -> np.ndarray:
    """Per row (positions), the row of the op its instance's last arrival ran just before it
    in the iteration (-1: none), by pandas groupbys."""
    o = ops.reset_index(drop=True)
    send, known = o["op"].eq("send"), o["op"].isin(["send", "recv"]) & o["peer"].ge(0)
    key = pd.DataFrame({
        "iteration": o["iteration"], "group": o["group"], "seq": o["seq"],
        "src": np.where(known, np.where(send, o["rank"], o["peer"]), -1),
        "dst": np.where(known, np.where(send, o["peer"], o["rank"]), -1)})
    last = o["start_ns"].groupby([key[c] for c in key]).transform("idxmax").to_numpy()
    by_rank = o.sort_values(["iteration", "rank", "start_ns"])
    prev = pd.Series(by_rank.index, index=by_rank.index).groupby(
        [by_rank["iteration"], by_rank["rank"]]).shift(1)
    return prev.reindex(o.index).fillna(-1).astype(np.int64).to_numpy()[last]


@pytest.mark.parametrize("hops", [1, 5, 7, 16])  # 7: three set bits
def test_chain_columns_follow_the_waits_hop_by_hop(hops):
    # a simulated pipeline job whose slow NIC delays receives several stages downstream
    fault = FaultSpec(kind="nic_slow", ranks=(3,), start_iteration=6, severity=2.0)
    ops = simulate(SimConfig(seed=7, iterations=14, faults=(fault,))).ops
    assert not ops.duplicated(["iteration", "group", "seq", "rank", "start_ns"]).any()
    f = build_features(ops, FeatureConfig(chain_hops=hops)).reset_index(drop=True)
    one = _waits_one_hop_back(ops)
    n = len(one)
    at = np.arange(n)
    best = {c: np.full(n, -np.inf) for c in ("stage_step_z", "step_xfer_ratio")}
    first = {}
    for _ in range(hops):  # one hop at a time, where the features double the hops
        at = np.where(at >= 0, one[np.maximum(at, 0)], -1)
        for c, b in best.items():
            np.maximum(b, np.where(at >= 0, f[c].to_numpy()[np.maximum(at, 0)], -np.inf), out=b)
        first = first or {c: b.copy() for c, b in best.items()}
    for c, got in (("stage_step_z", "chain_stage_z"), ("step_xfer_ratio", "chain_xfer_ratio")):
        want = np.where(np.isfinite(best[c]), best[c], 0.0)
        np.testing.assert_array_equal(f[got].to_numpy(), want.astype(np.float32))
        # the job has chains longer than one hop whose farther ops are worse
        assert hops == 1 or (best[c] > first[c]).mean() > 0.01


def test_p2p_without_peer_pairs_by_group_and_seq():
    rows = {
        "iteration": [0, 0, 0, 0], "rank": [0, 1, 0, 1], "op": ["send", "recv", "send", "recv"],
        "group": ["pp-0"] * 4, "seq": [0, 0, 1, 1], "nbytes": [64] * 4,
        "start_ns": [0, 2000, 10000, 10000], "duration_us": [3.0, 1.0, 1.0, 1.0],
    }
    f = build_features(pd.DataFrame(rows))  # no peer column at all
    np.testing.assert_array_equal(f["peer_count"], [2, 2, 2, 2])
    np.testing.assert_array_equal(f["arrived_last"], [0, 1, 0, 0])
    with_peer = build_features(pd.DataFrame({**rows, "peer": [1, 0, 1, 0]}))
    np.testing.assert_array_equal(with_peer.to_numpy(), f.to_numpy())


def test_straggler_signals_on_synthetic_job(ops, feats):
    ab = ops["abnormal"].to_numpy()
    assert 0 < ab.sum() < len(ab)
    assert feats["hist_z"][ab].mean() > feats["hist_z"][~ab].mean() + 2
    assert feats["hist_ratio"][ab].mean() > 1.2 * feats["hist_ratio"][~ab].mean()
    slow = ((ops["rank"] == 5) & ops["iteration"].between(12, 15) & ~ops["op"].isin(["send", "recv"])
            ).to_numpy()
    assert feats["arrived_last"][slow].mean() > 0.95
    assert feats["iter_time_ratio"][ops["iteration"] == 13].min() > 1.1


def test_input_errors_name_the_column(ops):
    with pytest.raises(SchemaError, match="seq"):
        build_features(ops.drop(columns="seq"))
    bad = ops.head(10).copy()
    bad["op"] = bad["op"].astype(object)
    bad.loc[bad.index[2], "op"] = "allreduce"
    with pytest.raises(SchemaError, match="op.*allreduce"):
        build_features(bad)
    bad = ops.head(10).copy()
    bad.loc[bad.index[4], "duration_us"] = np.inf
    with pytest.raises(SchemaError, match="duration_us"):
        build_features(bad)
    with pytest.raises(SchemaError):
        build_features([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window"):
        FeatureConfig(window=0)
    with pytest.raises(ValueError, match="chain_hops"):
        FeatureConfig(chain_hops=0)
    empty = build_features(ops.head(0))
    assert empty.shape == (0, len(FEATURE_COLUMNS))


def test_chunking_and_window_change_only_what_they_should(ops, feats):
    small_chunks = build_features(ops, FeatureConfig(chunk_rows=97))
    np.testing.assert_array_equal(small_chunks.to_numpy(), feats.to_numpy())
    short = build_features(ops, FeatureConfig(window=3))
    assert short["history_len"].max() == 3
    np.testing.assert_array_equal(short["peer_ratio_median"], feats["peer_ratio_median"])


def test_time_features_scale_with_time_and_the_rest_do_not(ops, feats):
    """A job running uniformly 2x slower: TIME_FEATURES double, every other column is equal
    (the property drift handling relies on)."""
    slow = ops.copy()
    slow["duration_us"] *= 2.0
    slow["start_ns"] = (slow["start_ns"] - slow["start_ns"].min()) * 2
    got = build_features(slow)
    for col in FEATURE_COLUMNS:
        factor = 2.0 if col in TIME_FEATURES else 1.0
        np.testing.assert_allclose(got[col], factor * feats[col], rtol=1e-4, atol=1e-4,
                                   err_msg=col)


def test_missing_ranks_in_some_iterations(ops, feats):
    gone = (ops["rank"] == 6) & ops["iteration"].isin([3, 4])
    partial = ops[~gone]
    got = build_features(partial)
    assert np.isfinite(got.to_numpy()).all()
    before = (partial["iteration"] < 3).to_numpy()
    np.testing.assert_array_equal(got.to_numpy()[before], feats.loc[partial.index].to_numpy()[before])
    tp_of_6 = (partial["group"] == "tp-1-0") & (partial["iteration"] == 3)
    assert (got.loc[tp_of_6[tp_of_6].index, "peer_count"] == 3).all()
    later6 = (partial["rank"] == 6) & (partial["iteration"] == 5)
    # rank 6's history skips the missing iterations: still `window`-capped, never empty
    assert (got.loc[later6[later6].index, "history_len"] == 3).all()


def test_baseline_survives_a_persistent_fault_longer_than_the_window():
    ops = synthetic_ops(tp=4, pp=2, dp=2, iterations=24, seed=4, slow_rank=5,
                        slow_factor=1.6, slow_iterations=(6, 24))
    cfg = FeatureConfig(window=3)
    f = build_features(ops, cfg)
    late_ab = (ops["abnormal"] & (ops["iteration"] >= 12)).to_numpy()
    assert late_ab.sum() > 50
    # the plain history has absorbed the slowdown; the regular-only baseline has not
    assert np.median(f["hist_ratio"][late_ab]) < 1.1
    assert np.median(f["base_ratio"][late_ab]) > 1.3
    regular_only = build_features(ops, FeatureConfig(window=3, history_regular_only=True))
    assert np.median(regular_only["hist_ratio"][late_ab]) > 1.3
    np.testing.assert_array_equal(regular_only["base_ratio"], f["base_ratio"])


@pytest.mark.parametrize("memory", [1, 4, 20])
def test_level_columns_match_a_direct_computation(memory):
    rng = np.random.default_rng(2)
    ops = synthetic_ops(tp=2, pp=2, dp=2, iterations=30, seed=6, jitter=0.1, slow_rank=3,
                        slow_factor=1.5, slow_iterations=(12, 30))
    # gaps: a signature's copies, not its iterations, count
    ops = ops.drop(index=rng.choice(len(ops), size=len(ops) // 10, replace=False))
    # the slow iterations are irregular: the transfer's level still reads every earlier copy
    cfg = FeatureConfig(window=5, level_memory=memory)
    f = build_features(ops, cfg)
    checked = waited = 0

    def lowest_levels(v):
        # history median of each copy: over up to `window` earlier copies, a level from 3;
        # the lowest of them over the last `memory` copies
        med = [np.median(v[max(0, i - 5):i]) if i >= 3 else np.inf for i in range(len(v))]
        return med, [min(med[max(0, i - memory + 1): i + 1]) for i in range(len(v))]

    for (_, _), one in ops.groupby(["rank", "group"]):
        one = one[one["seq"] == one.groupby("iteration")["seq"].transform("min")]
        one = one.sort_values("iteration")
        d = one["duration_us"].to_numpy()
        x = f.loc[one.index, "xfer_us"].to_numpy(np.float64)
        med, lows = lowest_levels(d)
        _, x_lows = lowest_levels(x)
        for i in range(len(d)):
            low, x_low = lows[i], x_lows[i]
            row = f.loc[one.index[i]]
            rise = max(med[i] - low, 0) / d[i] if np.isfinite(low) else 0.0
            excess = max(d[i] - low, 0) / d[i] if np.isfinite(low) else 0.0
            wait = (max(d[i] - low - max(x[i] - x_low, 0), 0) / d[i]
                    if np.isfinite(low) and np.isfinite(x_low) else 0.0)
            assert row["level_rise_frac"] == pytest.approx(rise, rel=1e-5, abs=1e-6)
            assert row["level_excess_frac"] == pytest.approx(excess, rel=1e-5, abs=1e-6)
            assert row["level_wait_excess_frac"] == pytest.approx(wait, rel=1e-4, abs=1e-5)
            checked += np.isfinite(low) and excess > 0
            waited += wait > 0
    assert checked > 100 and waited > 50


def test_lowest_level_survives_a_persistent_fault_the_history_absorbs():
    ops = synthetic_ops(tp=4, pp=2, dp=2, iterations=30, seed=4, slow_rank=5,
                        slow_factor=1.6, slow_iterations=(8, 30))
    late_ab = (ops["abnormal"] & (ops["iteration"] >= 20)).to_numpy()
    assert late_ab.sum() > 50
    f = build_features(ops)
    assert np.median(f["hist_ratio"][late_ab]) < 1.1  # absorbed by the history
    assert np.median(f["level_excess_frac"][late_ab]) > 0.3  # not by the lowest level
    assert np.median(f["level_rise_frac"][late_ab]) > 0.3
    # the peers' copies are prolonged by waiting for rank 5, not in their transfer
    assert np.median(f["level_wait_excess_frac"][late_ab]) > 0.3
    # a memory shorter than the fault forgets it as the history does
    short = build_features(ops, FeatureConfig(level_memory=3))
    assert np.median(short["level_excess_frac"][late_ab]) < 0.1
    # healthy copies sit near their level
    normal = ~ops["abnormal"].to_numpy() & (ops["rank"] != 5).to_numpy()
    assert np.median(f["level_excess_frac"][normal]) < 0.1
    assert np.median(f["level_wait_excess_frac"][normal]) < 0.05


@pytest.mark.parametrize("seed", [1, 2])
def test_transfer_drift_raises_the_level_but_not_the_wait_over_it(seed):
    # a healthy job whose transfers slow down by 30 % over its run: every copy rises over its
    # lowest level, in its transfer; the wait part of that rise stays near nothing
    ops = simulate(SimConfig(gpus=32, iterations=30, seed=seed, comm_drift=0.3,
                             jitter=0.01)).ops
    assert not ops["abnormal"].any()
    f = build_features(ops)
    late_dp = ((ops["iteration"] >= 20) & (ops["group_kind"] == "dp")).to_numpy()
    assert np.median(f["level_excess_frac"][late_dp]) > 0.1
    assert np.quantile(f["level_wait_excess_frac"][late_dp], 0.9) < 0.05


def test_absurd_but_finite_durations_stay_finite(ops):
    wild = ops.head(200).copy()
    wild.loc[wild.index[7], "duration_us"] = 1e40  # overflows float32
    f = build_features(wild)
    assert np.isfinite(f.to_numpy()).all()
    assert f.loc[wild.index[7], "duration_us"] == np.finfo(np.float32).max


@pytest.mark.parametrize("dtype", ["category", "object", "str"])
def test_first_text_reads_as_the_text_conversion(dtype):
    from holmes_ml.features.build import _first_text

    col = pd.Series(["0 1 2 3", None, "TP", "4\t5", "0 1 2 3", None], dtype=dtype)
    rows = np.array([0, 1, 2, 3, 5])
    # (a categorical cannot take "" in fillna: the conversion reads its values as objects)
    text = col.iloc[rows].astype(object).fillna("").astype(str)
    assert _first_text(col, rows) == text.tolist() == ["0 1 2 3", "", "TP", "4\t5", ""]
    assert [len(t.split()) for t in text] == text.str.count(r"\S+").tolist() == [4, 0, 1, 2, 0]


def test_signature_codes_follow_an_op_from_iteration_to_iteration(ops):
    """The same op of the same rank on the same communicator at the same place (by sequence
    number) and of the same size is one signature in every iteration; shuffled rows keep it."""
    from holmes_ml.features.build import signature_codes

    sig = signature_codes(ops)
    key = ops.assign(pos=ops.sort_values("seq").groupby(
        ["iteration", "rank", "group"], observed=True).cumcount())
    direct = key.groupby(["rank", "group", "op", "pos", "nbytes"], observed=True).ngroup()
    assert set(sig) == set(range(sig.max() + 1))  # numbered densely
    shuffled = ops.sample(frac=1.0, random_state=0)
    again = pd.Series(signature_codes(shuffled), index=shuffled.index).loc[ops.index]
    for other in (direct.to_numpy(), again.to_numpy()):  # the same partition of the rows
        pairs = pd.crosstab(sig, other) > 0
        assert (pairs.sum(axis=1) == 1).all() and (pairs.sum(axis=0) == 1).all()
    assert sig.max() + 1 < len(ops) / 10  # ops recur: 20 iterations, one signature each
    assert signature_codes(ops.iloc[:0]).shape == (0,)


def test_replay_gain_by_hand():
    # rank 0: x (4 us of its transfer slow), a 2 us gap, then y; rank 1 reaches y at 3 us and
    # waits for rank 0 until 12 us
    inst, prev = np.array([0, 1, 1]), np.array([-1, 0, -1])
    start_ns, dur = np.array([0, 12_000, 3_000]), np.array([10.0, 5.0, 14.0])
    excess, none = np.array([4.0, 0.0, 0.0]), np.zeros(3)
    np.testing.assert_allclose(replay_gain(inst, start_ns, prev, dur, excess, none, 8), [4, 0, 4])
    # a slow compute gap before y moves rank 0's arrival too; rank 0 itself waits no less
    gap = np.array([0.0, 1.0, 0.0])
    np.testing.assert_allclose(replay_gain(inst, start_ns, prev, dur, excess, gap, 8), [4, 0, 5])
    # rank 1 arriving at 10 us: y can start no earlier, so its wait shrinks by 2 us only
    late = np.array([0, 12_000, 10_000])
    np.testing.assert_allclose(replay_gain(inst, late, prev, dur, excess, gap, 8), [4, 0, 2])
    # no sweep: only each copy's own transfer
    np.testing.assert_allclose(replay_gain(inst, start_ns, prev, dur, excess, gap, 0), [4, 0, 0])


def test_replay_gain_of_a_send_that_left_early():
    # rank 1: p (3 us of its transfer slow) until 6 us, then q, the receive of rank 0's send s,
    # then t, its send to rank 0's r. s left at 4 us, before q came: rank 0 reached r at 5 us
    # and waited for t whatever happened on rank 1
    inst, prev = np.array([0, 0, 1, 1, 2]), np.array([-1, 4, 1, 0, -1])
    start_ns = np.array([0, 6_000, 11_000, 5_000, 0])
    dur, excess = np.array([4.0, 5.0, 3.0, 9.0, 6.0]), np.array([0.0, 0.0, 0.0, 0.0, 3.0])
    gain = replay_gain(inst, start_ns, prev, dur, excess, np.zeros(5), 8)
    # r would have been 3 us shorter (t 3 us earlier); had s ended with q, r would have been
    # reached 3 us earlier too and gained nothing
    np.testing.assert_allclose(gain, [0, 0, 0, 3, 3])


def _replay_by_pandas(inst, start, prev, dur, excess, gap, sweeps):
    """replay_gain's rule with pandas: every instance recomputed in every sweep."""
    arrive = pd.Series((start - start.min()) / 1e3)
    latest = arrive.groupby(inst).transform("max")
    # copies that ended before their instance's latest arrival end with their own arrival
    early = (pd.Series(start).groupby(inst).transform("max") - start).to_numpy() > dur * 1e3
    end = excess.copy()
    for _ in range(sweeps):
        arr = np.where(prev >= 0, end[np.maximum(prev, 0)], 0.0) + gap
        moved = np.where(early, arr, (latest - (arrive - arr).groupby(inst).transform("max"))
                         .to_numpy()) + excess
        if np.allclose(moved, end, rtol=0, atol=1e-9):
            break
        end = moved
    arr = np.where(prev >= 0, end[np.maximum(prev, 0)], 0.0) + gap
    return np.clip(end - arr, 0.0, dur)


@pytest.mark.parametrize("sweeps", [1, 2, 5, 10_000])
def test_replay_gain_matches_a_group_by(sweeps):
    fault = FaultSpec(kind="nic_slow", ranks=(3,), start_iteration=6, severity=2.0)
    o = simulate(SimConfig(seed=7, iterations=10, faults=(fault,))).ops.reset_index(drop=True)
    send, known = o["op"].eq("send"), o["op"].isin(["send", "recv"]) & o["peer"].ge(0)
    inst = pd.DataFrame({
        "iteration": o["iteration"], "group": o["group"].astype(str), "seq": o["seq"],
        "src": np.where(known, np.where(send, o["rank"], o["peer"]), -1),
        "dst": np.where(known, np.where(send, o["peer"], o["rank"]), -1)}).groupby(
        ["iteration", "group", "seq", "src", "dst"], sort=False).ngroup().to_numpy()
    by_rank = o.sort_values(["iteration", "rank", "start_ns"])
    prev = pd.Series(by_rank.index, index=by_rank.index).groupby(
        [by_rank["iteration"], by_rank["rank"]]).shift(1).reindex(o.index).fillna(-1)
    prev = prev.astype(np.int64).to_numpy()
    rng = np.random.default_rng(0)
    dur, start = o["duration_us"].to_numpy(), o["start_ns"].to_numpy()
    excess = np.where(rng.random(len(o)) < 0.05, rng.random(len(o)) * dur * 0.5, 0.0)
    gap = np.where(rng.random(len(o)) < 0.05, rng.random(len(o)) * 50.0, 0.0)
    got = replay_gain(inst, start, prev, dur, excess, gap, sweeps)
    want = _replay_by_pandas(inst, start, prev, dur, excess, gap, sweeps)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-6)
    if sweeps == 10_000:  # swept until nothing moves
        assert (want > 0).mean() > 0.1  # the gains reach far beyond the 5 % given them


@pytest.mark.parametrize("seed", range(20))
def test_replay_gain_with_any_predecessors(seed):
    # several copies may name the same previous op (not a rank's timeline), instances of any
    # size, some sweeps cut short: the same as recomputing every instance in every sweep
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 80))
    inst = rng.integers(0, max(1, n // 3), n)
    start = rng.integers(0, 10**6, n)
    prev = np.where(rng.random(n) < 0.7, rng.integers(0, n, n), -1)
    dur = rng.random(n) * 100
    excess = np.where(rng.random(n) < 0.3, rng.random(n) * 20, 0.0)
    gap = np.where(rng.random(n) < 0.3, rng.random(n) * 20, 0.0)
    for sweeps in (0, 1, 3, 50):
        np.testing.assert_allclose(replay_gain(inst, start, prev, dur, excess, gap, sweeps),
                                   _replay_by_pandas(inst, start, prev, dur, excess, gap, sweeps),
                                   rtol=1e-9, atol=1e-9)


def test_replay_columns_on_a_slow_nic():
    fault = FaultSpec(kind="nic_slow", ranks=(3,), start_iteration=6, severity=2.0)
    ops = simulate(SimConfig(seed=7, iterations=10, faults=(fault,))).ops
    f = build_features(ops)
    ab = ops["abnormal"].to_numpy()
    share = f["replay_share"].to_numpy()
    # many of the fault's copies owe a tenth of their duration or more to slow transfers
    # (every data-parallel one on the slow NIC); hardly any normal copy does
    assert (share[ab] > 0.1).mean() > 0.3
    assert (share[~ab] > 0.1).mean() < 0.01
    dp = ab & ops["group_kind"].eq("dp").to_numpy()
    assert dp.sum() > 50 and (share[dp] > 0.1).all()
    # one sweep passes each gain one op on; the default's sweeps pass it further down the chains
    one = build_features(ops, FeatureConfig(replay_sweeps=1))["replay_share"].to_numpy()
    assert (one > 0).sum() < (share > 0).sum()


def test_replay_follows_a_slow_gpu_to_the_end_of_the_iteration():
    # A slow GPU on the first pipeline stage of LLaMA2-70B delays its replica's arrival at every
    # stage's data-parallel reduce-scatter, which every other replica waits for: the delay
    # reaches them some 100 ops down the chains of waits. The replay must follow it that far
    # (64 sweeps, the earlier default, left a fifth of them with no share).
    fault = FaultSpec(kind="gpu_slow", ranks=(0,), start_iteration=4, severity=0.5)
    ops = simulate(SimConfig(gpus=64, model="llama2-70b", iterations=8, seed=3,
                             faults=(fault,))).ops
    waited = ops["abnormal"].to_numpy(bool) & ops["op"].eq("reduce_scatter").to_numpy()
    assert waited.sum() >= 100
    share = build_features(ops)["replay_share"].to_numpy()
    assert (share[waited] > 0.05).all()
    short = build_features(ops, FeatureConfig(replay_sweeps=64))["replay_share"].to_numpy()
    assert (short[waited] > 0.05).mean() < 0.9


@pytest.mark.parametrize("seed", [0, 1])
def test_replay_leaves_a_noisy_healthy_job_alone(seed):
    # At 10 % jitter a fifth of a healthy job's copies got a tenth of their duration or more
    # from the replay when 15 % over the step's usual gap or transfer was enough to count as
    # slowed; jitter's spread now has to be passed as well
    ops = simulate(SimConfig(gpus=64, model="llama2-13b", iterations=8, seed=seed,
                             jitter=0.1)).ops
    share = build_features(ops)["replay_share"].to_numpy()
    assert (share > 0.1).mean() < 0.08


def test_replay_still_takes_back_a_slow_gpu_in_a_noisy_job():
    # the slow GPU of the test above, in a cluster with 10 % jitter: its compute is far outside
    # the jitter's spread, so the waits it passes on still get their share, and the normal
    # copies hardly any (two in five did when 15 % was enough)
    fault = FaultSpec(kind="gpu_slow", ranks=(0,), start_iteration=4, severity=0.5)
    ops = simulate(SimConfig(gpus=64, model="llama2-70b", iterations=8, seed=3, jitter=0.1,
                             faults=(fault,))).ops
    ab = ops["abnormal"].to_numpy(bool)
    waited = ab & ops["op"].eq("reduce_scatter").to_numpy()
    assert waited.sum() >= 40
    share = build_features(ops)["replay_share"].to_numpy()
    assert (share[waited] > 0.05).mean() > 0.95
    assert (share[~ab] > 0.05).mean() < 0.1
