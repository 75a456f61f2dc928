"""Lazy, explained import of the optional torch dependency."""

from __future__ import annotations

import importlib
from types import ModuleType

#: What to do when torch is missing (quoted so it pastes into any shell).
TORCH_INSTALL_HINT = (
    "pip install 'holmes-ml[torch]' (or a CPU-only build: pip install torch "
    "--index-url https://download.pytorch.org/whl/cpu)"
)


def import_torch_distributed(
    needed_by: str = "holmes_ml.collect needs PyTorch to record torch.distributed calls",
) -> ModuleType:
    """Import and return ``torch.distributed``, or explain how to install it.

    Parameters
    ----------
    needed_by:
        What needs torch, the start of the error message.

    Returns
    -------
    module
        The ``torch.distributed`` module.

    Raises
    ------
    ImportError
        torch is not installed, or was built without distributed support; the message says how
        to install it.
    """
    try:
        dist = importlib.import_module("torch.distributed")
    except ImportError as exc:
        raise ImportError(
            f"{needed_by}, but it could not be imported ({exc}). Install it with: "
            f"{TORCH_INSTALL_HINT}"
        ) from exc
    if not dist.is_available():
        raise ImportError(
            "this PyTorch build has no torch.distributed support (dist.is_available() is False); "
            f"install a standard build: {TORCH_INSTALL_HINT}"
        )
    return dist
