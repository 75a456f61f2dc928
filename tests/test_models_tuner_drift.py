"""TunedDetector (shared sqlite study) and drift adjustment."""

from __future__ import annotations

import numpy as np
import optuna
import pandas as pd
import pytest
from sklearn.datasets import make_classification

from holmes_ml.features import FEATURE_COLUMNS, TIME_FEATURES
from holmes_ml.models import DriftAdjuster, DriftAwareDetector, RandomForestDetector, TunedDetector


def test_tuner_shares_sqlite_study(tmp_path):
    X, y = make_classification(300, n_features=6, weights=[0.85], random_state=0)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    a = TunedDetector("lgbm", n_trials=2, storage=url, study_name="s", random_state=0).fit(X, y)
    assert len(optuna.load_study(study_name="s", storage=url).trials) == 2
    b = TunedDetector("lgbm", n_trials=2, storage=url, study_name="s", random_state=1).fit(X, y)
    study = optuna.load_study(study_name="s", storage=url)
    assert len(study.trials) == 4
    assert b.best_score_ >= a.best_score_
    assert set(b.best_params_) >= {"num_leaves", "learning_rate"}
    s = b.decision_function(X)
    np.testing.assert_array_equal(b.predict(X), b.classes_[(s >= b.threshold_).astype(int)])
    assert b.best_score_ > 0.5


def test_a_study_used_again_for_other_data_chooses_among_this_datas_trials(tmp_path, caplog):
    """A trial scored on an easy dataset must not become the choice for a hard one."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    # 600 rows: with a shared study the sampler draws its own seed, and on 200 rows the
    # configurations asking about 70 rows a leaf or more (min_child_samples) scored 0.667 (7
    # and 10 of 90 draws in two tries), below the hard data's best when all three were such
    # (seen once); on 600 rows each of 180 draws scored 0.997 or more. (The tuner no longer
    # draws such configurations: see the test below.)
    easy = make_classification(600, n_features=6, class_sep=3.0, flip_y=0, random_state=1)
    hard = make_classification(300, n_features=6, class_sep=0.3, flip_y=0.2, random_state=2)
    a = TunedDetector("lgbm", n_trials=3, storage=url, study_name="s", random_state=0).fit(*easy)
    with caplog.at_level("WARNING", logger="holmes_ml.models.tuner"):
        b = TunedDetector("lgbm", n_trials=2, storage=url, study_name="s",
                          random_state=0).fit(*hard)
    trials = optuna.load_study(study_name="s", storage=url).trials
    mine = [t for t in trials[3:] if t.value is not None]
    assert len(trials) == 5 and a.n_trials_ == 3 and b.n_trials_ == len(mine) == 2
    best = max(mine, key=lambda t: t.value)
    assert b.best_score_ == best.value < a.best_score_  # the easy data's best was left out
    assert b.best_params_ == best.params and b.threshold_ == best.user_attrs["threshold"]
    assert "3 trial(s) scored on other data" in caplog.text
    # the same data again: its trials are all in the choice, and no warning about them
    caplog.clear()
    c = TunedDetector("lgbm", n_trials=1, storage=url, study_name="s", random_state=5).fit(*easy)
    assert c.n_trials_ == 4 and c.best_score_ >= a.best_score_
    assert "2 trial(s) scored on other data" in caplog.text


@pytest.mark.parametrize("kind", ["lgbm", "rf"])
def test_no_trial_asks_a_leaf_for_more_rows_than_a_tenth_of_a_training_fold(tmp_path, kind):
    """On 200 rows (133 a training fold), LightGBM asked for 70 rows a leaf or more cannot
    split and scores every row alike: F1 0.667 on this easy data, a wasted trial."""
    easy = make_classification(200, n_features=6, class_sep=3.0, flip_y=0, random_state=1)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    TunedDetector(kind, n_trials=30, storage=url, study_name="s", random_state=0).fit(*easy)
    trials = optuna.load_study(study_name="s", storage=url).trials
    leaf = "min_child_samples" if kind == "lgbm" else "min_samples_leaf"
    assert max(t.params[leaf] for t in trials) <= 13  # a tenth of 133
    assert min(t.value for t in trials) > 0.9, sorted((t.value, t.params[leaf]) for t in trials)
    # on 3,000 rows (2,000 a fold) the range is as before: up to 100 (rf: 20) rows a leaf
    big = make_classification(3000, n_features=6, class_sep=3.0, flip_y=0, random_state=1)
    TunedDetector(kind, n_trials=1, storage=url, study_name="b", random_state=0).fit(*big)
    dist = optuna.load_study(study_name="b", storage=url).trials[0].distributions[leaf]
    assert dist.high == (100 if kind == "lgbm" else 20)


def test_tuner_folds_leave_whole_runs_out_when_given_them():
    """Rows of one run are near-copies: folds over rows score memorizing them, runs do not."""
    from holmes_ml.models.tuner import _folds

    rng = np.random.default_rng(0)
    base = rng.normal(size=(240, 6))
    label = rng.random(240) < 0.3  # no pattern to learn: only copies to remember
    X = np.repeat(base, 5, axis=0) + rng.normal(scale=1e-3, size=(1200, 6))
    y = np.repeat(label, 5)
    runs = np.repeat(np.arange(6), 200)  # 6 runs of 40 rows, each row 5 times
    rows = TunedDetector("rf", n_trials=2, random_state=0).fit(X, y)
    left_out = TunedDetector("rf", n_trials=2, random_state=0).fit(X, y, groups=runs)
    assert rows.best_score_ > 0.8 and left_out.best_score_ < rows.best_score_ - 0.3
    # every run on one side of each fold; with fewer than 5 runs (or a fold without an
    # abnormal op to train on) folds over rows, which split each run
    for train, test in _folds(y.astype(int), runs, 3):
        assert not set(runs[train]) & set(runs[test])
    for train, test in _folds(y.astype(int), runs % 4, 3):
        assert set(runs[test] % 4) <= set(runs[train] % 4) == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="groups: got 3 values; expected one per row"):
        TunedDetector("rf", n_trials=1).fit(X, y, groups=[1, 2, 3])


def test_tuner_rejects_unknown_estimator():
    X, y = make_classification(60, random_state=0)
    with pytest.raises(ValueError, match="estimator: got 'xgb'"):
        TunedDetector("xgb", n_trials=1).fit(X, y)


def _frame(rng, n=4000):
    F = pd.DataFrame(rng.lognormal(5, 0.3, size=(n, len(FEATURE_COLUMNS))),
                     columns=list(FEATURE_COLUMNS))
    F["hist_ratio"] = rng.lognormal(0, 0.05, n)
    return F


@pytest.mark.parametrize("scale", [0.7, 1.3, 2.0])
def test_adjuster_recovers_known_scale(scale):
    rng = np.random.default_rng(3)
    ref = _frame(rng)
    cur = _frame(rng)
    cols = list(TIME_FEATURES)
    cur[cols] *= scale
    adj = DriftAdjuster().fit(ref)
    est = adj.estimate(cur)
    assert est == pytest.approx(scale, rel=0.03)
    back = adj.transform(cur, est)
    assert np.median(back["duration_us"]) == pytest.approx(np.median(ref["duration_us"]), rel=0.05)


def test_drift_aware_detector_restores_predictions():
    rng = np.random.default_rng(0)
    F = _frame(rng, 3000)
    y = (F["duration_us"] > 1.6 * F["hist_median_us"]).to_numpy()
    drifted = F.copy()
    drifted[list(TIME_FEATURES)] *= 1.5
    base = RandomForestDetector(n_estimators=20, random_state=0)
    on = DriftAwareDetector(base, adjust=True).fit(F, y)
    off = DriftAwareDetector(base, adjust=False).fit(F, y)
    # Untouched windows score the same with or without adjustment.
    np.testing.assert_allclose(on.decision_function(F), off.decision_function(F), atol=0.05)
    # On the drifted window the adjusted detector scores like the original data; the plain one
    # must differ (its absolute-time splits are off by 1.5x).
    ref_pred = on.predict(F)
    drift_pred = on.predict(drifted)
    assert on.last_scale_ == pytest.approx(1.5, rel=0.05)
    assert (drift_pred == ref_pred).mean() > 0.97
    assert (off.predict(drifted) == ref_pred).mean() < (drift_pred == ref_pred).mean()


def test_a_saved_tuned_detector_loads_without_its_storage_and_keeps_no_password(
        tmp_path, monkeypatch):
    """Loading a tuned model elsewhere opens no storage (it used to create an empty study.db
    in the current directory, or fail when the database was gone), keeps what the study found,
    and never holds the storage's password."""
    import pickle

    from holmes_ml.models import load_model, save_model

    X, y = make_classification(200, n_features=5, random_state=0)
    (tmp_path / "train").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "train")
    det = TunedDetector("lgbm", n_trials=2, storage="sqlite:///study.db", study_name="s",
                        random_state=0).fit(X, y)
    path = save_model(det, tmp_path / "t.holmes")
    (tmp_path / "train" / "study.db").unlink()
    monkeypatch.chdir(tmp_path / "elsewhere")
    back = load_model(path, check_features=False)
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert not (tmp_path / "train" / "study.db").exists()
    assert not hasattr(back, "study_")
    assert back.n_trials_ == 2 and back.study_name_ == "s"
    assert back.best_params_ == det.best_params_ and back.best_score_ == det.best_score_
    np.testing.assert_array_equal(back.decision_function(X), det.decision_function(X))
    det.set_params(storage="postgresql://holmes:s3cret@db.example/optuna")
    data = pickle.dumps(det)
    assert b"s3cret" not in data
    assert pickle.loads(data).storage == "postgresql://holmes:***@db.example/optuna"
    # an unfitted one (a clone sent to a worker) keeps the URL it needs to open the study
    fresh = TunedDetector(storage="postgresql://holmes:s3cret@db.example/optuna")
    assert pickle.loads(pickle.dumps(fresh)).storage == fresh.storage
