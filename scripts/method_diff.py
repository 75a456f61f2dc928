"""Where do two localization methods part ways, on the bench's own jobs?

Runs jobs of ``holmes bench localize`` - its grid, its healthy sweep or its noisy sweep, or a
fresh draw of a sweep - through the methods asked for (names of the bench's methods), exactly as
the bench scores them, and prints each method's top-1 (faulty jobs) or share flagged (healthy
jobs) and every job on which the methods disagree, with the truth and what each named.
``--debug`` logs the network rules' working (``holmes_ml.localize.rules`` at DEBUG: the slow
flows too light to count (``min_flow_share``), each device's slow flows over the window, its
excess and the floor it must reach, and the flows it had slow as a whole in each step). Run it
with ``PYTHONPATH`` at another checkout to compare versions, or with ``--undo RULE`` to see what
one localization rule changes on the same jobs (``hand-down``: a long send whose receiver had
itself been waiting counts as a slow transfer again; ``released-together``: ranks let go at one
instant are singled out again; ``lone-pause``: a rank late in a single operator instance is
dropped however long its partners waited).

Usage:
``.venv/bin/python scripts/method_diff.py --sweep noisy`` (the noisy sweep, holmes_ml against
"3sigma+rule (no ML)", about 5 minutes on 2 cores);
``--sweep noisy --seeds 3022,3048,3122 --methods holmes --debug``;
``--sweep healthy --where dims=5-D --methods holmes "holmes, per node"``;
``--sweep grid --where sweep=delta --where delta=1.05 --where kind=nic_slow --seeds 11
--methods holmes "holmes, per node" --debug``;
``--sweep noisy --draw 4242 --first-seed 7000 --jobs 120 --where
kind=nic_slow,link_slow,switch_congested --methods holmes`` (a fresh draw);
``--sweep noisy --seeds 3032,3121 --methods holmes --undo hand-down``;
``--sweep healthy --csv new.csv``, then with ``PYTHONPATH`` at a worktree of another commit
``--sweep healthy --csv old.csv`` (run from outside the repository, so that the worktree is the
one imported), and compare the two files job by job.
"""

from __future__ import annotations

import argparse
import logging

import pandas as pd
from joblib import Parallel, delayed

from holmes_ml.bench.localize import _jobs, _trials, healthy_sweep, noisy_sweep, scenarios


def _select(scs: list[dict], where: list[str], seeds: set[int] | None) -> list[dict]:
    """Jobs whose field starts with one of the comma-separated values of each ``key=values``
    of ``where`` (as text), and whose seed is in ``seeds`` (all when None)."""
    tests = [(k, tuple(v.split(","))) for k, v in (w.split("=", 1) for w in where)]
    out = []
    for sc in scs:
        if seeds is not None and sc["seed"] not in seeds:
            continue
        if all(str(sc.get(k, "")).startswith(v) for k, v in tests):
            out.append(sc)
    return out


def _undo(rule: str | None) -> None:
    """Turn one localization rule off in this process (see the module docstring)."""
    import numpy as np

    from holmes_ml.localize import rules

    if rule == "hand-down":
        rules._slow_transfers = lambda sends, *_: rules._as_transfers(sends)
    elif rule == "released-together":
        rules._released_together = lambda strag, held, *_: np.zeros(len(held), dtype=bool)
    elif rule == "lone-pause":
        keep = rules._rank_candidates
        rules._rank_candidates = lambda *a, **k: keep(*a[:8], np.inf)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep", choices=("grid", "healthy", "noisy"), default="noisy")
    ap.add_argument("--draw", type=int, help="a fresh draw of the sweep (default: the bench's)")
    ap.add_argument("--first-seed", type=int, help="first simulator seed of a fresh draw")
    ap.add_argument("--jobs", type=int, help="jobs drawn (default: the bench's count)")
    ap.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                    help="keep jobs whose KEY starts with VALUE or one of VALUE,VALUE (dims=5-D, "
                         "kind=nic_slow,link_slow)")
    ap.add_argument("--seeds", help="comma-separated simulator seeds to keep")
    ap.add_argument("--methods", nargs="+", default=["holmes", "3sigma+rule (no ML)"])
    ap.add_argument("--debug", action="store_true", help="log the network rules' working")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--undo", choices=("hand-down", "released-together", "lone-pause"),
                    help="run with this localization rule turned off")
    ap.add_argument("--csv", help="also write every job's row per method (truth, named, score) "
                                  "to this CSV, to compare two versions job by job")
    args = ap.parse_args()
    if args.debug:
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        logging.getLogger("holmes_ml.localize.rules").setLevel(logging.DEBUG)
    draw = {k: v for k, v in (("draw", args.draw), ("first_seed", args.first_seed),
                              ("n", args.jobs)) if v is not None}
    if args.sweep == "grid":
        scs = scenarios(False)
    else:
        scs = (noisy_sweep if args.sweep == "noisy" else healthy_sweep)(False, **draw)
    seeds = {int(s) for s in args.seeds.split(",")} if args.seeds else None
    scs = _select(scs, args.where, seeds)
    if not scs:
        raise SystemExit("no job matches --where / --seeds")

    def run(job: list[dict]) -> list[dict]:
        _undo(args.undo)  # in each worker process
        return _trials(job, None, only=tuple(args.methods))[0]

    workers = 1 if args.debug else args.workers  # one process keeps the log in order
    rows = [r for out in Parallel(n_jobs=workers)(delayed(run)(j) for j in _jobs(scs))
            for r in out]
    df = pd.DataFrame(rows)
    if args.csv:
        df.to_csv(args.csv, index=False)
    score = "flagged" if args.sweep == "healthy" else "top1"
    key = ["seed", "gpus", "dims", "delta", "kind"]
    for method, sub in df.groupby("method", sort=False):
        print(f"{method}: {score} {sub[score].mean():.3f} over {len(sub)} jobs")
    wide = df.pivot_table(index=key, columns="method", values=score, aggfunc="first")
    named = df.pivot_table(index=key, columns="method", values="named", aggfunc="first")
    differ = wide.nunique(axis=1) > 1
    print(f"\njobs where the methods disagree ({int(differ.sum())}):")
    for idx in wide.index[differ]:
        truth = df.set_index(key).loc[idx, "truth"] if "truth" in df else ""
        truth = truth.iloc[0] if isinstance(truth, pd.Series) else truth
        print(f"  {dict(zip(key, idx, strict=True))} truth={truth}")
        for m in wide.columns:
            print(f"    {m}: {score}={wide.loc[idx, m]} named={named.loc[idx, m]!r}")


if __name__ == "__main__":
    main()
