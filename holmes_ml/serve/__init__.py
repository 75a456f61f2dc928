"""Serving beside clusters: a per-node agent and a central service.

``holmes agent`` follows a node's CommOps log files, scores operators locally and sends only
iteration summaries and abnormal-operator records upstream through a durable outbox;
``holmes serve`` accumulates them per job in SQLite and localizes the slow device.

The web stack (fastapi, uvicorn, httpx, prometheus-client) is the ``serve`` extra; it is imported
only by the modules of this package that need it, through :func:`require_extra`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

_HINT = "pip install 'holmes-ml[serve]'"

#: Names of jobs, agents, batches: safe in URLs, logs and Prometheus labels.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"


def check_name(option: str, value: str) -> None:
    """Refuse a job/agent name the service would refuse (``ValueError`` naming ``option``):
    said before anything is read or sent, not as an HTTP 404 or 422 afterwards.

    >>> check_name("--job", "train/run 1")
    Traceback (most recent call last):
    ...
    ValueError: --job 'train/run 1': expected a name of letters, digits and . _ : @ - (not first), at most 128 characters
    """
    import re

    if not re.fullmatch(NAME_PATTERN, value):
        raise ValueError(f"{option} {value!r}: expected a name of letters, digits and . _ : @ - "
                         "(not first), at most 128 characters")


def plain_http_hint(server: str, error: str) -> str:
    """What to do when a request to ``server`` failed with ``error``: when a TLS hello was
    answered in plain HTTP (holmes serve speaks HTTP), the ``http://`` URL to use; else "".

    >>> plain_http_hint("https://head:8600", "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    'the service answers in plain HTTP, not TLS: expected --server http://head:8600'
    """
    if "WRONG_VERSION_NUMBER" in error and server.startswith("https://"):
        return ("the service answers in plain HTTP, not TLS: expected --server http://"
                + server.removeprefix("https://"))
    return ""


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


def hold_lock(path: str, refusal: Callable[[str], str]) -> Any:
    """Hold an advisory lock (``flock``) on ``<path>.lock`` while ``path`` is in use, the pid
    written in it; a second process is refused with ``ValueError(refusal(its pid))``.
    The kernel drops the lock when its process ends, killed too: a stale lock file blocks
    nothing. Returns the open lock file (keep it), or None when no lock file can be made
    there (opening ``path`` then says why)."""
    import fcntl
    import os

    try:
        lock = open(f"{path}.lock", "a+")  # noqa: SIM115 - open as long as path is used
    except OSError:
        return None
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "?"
        lock.close()
        raise ValueError(refusal(holder)) from None
    except BaseException:
        lock.close()
        raise
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock

