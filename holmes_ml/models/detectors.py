"""Abnormal-operator detectors: the random forest of Holmes, LightGBM, and the baselines.

Every detector follows the scikit-learn estimator contract (``__init__`` stores keyword
arguments only, ``fit`` validates and returns ``self``, learned state ends in ``_``) and the
PyOD convention for scores: :meth:`decision_function` returns an *abnormality score in [0, 1]*,
higher = more abnormal, and :meth:`predict` compares it with ``threshold_``. Scores and the
decision threshold are kept apart so a caller can rank ops by score and choose its own cut.

Because the score lives in [0, 1] rather than being centred on 0, the two scikit-learn checks
that assume ``decision_function > 0`` means the positive class do not apply; the test suite marks
them as expected failures with that reason.

Supervised detectors (:class:`RandomForestDetector`, :class:`LightGBMDetector`,
:class:`KNNDetector`, :class:`SVMDetector`) are binary classifiers: the positive class is
``classes_[1]`` (``True``/``1`` = abnormal for simulator labels). Unsupervised ones
(:class:`ThreeSigmaDetector`, :class:`IsolationForestDetector`) ignore ``y`` and predict
``0``/``1`` (1 = abnormal).
"""

from __future__ import annotations

import logging
import numbers
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.ensemble import IsolationForest, RandomForestClassifier
from sklearn.model_selection import GroupKFold, StratifiedKFold, cross_val_predict
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import LinearSVC
from sklearn.utils.multiclass import check_classification_targets, type_of_target
from sklearn.utils.validation import check_is_fitted, validate_data

logger = logging.getLogger(__name__)

__all__ = [
    "BinaryDetectorMixin",
    "IsolationForestDetector",
    "KNNDetector",
    "LightGBMDetector",
    "RandomForestDetector",
    "SVMDetector",
    "ThreeSigmaDetector",
    "best_f1_threshold",
    "check_abnormal_class",
]


def best_f1_threshold(
    y_true: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None
) -> float:
    """The score cut that maximizes F1 of ``scores >= cut`` against binary ``y_true``.

    Parameters
    ----------
    y_true:
        Binary labels (1/True = abnormal).
    scores:
        Abnormality scores, higher = more abnormal.
    weights:
        How many operators each row stands for (e.g. normal rows kept 1 in 10 weigh 10), so
        that F1 is that of the population the rows were sampled from; ``None``: 1 each.

    Returns
    -------
    float
        The cut halfway between the chosen score and the next lower one, so that small score
        perturbations on unseen data do not flip the boundary cases; 0.5 when ``y_true`` has no
        positive.

    Examples
    --------
    >>> round(best_f1_threshold(np.array([0, 0, 1, 1]), np.array([0.1, 0.3, 0.6, 0.9])), 6)
    0.45
    """
    y = np.asarray(y_true).astype(bool)
    s = np.asarray(scores, dtype=np.float64)
    w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != y.shape or not np.all(np.isfinite(w) & (w >= 0)):
        raise ValueError(f"weights: got shape {w.shape}; expected {len(y)} finite values >= 0, "
                         "one per row")
    if not (y & (w > 0)).any():
        return 0.5
    order = np.argsort(-s, kind="stable")
    s_sorted = s[order]
    tp = np.cumsum(w[order] * y[order])
    flagged = np.cumsum(w[order])
    # Only cut between distinct scores: ties must fall on the same side.
    last_of_tie = np.r_[s_sorted[1:] != s_sorted[:-1], True]
    f1 = np.where(last_of_tie, 2 * tp / (flagged + (w * y).sum()), -1.0)
    i = int(np.argmax(f1))
    below = s_sorted[i + 1] if i + 1 < len(s_sorted) else 0.0
    return float((s_sorted[i] + below) / 2.0)


def _check_threshold(threshold: Any, name: str = "threshold") -> None:
    if isinstance(threshold, str):
        if threshold != "auto":
            raise ValueError(f"{name}: got {threshold!r}; expected a float in [0, 1] or 'auto'")
        return
    if not isinstance(threshold, numbers.Real) or not 0.0 <= float(threshold) <= 1.0:
        raise ValueError(f"{name}: got {threshold!r}; expected a float in [0, 1] or 'auto'")


#: Label names that say "normal" / "abnormal": with text labels the larger one is taken as
#: abnormal (``classes_[1]``, as scikit-learn takes the positive class), which these would flip.
_NORMAL_NAMES = frozenset({"normal", "ok", "healthy", "good", "regular", "negative", "no",
                           "false"})
_ABNORMAL_NAMES = frozenset({"abnormal", "anomaly", "anomalous", "slow", "fault", "faulty",
                             "bad", "straggler", "irregular", "positive", "yes", "true"})


def check_abnormal_class(classes: np.ndarray, who: str) -> None:
    """Refuse text labels whose larger one (``classes[1]``, the class a detector flags as
    abnormal) is named like the normal class, e.g. ``"abnormal"``/``"normal"``: a detector
    fitted on them would flag every normal operator and pass every abnormal one.

    >>> check_abnormal_class(np.array(["no", "yes"]), "fit")
    >>> check_abnormal_class(np.array(["abnormal", "normal"]), "LightGBMDetector.fit")
    Traceback (most recent call last):
    ...
    ValueError: LightGBMDetector.fit: y's labels are 'abnormal' and 'normal'; a detector flags the larger label ('normal') as abnormal, which would flag the normal operators; expected booleans or 0/1 with True/1 = abnormal, e.g. y == 'abnormal'
    """
    if len(classes) != 2 or not all(isinstance(c, str) for c in classes):
        return
    first, second = (str(c) for c in classes)
    if second.strip().lower() in _NORMAL_NAMES or first.strip().lower() in _ABNORMAL_NAMES:
        raise ValueError(
            f"{who}: y's labels are {first!r} and {second!r}; a detector flags the larger "
            f"label ({second!r}) as abnormal, which would flag the normal operators; expected "
            f"booleans or 0/1 with True/1 = abnormal, e.g. y == {first!r}")


class BinaryDetectorMixin(ClassifierMixin):
    """``predict_proba`` and ``predict`` of a binary detector from its ``decision_function``
    (P(abnormal) in [0, 1]), ``threshold_`` and ``classes_``; binary-only estimator tags."""

    classes_: np.ndarray
    threshold_: float

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        return tags

    def decision_function(self, X) -> np.ndarray:  # pragma: no cover - every detector has one
        raise NotImplementedError

    def predict_proba(self, X) -> np.ndarray:
        """``[P(normal), P(abnormal)]`` per row, columns in the order of ``classes_``."""
        s = self.decision_function(X)
        return np.column_stack([1.0 - s, s])

    def predict(self, X) -> np.ndarray:
        """``classes_[1]`` (abnormal) where the score reaches ``threshold_``, else ``classes_[0]``."""
        scores = self.decision_function(X)  # checks fitted before classes_ is touched
        return self.classes_[(scores >= self.threshold_).astype(np.int64)]


class _SupervisedDetector(BinaryDetectorMixin, BaseEstimator):
    """Shared machinery of the binary supervised detectors.

    Subclasses implement :meth:`_make_estimator` (an unfitted scikit-learn-style classifier with
    ``predict_proba``) and list their constructor parameters.
    """

    def _make_estimator(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def fit(self, X, y, groups=None, threshold_weights=None):
        """Learn from features ``X`` and binary labels ``y``.

        Parameters
        ----------
        X:
            Feature matrix (DataFrame or array), one row per operator.
        y:
            Binary labels; the larger label (``True``/``1``) is the abnormal class. Text
            labels named the other way round (``"abnormal"``/``"normal"``) are refused.
        groups:
            Optional run/scenario id per row. With ``threshold="auto"`` the out-of-fold scores
            that pick the cut then come from folds that hold out whole runs, so the cut is the
            one that transfers to unseen jobs rather than to unseen rows of seen jobs (used with
            at least 5 distinct groups; fewer fall back to stratified folds).
        threshold_weights:
            Optional number of operators each row stands for, used only by the F1 that picks
            the ``"auto"`` threshold: training sets keep every abnormal op but a sample of the
            normal ones (:func:`~holmes_ml.models.training.make_dataset`), and a cut chosen as
            if that sample were the whole job flags far too many normal ops in a real one.
            The model itself trains on the rows as given (weighting its training too was
            measured to be worse).

        Returns
        -------
        self
        """
        _check_threshold(self.threshold)
        X, y = validate_data(self, X, y, dtype=np.float64)
        self.used_features_ = self._used_features()
        X = X[:, self.used_features_]
        check_classification_targets(y)
        y_type = type_of_target(y, input_name="y", raise_unknown=True)
        self.classes_ = np.unique(y)
        if len(self.classes_) < 2:
            raise ValueError(
                f"{type(self).__name__}.fit: y has only one class ({self.classes_[0]!r}); "
                "a supervised detector needs both normal and abnormal examples"
            )
        check_abnormal_class(self.classes_, f"{type(self).__name__}.fit")
        if y_type != "binary":
            raise ValueError(
                "Only binary classification is supported. The type of the target "
                f"is {y_type} ({type(self).__name__} separates normal from abnormal ops)."
            )
        y01 = (y == self.classes_[1]).astype(np.int64)
        if threshold_weights is not None and len(np.asarray(threshold_weights)) != len(y01):
            raise ValueError(
                f"threshold_weights: got {len(np.asarray(threshold_weights))} values; expected "
                f"one per row of X ({len(y01)})"
            )
        if groups is not None and len(np.asarray(groups)) != len(y01):
            raise ValueError(
                f"groups: got {len(np.asarray(groups))} values; expected one per row of X "
                f"({len(y01)})"
            )
        if self.threshold == "auto":
            # Out-of-fold scores, so the cut is not tuned on memorized training rows.
            n_splits = int(min(3, np.bincount(y01).min()))
            n_groups = 0 if groups is None else len(np.unique(np.asarray(groups)))
            # Leave-runs-out needs enough runs: with fewer than 5, each fold loses a whole
            # fault kind and the cut it picks is erratic (seen: 0.06 where 0.4 transfers).
            if n_groups >= 5 and n_splits >= 2:
                oof = cross_val_predict(
                    self._make_estimator(), X, y01, groups=np.asarray(groups),
                    cv=GroupKFold(n_splits=min(4, n_groups)), method="predict_proba",
                )[:, 1]
                self.threshold_ = best_f1_threshold(y01, oof, threshold_weights)
            elif n_splits >= 2:
                cv = StratifiedKFold(n_splits=n_splits, shuffle=True, random_state=0)
                oof = cross_val_predict(
                    self._make_estimator(), X, y01, cv=cv, method="predict_proba"
                )[:, 1]
                self.threshold_ = best_f1_threshold(y01, oof, threshold_weights)
            else:
                self.threshold_ = 0.5
        else:
            self.threshold_ = float(self.threshold)
        self.estimator_ = self._make_estimator().fit(X, y01)
        return self

    def _used_features(self) -> np.ndarray:
        """Indices of the input columns the model sees (all but ``ignore_features``)."""
        given = getattr(self, "ignore_features", None) or ()
        if isinstance(given, str):  # ("hist_z") is a string: each letter was a name
            raise TypeError(f"ignore_features: got the string {given!r}; expected a tuple of "
                            f"feature names, e.g. ({given!r},)")
        ignore = set(given)
        names = getattr(self, "feature_names_in_", None)
        if not ignore or names is None:
            return np.arange(self.n_features_in_)
        unknown = sorted(ignore - {str(n) for n in names})
        if unknown:  # a typo ignored nothing, without a word
            raise ValueError(f"ignore_features: {unknown[0]!r} is no column of X; expected "
                             "names among its columns (holmes_ml.features.FEATURE_COLUMNS)")
        return np.flatnonzero([str(n) not in ignore for n in names])

    def _validate(self, X) -> np.ndarray:
        """``X`` checked against the fitted schema, every input column kept."""
        check_is_fitted(self)
        # float32 stays float32: build_features returns float32, and a float64 copy of a
        # million-row matrix costs as much as a small forest's prediction.
        return validate_data(self, X, reset=False, dtype=(np.float64, np.float32))

    def decision_function(self, X) -> np.ndarray:
        """Abnormality score in [0, 1] of every row (higher = more abnormal)."""
        return self._scores_all_columns(self._validate(X))

    def _scores(self, X: np.ndarray) -> np.ndarray:
        """Scores of rows already validated and reduced to ``used_features_``."""
        return self.estimator_.predict_proba(X)[:, 1].astype(np.float64)

    def _scores_all_columns(self, X: np.ndarray) -> np.ndarray:
        """Scores of validated rows that still hold every input column (no name check: for
        a wrapper that validated ``X`` against the same schema once for several detectors)."""
        check_is_fitted(self)
        used = getattr(self, "used_features_", None)
        return self._scores(X if used is None else X[:, used])

class RandomForestDetector(_SupervisedDetector):
    """Random-forest detector of abnormal operators (the Holmes detector).

    Parameters
    ----------
    n_estimators, max_depth, min_samples_leaf, max_features, class_weight, random_state, n_jobs:
        As in :class:`sklearn.ensemble.RandomForestClassifier`. ``class_weight="balanced"``
        by default because abnormal ops are rare (a few percent of all ops).
    threshold:
        Score cut for :meth:`predict`: a float in [0, 1], or ``"auto"`` to learn the cut that
        maximizes F1 on out-of-fold predictions.
    ignore_features:
        Names of input columns the model must not see (only applies when ``X`` is a DataFrame
        with column names): e.g. absolute microsecond columns that do not transfer across
        scales. The input schema (``n_features_in_``) is unchanged.

    Attributes
    ----------
    estimator_ : RandomForestClassifier
        The fitted forest (its trees are what :class:`holmes_ml.models.DriftAdjuster` shifts).
    threshold_ : float
    classes_, n_features_in_, feature_names_in_ :
        As in scikit-learn.

    Examples
    --------
    >>> from sklearn.datasets import make_classification
    >>> X, y = make_classification(200, random_state=0)
    >>> det = RandomForestDetector(n_estimators=10, random_state=0).fit(X, y)
    >>> bool(0.0 <= det.decision_function(X).min() <= det.decision_function(X).max() <= 1.0)
    True
    """

    def __init__(
        self,
        n_estimators: int = 100,
        max_depth: int | None = None,
        min_samples_leaf: int = 1,
        max_features: str | float | None = "sqrt",
        class_weight: str | dict | None = "balanced",
        threshold: float | str = 0.5,
        ignore_features: tuple[str, ...] | None = None,
        random_state: int | None = None,
        n_jobs: int | None = None,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.max_features = max_features
        self.class_weight = class_weight
        self.threshold = threshold
        self.ignore_features = ignore_features
        self.random_state = random_state
        self.n_jobs = n_jobs

    def _make_estimator(self) -> RandomForestClassifier:
        return RandomForestClassifier(
            n_estimators=self.n_estimators,
            max_depth=self.max_depth,
            min_samples_leaf=self.min_samples_leaf,
            max_features=self.max_features,
            class_weight=self.class_weight,
            random_state=self.random_state,
            n_jobs=self.n_jobs,
        )

    @property
    def feature_importances_(self) -> np.ndarray:
        """Impurity-based importance of each input feature (sums to 1)."""
        check_is_fitted(self)
        return self.estimator_.feature_importances_


class LightGBMDetector(_SupervisedDetector):
    """Gradient-boosted trees (LightGBM) detector of abnormal operators.

    Parameters
    ----------
    n_estimators, learning_rate, num_leaves, max_depth, min_child_samples, subsample,
    colsample_bytree, reg_lambda, random_state, n_jobs:
        As in :class:`lightgbm.LGBMClassifier` (``subsample`` applies bagging every iteration).
    class_weight:
        ``"balanced"`` by default (abnormal ops are rare).
    threshold:
        Float in [0, 1] or ``"auto"`` (see :class:`RandomForestDetector`).
    ignore_features:
        Names of input columns the model must not see (only applies when ``X`` is a DataFrame
        with column names): e.g. absolute microsecond columns that do not transfer across
        scales. The input schema (``n_features_in_``) is unchanged.

    Examples
    --------
    >>> from sklearn.datasets import make_classification
    >>> X, y = make_classification(200, random_state=0)
    >>> det = LightGBMDetector(n_estimators=20, random_state=0).fit(X, y)
    >>> det.predict(X[:3]).shape
    (3,)
    """

    def __init__(
        self,
        n_estimators: int = 200,
        learning_rate: float = 0.1,
        num_leaves: int = 31,
        max_depth: int = -1,
        min_child_samples: int = 20,
        subsample: float = 1.0,
        colsample_bytree: float = 1.0,
        reg_lambda: float = 0.0,
        class_weight: str | dict | None = "balanced",
        threshold: float | str = 0.5,
        ignore_features: tuple[str, ...] | None = None,
        random_state: int | None = None,
        n_jobs: int | None = None,
    ) -> None:
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.num_leaves = num_leaves
        self.max_depth = max_depth
        self.min_child_samples = min_child_samples
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.reg_lambda = reg_lambda
        self.class_weight = class_weight
        self.threshold = threshold
        self.ignore_features = ignore_features
        self.random_state = random_state
        self.n_jobs = n_jobs

    def _make_estimator(self):
        try:
            from lightgbm import LGBMClassifier
        except ImportError as exc:  # pragma: no cover - lightgbm is a core dependency
            raise ImportError(
                "LightGBMDetector needs lightgbm: pip install 'lightgbm>=4.1'"
            ) from exc
        return LGBMClassifier(
            n_estimators=self.n_estimators,
            learning_rate=self.learning_rate,
            num_leaves=self.num_leaves,
            max_depth=self.max_depth,
            min_child_samples=self.min_child_samples,
            subsample=self.subsample,
            subsample_freq=1 if self.subsample < 1.0 else 0,
            colsample_bytree=self.colsample_bytree,
            reg_lambda=self.reg_lambda,
            class_weight=self.class_weight,
            random_state=self.random_state,
            n_jobs=1 if self.n_jobs is None else self.n_jobs,
            deterministic=self.random_state is not None,
            force_row_wise=True,
            verbose=-1,
        )

    def fit(self, X, y, groups=None, threshold_weights=None):
        """As :meth:`RandomForestDetector.fit`; the trees are also compiled for fast scoring
        (see :mod:`holmes_ml.models._compiled`): small models column-wise (``compiled_``),
        larger ones as flat arrays walked row by row (``row_trees_``)."""
        super().fit(X, y, groups=groups, threshold_weights=threshold_weights)
        self._compile()
        return self

    def _compile(self) -> None:
        from holmes_ml.models._compiled import CompiledTrees, RowTrees, parse_booster

        parsed = parse_booster(self.estimator_.booster_)  # (the booster's dump, read once)
        self.compiled_ = None if parsed is None else CompiledTrees.from_trees(*parsed)
        self.row_trees_ = (None if parsed is None or self.compiled_ is not None
                           else RowTrees.from_trees(*parsed))

    def __setstate__(self, state: dict) -> None:
        """A model saved before ``row_trees_`` existed gets its trees flattened on load (as
        its fit would now), so that it scores as fast as a new one."""
        super().__setstate__(state)
        if "estimator_" in self.__dict__ and "row_trees_" not in self.__dict__:
            if self.__dict__.get("compiled_") is not None:
                self.row_trees_ = None  # (compiled column-wise already: nothing to walk)
            else:
                self._compile()

    def _scores(self, X: np.ndarray) -> np.ndarray:
        """The same scores as ``predict_proba``, from the compiled trees (see :meth:`fit`), or
        from the booster where its splits cannot be reproduced: the scikit-learn wrapper
        re-validates the input and builds a two-column array the detector would throw away,
        and LightGBM's default thread pool costs more than it gains on a shared small machine
        (``n_jobs=None`` means one thread, as when fitting).
        """
        if len(X) == 0:
            return np.zeros(0, dtype=np.float64)
        fast = self._fast()
        if fast is not None:
            return fast.predict(X)
        booster = getattr(self.estimator_, "booster_", None)
        if booster is None:  # pragma: no cover - every fitted LGBMClassifier has one
            return self.estimator_.predict_proba(X)[:, 1].astype(np.float64)
        threads = 1 if self.n_jobs is None else int(self.n_jobs)
        return np.asarray(booster.predict(X, num_threads=threads), dtype=np.float64)

    def _fast(self):
        """The compiled trees: column-wise, else row-wise, else ``None`` (the booster)."""
        compiled = getattr(self, "compiled_", None)
        return compiled if compiled is not None else getattr(self, "row_trees_", None)

    def _scores_all_columns(self, X: np.ndarray) -> np.ndarray:
        """As the base class, but compiled trees read the used columns of ``X`` in place: for
        a screen over millions of rows, copying its columns would cost a fifth of scoring."""
        check_is_fitted(self)
        fast = self._fast()
        used = getattr(self, "used_features_", None)
        if fast is None or used is None or len(X) == 0:
            return super()._scores_all_columns(X)
        return fast.predict(X, columns=used)


class KNNDetector(_SupervisedDetector):
    """k-nearest-neighbours baseline (features standardized first).

    Parameters
    ----------
    n_neighbors, weights:
        As in :class:`sklearn.neighbors.KNeighborsClassifier`.
    threshold:
        Float in [0, 1] or ``"auto"``.
    """

    def __init__(
        self, n_neighbors: int = 15, weights: str = "distance", threshold: float | str = 0.5
    ) -> None:
        self.n_neighbors = n_neighbors
        self.weights = weights
        self.threshold = threshold

    def _make_estimator(self):
        return make_pipeline(
            StandardScaler(),
            KNeighborsClassifier(n_neighbors=self.n_neighbors, weights=self.weights),
        )


class _LinearSVMProba(ClassifierMixin, BaseEstimator):
    """Standardize, fit a linear SVM, and squash its margin into a probability-like score.

    Platt scaling (``SVC(probability=True)``) costs an internal 5-fold CV; a logistic squash
    of the margin keeps the ranking identical and is enough for a baseline.
    """

    def __init__(self, C: float = 1.0, class_weight="balanced", random_state=None) -> None:
        self.C = C
        self.class_weight = class_weight
        self.random_state = random_state

    def fit(self, X, y):
        self.scaler_ = StandardScaler().fit(X)
        self.svm_ = LinearSVC(
            C=self.C, class_weight=self.class_weight, random_state=self.random_state
        ).fit(self.scaler_.transform(X), y)
        self.classes_ = self.svm_.classes_
        return self

    def predict_proba(self, X):
        margin = self.svm_.decision_function(self.scaler_.transform(X))
        p = 1.0 / (1.0 + np.exp(-np.clip(margin, -50, 50)))
        return np.column_stack([1.0 - p, p])

    def predict(self, X):
        return self.classes_[(self.predict_proba(X)[:, 1] >= 0.5).astype(np.int64)]


class SVMDetector(_SupervisedDetector):
    """Linear support-vector-machine baseline (features standardized first).

    The score is the logistic function of the SVM margin, so the default threshold 0.5 is the
    SVM's own decision boundary.

    Parameters
    ----------
    C, class_weight, random_state:
        As in :class:`sklearn.svm.LinearSVC`.
    threshold:
        Float in [0, 1] or ``"auto"``.
    """

    def __init__(
        self,
        C: float = 1.0,
        class_weight: str | dict | None = "balanced",
        threshold: float | str = 0.5,
        random_state: int | None = None,
    ) -> None:
        self.C = C
        self.class_weight = class_weight
        self.threshold = threshold
        self.random_state = random_state

    def _make_estimator(self):
        return _LinearSVMProba(
            C=self.C, class_weight=self.class_weight, random_state=self.random_state
        )


class _UnsupervisedDetector(BaseEstimator):
    """Shared machinery of detectors that learn from unlabelled (mostly normal) operators."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = False
        return tags

    def predict(self, X) -> np.ndarray:
        """1 (abnormal) where the score reaches ``threshold_``, else 0."""
        return (self.decision_function(X) >= self.threshold_).astype(np.int64)

    def predict_proba(self, X) -> np.ndarray:
        """``[1 - score, score]`` per row (the score is not a calibrated probability)."""
        s = self.decision_function(X)
        return np.column_stack([1.0 - s, s])


class ThreeSigmaDetector(_UnsupervisedDetector):
    """The 3-sigma rule on one history feature: abnormal when ``z = (x - mean) / std > k``.

    Parameters
    ----------
    feature:
        Column to test: a name (when fitted on a DataFrame) or an integer position. Pick a
        feature that compares an op with its own history (e.g. duration over the rank's
        running median); ``None`` uses column 0.
    k:
        Number of standard deviations; the score maps ``z = k`` to exactly 0.5.

    Notes
    -----
    ``score = z / (z + k)`` for ``z > 0`` and 0 otherwise: monotone in ``z``, in [0, 1), and
    ``predict`` (``score >= threshold_ = 0.5``) is exactly the ``z >= k`` rule.
    """

    def __init__(self, feature: str | int | None = None, k: float = 3.0) -> None:
        self.feature = feature
        self.k = k

    def fit(self, X, y=None):
        """Learn the mean and standard deviation of the chosen feature; ``y`` is ignored."""
        if not (isinstance(self.k, numbers.Real) and self.k > 0):
            raise ValueError(f"ThreeSigmaDetector.k: got {self.k!r}; expected a number > 0")
        X = validate_data(self, X, dtype=np.float64)
        self.feature_index_ = self._resolve_feature()
        col = X[:, self.feature_index_]
        self.mean_ = float(col.mean())
        std = float(col.std())
        # A constant feature has std 0: any deviation is then infinitely many sigmas.
        self.std_ = std if std > 0 else 1e-12
        self.threshold_ = 0.5
        return self

    def _resolve_feature(self) -> int:
        f = self.feature
        if f is None:
            return 0
        if isinstance(f, str):
            names = list(getattr(self, "feature_names_in_", []))
            if f not in names:
                raise ValueError(
                    f"ThreeSigmaDetector.feature: got {f!r}; expected one of the fitted "
                    f"DataFrame's columns ({', '.join(names) or 'fit on a DataFrame'})"
                )
            return names.index(f)
        if isinstance(f, numbers.Integral) and 0 <= int(f) < self.n_features_in_:
            return int(f)
        raise ValueError(
            f"ThreeSigmaDetector.feature: got {f!r}; expected a column name or an index in "
            f"[0, {self.n_features_in_})"
        )

    def decision_function(self, X) -> np.ndarray:
        """``z / (z + k)`` with ``z`` the positive z-score of the feature (0 when below mean)."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64)
        z = np.maximum((X[:, self.feature_index_] - self.mean_) / self.std_, 0.0)
        return z / (z + float(self.k))


class IsolationForestDetector(_UnsupervisedDetector):
    """Isolation-forest baseline (unsupervised).

    Parameters
    ----------
    n_estimators, max_samples, random_state, n_jobs:
        As in :class:`sklearn.ensemble.IsolationForest`.
    contamination:
        Expected share of abnormal ops: ``threshold_`` is the ``1 - contamination`` quantile
        of the training scores.

    Notes
    -----
    The score is scikit-learn's anomaly score ``-score_samples`` (in (0, 1], about 0.5 for
    ordinary points and close to 1 for easily isolated ones).
    """

    def __init__(
        self,
        n_estimators: int = 100,
        max_samples: int | float | str = "auto",
        contamination: float = 0.05,
        random_state: int | None = None,
        n_jobs: int | None = None,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_samples = max_samples
        self.contamination = contamination
        self.random_state = random_state
        self.n_jobs = n_jobs

    def fit(self, X, y=None):
        """Grow the isolation forest on ``X``; ``y`` is ignored."""
        if not (isinstance(self.contamination, numbers.Real) and 0 < self.contamination < 0.5):
            raise ValueError(
                f"IsolationForestDetector.contamination: got {self.contamination!r}; "
                "expected a float in (0, 0.5)"
            )
        X = validate_data(self, X, dtype=np.float64)
        self.estimator_ = IsolationForest(
            n_estimators=self.n_estimators,
            max_samples=self.max_samples,
            random_state=self.random_state,
            n_jobs=self.n_jobs,
        ).fit(X)
        train = -self.estimator_.score_samples(X)
        self.threshold_ = float(np.quantile(train, 1.0 - self.contamination))
        return self

    def decision_function(self, X) -> np.ndarray:
        """Anomaly score in (0, 1] (higher = easier to isolate = more abnormal)."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64)
        return np.clip(-self.estimator_.score_samples(X), 0.0, 1.0)
