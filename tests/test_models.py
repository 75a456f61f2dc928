"""scikit-learn contract and basic behaviour of the detectors."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import make_classification
from sklearn.metrics import f1_score
from sklearn.utils.estimator_checks import parametrize_with_checks

from holmes_ml.models import (
    IsolationForestDetector,
    KNNDetector,
    LightGBMDetector,
    RandomForestDetector,
    ScreenedDetector,
    SVMDetector,
    ThreeSigmaDetector,
    TunedDetector,
    best_f1_threshold,
)

# Our decision_function is P(abnormal) in [0, 1], not a margin centred on 0, so the checks that
# read "decision_function > 0" as the positive class cannot apply.
_MARGIN = "decision_function is P(abnormal) in [0, 1], not a margin centred on 0"


def _expected(est):
    failed = {"check_classifiers_train": _MARGIN}
    if isinstance(est, (LightGBMDetector, ScreenedDetector)):
        # RF happens to pass: its training-set probabilities sit at 0/1, so "> 0" agrees.
        failed["check_classifiers_classes"] = _MARGIN
    return failed


@parametrize_with_checks(
    [
        RandomForestDetector(n_estimators=5, random_state=0),
        LightGBMDetector(n_estimators=30, min_child_samples=2, random_state=0),
        ScreenedDetector(LightGBMDetector(n_estimators=30, min_child_samples=2, random_state=0)),
    ],
    expected_failed_checks=_expected,
)
def test_sklearn_contract(estimator, check):
    check(estimator)


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(
        600, n_features=8, weights=[0.9], class_sep=2.0, random_state=1
    )
    return X[:400], y[:400], X[400:], y[400:]


@pytest.mark.parametrize(
    "det",
    [
        RandomForestDetector(n_estimators=30, random_state=0, threshold="auto"),
        LightGBMDetector(n_estimators=30, random_state=0, threshold="auto"),
        KNNDetector(threshold="auto"),
        SVMDetector(random_state=0, threshold="auto"),
    ],
    ids=["rf", "lgbm", "knn", "svm"],
)
def test_supervised_detectors_learn(det, data):
    X, y, Xt, yt = data
    det = clone(det).fit(X, y)
    s = det.decision_function(Xt)
    assert s.shape == (len(Xt),) and s.min() >= 0 and s.max() <= 1
    assert 0 <= det.threshold_ <= 1
    np.testing.assert_array_equal(det.predict(Xt), (s >= det.threshold_).astype(int))
    assert f1_score(yt, det.predict(Xt)) > 0.6


def test_threshold_separate_from_scores(data):
    X, y, Xt, _ = data
    a = RandomForestDetector(n_estimators=20, random_state=0, threshold=0.2).fit(X, y)
    b = RandomForestDetector(n_estimators=20, random_state=0, threshold=0.8).fit(X, y)
    np.testing.assert_allclose(a.decision_function(Xt), b.decision_function(Xt))
    assert a.predict(Xt).sum() >= b.predict(Xt).sum()


def test_three_sigma_is_the_z_rule():
    rng = np.random.default_rng(0)
    X = rng.normal(10, 2, size=(1000, 2))
    det = ThreeSigmaDetector(feature=1).fit(X)
    probe = np.array([[0, det.mean_ + 3.5 * det.std_], [0, det.mean_ + 2.5 * det.std_]])
    np.testing.assert_array_equal(det.predict(probe), [1, 0])


def test_isolation_forest_flags_outliers():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 3))
    det = IsolationForestDetector(random_state=0, contamination=0.02).fit(X)
    assert det.predict(np.full((1, 3), 8.0))[0] == 1
    assert det.predict(X).mean() < 0.05


def test_bad_threshold_is_named():
    X, y = make_classification(50, random_state=0)
    with pytest.raises(ValueError, match="threshold: got 'high'"):
        RandomForestDetector(threshold="high").fit(X, y)


def test_best_f1_threshold_separates():
    y = np.array([0, 0, 0, 1, 1])
    s = np.array([0.1, 0.2, 0.3, 0.7, 0.8])
    t = best_f1_threshold(y, s)
    assert 0.3 < t < 0.7


@pytest.mark.parametrize("cls", [LightGBMDetector, RandomForestDetector])
def test_ignore_features_hides_named_columns(cls):
    import pandas as pd

    rng = np.random.default_rng(3)
    X = pd.DataFrame(rng.normal(size=(600, 4)), columns=["a", "b", "c", "d"])
    y = (X["a"] > 0).to_numpy()
    kw = {"n_estimators": 20, "random_state": 0}
    seen = cls(**kw).fit(X, y)
    blind = cls(ignore_features=("a",), **kw).fit(X, y)
    assert seen.n_features_in_ == blind.n_features_in_ == 4
    assert blind.used_features_.tolist() == [1, 2, 3]
    Xt = pd.DataFrame(rng.normal(size=(400, 4)), columns=["a", "b", "c", "d"])
    yt = (Xt["a"] > 0).to_numpy()
    assert (seen.predict(Xt) == yt).mean() > 0.9
    assert (blind.predict(Xt) == yt).mean() < 0.7  # chance level without column a


def test_grouped_threshold_and_groups_length_checked():
    X, y = make_classification(400, n_features=6, random_state=0)
    groups = np.arange(400) % 6
    det = LightGBMDetector(n_estimators=20, threshold="auto", random_state=0)
    det.fit(X, y, groups=groups)
    assert 0.0 <= det.threshold_ <= 1.0
    assert f1_score(y, det.predict(X)) > 0.8
    with pytest.raises(ValueError, match="groups"):
        LightGBMDetector(n_estimators=5, threshold="auto").fit(X, y, groups=groups[:-1])
    # a fixed threshold never used groups, so a wrong length went unsaid
    with pytest.raises(ValueError, match="groups: got 399 values; expected one per row"):
        LightGBMDetector(n_estimators=5, threshold=0.5).fit(X, y, groups=groups[:-1])


@pytest.mark.parametrize("make", [
    lambda: LightGBMDetector(n_estimators=5, min_child_samples=2),
    lambda: RandomForestDetector(n_estimators=3),
    lambda: TunedDetector("lgbm", n_trials=1, max_tune_samples=200, random_state=0),
])
def test_text_labels_named_the_other_way_round_are_refused(make):
    """With text labels the larger one is the abnormal class, so 'abnormal'/'normal' fitted a
    detector that flagged the normal operators; 'no'/'yes' is the right way round."""
    X, y = make_classification(200, n_features=4, random_state=0)
    named = np.where(y == 1, "abnormal", "normal")
    with pytest.raises(ValueError, match=r"larger label \('normal'\) as abnormal.*"
                                         "y == 'abnormal'"):
        make().fit(X, named)
    det = make().fit(X, np.where(y == 1, "yes", "no"))
    assert set(det.predict(X)) <= {"yes", "no"}
    assert f1_score(y, det.predict(X) == "yes") > 0.7


def test_lightgbm_fast_scores_match_the_wrapper_on_float32_and_float64():
    import pandas as pd

    X, y = make_classification(500, n_features=6, random_state=1)
    cols = [f"f{i}" for i in range(6)]
    det = LightGBMDetector(n_estimators=20, ignore_features=("f5",), random_state=0)
    det.fit(pd.DataFrame(X, columns=cols), y)
    X32 = pd.DataFrame(X.astype(np.float32), columns=cols)
    ref = det.estimator_.predict_proba(X32.to_numpy(np.float64)[:, det.used_features_])[:, 1]
    s32 = det.decision_function(X32)
    assert s32.dtype == np.float64
    np.testing.assert_allclose(s32, ref, rtol=0, atol=1e-12)
    s64 = det.decision_function(pd.DataFrame(X.astype(np.float32).astype(np.float64),
                                             columns=cols))
    np.testing.assert_array_equal(s32, s64)
    np.testing.assert_array_equal(det.predict_proba(X32)[:, 1], s32)


def test_small_estimator_is_shallow_and_scale_free():
    from holmes_ml.models.training import SCALE_DEPENDENT, small_estimator

    det = small_estimator(0)
    assert det.max_depth == 3 and det.n_estimators <= 40
    assert set(det.ignore_features) == set(SCALE_DEPENDENT)
    X, y = make_classification(600, n_features=5, random_state=2)
    det.set_params(ignore_features=None, threshold=0.5).fit(X, y)
    trees = det.estimator_.booster_.dump_model()["tree_info"]
    assert len(trees) == det.n_estimators
    assert max(t["num_leaves"] for t in trees) <= 8
    assert f1_score(y, det.predict(X)) > 0.8


def test_small_lightgbm_compiled_scores_equal_the_booster():
    import pandas as pd

    rng = np.random.default_rng(4)
    X = pd.DataFrame(rng.normal(size=(3000, 5)).astype(np.float32), columns=list("abcde"))
    y = (X["a"] + 0.5 * X["b"] ** 2 + 0.3 * rng.normal(size=3000) > 0.6).to_numpy()
    # an ignored column in the middle: the compiled trees read the others through a map
    small = LightGBMDetector(n_estimators=25, num_leaves=7, max_depth=3, ignore_features=("c",),
                             random_state=0).fit(X, y)
    big = LightGBMDetector(n_estimators=60, num_leaves=31, random_state=0).fit(X, y)
    assert small.compiled_ is not None and big.compiled_ is None  # big: walked row-wise
    assert small.row_trees_ is None and big.row_trees_ is not None
    Xt = pd.DataFrame(rng.normal(size=(70_000, 5)).astype(np.float32), columns=list("abcde"))
    want = small.estimator_.booster_.predict(
        Xt.to_numpy(np.float64)[:, small.used_features_], num_threads=1)
    np.testing.assert_allclose(small.decision_function(Xt), want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(small.decision_function(Xt.astype(np.float64)), want,
                               rtol=0, atol=1e-12)
    # a model saved before the flat arrays existed gets them when loaded, and scores alike
    import pickle

    old = pickle.loads(pickle.dumps(small))
    del old.compiled_.__dict__["_flat"]
    loaded = pickle.loads(pickle.dumps(old))
    np.testing.assert_array_equal(loaded.decision_function(Xt), small.decision_function(Xt))
    # values exactly on a split threshold go left, as in LightGBM
    tree = small.compiled_.trees[0]
    edge = Xt.iloc[:2].copy()
    edge.iloc[:, small.used_features_[tree[0]]] = np.float32(tree[2])
    np.testing.assert_allclose(
        small.decision_function(edge),
        small.estimator_.booster_.predict(edge.to_numpy(np.float64)[:, small.used_features_]),
        rtol=0, atol=1e-12)


def test_row_walked_trees_score_as_the_booster_bit_for_bit():
    # a model too large to evaluate column-wise is walked row by row over flat node arrays:
    # the same double comparisons, leaf sums in tree order and sigmoid as LightGBM's
    import pickle

    import pandas as pd

    rng = np.random.default_rng(6)
    X = pd.DataFrame(rng.normal(size=(3000, 5)).astype(np.float32), columns=list("abcde"))
    y = (X["a"] + 0.5 * X["b"] ** 2 + 0.3 * rng.normal(size=3000) > 0.6).to_numpy()
    det = LightGBMDetector(n_estimators=60, num_leaves=31, ignore_features=("c",),
                           random_state=0).fit(X, y)
    assert det.compiled_ is None and det.row_trees_ is not None
    Xt = pd.DataFrame(rng.normal(size=(5000, 5)).astype(np.float32), columns=list("abcde"))
    used = Xt.to_numpy(np.float64)[:, det.used_features_]
    want = det.estimator_.booster_.predict(used, num_threads=1)
    np.testing.assert_array_equal(det.decision_function(Xt), want)
    # values exactly on split thresholds (doubles) go left, as in LightGBM
    trees = det.row_trees_
    Xt = Xt.astype(np.float64)
    for k in range(0, len(trees.feature), 7):
        Xt.iloc[k, det.used_features_[trees.feature[k]]] = trees.threshold[k]
    used = Xt.to_numpy(np.float64)[:, det.used_features_]
    want = det.estimator_.booster_.predict(used, num_threads=1)
    np.testing.assert_array_equal(det.decision_function(Xt), want)
    # a model saved before the flat arrays existed gets them when loaded
    old = pickle.loads(pickle.dumps(det))
    del old.row_trees_
    loaded = pickle.loads(pickle.dumps(old))
    assert loaded.row_trees_ is not None
    np.testing.assert_array_equal(loaded.decision_function(Xt), want)
    # trees that route missing values (learnt from NaN) are not flattened: the booster scores
    from lightgbm import LGBMClassifier

    from holmes_ml.models._compiled import RowTrees

    Xn = X.to_numpy(np.float64, copy=True)
    Xn[::5, 0] = np.nan
    booster = LGBMClassifier(n_estimators=20, verbose=-1).fit(Xn, y).booster_
    assert RowTrees.from_booster(booster) is None


def test_compiled_unbalanced_trees_score_like_the_booster():
    # Deep, lopsided trees (leaf-wise growth without a depth cap) exercise the leaf-index
    # arithmetic on subtrees of unequal size; rows are more than one evaluation block.
    import pandas as pd

    from holmes_ml.models import _compiled

    rng = np.random.default_rng(11)
    X = pd.DataFrame(rng.normal(size=(4000, 4)).astype(np.float32), columns=list("abcd"))
    y = ((X["a"] > 0.8) | ((X["b"] < -0.5) & (X["c"] > 0.2)) | (rng.random(4000) < 0.05))
    det = LightGBMDetector(n_estimators=12, num_leaves=14, min_child_samples=5,
                           random_state=0).fit(X, y.to_numpy())
    assert det.compiled_ is not None

    def depth(node):
        return 0 if isinstance(node, float) else 1 + max(depth(node[3]), depth(node[4]))

    depths = [depth(t) for t in det.compiled_.trees]
    assert max(depths) > 4  # lopsided: 14 leaves deeper than a balanced tree's 4 levels
    Xt = pd.DataFrame(rng.normal(size=(_compiled._BLOCK + 5000, 4)).astype(np.float32),
                      columns=list("abcd"))
    want = det.estimator_.booster_.predict(Xt.to_numpy(np.float64), num_threads=1)
    np.testing.assert_allclose(det.decision_function(Xt), want, rtol=0, atol=1e-12)


def test_weighted_threshold_equals_duplicated_rows():
    rng = np.random.default_rng(3)
    y = rng.random(400) < 0.2
    s = np.clip(y * 0.3 + rng.random(400) * 0.7, 0, 1)
    w = rng.integers(1, 5, size=400)
    dup = np.repeat(np.arange(400), w)
    assert best_f1_threshold(y, s, w) == pytest.approx(best_f1_threshold(y[dup], s[dup]))
    # up-weighting the normal rows (as a subsample of them stands for many) raises the cut
    heavy = np.where(y, 1.0, 20.0)
    assert best_f1_threshold(y, s, heavy) > best_f1_threshold(y, s)
    with pytest.raises(ValueError, match="weights: got shape"):
        best_f1_threshold(y, s, w[:10])


def test_ignore_features_that_would_ignore_nothing_are_refused():
    """A name given as a bare string was read letter by letter, and a misspelt one ignored
    nothing: either way the model saw every column, without a word."""
    import pandas as pd

    X, y = make_classification(n_samples=120, n_features=4, random_state=0)
    X = pd.DataFrame(X, columns=["a", "hist_z", "c", "d"])
    fitted = RandomForestDetector(n_estimators=5, random_state=0,
                                  ignore_features=("hist_z",)).fit(X, y)
    assert fitted.used_features_.tolist() == [0, 2, 3]
    with pytest.raises(TypeError, match=r"ignore_features: got the string 'hist_z'; expected "
                       r"a tuple of feature names, e\.g\. \('hist_z',\)"):
        RandomForestDetector(n_estimators=5, ignore_features="hist_z").fit(X, y)
    with pytest.raises(ValueError, match="ignore_features: 'hist_zz' is no column of X"):
        RandomForestDetector(n_estimators=5, ignore_features=("hist_zz",)).fit(X, y)
