"""Readers that turn every supported input into the canonical CommOps table."""

from holmes_ml.io.flight_recorder import HangFinding, hang_report
from holmes_ml.io.readers import FORMATS, detect_format, read_ops
from holmes_ml.io.schema import (
    COLLECTIVE_OPS,
    LABEL_COLUMNS,
    OP_TYPES,
    OPTIONAL_COLUMNS,
    P2P_OPS,
    REQUIRED_COLUMNS,
    SchemaError,
    validate,
    without_labels,
)

__all__ = [
    "FORMATS",
    "HangFinding",
    "hang_report",
    "detect_format",
    "read_ops",
    "COLLECTIVE_OPS",
    "LABEL_COLUMNS",
    "OPTIONAL_COLUMNS",
    "OP_TYPES",
    "P2P_OPS",
    "REQUIRED_COLUMNS",
    "SchemaError",
    "validate",
    "without_labels",
]
