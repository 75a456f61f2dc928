"""Serving beside clusters: a per-node agent and a central service.

``holmes agent`` follows a node's CommOps log files, scores operators locally and sends only
iteration summaries and abnormal-operator records upstream through a durable outbox;
``holmes serve`` accumulates them per job in SQLite and localizes the slow device.

The web stack (fastapi, uvicorn, httpx, prometheus-client) is the ``serve`` extra; it is imported
only by the modules of this package that need it, through :func:`require_extra`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

_HINT = "pip install 'holmes-ml[serve]'"


def require_extra(module: str) -> ModuleType:
    """Import ``module`` from the ``serve`` extra, or explain how to install it.

    Raises
    ------
    ImportError
        Naming the missing module and the pip command that installs it.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - the extra is installed in the dev env
        raise ImportError(
            f"holmes_ml.serve needs {module!r}, which is not installed; run: {_HINT}"
        ) from exc
