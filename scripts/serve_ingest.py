"""The ingest part of ``holmes bench serve`` alone: a real service on loopback, 100 batches of
20,000 raw records posted by two clients as JSON, then the same as Arrow IPC; prints ops/s.

For comparing two versions on one machine, where runs vary by 10 % or more: run it
alternately in this checkout and in a worktree of the other commit, e.g.
``git worktree add /tmp/old HEAD~1`` then, several times each,
``PYTHONPATH=/tmp/old .venv/bin/python scripts/serve_ingest.py old`` and
``.venv/bin/python scripts/serve_ingest.py new`` (about 30 s a run).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from holmes_ml.bench.serve import _arrow_bodies, _batches, _ingest, _start

BATCHES, ROWS, CLIENTS = 100, 20_000, 2


def main(label: str) -> None:
    bodies = _batches(BATCHES, ROWS, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = _start(Path(tmp) / "bench.db")
        try:
            json_s, _ = _ingest(url, bodies, CLIENTS)
            arrow_s, _ = _ingest(url, _arrow_bodies(bodies), CLIENTS, arrow=True)
        finally:
            proc.terminate()
            proc.wait()
    n = BATCHES * ROWS
    print(f"{label}: JSON {n / json_s:,.0f} ops/s, Arrow {n / arrow_s:,.0f} ops/s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "this checkout")
