"""Recording benchmark results: figures plus the commit, config, machine and library versions."""

from __future__ import annotations

import gc
import json
import logging
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_LIBS = ("holmes-ml", "numpy", "pandas", "pyarrow", "scikit-learn", "lightgbm", "networkx", "optuna")


@dataclass
class BenchResult:
    """What one benchmark measured.

    Parameters
    ----------
    name:
        Benchmark name (``simulator``, ``features``, ...).
    figures:
        Headline numbers, flat ``name -> number`` (e.g. ``{"seconds": 41.2, "peak_rss_mb": 2900}``).
    config:
        The inputs that produced them (scale, seeds, quick mode ...).
    details:
        Anything else worth keeping (per-trial rows, tables).
    goals:
        Optional ``figure -> "<= 60"`` style targets, echoed into the report.
    tables:
        Named tables (``title -> list of row dicts``) rendered into the Markdown report, e.g.
        accuracy per scale for every method.
    plots:
        PNG files the benchmark wrote (paths relative to the output directory).
    """

    name: str
    figures: dict[str, float]
    config: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    goals: dict[str, str] = field(default_factory=dict)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    plots: list[str] = field(default_factory=list)


def git_commit(cwd: str | Path | None = None) -> str:
    """The checked-out commit (with ``-dirty`` when the tree has changes), or ``unknown``.

    By default, of the checkout the running ``holmes_ml`` package was imported from (what the
    benchmark measured), wherever the command was started; ``unknown`` for an installed wheel.
    """
    if cwd is None:
        cwd = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, check=True,
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine_info() -> dict[str, Any]:
    from holmes_ml._malloc import setting

    return {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        # (the kernel's page faults of fresh memory are part of every CPU figure)
        "malloc": setting(),
    }


def library_versions() -> dict[str, str]:
    versions = {}
    for lib in _LIBS:
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = "absent"
    return versions


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(field + ":"))


def rss_rise_mb(fn: Callable[[], Any]) -> tuple[Any, float | None]:
    """Run ``fn``; return its result and how far this process's resident memory rose above
    where it stood when ``fn`` started, at its peak, in MiB. Unlike tracemalloc this counts
    every allocator (Arrow's buffers too). Linux only (the peak is reset through
    ``/proc/self/clear_refs``); ``None`` elsewhere or where that is not allowed."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM, the peak, to the current resident size
        before = _status_kib("VmRSS")
    except (OSError, StopIteration, ValueError):
        return fn(), None
    out = fn()
    return out, (_status_kib("VmHWM") - before) / 1024.0


def _cell(value: Any) -> str:
    if value is None:  # a figure the row does not have (not the word None)
        return "–"
    if isinstance(value, float):
        return f"{value:,.4g}"
    return str(value)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """Render row dicts as a GitHub Markdown table (columns in first-seen order)."""
    if not rows:
        return "_(no rows)_\n"
    columns: list[str] = []
    for row in rows:
        columns.extend(c for c in row if c not in columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def render_markdown(result: BenchResult, commit: str | None = None) -> str:
    """The human-readable report of one result: headline figures with goals, then its tables."""
    rows = [
        {"figure": k, "value": v, "goal": result.goals.get(k, "")} for k, v in result.figures.items()
    ]
    parts = [f"## holmes bench {result.name}\n", f"commit `{commit or git_commit()}`\n",
             markdown_table(rows)]
    for title, table in result.tables.items():
        parts += [f"\n### {title}\n", markdown_table(table)]
    for plot in result.plots:
        parts.append(f"\n![{Path(plot).stem}]({plot})\n")
    return "\n".join(parts)


def write_result(result: BenchResult, out_dir: str | Path, commit: str | None = None) -> Path:
    """Write ``<out_dir>/<name>.json`` and ``<out_dir>/<name>.md``; return the JSON path.

    ``commit``: the checkout's commit when the benchmark started (:func:`git_commit`; default:
    now). A benchmark runs for up to an hour and a half: a commit made meanwhile would be
    recorded as the one measured, so when the checkout moved the JSON keeps both
    (``git_commit`` the start's, ``git_commit_at_end``) and a warning says so."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    now = git_commit()
    moved = {} if commit is None or commit == now else {"git_commit_at_end": now}
    if moved:
        logger.warning("the checkout moved from %s to %s while benchmark %s ran: modules "
                       "imported after the start may be of the later one; the result records "
                       "both", commit, now, result.name)
    payload = {
        "benchmark": result.name,
        "git_commit": commit or now,
        **moved,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(),
        "libraries": library_versions(),
        **asdict(result),
    }
    path = out / f"{result.name}.json"
    path.write_text(json.dumps(payload, indent=2, default=_json_default))
    (out / f"{result.name}.md").write_text(render_markdown(result, payload["git_commit"]))
    return path


def _json_default(value: Any) -> Any:
    # numpy scalars and arrays, Paths: whatever json cannot encode natively
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    return float(value)
