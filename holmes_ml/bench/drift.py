"""``holmes bench drift``: F1 over time on a long drifting run — adjusted vs untuned vs retrained.

* untuned: a detector trained on a drift-free run, applied as is;
* tuned: the same detector wrapped in :class:`~holmes_ml.models.DriftAwareDetector` (time features
  of each window rescaled to the training scale — the Holmes threshold shift, no retraining);
* retrained: a detector refit on the labelled previous window (the costly upper reference).

The default feature set is mostly relative (z-scores, ratios to the op's own history and to its
peers), so it is largely drift-invariant by construction. The ``abs-*`` arms show the threshold
shift where it matters: a forest that sees only the microsecond-valued columns (as a detector on
raw durations would), untuned vs tuned. The long run drifts compute (``drift``) and every
transfer (``comm_drift``) by the same factor.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
from sklearn.metrics import f1_score

from holmes_ml.bench.record import BenchResult

logger = logging.getLogger(__name__)

#: Arms compared window by window (see the module docstring).
ARMS: tuple[str, ...] = ("tuned", "untuned", "retrained", "abs-tuned", "abs-untuned")


def run(quick: bool = False, out_dir: str | Path | None = None) -> BenchResult:
    """Simulate a long run with drift and compare the three arms window by window."""
    from holmes_ml.features import FEATURE_COLUMNS, TIME_FEATURES, build_features
    from holmes_ml.models import DriftAwareDetector, LightGBMDetector
    from holmes_ml.simulator import FaultSpec, SimConfig, simulate

    iters, window, drift = (60, 10, 0.4) if quick else (200, 20, 0.45)
    t0 = time.perf_counter()
    fault = FaultSpec(kind="gpu_slow", pattern="fluctuation", severity=0.5, probability=0.5)
    train = simulate(SimConfig(gpus=64, iterations=window * 2, seed=1, faults=(fault,)))
    Xtr, ytr = build_features(train.ops), train.ops["abnormal"].to_numpy(dtype=bool)
    base = LightGBMDetector(n_estimators=60, threshold="auto", random_state=0)
    tuned = DriftAwareDetector(base, adjust=True).fit(Xtr, ytr)
    untuned = DriftAwareDetector(base, adjust=False).fit(Xtr, ytr)
    relative = tuple(c for c in FEATURE_COLUMNS if c not in TIME_FEATURES)
    abs_base = LightGBMDetector(n_estimators=60, threshold="auto", random_state=0,
                                ignore_features=relative)
    abs_tuned = DriftAwareDetector(abs_base, adjust=True).fit(Xtr, ytr)
    abs_untuned = DriftAwareDetector(abs_base, adjust=False).fit(Xtr, ytr)
    long = simulate(SimConfig(gpus=64, iterations=iters, seed=2, drift=drift, comm_drift=drift,
                              faults=(fault,)))
    F, y = build_features(long.ops), long.ops["abnormal"].to_numpy(dtype=bool)
    it = long.ops["iteration"].to_numpy()
    rows = []
    prev = None
    for w0 in range(0, iters, window):
        m = (it >= w0) & (it < w0 + window)
        if not y[m].any():
            continue
        row = {"window_start": w0,
               "tuned": float(f1_score(y[m], tuned.predict(F[m]).astype(bool))),
               "scale": round(tuned.last_scale_, 4),
               "untuned": float(f1_score(y[m], untuned.predict(F[m]).astype(bool))),
               "abs-tuned": float(f1_score(y[m], abs_tuned.predict(F[m]).astype(bool))),
               "abs-untuned": float(f1_score(y[m], abs_untuned.predict(F[m]).astype(bool)))}
        if prev is not None and 0 < y[prev].sum() < prev.sum():
            re = LightGBMDetector(n_estimators=60, threshold="auto", random_state=0)
            re.fit(F[prev], y[prev])
            row["retrained"] = float(f1_score(y[m], re.predict(F[m]).astype(bool)))
        else:
            row["retrained"] = row["untuned"]
        rows.append({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
        prev = m
    plots = []
    if out_dir is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        Path(out_dir).mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(7, 3.5))
        xs = [r["window_start"] for r in rows]
        for arm in ARMS:
            ax.plot(xs, [r[arm] for r in rows], marker="o", label=arm,
                    linestyle="--" if arm.startswith("abs-") else "-")
        ax.set_xlabel("iteration (window start)")
        ax.set_ylabel("op-level F1")
        ax.set_title(f"drift {drift:.0%} over {iters} iterations")
        ax.legend()
        fig.tight_layout()
        fig.savefig(Path(out_dir) / "drift.png", dpi=100)
        plt.close(fig)
        plots.append("drift.png")
    figures = {f"mean_f1_{a}": float(np.mean([r[a] for r in rows])) for a in ARMS}
    last = rows[-1] if rows else {}
    figures.update({f"last_window_f1_{a}": float(last[a]) for a in ARMS if a in last})
    figures["seconds"] = time.perf_counter() - t0
    return BenchResult(
        name="drift", figures=figures,
        config={"quick": quick, "iterations": iters, "window": window, "drift": drift,
                "comm_drift": drift, "gpus": 64},
        tables={"F1 per window": rows}, plots=plots,
    )
