"""JSON Lines read by pyarrow (:func:`holmes_ml.io.readers.json_lines_frame`) against the
readers it replaced: Python's json line by line in ``read_ops``, pandas in the node agent.

Two timings on seeded operator rows (no file is kept):

* ``read_ops`` of 8 per-rank JSON Lines logs (``--iterations`` of 6 operators a rank), twice
  each way, wall and CPU seconds;
* one chunk as the agent reads it, 1 to 10,000 lines: pyarrow on its threads, on one core (what
  the agent does), and pandas' ``read_json``; median milliseconds.

Usage: ``.venv/bin/python scripts/json_lines_speed.py`` (about a minute).
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd

from holmes_ml.io import read_ops, readers


def _ops(ranks: int, iterations: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = [{"iteration": it, "rank": r, "op": "all_reduce", "group": "dp-0", "seq": it * 6 + k,
             "nbytes": 1 << 20, "start_ns": 10**18 + (it * 6 + k) * 10**6 + r,
             "duration_us": float(rng.uniform(100, 200)),
             "group_ranks": " ".join(map(str, range(ranks))), "peer": -1, "host": "n0",
             "group_kind": "dp", "job": ""}
            for it in range(iterations) for r in range(ranks) for k in range(6)]
    return pd.DataFrame(rows)


def _read_ops(ops: pd.DataFrame) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for r, sub in ops.groupby("rank"):
            path = Path(tmp) / f"rank{r}.jsonl"
            sub.to_json(path, orient="records", lines=True)
            files.append(str(path))
        for _ in range(2):
            for name, patch in (("python json", lambda data, threads=True: None),
                                ("pyarrow", readers.json_lines_frame)):
                with mock.patch.object(readers, "json_lines_frame", patch):
                    wall, cpu = time.perf_counter(), time.process_time()
                    n = len(read_ops(files))
                    print(f"read_ops, {name}: {time.perf_counter() - wall:.2f} s wall, "
                          f"{time.process_time() - cpu:.2f} s CPU ({n:,} rows)")


def _chunks(row: dict) -> None:
    line = (json.dumps(row) + "\n").encode()
    for n in (1, 10, 100, 1000, 10_000):
        data = line * n
        ways = {"pyarrow, threads": lambda d: readers.json_lines_frame(d),
                "pyarrow, one core": lambda d: readers.json_lines_frame(d, threads=False),
                "pandas": lambda d: pd.read_json(io.BytesIO(d), lines=True, dtype=False)}
        took = {}
        for name, read in ways.items():
            times = []
            for _ in range(max(5, 2000 // n)):
                t0 = time.perf_counter()
                read(data)
                times.append(time.perf_counter() - t0)
            took[name] = np.median(times) * 1e3
        print(f"{n:>6,} lines: " + ", ".join(f"{k} {v:.2f} ms" for k, v in took.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=4000,
                        help="iterations of the read_ops logs (8 ranks, 6 operators each)")
    args = parser.parse_args()
    ops = _ops(8, args.iterations)
    _read_ops(ops)
    _chunks(json.loads(ops.iloc[:1].to_json(orient="records"))[0])


if __name__ == "__main__":
    main()
