"""Collect CommOps logs from a running job.

:class:`CommOpsLogger` records every ``torch.distributed`` collective and point-to-point call of
one rank into the canonical CommOps table (:mod:`holmes_ml.io.schema`), one file per rank.
torch is an optional extra: importing this package does not import torch; using the logger does,
and tells you how to install it when it is missing.
"""

from holmes_ml.collect.logger import CommOpsLogger, LoggerConfig, rank_log_path
from holmes_ml.collect.torch_import import TORCH_INSTALL_HINT, import_torch_distributed

__all__ = [
    "TORCH_INSTALL_HINT",
    "CommOpsLogger",
    "LoggerConfig",
    "import_torch_distributed",
    "rank_log_path",
]
