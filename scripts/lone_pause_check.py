"""Does the lone-pause clause change any verdict on the bench's jobs?

Runs jobs of ``holmes bench localize`` through ``holmes`` and ``holmes, per node`` exactly as
the bench does, and recomputes every GPU/host candidate list (``rules._rank_candidates``) with
the clause off (a rank late at a single operator instance never counts, however long its
partners waited). Prints the methods' top-1 (or share of healthy jobs flagged), how many
candidate lists were computed and how many differ, with the first differences.

Usage: ``.venv/bin/python scripts/lone_pause_check.py noisy`` (181 jobs, about 15 minutes on
2 cores); ``healthy``; ``grid --pattern spike --kind host_stall,gpu_slow --max-gpus 2048``.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
from joblib import Parallel, delayed

from holmes_ml.bench.localize import _jobs, _trials, healthy_sweep, noisy_sweep, scenarios


def _key(out: tuple) -> tuple:
    cands, workload, total = out
    return ([(c.device, round(c.score, 9), c.tied_with) for c in cands], len(workload),
            round(total, 6))


def _run(job: list[dict]) -> tuple[list[dict], int, list[str]]:
    """The job's bench rows, the candidate lists computed and those the clause changed."""
    from holmes_ml.localize import rules

    calls: list[str] = []
    differ: list[str] = []
    keep = rules._rank_candidates

    def both(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = keep(*args, **kwargs)
        off = keep(*args[:8], np.inf)  # the 9th argument is the lone-pause threshold
        calls.append("")
        if _key(out) != _key(off):
            differ.append(f"{_key(out)} vs off {_key(off)}")
        return out

    rules._rank_candidates = both
    try:
        rows = _trials(job, None, only=("holmes", "holmes, per node"))[0]
    finally:
        rules._rank_candidates = keep
    return rows, len(calls), differ


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", choices=("grid", "healthy", "noisy"))
    ap.add_argument("--pattern", help="grid: keep these patterns (comma-separated)")
    ap.add_argument("--kind", help="grid: keep these fault kinds (comma-separated)")
    ap.add_argument("--max-gpus", type=int, help="grid: keep jobs of at most this many GPUs")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    if args.sweep == "grid":
        scs = [s for s in scenarios(False)
               if (not args.pattern or s["pattern"] in args.pattern.split(","))
               and (not args.kind or s["kind"] in args.kind.split(","))
               and (not args.max_gpus or s["gpus"] <= args.max_gpus)]
    else:
        scs = (noisy_sweep if args.sweep == "noisy" else healthy_sweep)(False)
    out = Parallel(n_jobs=args.workers)(delayed(_run)(j) for j in _jobs(scs))
    df = pd.DataFrame([r for rows, _, _ in out for r in rows])
    score = "flagged" if args.sweep == "healthy" else "top1"
    for method, sub in df.groupby("method", sort=False):
        print(f"{method}: {score} {sub[score].mean():.3f} over {len(sub)} jobs")
    differ = [d for _, _, ds in out for d in ds]
    print(f"candidate lists computed: {sum(n for _, n, _ in out)}; changed by the clause: "
          f"{len(differ)}")
    for d in differ[:10]:
        print("  " + d)


if __name__ == "__main__":
    main()
