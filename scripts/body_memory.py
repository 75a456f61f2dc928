"""What a raw-records JSON body costs the service once parsed: the steps of ``POST
/v1/jobs/{job}/raw`` up to the DataFrame (``json.loads``, the ``RawBatch`` model, the columns as
a DataFrame), the peak of the Python memory they allocate (``tracemalloc``) against the body's
size. The figure behind ``holmes serve --large-at-once``.

Usage: ``.venv/bin/python scripts/body_memory.py [ROWS] [--short]`` (default 1,000,000 rows, a
body of about 70 MiB; under a minute, tracemalloc slows the parse). ``--short``: every
integer 1 and every duration 0.5 (the most list entries per byte).
"""

from __future__ import annotations

import json
import sys
import tracemalloc

import pandas as pd

from holmes_ml.serve.schemas import RawBatch


def main(rows: int, short: bool) -> None:
    if short:  # the most list entries per byte: one-character values
        cols = {c: [1] * rows for c in ("iteration", "rank", "seq", "nbytes", "start_ns")}
        cols.update(op=["send"] * rows, group=["g"] * rows, duration_us=[0.5] * rows)
        _measure(cols)
        return
    # what a logger sends: small ranks and iterations, distinct sequence numbers, start times
    # and durations (each a Python object of its own once parsed)
    cols = {"iteration": [i // 10_000 for i in range(rows)], "rank": [i % 64 for i in range(rows)],
            "op": ["all_reduce"] * rows, "group": ["dp-0"] * rows, "seq": list(range(rows)),
            "nbytes": [1 << 20] * rows, "start_ns": [10**18 + 1_000 * i for i in range(rows)],
            "duration_us": [100.0 + i / 7 for i in range(rows)]}
    _measure(cols)


def _measure(cols: dict) -> None:
    body = json.dumps({"source": "a", "batch_id": "b", "columns": cols},
                      separators=(",", ":")).encode()
    cols.clear()
    tracemalloc.start()
    batch = RawBatch.model_validate(json.loads(body))
    frame = pd.DataFrame({k: v for k, v in batch.columns.__dict__.items() if v is not None})
    rise = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    size = len(body) / 2**20
    print(f"body {size:.1f} MiB ({len(frame):,} rows): peak memory +{rise:.0f} MiB, "
          f"{rise / size:.1f}x the body")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--short"]
    main(int(args[0]) if args else 1_000_000, "--short" in sys.argv[1:])
