"""Does the detector learn better without the label's boundary negatives?

``make_dataset`` keeps every copy the fault prolonged without taking it outside its op step's
usual range (``affected`` but not ``abnormal``): copies the fault lengthened alike fall on both
sides of the label (``scripts/miss_profile.py``'s last table), so these negatives look like the
abnormal copies the detector misses, and leaving them out might let the trees learn the
fault's prolongation itself. This script trains the shipped detector's trees
(``scale_free_estimator``) on the default training mix with all of them, a random 30 % of them,
and none, and prints the bench's per-scale F1 on the bench's held-out rows (its first row
reproduces the bench's shipped row) and each variant's per-run table.

Usage: ``.venv/bin/python scripts/boundary_training.py`` (about 4 minutes on 2 cores;
``--quick``: the tiny preset and the bench's quick held-out jobs, a smoke test).
"""

from __future__ import annotations

import argparse

import numpy as np

from holmes_ml.bench.detector import _per_run_rows, _scores_row, heldout_dataset, heldout_scenarios
from holmes_ml.features import FEATURE_COLUMNS
from holmes_ml.models.training import make_dataset, scale_free_estimator, scenarios

#: share of the boundary negatives each variant trains on
VARIANTS = {"all boundary negatives (as shipped)": 1.0, "30 % of them": 0.3, "none": 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test in a few minutes")
    args = parser.parse_args()
    X, y, run, w, labels = make_dataset(scenarios("tiny" if args.quick else "default", 0),
                                        return_weights=True, also=("affected",))
    boundary = labels["affected"] & ~y
    print(f"training rows {len(y):,}: {int(y.sum()):,} abnormal, {int(boundary.sum()):,} "
          "boundary negatives (affected, not abnormal)", flush=True)
    cfgs = heldout_scenarios(args.quick)
    Xh, yh, runh, wh = heldout_dataset(args.quick)
    scales = sorted({c.gpus for c in cfgs})
    scale_of = np.array([cfgs[r].gpus for r in runh])
    cols = list(FEATURE_COLUMNS)
    rng = np.random.default_rng(0)
    for name, share in VARIANTS.items():
        keep = ~boundary | (rng.random(len(y)) < share)
        m = scale_free_estimator(0).fit(X.loc[keep, cols].reset_index(drop=True), y[keep],
                                        groups=run[keep], threshold_weights=w[keep])
        pred = np.asarray(m.predict(Xh[cols])).astype(bool)
        print(_scores_row(name, yh, pred, scale_of, scales, wh), flush=True)
        for row in _per_run_rows(yh, pred, runh, cfgs, wh):
            print("   ", row)


if __name__ == "__main__":
    main()
