"""Would the detector do better across fault kinds with every kind in training at every scale,
and with a memory of each op's lowest level?

The kind grid of ``holmes bench detector`` (every fault kind at every scale) shows the shipped
detector far below its ten held-out jobs' figures on cells those jobs never drew: a persistent
slow GPU on LLaMA2-70B at 1,024-4,096 GPUs, where the fault lengthens every copy of the
data-parallel reduce_scatter alike (no copy stands out from its peers) and the op's history
absorbs the new level after a few iterations; and network-fault spikes. The default training
mix has 30 runs: per scale one healthy and five faulty, the kinds cycling within a scale and
the pattern changing from one scale to the next, so each (kind, pattern) meets one or two of
the five training scales. This script trains the shipped detector's trees
(:func:`~holmes_ml.models.training.scale_free_estimator`, seed 0) on

- ``default``: the bundled model's mix, and
- ``full``: drawn the same way (the same random stream and knob ranges) with 16 runs per scale
  (one healthy, every kind in every pattern: 80 runs, 1.8 M rows),

each with the detector's columns alone, and with ``scripts/level_shift.py``'s columns (the
signature's recent level and the copy over its lowest level so far: ``+ level 2``, the first
two; ``+ level 4``, all four), and scores each on the grid's persistent jobs at 64-4,096 GPUs
and spikes at 64-1,024 (one job per cell, the bench's seeds for the persistent cells; the spike
cells on the seeds the persistent ones use) and on the bench's own held-out rows.

Usage: ``.venv/bin/python scripts/coverage_check.py`` (21 minutes on 2 cores beside a bench run);
``--variants "default:detector's columns" "full:+ level 4"`` for some of them; ``--cache FILE``
keeps the rows (some 3 GB) for the next run.

The figures docs/results.md quotes from this script were made at ``828d6be``, before the
detector's columns took in the lowest level (``level_rise_frac``, ``level_excess_frac``) and
the default training mix every kind in every pattern from the plain and the noisy mix; run it
in a checkout of that commit to reproduce them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import joblib
import numpy as np
import pandas as pd
from level_shift import SHIFT, level_columns

from holmes_ml.bench.detector import (
    HELDOUT_OTHER_ROWS,
    _grid_rows,
    _scores_row,
    heldout_dataset,
    heldout_scenarios,
    kind_grid_scenarios,
)
from holmes_ml.features import FEATURE_COLUMNS
from holmes_ml.models.training import (
    MIXES,
    PRESETS,
    _mix,
    make_dataset,
    scale_free_estimator,
    scenarios,
)

COLUMNS = {"detector's columns": (), "+ level 2": SHIFT[:2], "+ level 4": SHIFT}
VARIANTS = ("default:detector's columns", "full:detector's columns", "default:+ level 2",
            "full:+ level 2", "full:+ level 4")


def full_mix() -> list:
    """Runs drawn as the default mix draws them, 16 per scale: every kind in every pattern."""
    scales, _, iterations = PRESETS["default"]
    return _mix((scales, 16, iterations), MIXES["plain"], np.random.default_rng(0), 0, first=0)


def _columns(res) -> pd.DataFrame:
    return level_columns(res.ops.reset_index(drop=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS),
                        help="TRAINING:COLUMNS pairs (training: default or full; columns: "
                             + ", ".join(repr(c) for c in COLUMNS) + ")")
    parser.add_argument("--cache", type=Path, default=None,
                        help="joblib file for every run's rows (read if it exists, as it is)")
    args = parser.parse_args()
    wanted = [v.split(":", 1) for v in args.variants]
    for v, (mix, cols) in zip(args.variants, wanted, strict=True):
        if mix not in ("default", "full") or cols not in COLUMNS:
            parser.error(f"--variants: got {v!r}; expected TRAINING:COLUMNS with TRAINING "
                         f"default or full and COLUMNS one of {sorted(COLUMNS)}")
    t0 = time.perf_counter()
    grid_cfgs = (kind_grid_scenarios((64, 256, 1024, 4096), ("persistent",))
                 + kind_grid_scenarios((64, 256, 1024), ("spike",)))
    bench_cfgs = heldout_scenarios()
    if args.cache is not None and args.cache.exists():
        training, grid, bench = joblib.load(args.cache)
    else:
        training = {mix: make_dataset(scenarios("default", 0) if mix == "default"
                                      else full_mix(), return_weights=True, columns=_columns)
                    for mix in ("default", "full")}
        grid = make_dataset(grid_cfgs, max_normal_per_run=HELDOUT_OTHER_ROWS[0], seed=1,
                            return_weights=True, columns=_columns)
        bench = heldout_dataset(columns=_columns)
        if args.cache is not None:
            joblib.dump((training, grid, bench), args.cache)
    Xg, yg, gg, wg = grid
    Xh, yh, gh, wh = bench
    bench_scales = [c.gpus for c in bench_cfgs]
    scales = sorted({c.gpus for c in grid_cfgs})
    print(f"rows ready ({time.perf_counter() - t0:.0f} s)", flush=True)
    for mix, cols in wanted:
        X, y, run, w = training[mix]
        use = [*FEATURE_COLUMNS, *COLUMNS[cols]]
        model = scale_free_estimator(0).fit(X[use], y, groups=run, threshold_weights=w)
        print(f"\n== trained on {mix} ({len(y):,} rows), {cols}", flush=True)
        pg = np.asarray(model.predict(Xg[use])).astype(bool)
        for r in _grid_rows(np.asarray(yg).astype(bool), pg, gg, grid_cfgs, wg):
            if r["pattern"] == "all":
                continue
            print(f"  {r['pattern']:<11} {r['fault']:<17}"
                  + "".join(f"{s:>6}: {r[str(s)]:.3f}" for s in scales if r[str(s)] is not None))
        ph = np.asarray(model.predict(Xh[use])).astype(bool)
        row = _scores_row(cols, np.asarray(yh).astype(bool), ph,
                          np.array(bench_scales)[gh], sorted(set(bench_scales)), wh)
        print("  bench's held-out rows:", row, flush=True)


if __name__ == "__main__":
    main()
