"""CPU seconds of the compiled parts of feature extraction and scoring, beside what they replaced
where that is still in the package, on the job ``holmes bench features`` times (2.0 M ops).

Prints, best of ``--repeats`` calls each:

* the screen (QuickScorer passes) on every row, and the 100-tree model walked row by row on the
  rows the screen passes, beside LightGBM's own ``Booster.predict`` of the same rows;
* the medians by group through sorting networks (the stage step's crowd, the replay's usual
  gap) beside selection one group at a time (``group_median_kernel``);
* the group minimum of the same step's instances beside ``np.minimum.at``;
* the history's 15 gathers back to row order with ``mode="clip"`` into one row beside plain
  ``take``.

Usage (about a minute on 2 cores)::

    .venv/bin/python scripts/speed_parts.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from holmes_ml._malloc import keep_freed_memory
from holmes_ml.bench.features import _simulated_ops
from holmes_ml.features import FEATURE_COLUMNS, build, build_features
from holmes_ml.features import _segments as seg
from holmes_ml.models import default_model


def best(work, repeats: int) -> float:
    """The least CPU seconds of ``repeats`` calls of ``work`` (after one untimed call)."""
    work()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        work()
        times.append(time.process_time() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    keep_freed_memory()
    ops, _ = _simulated_ops(2_000_000, seed=0)
    r = args.repeats

    # the arguments of the steps, caught as build_features calls them
    caught: dict[str, tuple] = {}

    def catch(name):
        original = getattr(build, name)

        def spy(*a, **k):
            caught.setdefault(name, (a, k))
            return original(*a, **k)
        setattr(build, name, spy)
        return original

    originals = {name: catch(name) for name in ("_stage_step", "_same_step", "_history")}
    features = build_features(ops)
    for name, func in originals.items():
        setattr(build, name, func)

    model = default_model()
    X = np.asfortranarray(features.loc[:, list(FEATURE_COLUMNS)].to_numpy())
    screen, detector = model.screen_, model.detector_
    passed = np.flatnonzero(screen._scores_all_columns(X) >= model.screen_cut_)
    Xp = X[passed]
    booster = detector.estimator_.booster_
    used = np.asarray(detector.used_features_)
    print(f"{len(ops):,} ops, the screen passes {len(passed):,}")
    print(f"screen (QuickScorer)              {best(lambda: screen._scores_all_columns(X), r):.4f} s")
    print(f"100-tree model walked row-wise    "
          f"{best(lambda: detector._scores_all_columns(Xp), r):.4f} s")
    Xu = Xp[:, used].astype(np.float64)
    print(f"  LightGBM Booster.predict        "
          f"{best(lambda: booster.predict(Xu, num_threads=1), r):.4f} s")

    (_, key, dur, _, layout), _ = caught["_stage_step"]
    bound, rows = layout
    print(f"stage crowd, networks (med + MAD) "
          f"{best(lambda: seg.group_median_mad(bound, rows, dur), r):.4f} s")

    def selection(values):
        values = np.ascontiguousarray(values, dtype=np.float64)
        k = seg.order_key(values)
        groups = np.arange(len(bound) - 1)
        med = seg.group_median_kernel(bound, rows, k, k, values, groups)
        centre = np.empty(len(values))
        centre[rows] = np.repeat(med, np.diff(bound))
        adev = np.abs(values - centre)
        return seg.group_median_kernel(bound, rows, seg.order_key(adev), k, adev, groups)
    print(f"  selection one group at a time   {best(lambda: selection(dur), r):.4f} s")

    (_, step, instance, *_), _ = caught["_same_step"]
    n_inst = int(instance.max()) + 1
    top = np.iinfo(np.int64).max
    print(f"same step's minimum, compiled     "
          f"{best(lambda: seg.reduce_at(np.minimum, instance, step, n_inst, top), r):.4f} s")

    def at():
        out = np.full(n_inst, top)
        np.minimum.at(out, instance, step)
    print(f"  np.minimum.at                   {best(at, r):.4f} s")

    (_, _, _, _, sig, iteration, *_), _ = caught["_history"]
    order = seg.sort_by(sig, iteration)
    back = np.empty(len(order), dtype=np.int64)
    back[order] = np.arange(len(order))
    rows15 = np.random.default_rng(0).random((15, len(order))).astype(np.float32)
    gathered = np.empty(len(order), dtype=np.float32)

    def clip():
        for row in rows15:
            np.take(row, back, out=gathered, mode="clip")
            row[:] = gathered

    def plain():
        for row in rows15:
            row[:] = row.take(back)
    print(f"history's 15 gathers, mode=clip   {best(clip, r):.4f} s")
    print(f"  plain take                      {best(plain, r):.4f} s")


if __name__ == "__main__":
    main()
