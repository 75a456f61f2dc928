"""Generalization floor on seeded simulator data: train on some seeds, test on another scale."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import f1_score

from holmes_ml.models import LightGBMDetector, ThreeSigmaDetector
from holmes_ml.models.training import make_dataset, scenarios


@pytest.fixture(scope="module")
def train():
    X, y, _ = make_dataset(scenarios("tiny", seed=0), max_normal_per_run=15_000)
    return X, y


@pytest.mark.parametrize("seed", [5, 9])
def test_heldout_f1_floor(train, seed):
    from holmes_ml.simulator import FaultSpec, SimConfig

    X, y = train
    det = LightGBMDetector(n_estimators=60, threshold="auto", random_state=0).fit(X, y)
    cfg = SimConfig(gpus=128, iterations=16, seed=seed,
                    faults=(FaultSpec.parse("gpu_slow:severity=0.6,start=4"),))
    Xt, yt, _ = make_dataset([cfg], max_normal_per_run=None)
    f1 = f1_score(yt, det.predict(Xt).astype(bool))
    base = f1_score(yt, ThreeSigmaDetector(feature="hist_z").fit(X).predict(Xt).astype(bool))
    assert f1 >= 0.5, f1
    assert f1 > base
    assert np.isfinite(det.decision_function(Xt)).all()


@pytest.mark.parametrize("seed", [6, 11])
def test_scale_free_estimator_heldout_floor(seed):
    """The scale-free configuration (scale-dependent columns ignored) on an unseen 128-GPU run.

    Measured 0.94-0.98 over seeds 5-12; the floor leaves room for seed noise.
    """
    from holmes_ml.models.training import scale_free_estimator
    from holmes_ml.simulator import FaultSpec, SimConfig

    X, y, run, w = make_dataset(scenarios("tiny", seed=0), max_normal_per_run=15_000,
                                return_weights=True)
    det = scale_free_estimator(0).fit(X, y, groups=run, threshold_weights=w)
    cfg = SimConfig(gpus=128, iterations=16, seed=seed,
                    faults=(FaultSpec.parse("gpu_slow:severity=0.6,start=4"),))
    Xt, yt, _ = make_dataset([cfg], max_normal_per_run=None)
    assert f1_score(yt, det.predict(Xt).astype(bool)) >= 0.9
