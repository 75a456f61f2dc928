"""Are two commits' features (and the bundled model's scores) the same, bit for bit?

A speed change to ``build_features`` that claims to compute the same features is checked with
this script: ``save`` at the commit before it writes every feature matrix and score vector to
``--dir``; ``compare`` at the commit after it recomputes them and names the columns that
differ. The jobs: the job ``holmes bench features`` times (2.0 M ops), the ten held-out jobs of
``holmes bench detector`` (``--quick``: its two quick ones) and three small simulated jobs under
13 feature configurations (windows 1 to 40, regular-only history, level memory 1 and 3, clips
0.5 and 2, blocks of 1,000 rows).

Usage (about 2.5 minutes per side on 2 cores, 9 GB in ``--dir``; ``--quick``: 20 s, 0.3 GB)::

    git worktree add /tmp/before HEAD~1   # the code before the change
    PYTHONPATH=/tmp/before .venv/bin/python scripts/feature_parity.py save
    .venv/bin/python scripts/feature_parity.py compare
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from holmes_ml._malloc import keep_freed_memory
from holmes_ml.features import FEATURE_COLUMNS, FeatureConfig, build_features
from holmes_ml.models import default_model

CONFIGS = {
    "window40": FeatureConfig(window=40), "window33": FeatureConfig(window=33),
    "window32": FeatureConfig(window=32), "window3": FeatureConfig(window=3),
    "window1": FeatureConfig(window=1), "regular": FeatureConfig(history_regular_only=True),
    "regular7": FeatureConfig(window=7, history_regular_only=True),
    "blocks1000": FeatureConfig(chunk_rows=1000), "memory1": FeatureConfig(level_memory=1),
    "memory3": FeatureConfig(level_memory=3, window=4),
    "clip2": FeatureConfig(min_spread=0.0, clip=2.0),
    "clip05": FeatureConfig(clip=0.5, history_regular_only=True), "default": FeatureConfig(),
}


def _jobs(quick: bool):
    """``(name, ops, configs)`` of every job checked."""
    from holmes_ml.bench.detector import heldout_scenarios
    from holmes_ml.bench.features import _simulated_ops
    from holmes_ml.simulator import FaultSpec, SimConfig, simulate

    if not quick:
        yield "bench", _simulated_ops(2_000_000, 0)[0], ["default"]
    for i, cfg in enumerate(heldout_scenarios(quick=quick)):
        yield f"heldout{i}", simulate(cfg).ops, ["default"]
    for seed, kind in ((1, "nic_slow"), (2, "gpu_slow"), (3, "host_stall")):
        fault = FaultSpec(kind=kind, ranks=(3,), start_iteration=5, severity=1.0)
        ops = simulate(SimConfig(seed=seed, iterations=30, faults=(fault,))).ops
        yield f"{kind}{seed}", ops, list(CONFIGS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("save", "compare"))
    parser.add_argument("--dir", type=Path, default=Path("/tmp/feature-parity"))
    parser.add_argument("--quick", action="store_true", help="small jobs only")
    args = parser.parse_args(argv)
    keep_freed_memory()
    args.dir.mkdir(parents=True, exist_ok=True)
    model = default_model()
    differ = 0
    for name, ops, configs in _jobs(args.quick):
        for label in configs:
            X = build_features(ops, CONFIGS[label]).loc[:, list(FEATURE_COLUMNS)]
            scores = model.decision_function(X) if label == "default" else np.zeros(0)
            X = X.to_numpy()
            path = args.dir / f"{name}-{label}"
            if args.mode == "save":
                np.save(f"{path}-X.npy", X)
                np.save(f"{path}-scores.npy", scores)
                continue
            ref = np.load(f"{path}-X.npy")
            diff = ~((ref == X) | (np.isnan(ref) & np.isnan(X)))
            ref_scores = np.load(f"{path}-scores.npy")
            if diff.any() or not np.array_equal(ref_scores, scores):
                differ += 1
                cols = [FEATURE_COLUMNS[j] for j in np.flatnonzero(diff.any(axis=0))]
                print(f"{name} {label}: {int(diff.any(axis=1).sum())} rows differ in {cols}; "
                      f"scores {'differ' if not np.array_equal(ref_scores, scores) else 'same'}")
            else:
                print(f"{name} {label}: the same, bit for bit")
    if args.mode == "compare":
        print("all the same" if not differ else f"{differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
