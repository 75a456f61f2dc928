"""Drift handling: rescale time features instead of retraining (the Holmes threshold shift).

A forest splits microsecond-valued features at fixed thresholds. When the whole job drifts
slower or faster (thermal throttling, data-dependent work), every such threshold should move by the
same factor. Dividing the time features of the current window by the estimated factor is the
same as multiplying every split threshold on them by it, and needs no retraining.
"""

from __future__ import annotations

import logging
import numbers
from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, clone
from sklearn.utils.validation import check_is_fitted

from holmes_ml.features import TIME_FEATURES
from holmes_ml.models.detectors import BinaryDetectorMixin

logger = logging.getLogger(__name__)

__all__ = ["DriftAdjuster", "DriftAwareDetector"]


def _frame(X: Any, columns: Any) -> pd.DataFrame:
    if isinstance(X, pd.DataFrame):
        return X
    return pd.DataFrame(np.asarray(X, dtype=np.float64), columns=columns)


class DriftAdjuster:
    """Estimate the scale of time features between a reference and a window, and undo it.

    Parameters
    ----------
    time_features:
        Columns measured in time (default :data:`holmes_ml.features.TIME_FEATURES`).
    anchor:
        Column whose median ratio gives the scale (default ``"hist_median_us"``: an op's own
        recent history, which moves with drift but not with a single slow op).
    normal_quantile:
        Only ops whose ``hist_ratio`` (duration over own history) is below this quantile count
        as normal-looking when taking medians.

    Examples
    --------
    >>> ref = pd.DataFrame({"hist_median_us": [10.0, 20, 30], "duration_us": [10.0, 20, 30]})
    >>> adj = DriftAdjuster(time_features=("hist_median_us", "duration_us")).fit(ref)
    >>> round(adj.estimate(ref * 1.5), 3)
    1.5
    """

    def __init__(
        self,
        time_features: tuple[str, ...] = TIME_FEATURES,
        anchor: str = "hist_median_us",
        normal_quantile: float = 0.9,
    ) -> None:
        self.time_features = tuple(time_features)
        self.anchor = anchor
        self.normal_quantile = normal_quantile

    def _key(self, F: pd.DataFrame) -> pd.Series:
        if self.anchor not in F.columns:
            raise KeyError(
                f"DriftAdjuster.anchor: column {self.anchor!r} not in features "
                f"(have {list(F.columns)[:8]}...)"
            )
        v = F[self.anchor].astype(np.float64)
        if "hist_ratio" in F.columns:
            r = F["hist_ratio"].to_numpy(dtype=np.float64)
            cut = np.nanquantile(r, self.normal_quantile) if np.isfinite(r).any() else np.inf
            v = v[~(r > cut)]
        return v[np.isfinite(v) & (v > 0)]

    def fit(self, F_ref: pd.DataFrame) -> DriftAdjuster:
        """Record the reference log-median of the anchor column on normal-looking ops."""
        v = self._key(F_ref)
        if v.empty:
            raise ValueError(f"DriftAdjuster.fit: no positive {self.anchor!r} values in reference")
        self.ref_log_median_ = float(np.median(np.log(v)))
        return self

    def estimate(self, F: pd.DataFrame) -> float:
        """Scale factor of the window ``F`` relative to the reference (1.0 = no drift)."""
        v = self._key(F)
        if v.empty:
            return 1.0
        return float(np.exp(np.median(np.log(v)) - self.ref_log_median_))

    def transform(self, F: pd.DataFrame, scale: float) -> pd.DataFrame:
        """``F`` with its time features divided by ``scale``."""
        cols = [c for c in self.time_features if c in F.columns]
        out = F.copy()
        out[cols] = out[cols].to_numpy(dtype=np.float64) / scale
        return out


class DriftAwareDetector(BinaryDetectorMixin, BaseEstimator):
    """Wrap a detector so each scored window is rescaled to the training time scale first.

    Parameters
    ----------
    estimator:
        A detector (default :class:`~holmes_ml.models.RandomForestDetector`).
    adjust:
        When False, behaves exactly like ``estimator`` (the "untuned" arm of the drift bench).
    anchor:
        See :class:`DriftAdjuster`.

    Attributes
    ----------
    estimator_, adjuster_, threshold_, classes_, feature_names_in_
    last_scale_ : float
        Scale estimated for the last scored window.
    """

    def __init__(self, estimator: Any = None, adjust: bool = True,
                 anchor: str = "hist_median_us") -> None:
        self.estimator = estimator
        self.adjust = adjust
        self.anchor = anchor

    def fit(self, X, y):
        """Fit the wrapped detector and the reference time scale on ``X`` (a feature DataFrame)."""
        from holmes_ml.features import FEATURE_COLUMNS
        from holmes_ml.models.detectors import RandomForestDetector

        if not isinstance(self.adjust, bool | np.bool_ | numbers.Integral):
            raise ValueError(f"DriftAwareDetector.adjust: got {self.adjust!r}; expected a bool")
        cols = list(X.columns) if isinstance(X, pd.DataFrame) else list(FEATURE_COLUMNS)
        F = _frame(X, cols)
        self.feature_names_in_ = np.asarray(cols, dtype=object)
        self.n_features_in_ = len(cols)
        base = self.estimator if self.estimator is not None else RandomForestDetector(
            n_estimators=50, max_depth=16, random_state=0)
        self.estimator_ = clone(base).fit(F, y)
        self.classes_ = self.estimator_.classes_
        self.threshold_ = self.estimator_.threshold_
        self.adjuster_ = DriftAdjuster(anchor=self.anchor).fit(F)
        self.last_scale_ = 1.0
        return self

    def rescale(self, X) -> pd.DataFrame:
        """``X`` with its time features divided by the window's estimated drift scale."""
        check_is_fitted(self)
        F = _frame(X, list(self.feature_names_in_))
        if not self.adjust:
            self.last_scale_ = 1.0
            return F
        self.last_scale_ = self.adjuster_.estimate(F)
        logger.debug("drift scale %.4f", self.last_scale_)
        return self.adjuster_.transform(F, self.last_scale_)

    def decision_function(self, X) -> np.ndarray:
        """P(abnormal) of the rescaled window."""
        return self.estimator_.decision_function(self.rescale(X))
