"""The bundled detector on every fault kind at every scale, over several seeds per cell.

``holmes bench detector``'s ten held-out jobs rotate the fault kinds over the scales, so each
scale meets two kinds: the persistent network faults (slow NIC, slow link, congested switch)
fall on 256, 1,024 and 4,096 GPUs, the scales that miss the 0.95 goal, while 64 and 8,192 GPUs
get a slow GPU, a slow NIC's spike, a host stall and a GPU spike. The bench therefore also
scores its shipped method on a grid of every kind at every scale, one job per cell
(:func:`~holmes_ml.bench.detector.kind_grid_scenarios`). This script scores the *bundled*
model on the same grid, with ``--repeats`` jobs per cell on further seeds to show how much a
cell moves from one job to the next, as the bench scores (every abnormal or affected op and a
seeded sample of 100,000 others, weighted back to the job, drawn in one pass over the jobs as the
bench draws them, so its own cells come out as in the bench). It prints F1 per job, then per
pattern a kind x scale table (each cell pooled over its jobs) and each scale pooled over its
kinds. A job's seed follows its scale's place in ``--gpus`` (and its pattern's in
``--patterns``): ``--gpus 64 256 1024 4096 8192 --patterns persistent spike`` draws the bench's
own jobs, ``--gpus 8192`` alone others.

Usage: ``.venv/bin/python scripts/kind_by_scale.py`` (64-4,096 GPUs, persistent: about
a minute and a half on 2 cores, 4,096 GPUs the most of it); ``--gpus 64 256 --patterns
persistent spike --repeats 3``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from holmes_ml.bench.detector import (
    HELDOUT_OTHER_ROWS,
    _grid_rows,
    _per_run_rows,
    kind_grid_scenarios,
)
from holmes_ml.models import default_model
from holmes_ml.models.training import make_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--patterns", nargs="+", default=["persistent"],
                        choices=["persistent", "spike", "fluctuation"])
    parser.add_argument("--repeats", type=int, default=1,
                        help="jobs per cell, each on its own seed (default 1)")
    args = parser.parse_args()
    from holmes_ml._malloc import keep_freed_memory

    keep_freed_memory()  # a batch run, as the CLI's batch commands
    if args.repeats < 1:
        parser.error(f"--repeats: got {args.repeats}; expected 1 or more")
    det = default_model()
    cfgs = kind_grid_scenarios(args.gpus, args.patterns, args.repeats)
    # one pass over every job, as the bench draws its grid: each job's sample of normal ops
    # follows from the same seeded stream, so the bench's own cells come out as it scores them
    X, y, run, w = make_dataset(cfgs, max_normal_per_run=HELDOUT_OTHER_ROWS[0], seed=1,
                                return_weights=True, progress=sys.stderr.isatty())
    p = np.asarray(det.predict(X)).astype(bool)
    y, run, w = np.asarray(y).astype(bool), np.asarray(run), np.asarray(w)
    print("gpus  pattern     fault              seed  abnormal  precision  recall  F1")
    for cfg, r in zip(cfgs, _per_run_rows(y, p, run, cfgs, w), strict=True):
        f = cfg.faults[0]
        print(f"{cfg.gpus:>5} {f.pattern:<11} {f.kind:<17} {cfg.seed:>5} {r['abnormal']:>9}  "
              f"{r['precision']:>9.3f}  {r['recall']:>6.3f}  {r['f1']:.3f}")

    # the bench's table: each cell's jobs pooled, then each pattern's kinds
    grid = _grid_rows(y, p, run, cfgs, w)
    for pattern in args.patterns:
        print(f"\nF1, {pattern} faults (rows: kind; columns: GPUs)")
        print(f"{'':<17}" + "".join(f"{g:>8}" for g in args.gpus))
        for r in (r for r in grid if r["pattern"] == pattern):
            name = "pooled over kinds" if r["fault"] == "all" else r["fault"]
            print(f"{name:<17}" + "".join(f"{r[str(g)]:>8.3f}" for g in args.gpus))


if __name__ == "__main__":
    main()
