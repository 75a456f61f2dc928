"""GPU or host on the bench's own jobs: how often does the top suspect have the right kind?

Runs the slow-GPU and host-stall jobs of ``holmes bench localize`` (its grid and its noisy
sweep, up to ``--max-gpus``) through ``holmes`` exactly as the bench scores them, and prints
top-1 (the faulty device's ranks on top) and device top-1 (the faulty device itself: the kind
right too) per sweep, fault kind and layout, then one line per job with what it named. Run it
with ``PYTHONPATH`` at another checkout to compare versions (``diff`` the per-job lines).

Usage: ``.venv/bin/python scripts/kind_check.py`` (about 15 minutes on 2 cores);
``--max-gpus 256 --sweep grid``.
"""

from __future__ import annotations

import argparse

import pandas as pd
from joblib import Parallel, delayed

from holmes_ml.bench.localize import _jobs, _trials, noisy_sweep, scenarios

KINDS = ("gpu_slow", "host_stall")


def _run(job: list[dict]) -> list[dict]:
    return _trials(job, None, only=("holmes",))[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep", choices=("all", "grid", "noisy"), default="all")
    ap.add_argument("--max-gpus", type=int, default=1024)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    scs = []
    if args.sweep in ("all", "grid"):
        scs += [s for s in scenarios(False) if not s.get("sweep") or s["sweep"] == "delta"]
    if args.sweep in ("all", "noisy"):
        scs += noisy_sweep(False)
    scs = [s for s in scs if s["kind"] in KINDS and s["gpus"] <= args.max_gpus]
    out = Parallel(n_jobs=args.workers)(delayed(_run)(j) for j in _jobs(scs))
    df = pd.DataFrame([r for rows in out for r in rows])
    df["sweep"] = df.get("sweep", pd.Series("grid", index=df.index)).fillna("grid")
    summary = df.groupby(["sweep", "kind", "dims"]).agg(
        jobs=("top1", "size"), top1=("top1", "mean"), device_top1=("device_top1", "mean"))
    print(summary.round(3).to_string())
    for sweep, sub in df.groupby("sweep"):
        print(f"{sweep}: {len(sub)} jobs, top-1 {sub['top1'].mean():.3f}, device top-1 "
              f"{sub['device_top1'].mean():.3f}")
    cols = [c for c in ("sweep", "gpus", "dims", "kind", "pattern", "seed", "delta", "truth",
                        "named", "top1", "device_top1") if c in df.columns]
    print(df[cols].sort_values(cols[:7]).to_string(index=False))


if __name__ == "__main__":
    main()
