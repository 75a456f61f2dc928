"""Would the shipped detector gain from training on small jobs (16 and 32 GPUs) too?

Trains the shipped configuration (:func:`~holmes_ml.models.training.default_estimator`, seed 0)
on the default mix, and on the default mix plus 12 runs of 16 and 32 GPUs drawn the way the
default mix draws its runs, then scores both on the rows of ``holmes bench detector``'s held-out
jobs (as ``scripts/detector_ab.py`` does: the default row reproduces the bench's exactly) and
on 20 fresh jobs of 8-48 GPUs, one per fault kind and size (F1 over every op of each job).

Usage: ``.venv/bin/python scripts/small_jobs_ab.py [--cache heldout.joblib]`` (about 4 minutes
on 2 cores, 2.5 with the held-out rows cached by an earlier run).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from detector_ab import _heldout
from sklearn.metrics import f1_score, precision_score, recall_score

from holmes_ml.bench.detector import _scores_row
from holmes_ml.models.training import MIXES, _mix, default_estimator, make_dataset, scenarios
from holmes_ml.simulator import FaultSpec, SimConfig

_KINDS = ("gpu_slow", "nic_slow", "link_slow", "switch_congested", "host_stall")
_PATTERNS = ("persistent", "spike", "fluctuation")


def small_scenarios(seed: int = 0) -> list:
    """Six runs each of 16 and 32 GPUs, drawn as the default mix draws its runs."""
    rng = np.random.default_rng((seed, 7))
    return _mix(((16, 32), 6, 20), MIXES["plain"], rng, seed, first=1000)


def small_test_jobs() -> list:
    """One job per fault kind at 8, 16, 32 and 48 GPUs, seeds never used in training."""
    out = []
    for i, (gpus, kind) in enumerate((g, k) for g in (8, 16, 32, 48) for k in _KINDS):
        out.append(SimConfig(gpus=gpus, model="llama2-7b" if i % 2 else "llama2-13b",
                             iterations=20, seed=5000 + i,
                             faults=(FaultSpec(kind=kind, pattern=_PATTERNS[i % 3], severity=0.5,
                                               start_iteration=6),)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=None,
                        help="joblib file for the held-out rows (read if it exists)")
    args = parser.parse_args()
    cfgs, Xh, yh, gh, wh = _heldout(args.cache)
    scales = tuple(dict.fromkeys(c.gpus for c in cfgs))
    scale_of = np.array([c.gpus for c in cfgs])[gh]
    test = small_test_jobs()
    Xs, ys, gs, ws = make_dataset(test, seed=5, return_weights=True)
    for name, mix in (("default", scenarios("default", 0)),
                      ("default + 16/32 GPUs", scenarios("default", 0) + small_scenarios(0))):
        t = time.perf_counter()
        X, y, run, w = make_dataset(mix, return_weights=True)
        det = default_estimator(0).fit(X, y, groups=run, threshold_weights=w)
        row = _scores_row(name, yh, np.asarray(det.predict(Xh)).astype(bool), scale_of, scales,
                          wh)
        print(f"\n{name} ({time.perf_counter() - t:.0f} s): held-out F1 by scale "
              + ", ".join(f"{s}: {row[str(s)]}" for s in scales)
              + f"; pooled {row['all']}")
        ps = np.asarray(det.predict(Xs)).astype(bool)
        print(f"  8-48 GPU jobs pooled: F1 {f1_score(ys, ps, sample_weight=ws):.3f} "
              f"precision {precision_score(ys, ps, sample_weight=ws):.3f} "
              f"recall {recall_score(ys, ps, sample_weight=ws):.3f}")
        for j, c in enumerate(test):
            m = gs == j
            f = c.faults[0]
            if not m.any():  # skipped by make_dataset (a fault the job cannot host)
                print(f"   {c.gpus:>3} {f.kind:<17} not simulated: the job cannot host it")
                continue
            if not ys[m].any():
                print(f"   {c.gpus:>3} {f.kind:<17} no abnormal op; flagged {int(ps[m].sum())}")
                continue
            print(f"   {c.gpus:>3} {f.kind:<17} {f.pattern:<12} abnormal {int(ys[m].sum()):>5} "
                  f"F1 {f1_score(ys[m], ps[m], sample_weight=ws[m]):.3f}")


if __name__ == "__main__":
    main()
