"""The shipped default detector and per-op scoring of a CommOps table."""

from __future__ import annotations

import copy
import functools
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import sklearn

from holmes_ml.models.persist import ModelFileError, load_model

__all__ = ["DEFAULT_MODEL", "default_model", "score_features", "score_ops"]

#: File name of the shipped model inside ``holmes_ml/data``.
DEFAULT_MODEL = "default-model.holmes"


@functools.lru_cache(maxsize=1)
def _shared_default_model() -> Any:
    """The bundled detector, loaded once and shared by the scoring paths of this package, which
    only read it; never handed to callers (see :func:`default_model`)."""
    ref = resources.files("holmes_ml") / "data" / DEFAULT_MODEL
    if not ref.is_file():
        raise ModelFileError(
            f"{ref}: default model missing; build it with "
            "`holmes train --preset default --out holmes_ml/data/default-model.holmes`"
        )
    with resources.as_file(ref) as path:
        return load_model(path)


def default_model() -> Any:
    """The detector shipped in ``holmes_ml/data/default-model.holmes``: a copy of its own.

    The file is read once per process; each call returns a fresh deep copy (some 5 ms), so
    that ``default_model().set_params(...).fit(...)`` changes that copy only, not what later
    calls and :func:`score_ops` (``model=None``) use.
    """
    return copy.deepcopy(_shared_default_model())


def score_ops(
    ops: pd.DataFrame, model: Any = None, features: pd.DataFrame | None = None
) -> np.ndarray:
    """P(abnormal) of every op, aligned with the rows of ``ops``.

    Parameters
    ----------
    ops:
        Canonical CommOps table.
    model:
        A fitted detector whose ``decision_function`` is P(abnormal) in [0, 1] (those of
        :mod:`holmes_ml.models`), or a model file's path (``str`` or ``Path``: loaded with
        :func:`load_model`, as ``analyze`` takes it); ``None`` uses :func:`default_model`.
    features:
        Precomputed :func:`holmes_ml.features.build_features` of ``ops`` (same row order):
        the model's input check searches them for NaN and infinity, which features built here
        are free of by construction (see :func:`score_features`).

    Returns
    -------
    numpy.ndarray
        float64 scores in [0, 1], one per row of ``ops``.

    Raises
    ------
    ValueError
        ``model`` gave a score outside [0, 1] (or NaN): it is no holmes_ml detector.
    """
    from holmes_ml.features import build_features

    if model is None:
        model = _shared_default_model()
    elif isinstance(model, (str, Path)):
        model = load_model(model)
    elif not hasattr(model, "decision_function"):
        raise TypeError(f"model: got a {type(model).__name__}; expected a fitted holmes_ml "
                        "detector, a model file's path or None (the bundled model)")
    built = features is None
    if features is None:
        features = build_features(ops)
    if len(features) != len(ops):
        raise ValueError(
            f"score_ops: features has {len(features)} rows; expected {len(ops)} (one per op)"
        )
    return score_features(features, model, finite=built)


def score_features(features: pd.DataFrame, model: Any, finite: bool = False) -> np.ndarray:
    """:func:`score_ops`' scoring of a feature table: ``model``'s P(abnormal) per row.

    ``finite=True`` says the features are known to be finite, as
    :func:`~holmes_ml.features.build_features` makes them: the model's input check then skips
    the pass over every value that looks for NaN and infinity (scikit-learn's
    ``assume_finite``), some 0.05 s for two million ops. Features from elsewhere keep it.
    """
    from holmes_ml.features import FEATURE_COLUMNS

    if len(features) == 0:
        return np.zeros(0, dtype=np.float64)
    F = features.loc[:, list(FEATURE_COLUMNS)]
    with sklearn.config_context(assume_finite=finite):
        scores = np.asarray(model.decision_function(F), dtype=np.float64)
    # A model of another kind (a LogisticRegression's margins) would be thresholded as if its
    # scores were probabilities: refused rather than read.
    low, high = float(np.min(scores)), float(np.max(scores))
    if not (0.0 <= low and high <= 1.0):
        raise ValueError(
            f"score_ops: model {type(model).__name__} scored ops from {low:.4g} to {high:.4g}; "
            "expected P(abnormal) in [0, 1], as holmes_ml.models' detectors give"
        )
    return scores
