"""An optuna-tuned detector that is itself a scikit-learn estimator.

:class:`TunedDetector` searches the hyper-parameters of a random-forest or LightGBM detector by
maximizing out-of-fold F1, then refits the best configuration on all data (no trial asks a leaf for
more than a tenth of a training fold's rows, or the range's lowest where that is more: on small
data such trees cannot split). With ``storage`` set to an optuna RDB URL (``sqlite:///study.db``)
several processes can tune the same named study.

A fitted detector keeps what the study found (best parameters and F1, the number of finished
trials, the study's name), not the study itself: a pickled or saved one needs no storage and opens
none when loaded, and it keeps the storage URL only with its password masked.
"""

from __future__ import annotations

import logging
import numbers
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold, cross_val_predict
from sklearn.utils.validation import check_is_fitted, validate_data

from holmes_ml.models.detectors import (
    BinaryDetectorMixin,
    LightGBMDetector,
    RandomForestDetector,
    best_f1_threshold,
    check_abnormal_class,
)
from holmes_ml.models.persist import data_hash

logger = logging.getLogger(__name__)

__all__ = ["TunedDetector"]

_ESTIMATORS = ("rf", "lgbm")


def storage_label(storage: Any) -> str:
    """An optuna storage URL as it may be shown: its password masked."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(str(storage)).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL (an optuna storage object): say what it is
        return type(storage).__name__


#: The most rows a leaf may be asked to hold, as a share of the smallest training fold.
_LEAF_SHARE = 0.1


def _suggest(trial: Any, kind: str, rows: int) -> dict[str, Any]:
    """One trial's configuration. ``rows`` (the smallest training fold) bounds the rows a leaf
    must hold to a tenth of it (or the range's lowest, 5 for LightGBM and 1 for a forest, on
    folds too small for that): on a few hundred rows, LightGBM asked for 70 or more a leaf
    cannot split at all and scores every row alike (a wasted trial)."""
    most = int(rows * _LEAF_SHARE)
    if kind == "rf":
        return {
            "n_estimators": trial.suggest_int("n_estimators", 20, 120, step=20),
            "max_depth": trial.suggest_int("max_depth", 6, 20),
            "min_samples_leaf": trial.suggest_int("min_samples_leaf", 1,
                                                  max(1, min(20, most)), log=True),
            "max_features": trial.suggest_float("max_features", 0.2, 0.8),
        }
    return {
        "n_estimators": trial.suggest_int("n_estimators", 50, 300, step=50),
        "learning_rate": trial.suggest_float("learning_rate", 0.02, 0.3, log=True),
        "num_leaves": trial.suggest_int("num_leaves", 8, 63, log=True),
        "min_child_samples": trial.suggest_int("min_child_samples", 5, max(5, min(100, most)),
                                               log=True),
        "colsample_bytree": trial.suggest_float("colsample_bytree", 0.4, 1.0),
        "reg_lambda": trial.suggest_float("reg_lambda", 1e-3, 10.0, log=True),
    }


def _base(kind: str, random_state: Any, params: dict[str, Any]) -> Any:
    cls = RandomForestDetector if kind == "rf" else LightGBMDetector
    return cls(random_state=random_state, **params)


class _Objective:
    """Out-of-fold F1 of one trial's configuration (at its own best threshold), recorded with
    the fingerprint of the data it was scored on (``data``)."""

    def __init__(self, kind: str, X: np.ndarray, y: np.ndarray,
                 cv: list[tuple[np.ndarray, np.ndarray]], random_state: Any, data: str,
                 weights: np.ndarray | None = None):
        # every trial scores on the same folds (_folds), and their size bounds its leaves
        self.cv = cv
        self.kind, self.X, self.y, self.random_state = kind, X, y, random_state
        self.data = data
        self.w = np.ones(len(y)) if weights is None else weights
        self.rows = min(len(train) for train, _ in self.cv)

    def __call__(self, trial: Any) -> float:
        det = _base(self.kind, self.random_state, _suggest(trial, self.kind, self.rows))
        est = det._make_estimator()
        oof = cross_val_predict(est, self.X, self.y, cv=self.cv, method="predict_proba")[:, 1]
        cut = best_f1_threshold(self.y, oof, self.w)
        pred, abnormal = oof >= cut, self.y == 1
        tp = float(self.w[pred & abnormal].sum())
        f1 = 2 * tp / max(float(self.w[pred].sum() + self.w[abnormal].sum()), 1e-12)
        trial.set_user_attr("threshold", cut)
        trial.set_user_attr("data", self.data)
        return f1


#: Fewest runs for folds that leave runs out (as the detectors' threshold picking).
_MIN_GROUPS = 5


def _per_row(values: Any, y: np.ndarray, name: str = "groups") -> np.ndarray:
    """``values`` (one per row) as an array, or a ValueError naming ``name``."""
    g = np.asarray(values)
    if len(g) != len(y):
        raise ValueError(f"{name}: got {len(g)} values; expected one per row of X ({len(y)})")
    return g


def _folds(y01: np.ndarray, groups: np.ndarray | None, cv: int
           ) -> list[tuple[np.ndarray, np.ndarray]]:
    """The trials' folds, drawn once as (train, test) row indices: whole runs left out when
    ``groups`` names enough runs and every training fold keeps an abnormal and a normal op;
    otherwise stratified over rows."""
    rows = np.zeros(len(y01))
    if groups is not None and len(np.unique(groups)) >= _MIN_GROUPS:
        grouped = list(StratifiedGroupKFold(cv, shuffle=True, random_state=0).split(
            rows, y01, groups))
        if all(len(np.unique(y01[train])) == 2 for train, _ in grouped):
            return grouped
    return list(StratifiedKFold(cv, shuffle=True, random_state=0).split(rows, y01))


class TunedDetector(BinaryDetectorMixin, BaseEstimator):
    """Random-forest or LightGBM detector with optuna-tuned hyper-parameters.

    Parameters
    ----------
    estimator:
        ``"rf"`` or ``"lgbm"``.
    n_trials:
        Trials this ``fit`` runs (added to any already in a shared study).
    storage:
        ``None`` (in memory) or an optuna RDB URL such as ``"sqlite:///study.db"``.
    study_name:
        Name of the study in ``storage`` (created if missing, joined if present).
    cv:
        Folds of the out-of-fold F1 each trial maximizes.
    max_tune_samples:
        Trials see a stratified subsample of at most this many rows (the refit uses all rows).
    timeout:
        Seconds after which no new trial starts (``None`` = no limit).
    progress:
        Show a bar over the trials.
    random_state:
        Seeds the subsample, the estimators and, without ``storage``, the sampler (with one,
        each process draws its own sampler seed: processes sharing a study would otherwise
        propose the same configurations; so with a storage, tuning is not reproducible from
        ``random_state``).

    A shared study may hold trials that other fits scored on other data (a study name used
    again for a new dataset): the choice takes only the trials scored on this ``fit``'s data
    (by a fingerprint of it, recorded with each trial), and a warning says how many others
    were left out.

    Attributes
    ----------
    best_params_ : dict
    best_score_ : float
        The best trial's out-of-fold F1 (NaN when no trial finished).
    n_trials_ : int
        Trials scored on this ``fit``'s data in the study when it ended (those of other
        processes tuning the same data in it included).
    study_name_ : str
        The study's name in ``storage`` (optuna's generated one when ``study_name`` is None).
    best_estimator_ : RandomForestDetector | LightGBMDetector
        Refit on all data with the best parameters.
    threshold_ : float
        The best trial's out-of-fold F1-optimal threshold.

    Examples
    --------
    >>> from sklearn.datasets import make_classification
    >>> X, y = make_classification(300, random_state=0)
    >>> det = TunedDetector("lgbm", n_trials=2, random_state=0).fit(X, y)
    >>> sorted(det.best_params_)[:2]
    ['colsample_bytree', 'learning_rate']
    """

    def __init__(
        self,
        estimator: str = "lgbm",
        n_trials: int = 20,
        storage: str | None = None,
        study_name: str | None = None,
        cv: int = 3,
        max_tune_samples: int = 100_000,
        timeout: float | None = None,
        random_state: int | None = None,
        progress: bool = False,
    ) -> None:
        self.estimator = estimator
        self.n_trials = n_trials
        self.storage = storage
        self.study_name = study_name
        self.cv = cv
        self.max_tune_samples = max_tune_samples
        self.timeout = timeout
        self.random_state = random_state
        self.progress = progress

    def fit(self, X, y, groups=None, threshold_weights=None):
        """Run the study on ``(X, y)``, then refit the best configuration on all rows.

        ``threshold_weights`` (how many ops each row stands for, as the detectors take them)
        weigh each trial's F1 and its threshold, so that they are those of the runs the rows
        were sampled from.

        ``groups`` (a run id per row), when it names at least 5 runs, makes each trial's
        folds leave whole runs out: rows of one run are alike (the same fault, the same
        job), and folds that split them score a configuration on near-copies of its training
        rows, above what it reaches on other jobs. Without it, or with fewer runs (or where a
        fold would train without an abnormal op), the folds are stratified over rows.
        """
        import optuna

        if self.estimator not in _ESTIMATORS:
            raise ValueError(
                f"TunedDetector.estimator: got {self.estimator!r}; expected one of {_ESTIMATORS}"
            )
        if not isinstance(self.n_trials, numbers.Integral) or self.n_trials < 0:
            raise ValueError(f"TunedDetector.n_trials: got {self.n_trials!r}; expected an int >= 0")
        if not isinstance(self.cv, numbers.Integral) or self.cv < 2:
            raise ValueError(f"TunedDetector.cv: got {self.cv!r}; expected an int >= 2")
        Xa, ya = validate_data(self, X, y, dtype=np.float64)
        classes = np.unique(ya)
        if len(classes) != 2:
            raise ValueError(
                f"TunedDetector.fit: y has classes {classes.tolist()}; expected exactly two "
                "(normal, abnormal)"
            )
        check_abnormal_class(classes, "TunedDetector.fit")
        self.classes_ = classes
        y01 = (ya == classes[1]).astype(np.int64)
        runs = None if groups is None else _per_row(groups, ya)
        weights = None if threshold_weights is None else _per_row(
            threshold_weights, ya, "threshold_weights").astype(np.float64)
        rng = np.random.default_rng(self.random_state)
        idx = np.arange(len(y01))
        if len(idx) > self.max_tune_samples:
            # Stratified: keep every class in proportion.
            keep = []
            for c in (0, 1):
                ci = idx[y01 == c]
                n = max(1, int(round(self.max_tune_samples * len(ci) / len(idx))))
                keep.append(rng.choice(ci, size=min(n, len(ci)), replace=False))
            idx = np.sort(np.concatenate(keep))
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        # Processes sharing a study, seeded alike, would propose the same configurations one
        # after the other: with a storage the sampler draws its own seed.
        sampler = optuna.samplers.TPESampler(
            seed=self.random_state if self.storage is None else None)
        # A local, not an attribute: a pickled study carries its storage, and unpickling one
        # opens it (creating an empty sqlite file, relative to wherever the model is loaded).
        study = optuna.create_study(
            storage=self.storage,
            study_name=self.study_name,
            direction="maximize",
            sampler=sampler,
            load_if_exists=True,
        )
        tunes = study.user_attrs.get("estimator")
        if tunes is None:
            study.set_user_attr("estimator", self.estimator)
        elif tunes != self.estimator:
            raise ValueError(
                f"TunedDetector: study {study.study_name!r} in "
                f"{storage_label(self.storage)} tunes {tunes!r}, not {self.estimator!r} (their "
                "parameters differ); expected "
                "another study name for this estimator")
        data = data_hash(Xa, y01)[:16]  # the whole data: alike in every process tuning it
        cv = int(min(self.cv, np.bincount(y01[idx]).min()))
        if cv >= 2 and self.n_trials > 0:
            folds = _folds(y01[idx], None if runs is None else runs[idx], cv)
            objective = _Objective(self.estimator, Xa[idx], y01[idx], folds, self.random_state,
                                   data, None if weights is None else weights[idx])
            from tqdm.auto import tqdm

            with tqdm(total=int(self.n_trials), desc=f"tuning {self.estimator}", unit="trial",
                      disable=not self.progress) as bar:
                study.optimize(objective, n_trials=int(self.n_trials),
                               timeout=self.timeout,
                               callbacks=[lambda _study, _trial: bar.update()])
        self.study_name_ = study.study_name
        scored = [t for t in study.trials if t.value is not None]
        done = [t for t in scored if t.user_attrs.get("data") == data]
        if len(done) < len(scored):
            logger.warning(
                "study %r in %s holds %d trial(s) scored on other data: left out of the choice "
                "(their F1 and threshold are another dataset's; a new study name keeps "
                "datasets apart)", study.study_name, storage_label(self.storage),
                len(scored) - len(done))
        self.n_trials_ = len(done)
        if done:
            best = max(done, key=lambda t: float(t.value))
            self.best_params_ = dict(best.params)
            self.best_score_ = float(best.value)
            self.threshold_ = float(best.user_attrs.get("threshold", 0.5))
        else:
            self.best_params_, self.best_score_, self.threshold_ = {}, float("nan"), 0.5
        self._fit_chosen(Xa, y01)
        logger.info("tuned %s: best F1 %.4f with %s", self.estimator, self.best_score_,
                    self.best_params_)
        return self

    def __getstate__(self) -> dict[str, Any]:
        """The state to pickle: a fitted detector's ``storage`` with its password masked.

        A fitted detector is saved to files that travel (model envelopes); its ``fit`` is done
        and :meth:`refit` needs no storage. An unfitted one keeps the URL as given, so a clone
        sent to a worker process can still open the study.
        """
        state = super().__getstate__()
        storage = state.get("storage")
        if "best_estimator_" in state and storage is not None:
            # an optuna storage object: its URL (a masked URL is no use to it anyway)
            state = {**state, "storage": storage_label(getattr(storage, "url", storage))}
        return state

    def refit(self, X, y):
        """Fit the configuration :meth:`fit` chose (``best_params_``, ``threshold_``) again on
        ``(X, y)``, without tuning: the study and the choice stay as they are."""
        check_is_fitted(self)
        Xa, ya = validate_data(self, X, y, dtype=np.float64)
        classes = np.unique(ya)
        if len(classes) != 2:
            raise ValueError(f"TunedDetector.refit: y has classes {classes.tolist()}; expected "
                             "exactly two (normal, abnormal)")
        check_abnormal_class(classes, "TunedDetector.refit")
        self.classes_ = classes
        return self._fit_chosen(Xa, (ya == classes[1]).astype(np.int64))

    def _fit_chosen(self, X: np.ndarray, y01: np.ndarray) -> TunedDetector:
        """Fit ``best_params_`` and ``threshold_`` on every row as ``best_estimator_``."""
        self.best_estimator_ = _base(
            self.estimator, self.random_state, {**self.best_params_, "threshold": self.threshold_}
        ).fit(X, y01)
        return self

    def decision_function(self, X) -> np.ndarray:
        """P(abnormal) from the refit best estimator."""
        check_is_fitted(self)
        Xa = validate_data(self, X, reset=False, dtype=np.float64)
        return self.best_estimator_.decision_function(Xa)
