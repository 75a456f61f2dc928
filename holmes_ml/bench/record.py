"""Recording benchmark results: figures plus the commit, config, machine and library versions."""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

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
    """

    name: str
    figures: dict[str, float]
    config: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    goals: dict[str, str] = field(default_factory=dict)


def git_commit(cwd: str | Path | None = None) -> str:
    """The checked-out commit (with ``-dirty`` when the tree has changes), or ``unknown``."""
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
    return {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
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


def write_result(result: BenchResult, out_dir: str | Path) -> Path:
    """Write ``<out_dir>/<name>.json`` and return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": result.name,
        "git_commit": git_commit(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(),
        "libraries": library_versions(),
        **asdict(result),
    }
    path = out / f"{result.name}.json"
    path.write_text(json.dumps(payload, indent=2, default=float))
    return path
