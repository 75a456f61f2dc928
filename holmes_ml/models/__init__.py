"""Abnormal-operator detectors, tuning, drift handling and the saved-model envelope."""

from holmes_ml.models.detectors import (
    IsolationForestDetector,
    KNNDetector,
    LightGBMDetector,
    RandomForestDetector,
    SVMDetector,
    ThreeSigmaDetector,
    best_f1_threshold,
)
from holmes_ml.models.drift import DriftAdjuster, DriftAwareDetector
from holmes_ml.models.persist import ModelFileError, load_model, read_header, save_model
from holmes_ml.models.score import default_model, score_features, score_ops
from holmes_ml.models.screen import ScreenedDetector
from holmes_ml.models.tuner import TunedDetector

__all__ = [
    "DriftAdjuster",
    "DriftAwareDetector",
    "IsolationForestDetector",
    "KNNDetector",
    "LightGBMDetector",
    "ModelFileError",
    "RandomForestDetector",
    "SVMDetector",
    "ScreenedDetector",
    "ThreeSigmaDetector",
    "TunedDetector",
    "best_f1_threshold",
    "default_model",
    "load_model",
    "read_header",
    "save_model",
    "score_features",
    "score_ops",
]
