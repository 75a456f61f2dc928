"""Figures about the localize bench's scoring quoted in docs/results.md and the closing notes.

Reads the kept run's trials (``docs/bench/localize-trials.csv.gz``, or ``--trials FILE``) and
prints: (1) of holmes_ml's first suspects that are a NIC for a slow leaf-spine link, how many
sit below the link's own leaf (the rest are NICs at the far end of flows crossing it, which the
rank-overlap top-1 counts as hits; ``device_top1_ties`` is the strict figure); (2) how the
noisy sweep's 200 jobs split into scored, unobservable and skipped; (3) with ``--score-skipped``,
the noisy jobs the run skipped, scored now by the bench's own ``_trials`` (minutes).

Usage: ``.venv/bin/python scripts/scoring_check.py [--score-skipped 3075,3080]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from holmes_ml.bench import localize as bl
from holmes_ml.simulator import simulate

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=Path, default=ROOT / "docs/bench/localize-trials.csv.gz")
    parser.add_argument("--score-skipped", default="", help="noisy-sweep seeds to score now")
    args = parser.parse_args()
    t = pd.read_csv(args.trials)

    h = t[(t["method"] == "holmes") & t["truth"].fillna("").str.startswith("link:")
          & t["named"].fillna("").str.startswith("nic:")].copy()
    own = 0
    for _, r in h.iterrows():
        sc = {"gpus": int(r["gpus"]), "layout": bl.LAYOUTS[r["dims"]], "iterations": 1,
              "seed": int(r["seed"])}
        topo = simulate(bl._sim_config(sc)).topology
        nic = r["named"].split(",")[0]
        own += set(topo.ranks_on(nic)) <= set(topo.ranks_on(r["truth"]))
    print(f"(1) link faults with a NIC first: {len(h)}; below the link's own leaf: {own}; "
          f"elsewhere: {len(h) - own}")

    noisy = bl.noisy_sweep(False)
    scored = set(t[(t["method"] == "holmes") & (t["sweep"] == "noisy")]["seed"])
    rest = [s["seed"] for s in noisy if s["seed"] not in scored]
    print(f"(2) noisy sweep: {len(noisy)} jobs, {len(scored)} scored, {len(rest)} not "
          f"(unobservable or skipped): {rest}")

    seeds = {int(x) for x in args.score_skipped.split(",") if x}
    if seeds:
        scs = [s for s in noisy if s["seed"] in seeds]
        for job in bl._jobs(scs):
            rows, unobservable = bl._trials(job, None, only=("holmes",))
            for r in rows:
                print("(3)", json.dumps({k: r.get(k) for k in (
                    "seed", "top1", "top2", "top1_ties", "tied_ranks", "truth", "named")}))
            for u in unobservable:
                print("(3) unobservable", u["seed"], u["peak_ratio"])


if __name__ == "__main__":
    main()
