"""What ``holmes agent --since`` saves a new agent started beside a job that has run for days.

Grows one host's JSON-lines logs (8 ranks) as ``holmes bench follow`` does, rotated and
compressed every ``--every`` iterations (logrotate with ``dateext`` and ``compress``), makes the
archives look two days old, then runs ``holmes agent --once`` on them twice, each with a new
outbox and no service (``--retry-for 0``: what it read stays queued): without ``--since`` and
with ``--since 1h``. Prints, for each, the rows it read, its CPU seconds and its peak resident
memory (the child's own, from ``wait4``).

Usage: ``.venv/bin/python scripts/since_memory.py`` (about 3 minutes on 2 cores;
``--iterations 150 --rows 2048 --every 10`` are the bench's sizes).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from holmes_ml.bench.follow import RANKS, _follow


def _agent(logs: Path, outbox: Path, *since: str) -> tuple[int, float, float]:
    """Rows read, CPU seconds and peak resident MB of ``holmes agent --once`` on ``logs``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "holmes_ml", "agent", "--follow", str(logs), "--job", "since",
         "--server", "http://127.0.0.1:9", "--outbox", str(outbox), "--once",
         "--retry-for", "0", *since], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):  # (1: the service, absent, was not reached)
        raise SystemExit(f"holmes agent exited {proc.returncode}: {out}")
    rows = int(re.search(r"read (\d+) ops", out)[1])  # type: ignore[index]
    return rows, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=150)
    ap.add_argument("--rows", type=int, default=2048, help="operators a rank per iteration")
    ap.add_argument("--every", type=int, default=10, help="iterations between rotations")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="holmes-since-") as tmp:
        got = _follow("jsonl", args.iterations, args.rows, Path(tmp), every=args.every,
                      name="rotated")
        logs = Path(got["config"].follow)
        then = time.time() - 2 * 86400
        for archive in logs.glob("*.gz"):
            os.utime(archive, (then, then))
        print(f"{got['archives'] * RANKS} archives two days old, {RANKS} live logs; "
              f"{args.iterations * args.rows * RANKS:,} rows in all")
        print(f"{'holmes agent --once':28} {'rows read':>10} {'CPU s':>8} {'peak MB':>8}")
        for label, since in (("(every file)", ()), ("--since 1h", ("--since", "1h"))):
            rows, cpu, peak = _agent(logs, Path(tmp) / f"outbox{len(since)}.db", *since)
            print(f"{label:28} {rows:>10,} {cpu:>8.1f} {peak:>8.0f}")


if __name__ == "__main__":
    main()
