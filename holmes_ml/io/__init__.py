"""Readers that turn every supported input into the canonical CommOps table."""

from holmes_ml.io.schema import (
    COLLECTIVE_OPS,
    LABEL_COLUMNS,
    OP_TYPES,
    OPTIONAL_COLUMNS,
    P2P_OPS,
    REQUIRED_COLUMNS,
    SchemaError,
    validate,
)

__all__ = [
    "COLLECTIVE_OPS",
    "LABEL_COLUMNS",
    "OPTIONAL_COLUMNS",
    "OP_TYPES",
    "P2P_OPS",
    "REQUIRED_COLUMNS",
    "SchemaError",
    "validate",
]
