"""Does the shipped detector gain from training on the normal ops it nearly flags?

``make_dataset`` keeps every abnormal op and every op the fault prolonged (``affected``), and a
sample of 20,000 of each run's other ops. The normal ops a detector finds hard - jitter's waits,
far out in their crowd like a fault's - are mostly left out of that sample. This script builds
the default mix again with a third stratum kept: the normal, unaffected ops the bundled detector
scores at least ``--score`` (up to ``--cap`` per run, sampled), each stratum weighted back to its
run for the decision threshold, fits the shipped configuration
(:func:`~holmes_ml.models.training.default_estimator`) and saves it to ``--out``; score it with
``scripts/detector_ab.py --model OUT`` (add ``--thresholds ...`` for other cuts).

The bundled detector was fitted on these very runs, so its scores pick the rows only: which ops a
detector like it finds hard, not a verdict the new one sees.

Usage: ``.venv/bin/python scripts/hard_negatives.py --out /tmp/hard.holmes`` (3 minutes for the
rows, then about 10 for the fit on 2 cores; 1.47 M such rows at the defaults).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from holmes_ml.features import FEATURE_COLUMNS, build_features
from holmes_ml.models import default_model
from holmes_ml.models.persist import save_model
from holmes_ml.models.training import default_estimator, scenarios
from holmes_ml.simulator import simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="model envelope to write")
    parser.add_argument("--score", type=float, default=0.02,
                        help="a normal op the bundled detector scores at least this is kept "
                             "(default 0.02)")
    parser.add_argument("--cap", type=int, default=20_000,
                        help="at most this many such ops per run (default 20,000)")
    args = parser.parse_args()
    if not 0.0 < args.score < 1.0:
        parser.error(f"--score: got {args.score}; expected a score in (0, 1)")
    first = default_model()
    rng = np.random.default_rng(0)
    frames, labels, runs, weights = [], [], [], []
    t0, hard_kept = time.perf_counter(), 0
    for i, cfg in enumerate(scenarios("default", 0)):
        res = simulate(cfg)
        F = build_features(res.ops)
        y = res.ops["abnormal"].to_numpy(dtype=bool)
        sure = y | res.ops["affected"].to_numpy(dtype=bool)
        score = np.asarray(first.decision_function(F.loc[:, list(FEATURE_COLUMNS)]))
        hard = ~sure & (score >= args.score)
        keep, w = sure.copy(), np.ones(len(y))
        for stratum, most in ((hard, args.cap), (~sure & ~hard, 20_000)):
            rows = np.flatnonzero(stratum)
            take = rows if len(rows) <= most else rng.choice(rows, size=most, replace=False)
            keep[take] = True
            w[rows] = len(rows) / max(len(take), 1)
        hard_kept += min(int(hard.sum()), args.cap)
        frames.append(F[keep].reset_index(drop=True))
        labels.append(y[keep])
        runs.append(np.full(int(keep.sum()), i))
        weights.append(w[keep])
    X = pd.concat(frames, ignore_index=True)
    y, run, w = np.concatenate(labels), np.concatenate(runs), np.concatenate(weights)
    print(f"{len(y):,} rows, {int(y.sum()):,} abnormal, {hard_kept:,} normal ones scored at least "
          f"{args.score} ({time.perf_counter() - t0:.0f} s)", flush=True)
    det = default_estimator(0).fit(X, y, groups=run, threshold_weights=w)
    print(f"fitted ({time.perf_counter() - t0:.0f} s); threshold {det.threshold_:.3f}")
    save_model(det, args.out, metrics={"hard_score": args.score},
               training_data=(X, y), extra={"preset": "default", "seed": 0,
                                            "hard_negatives": args.cap})


if __name__ == "__main__":
    main()
