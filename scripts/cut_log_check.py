"""Logs cut short: does the verdict name a rank for what its log does not hold?

Two cases per seed, each simulated and localized with the bundled model:

* **cut mid-episode**: a 16-GPU job whose rank 9 slows from iteration 15 (of 30); rank 3's log
  stops part-way through iteration 20 (at a seeded point between a fifth and four fifths of
  its operators there), as a file cut short or an agent behind would have it. Only rank 9
  should be named;
* **killed job**: a 32-GPU job whose rank 13 slows from iteration 10 (of 24), killed in its
  last iteration, so every rank's log stops at its own seeded point in it (the logger's
  Arrow streams keep what was flushed). Only rank 13 should be named.

Usage: ``.venv/bin/python scripts/cut_log_check.py --seeds 0 1 2 3 4 5`` (about a minute).
Prints, per seed, the ranks of each candidate, best first, and a count of the verdicts that
name anyone else.
"""

from __future__ import annotations

import argparse
import logging
import warnings

import numpy as np

from holmes_ml.io.schema import without_labels
from holmes_ml.pipeline import analyze
from holmes_ml.simulator import FaultSpec, SimConfig, simulate


def cut_mid_episode(seed: int) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    res = simulate(SimConfig(gpus=16, iterations=30, seed=seed, faults=(
        FaultSpec.parse("gpu_slow:rank=9,severity=0.5,start=15"),)))
    ops = without_labels(res.ops)
    mine = ops[(ops["rank"] == 3) & (ops["iteration"] == 20)]
    cut_ns = np.quantile(mine["start_ns"], rng.uniform(0.2, 0.8))
    verdict = analyze(ops[~((ops["rank"] == 3) & (ops["start_ns"] > cut_ns))], res.topology)
    return [c.ranks for c in verdict.candidates]


def killed(seed: int) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    res = simulate(SimConfig(gpus=32, model="llama2-7b", iterations=24, seed=seed, faults=(
        FaultSpec.parse("gpu_slow:rank=13,severity=0.5,start=10"),)))
    ops = without_labels(res.ops)
    last = ops[ops["iteration"] == 23]
    ends = {r: np.quantile(g["start_ns"], rng.uniform(0, 1)) for r, g in last.groupby("rank")}
    keep = (ops["iteration"] < 23) | (ops["start_ns"] <= ops["rank"].map(ends))
    return [c.ranks for c in analyze(ops[keep.to_numpy()], res.topology).candidates]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    wrong = {"cut mid-episode": 0, "killed job": 0}
    for seed in args.seeds:
        cut, kill = cut_mid_episode(seed), killed(seed)
        wrong["cut mid-episode"] += cut != [(9,)]
        wrong["killed job"] += kill != [(13,)]
        print(f"seed {seed}: cut mid-episode {cut} | killed job {kill}")
    print(", ".join(f"{k}: {v} of {len(args.seeds)} name another rank or miss the slow one"
                    for k, v in wrong.items()))


if __name__ == "__main__":
    main()
