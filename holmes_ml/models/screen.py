"""A detector behind a cheap screen: full accuracy at the price of a small model.

Almost every operator of a training job is normal, and a detector large enough to be accurate
(a hundred LightGBM trees of 31 leaves) spends nearly all its time confirming that. A
:class:`ScreenedDetector` first scores every row with a *screen*, a few shallow trees trained to
imitate the detector's own decisions (small enough to be evaluated column-wise with numpy, see
:mod:`holmes_ml.models._compiled`), and hands the detector only the rows the screen cannot rule
out. The screen's cut is set on the training rows so that it keeps ``keep`` of the rows the
detector flags; ``holmes bench features`` times the pair and ``holmes bench detector`` scores it.

Scores stay in [0, 1] and keep one threshold: a row the detector scores keeps the detector's
score; a row the screen rules out keeps the screen's score (the screen's estimate that the
detector would flag it, below the screen's cut), scaled down if the cut lies above
``threshold_``, so it stays below every flagged row and keeps its order among the other
ruled-out rows.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, clone
from sklearn.utils.validation import check_is_fitted, validate_data

from holmes_ml.models.detectors import (
    BinaryDetectorMixin,
    LightGBMDetector,
    _SupervisedDetector,
)

logger = logging.getLogger(__name__)

__all__ = ["ScreenedDetector", "default_screen"]


def default_screen(random_state: int | None = 0) -> LightGBMDetector:
    """30 LightGBM trees of depth 3: about 90 comparisons per row, compiled to numpy.

    The screen ignores the scale-dependent columns
    (:data:`~holmes_ml.models.training.SCALE_DEPENDENT`, by name) whatever its detector sees:
    it is cut on training rows, and on runs of other sizes a screen that had split on absolute
    microseconds ruled out 6-15 % of the rows its detector flags, where the scale-free one
    ruled out under 1 % (``tests/test_models_screen.py``).
    """
    from holmes_ml.models.training import SCALE_DEPENDENT

    return LightGBMDetector(n_estimators=30, num_leaves=7, max_depth=3, learning_rate=0.27,
                            colsample_bytree=0.8, class_weight="balanced", threshold=0.5,
                            ignore_features=SCALE_DEPENDENT, random_state=random_state)


#: Folds of whole runs whose out-of-fold screen scores set the screen's cut.
SCREEN_FOLDS = 4


def _out_of_fold(screen: Any, X, flagged: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Each row's score from a clone of ``screen`` fitted on the other folds' runs (two runs
    or more; the fitted ``screen``'s own score stands in where a fold's rest holds only
    flagged or only unflagged rows)."""
    from sklearn.model_selection import GroupKFold
    from sklearn.utils import _safe_indexing

    folds = min(SCREEN_FOLDS, len(np.unique(groups)))
    out = np.full(len(flagged), np.nan)
    for rest, fold in GroupKFold(n_splits=folds).split(flagged, flagged, groups):
        if flagged[rest].all() or not flagged[rest].any():
            continue
        part = clone(screen).fit(_safe_indexing(X, rest), flagged[rest])
        out[fold] = part.decision_function(_safe_indexing(X, fold))
    missing = np.isnan(out)
    if missing.any():
        out[missing] = screen.decision_function(_safe_indexing(X, np.flatnonzero(missing)))
    return out


class ScreenedDetector(BinaryDetectorMixin, BaseEstimator):
    """``detector`` scoring only the rows that a small ``screen`` cannot rule out.

    Parameters
    ----------
    detector:
        A supervised detector of :mod:`holmes_ml.models.detectors` (unfitted; it is cloned).
        ``None`` uses a 100-tree LightGBM detector with an ``"auto"`` threshold.
    screen:
        The screen (unfitted LightGBM or random-forest detector); ``None`` uses
        :func:`default_screen`. It is trained on the detector's own training-set decisions.
    keep:
        Share of the detector's flagged training rows the screen must pass, in (0, 1]. The cut
        is the screen score below which only ``1 - keep`` of them fall. Given ``groups`` (two
        runs or more), those scores are out of fold: each run's rows scored by a screen fitted
        without that run (:data:`SCREEN_FOLDS` folds of whole runs), so the cut holds on runs
        the screen never saw. A screen's scores on its own training rows sit higher: a cut set
        on them ruled out 9 % of the detector's flags on unseen runs after training on the 8
        runs of ``tests/test_models_screen.py``, 1-17 % after 16 runs of other seeds. Without
        ``groups`` the cut is set on the screen's own training rows; ``fit`` warns when given
        fewer than 5 runs.

    Attributes
    ----------
    detector_, screen_:
        The fitted detector and screen (``screen_`` is ``None`` when the detector flagged no
        training row or every one: then there is nothing to imitate and all rows are scored).
    screen_cut_:
        Screen score from which a row goes to the detector.
    pass_rate_:
        Share of the training rows the screen passes (the detector's share of the work).
    threshold_, classes_:
        The detector's.

    Examples
    --------
    >>> from sklearn.datasets import make_classification
    >>> X, y = make_classification(400, weights=[0.9], random_state=0)
    >>> det = ScreenedDetector(LightGBMDetector(n_estimators=20, random_state=0)).fit(X, y)
    >>> bool((det.predict(X) == det.detector_.predict(X)).mean() > 0.99)
    True
    """

    def __init__(self, detector: Any = None, screen: Any = None, keep: float = 0.999) -> None:
        self.detector = detector
        self.screen = screen
        self.keep = keep

    def fit(self, X, y, groups=None, threshold_weights=None):
        """Fit the detector on ``(X, y)``, then the screen on the detector's decisions.

        ``groups`` (run id per row) and ``threshold_weights`` are passed to the detector (see
        :meth:`~holmes_ml.models.RandomForestDetector.fit`).
        """
        if not (isinstance(self.keep, (int, float)) and 0.0 < self.keep <= 1.0):
            raise ValueError(f"keep: got {self.keep!r}; expected a number in (0, 1]")
        validate_data(self, X, y, dtype=np.float64)  # names, n_features_in_, shapes
        det = self.detector if self.detector is not None else LightGBMDetector(
            n_estimators=100, threshold="auto", random_state=0)
        if not isinstance(det, _SupervisedDetector):
            raise TypeError(f"detector: got {type(det).__name__}; expected a supervised "
                            "detector of holmes_ml.models (LightGBMDetector, "
                            "RandomForestDetector, ...)")
        self.detector_ = clone(det).fit(X, y, groups=groups, threshold_weights=threshold_weights)
        self.classes_ = self.detector_.classes_
        self.threshold_ = float(self.detector_.threshold_)
        flagged = self.detector_.decision_function(X) >= self.threshold_
        self.screen_, self.screen_cut_, self.pass_rate_ = None, 0.0, 1.0
        if flagged.all() or not flagged.any():
            logger.info("screen skipped: the detector flags %s training rows",
                        "all" if flagged.any() else "no")
            return self
        runs = None if groups is None else np.asarray(groups)
        n_runs = 0 if runs is None else len(np.unique(runs))  # 0: not told
        if 0 < n_runs < 5:
            logger.warning("screen: cut on %d runs; with so few, it may rule out more of the "
                           "detector's flags on other runs than on these (train on more runs, "
                           "or use the unscreened detector)", n_runs)
        screen = clone(self.screen if self.screen is not None else default_screen())
        self.screen_ = screen.fit(X, flagged)
        s = self.screen_.decision_function(X)
        held = s if n_runs < 2 else _out_of_fold(screen, X, flagged, runs)
        self.screen_cut_ = float(np.quantile(held[flagged], 1.0 - self.keep, method="lower"))
        self.pass_rate_ = float(np.mean(s >= self.screen_cut_))
        logger.info("screen: cut %.4g (%s) keeps %.4f of flagged rows, passes %.4f of all rows",
                    self.screen_cut_, "in sample" if held is s else "out of fold",
                    float(np.mean(s[flagged] >= self.screen_cut_)), self.pass_rate_)
        return self

    def _screen_scores(self, X) -> tuple[np.ndarray, np.ndarray | None]:
        """``X`` validated, and the screen's score per row (``None`` without a screen)."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=(np.float64, np.float32))
        return X, None if self.screen_ is None else self.screen_._scores_all_columns(X)

    def passes(self, X) -> np.ndarray:
        """Which rows the screen hands to the detector (all of them without a screen)."""
        X, s = self._screen_scores(X)
        return np.ones(len(X), dtype=bool) if s is None else s >= self.screen_cut_

    def decision_function(self, X) -> np.ndarray:
        """Abnormality score in [0, 1] per row (see the module docstring)."""
        X, s = self._screen_scores(X)
        if s is None:
            return self.detector_._scores_all_columns(X)
        passed = s >= self.screen_cut_
        # Ruled-out rows keep the screen's own score, shrunk if need be below threshold_.
        out = s * (min(1.0, self.threshold_ / max(self.screen_cut_, 1e-300)) * (1.0 - 1e-9))
        if passed.any():
            rows = np.flatnonzero(passed)  # (row numbers gather faster than a mask)
            out[rows] = self.detector_._scores_all_columns(X[rows])
        return out
