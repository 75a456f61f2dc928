"""The shipped detector's row of ``holmes bench detector`` for other training mixes, in minutes.

``holmes bench detector`` trains nine detectors and takes most of an hour. To compare training
mixes (or a saved model) this script scores only the shipped configuration
(:func:`~holmes_ml.models.training.default_estimator`) on the very rows the bench scores: the
bench's ten held-out jobs, every abnormal or affected op plus 100,000 of the others of each,
weighted back to their job. ``--preset default`` reproduces the bench's ``lgbm`` row and
per-run table exactly. Each ``--preset`` is trained as the bench trains it (seed 0, the
decision threshold from out-of-fold scores of held-out runs); each ``--model`` is a saved
envelope scored as it is (``bundled`` for the shipped one).

Usage: ``.venv/bin/python scripts/detector_ab.py --preset default --preset wide``
(about 2 minutes for the held-out rows, then 1-3 minutes per preset on 2 cores; ``--cache
FILE`` keeps the held-out rows for the next run).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import joblib
import numpy as np

from holmes_ml.bench.detector import (
    _per_run_rows,
    _scores_row,
    heldout_dataset,
    heldout_scenarios,
)
from holmes_ml.models import default_model, load_model
from holmes_ml.models.training import PRESETS, default_estimator, make_dataset, scenarios


def _heldout(cache: Path | None):
    if cache is not None and cache.exists():
        return joblib.load(cache)
    data = (heldout_scenarios(), *heldout_dataset())
    if cache is not None:
        joblib.dump(data, cache)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", action="append", default=[], choices=sorted(PRESETS),
                        help="train the shipped configuration on this preset (repeatable)")
    parser.add_argument("--model", action="append", default=[],
                        help="score a saved model envelope, or 'bundled' (repeatable)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="joblib file for the held-out rows (read if it exists)")
    args = parser.parse_args()
    if not args.preset and not args.model:
        parser.error("give at least one --preset or --model")
    t0 = time.perf_counter()
    cfgs, Xh, yh, gh, wh = _heldout(args.cache)
    scales = tuple(dict.fromkeys(c.gpus for c in cfgs))
    scale_of = np.array([c.gpus for c in cfgs])[gh]
    print(f"held-out rows ready: {len(yh):,} rows, {int(yh.sum()):,} abnormal "
          f"({time.perf_counter() - t0:.0f} s)")
    candidates = [("preset", p) for p in args.preset] + [("model", m) for m in args.model]
    for kind, what in candidates:
        name = f"{kind} {what}"
        t = time.perf_counter()
        if kind == "preset":
            X, y, run, w = make_dataset(scenarios(what, seed=0), return_weights=True)
            det = default_estimator(0).fit(X, y, groups=run, threshold_weights=w)
        else:
            det = default_model() if what == "bundled" else load_model(what)
        pred = np.asarray(det.predict(Xh)).astype(bool)
        row = _scores_row(name, yh, pred, scale_of, scales, wh)
        print(f"\n{name} ({time.perf_counter() - t:.0f} s): F1 by scale "
              + ", ".join(f"{s}: {row[str(s)]}" for s in scales)
              + f"; mean {row['mean']}, pooled {row['all']}, precision {row['precision']}")
        for r in _per_run_rows(yh, pred, gh, cfgs, wh):
            print(f"  {r['gpus']:>5} {r['model']:<11} {r['fault']:<17} {r['pattern']:<10} "
                  f"precision {r['precision']:.3f} recall {r['recall']:.3f} F1 {r['f1']:.3f}")


if __name__ == "__main__":
    main()
