"""Per-operator features and the iteration monitor.

* :func:`iteration_table` / :func:`detect_irregular`: job-wide iteration times
  (:func:`iteration_times`) and the delta-irregular iterations that trigger localization.
* :func:`build_features`: one float32 feature row per operator (:data:`FEATURE_COLUMNS`), with the
  microsecond-valued columns listed in :data:`TIME_FEATURES`.
* :class:`FeatureStream`: the same features for logs arriving in batches (keeps recent
  iterations as context).
"""

from holmes_ml.features.build import (
    FEATURE_COLUMNS,
    GROUP_KIND_CODES,
    OP_CODES,
    TIME_FEATURES,
    FeatureConfig,
    build_features,
)
from holmes_ml.features.iterations import (
    PATTERNS,
    IrregularityConfig,
    detect_irregular,
    iteration_table,
    iteration_times,
)
from holmes_ml.features.stream import FeatureStream, stream_context

__all__ = [
    "FEATURE_COLUMNS",
    "GROUP_KIND_CODES",
    "OP_CODES",
    "PATTERNS",
    "TIME_FEATURES",
    "FeatureConfig",
    "FeatureStream",
    "IrregularityConfig",
    "build_features",
    "detect_irregular",
    "iteration_table",
    "iteration_times",
    "stream_context",
]
