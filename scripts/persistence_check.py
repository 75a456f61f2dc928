"""Would a longer memory catch what the detector misses under a persistent network fault?

The detector's history features look at the op's last ``window`` occurrences, which a
persistent fault fills within ``window`` iterations. This script asks whether a feature that
remembers further back would separate the copies the bundled model misses on one held-out job
of ``holmes bench detector`` from the normal copies that look like them (as far out against
the same step on their pipeline stage, ``stage_step_z``, as the median missed one: the
look-alikes of ``scripts/miss_profile.py``). Four candidates, each per op signature (rank,
communicator, op, position in the iteration, size) and from earlier iterations only:

* ``stage_z_mean``: the mean of the signature's last 10 ``stage_step_z`` (clipped to +-5): a
  copy the fault keeps prolonging stands out against its stage iteration after iteration;
* ``vs_lowest``: log of the duration over the lowest rolling median (of 10) the signature has
  had so far: a fault raises the level the signature had before it began;
* ``vs_first``: log of the duration over the signature's median in its first 10 iterations;
* ``shift_frac``: the rise of the signature's recent level (median of its last 5 copies) over
  its lowest rolling median so far, over the copy's duration: an estimate of the delay the
  fault adds, over the duration, the ratio the label's 15 % is a bar for
  (``scripts/level_shift.py`` trains the detector with it).

For each op with 20 or more missed copies it prints the copies, then per candidate the area
under the ROC curve of missed against look-alike copies (0.5: no separation) and both medians.

Usage: ``.venv/bin/python scripts/persistence_check.py --run 2 4 6`` (the persistent NIC at 256
GPUs, link at 1,024 and switch at 4,096; about five minutes on 2 cores).
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
from sklearn.metrics import roc_auc_score

from holmes_ml.bench.detector import heldout_scenarios
from holmes_ml.features import FEATURE_COLUMNS, build_features
from holmes_ml.features.build import signature_codes
from holmes_ml.models import default_model
from holmes_ml.simulator import simulate

WINDOW = 10


def _candidates(ops: pd.DataFrame, feats: pd.DataFrame) -> dict[str, np.ndarray]:
    """Each candidate's value per row of ``ops`` (NaN where a signature has no past yet)."""
    frame = pd.DataFrame({
        "sig": signature_codes(ops), "it": ops["iteration"].to_numpy(),
        "dur": ops["duration_us"].to_numpy(dtype=float),
        "z": np.clip(feats["stage_step_z"].to_numpy(dtype=float), -5, 5)})
    frame = frame.sort_values(["sig", "it"], kind="stable")
    key = frame["sig"]
    past_z = frame.groupby(key)["z"].transform(
        lambda s: s.shift(1).rolling(WINDOW, min_periods=1).mean())
    rolling = frame.groupby(key)["dur"].transform(
        lambda s: s.shift(1).rolling(WINDOW, min_periods=3).median())
    lowest = rolling.groupby(key).cummin()
    recent = frame.groupby(key)["dur"].transform(
        lambda s: s.shift(1).rolling(5, min_periods=3).median())
    first = frame.groupby(key)["dur"].transform(lambda s: s.iloc[:WINDOW].median())
    values = {"stage_z_mean": past_z, "vs_lowest": np.log(frame["dur"] / lowest),
              "vs_first": np.log(frame["dur"] / first),
              "shift_frac": (recent - lowest).clip(lower=0) / frame["dur"]}
    # back to the order of ops
    return {name: pd.Series(np.asarray(v), index=frame.index).sort_index().to_numpy()
            for name, v in values.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=int, nargs="+", default=[4],
                        help="held-out jobs 0-9 of the detector bench (default 4)")
    args = parser.parse_args()
    cfgs = heldout_scenarios()
    model = default_model()
    for run in args.run:
        if not 0 <= run < len(cfgs):
            parser.error(f"--run: got {run}; expected 0-{len(cfgs) - 1}")
        cfg = cfgs[run]
        ops = simulate(cfg).ops.reset_index(drop=True)
        feats = build_features(ops)
        flagged = np.asarray(model.predict(feats.loc[:, list(FEATURE_COLUMNS)])).astype(bool)
        abnormal = ops["abnormal"].to_numpy(dtype=bool)
        fault = cfg.faults[0]
        print(f"job {run}: {cfg.gpus} GPUs, {cfg.model}, {fault.kind} {fault.pattern}: "
              f"{int(abnormal.sum())} abnormal, recall {flagged[abnormal].mean():.3f}")
        values = _candidates(ops, feats)
        kind = ops["group_kind"].astype(str).to_numpy()
        op = ops["op"].astype(str).to_numpy()
        z = feats["stage_step_z"].to_numpy(dtype=float)
        for k, o in sorted(set(zip(kind[abnormal], op[abnormal], strict=True))):
            same = (kind == k) & (op == o)
            missed = same & abnormal & ~flagged
            if missed.sum() < 20:
                continue
            alike = same & ~abnormal & (z >= np.median(z[missed]))
            print(f"  {k} {o}: {int(missed.sum())} missed, {int(alike.sum())} look-alikes")
            if not alike.any():
                continue
            both = missed | alike
            for name, v in values.items():
                x = np.nan_to_num(v[both], nan=0.0)
                is_missed = missed[both]
                print(f"    {name:13s} AUC {roc_auc_score(is_missed, x):.3f}  median missed "
                      f"{np.median(x[is_missed]):.2f}, look-alike {np.median(x[~is_missed]):.2f}")


if __name__ == "__main__":
    main()
