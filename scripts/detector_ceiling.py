"""Is a held-out job of ``holmes bench detector`` hard because training never saw its like,
or because its operator logs cannot tell its abnormal copies from normal ones?

For each ``--run`` (0-9, in the order of the bench's per-run table), the script simulates
``--seeds`` other seeds of exactly that job (same scale, model, layout, fault kind, pattern and
severity: the most favourable training set there can be) and trains on them the shipped
detector's trees (scale-free LightGBM, threshold picked on out-of-fold runs) and the same
trees on every column, absolute microseconds included. It then scores the bench's own
held-out job with them and with the bundled default model, on the rows the bench scores
(every abnormal or affected op and a weighted sample of 100,000 others).

If same-job training does no better than the bundled model, what the job lacks is not
training data like it but features that separate its cases. Read it beside
``scripts/miss_profile.py``, which shows which copies are missed.

Usage: ``.venv/bin/python scripts/detector_ceiling.py --run 2 4 6`` (the three persistent
network faults behind the 256-4,096 GPU gap; about 3 minutes and 4 GB on 2 cores).
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
from sklearn.metrics import f1_score, precision_score, recall_score

from holmes_ml.bench.detector import heldout_scenarios
from holmes_ml.features import FEATURE_COLUMNS
from holmes_ml.models import default_model
from holmes_ml.models.training import absolute_estimator, make_dataset, scale_free_estimator

#: seeds of the sibling training jobs: far from the bench's (500-540) and training's (0-29)
SIBLING_SEED = 9000


def _scores(truth: np.ndarray, pred: np.ndarray, weight: np.ndarray) -> str:
    kw = {"sample_weight": weight, "zero_division": 0.0}
    return (f"precision {precision_score(truth, pred, **kw):.3f}  "
            f"recall {recall_score(truth, pred, **kw):.3f}  "
            f"F1 {f1_score(truth, pred, **kw):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=int, nargs="+", default=[4],
                        help="held-out jobs 0-9 (default 4)")
    parser.add_argument("--seeds", type=int, default=3,
                        help="sibling jobs to train on (default 3)")
    args = parser.parse_args()
    cfgs = heldout_scenarios()
    bad = [r for r in args.run if not 0 <= r < len(cfgs)]
    if bad:
        parser.error(f"--run: got {bad[0]}; expected 0-{len(cfgs) - 1}")
    if args.seeds < 2:
        parser.error(f"--seeds: got {args.seeds}; expected at least 2 (the threshold is "
                     "picked on out-of-fold jobs)")
    shipped = default_model()
    for r in args.run:
        cfg = cfgs[r]
        fault = cfg.faults[0]
        print(f"job {r}: {cfg.gpus} GPUs, {cfg.model}, {fault.kind} {fault.pattern}")
        siblings = [dataclasses.replace(cfg, seed=SIBLING_SEED + 10 * r + k)
                    for k in range(args.seeds)]
        X, y, run, w = make_dataset(siblings, seed=1, return_weights=True)
        Xh, yh, _, wh = make_dataset([cfg], max_normal_per_run=100_000, seed=1,
                                     return_weights=True)
        pred = np.asarray(shipped.predict(Xh.loc[:, list(FEATURE_COLUMNS)])).astype(bool)
        print(f"  bundled model (default mix)      {_scores(yh, pred, wh)}")
        for name, det in (("same-job trees, scale-free", scale_free_estimator(0)),
                          ("same-job trees, every column", absolute_estimator(0))):
            det.fit(X, y, groups=run, threshold_weights=w)
            pred = np.asarray(det.predict(Xh)).astype(bool)
            print(f"  {name:<32} {_scores(yh, pred, wh)}")


if __name__ == "__main__":
    main()
