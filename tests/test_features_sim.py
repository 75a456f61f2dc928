"""Features on simulator output: abnormal-labelled ops stand out, the straggler arrives last."""

from __future__ import annotations

import numpy as np
import pytest

from holmes_ml.features import FEATURE_COLUMNS, build_features, detect_irregular

simulator = pytest.importorskip("holmes_ml.simulator")
if not hasattr(simulator, "simulate"):  # pragma: no cover - simulator still being written
    pytest.skip("holmes_ml.simulator.simulate not available yet", allow_module_level=True)

SLOW_RANK = 5
START = 4


@pytest.fixture(scope="module")
def sim():
    cfg = simulator.SimConfig(
        gpus=64, iterations=14, seed=3,
        faults=(simulator.FaultSpec.parse(f"gpu_slow:rank={SLOW_RANK},severity=0.5,start={START}"),),
    )
    res = simulator.simulate(cfg)
    return res.ops, build_features(res.ops)


def test_features_are_clean_on_simulated_job(sim):
    ops, feats = sim
    assert list(feats.columns) == list(FEATURE_COLUMNS)
    assert (feats.dtypes == np.float32).all()
    assert np.isfinite(feats.to_numpy()).all()
    assert feats.index.equals(ops.index)


def test_abnormal_ops_have_larger_history_and_peer_scores(sim):
    ops, feats = sim
    ab = ops["abnormal"].to_numpy(dtype=bool)
    assert 0 < ab.sum() < len(ab)
    for col in ("hist_z", "hist_iqr_score", "hist_ratio", "peer_ratio_median"):
        assert feats[col][ab].mean() > feats[col][~ab].mean(), col
    assert feats["hist_ratio"][ab].mean() > 1.5 * feats["hist_ratio"][~ab].mean()


def test_straggler_copies_arrive_last(sim):
    ops, feats = sim
    mine = ((ops["rank"] == SLOW_RANK) & (ops["iteration"] >= START)
            & ~ops["op"].astype(str).isin(["send", "recv"])).to_numpy()
    assert mine.sum() > 0
    assert feats["arrived_last"][mine].mean() > 0.95
    before = ((ops["rank"] == SLOW_RANK) & (ops["iteration"] < START)).to_numpy()
    assert feats["arrived_last"][before].mean() < 0.5


def test_monitor_flags_the_faulty_iterations(sim):
    ops, _ = sim
    out = detect_irregular(ops)
    assert not out.loc[: START - 1, "irregular"].any()
    assert out.loc[START:, "irregular"].all()
    assert set(out.loc[START:, "pattern"]) == {"persistent"}


@pytest.mark.parametrize("pattern", ["spike", "fluctuation", "persistent"])
def test_monitor_recovers_injected_pattern(pattern):
    spec = simulator.FaultSpec.parse(f"gpu_slow:rank=5,severity=0.5,start=10,pattern={pattern}")
    res = simulator.simulate(simulator.SimConfig(gpus=64, iterations=40, faults=(spec,), seed=4))
    out = detect_irregular(res.ops)
    active = list(res.faults[0].active_iterations)
    assert out.index[out["irregular"]].tolist() == active
    assert set(out.loc[active, "pattern"]) == {pattern}
