"""Launch the worker scripts of the real gloo tests (CPU torch) and fail with their stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_workers(tmp_path: Path, source: str, ranks: int | None = None,
                timeout: float = 120) -> Path:
    """Run ``source`` as a script and return the directory it writes to (``tmp_path/logs``).

    With ``ranks=None`` one process gets ``STORE OUT`` (it spawns its world itself); otherwise
    ``ranks`` processes get ``RANK STORE OUT`` and run concurrently. A worker that exits
    non-zero fails the test with the end of its stderr.
    """
    script = tmp_path / "worker.py"
    script.write_text(source)
    out = tmp_path / "logs"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    tail = [str(tmp_path / "store"), str(out)]
    argvs = ([tail] if ranks is None else [[str(r), *tail] for r in range(ranks)])
    procs = [subprocess.Popen([sys.executable, str(script), *argv], env=env,
                              stderr=subprocess.PIPE, text=True) for argv in argvs]
    for p in procs:
        _, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err[-3000:]
    return out
