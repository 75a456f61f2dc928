"""Where does the shipped detector miss on one held-out job of ``holmes bench detector``?

Re-simulates one of the bench's ten held-out jobs (``--run`` 0-9, in the order of the bench's
per-run table: 64, 256, 1,024, 4,096, 8,192 GPUs, a persistent fault then a spike at each),
scores every op with the bundled model and prints, per communicator kind and op, the abnormal
copies, the share caught (recall) and the false alarms; then, for the op with the most misses
(or ``--op``), the median features of its caught and missed abnormal copies beside its normal
copies and beside the normal copies as far out against their stage's same step
(``stage_step_z``) as the median missed one: when those look like the missed ones, the features
cannot tell them apart; and how many of each fall before the fault's start (far-out normal
copies there are jitter's). Last, every copy by how much the fault prolonged it (its duration
over the same copy's in the job's fault-free twin, kept by ``label_reach``'s hook on the
engine): the label calls a copy the fault prolonged ``abnormal`` only when it is also longer
than the twin's copies of its op step usually are, so copies prolonged alike fall on both sides
of the label; the table shows how many of each there are in each band, how many the detector
flags and how many of its misses were inside their step's usual range in the twin, then how many
copies were outside their op step's usual range in the twin already (jitter's waits the fault
lengthened), and the median features of the abnormal and normal copies of the band with the most
misses. Read it to see which waits the features do not tell apart, not as a figure of merit:
that is the bench.

``--grid GPUS PATTERN KIND`` profiles a job of the bench's kind grid instead (every fault kind at
every scale, :func:`~holmes_ml.bench.detector.kind_grid_scenarios`). Between the two tables it
prints, iteration by iteration from the fault's start, the profiled op's abnormal copies, how many
are caught and the median ``hist_ratio`` (duration over the op's own recent history) of the caught
and of the missed ones.

Usage: ``.venv/bin/python scripts/miss_profile.py --run 4`` (the 1,024-GPU persistent slow
link; about 10 seconds); ``--grid 1024 persistent gpu_slow`` (as long; 4,096 GPUs about a
minute).
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
from label_reach import _frame_with_twin

from holmes_ml.bench.detector import (
    GRID_KINDS,
    SCALES,
    heldout_scenarios,
    kind_grid_scenarios,
)
from holmes_ml.features import FEATURE_COLUMNS, build_features
from holmes_ml.models import default_model
from holmes_ml.simulator import simulate
from holmes_ml.simulator.engine import Engine

#: bands of the fault's prolongation (duration over the twin's)
BANDS = (0.0, 1.05, 1.15, 1.3, 1.5, 2.0, 4.0, np.inf)

SHOWN = ("duration_us", "wait_us", "xfer_us", "arrived_last", "hist_ratio", "step_ratio",
         "stage_step_ratio", "stage_step_z", "step_xfer_ratio", "late_prev_stage_ratio",
         "late_prev_xfer_ratio")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=int, default=4, help="held-out job 0-9 (default 4)")
    parser.add_argument("--op", help="KIND/OP to profile, e.g. tp/all_reduce (default: the op "
                        "with the most misses)")
    parser.add_argument("--grid", nargs=3, metavar=("GPUS", "PATTERN", "KIND"),
                        help="profile this job of the bench's kind grid instead, e.g. 1024 "
                             "persistent gpu_slow")
    args = parser.parse_args()
    if args.grid:
        grid = kind_grid_scenarios(SCALES[0])
        want = (args.grid[0], args.grid[1], args.grid[2])
        found = [c for c in grid if (str(c.gpus), c.faults[0].pattern, c.faults[0].kind) == want]
        if not found:
            parser.error(f"--grid: got {' '.join(want)}; expected GPUS in {SCALES[0]}, "
                         f"PATTERN persistent or spike, KIND in {', '.join(GRID_KINDS)}")
        cfg, name = found[0], "grid job"
    else:
        cfgs = heldout_scenarios()
        if not 0 <= args.run < len(cfgs):
            parser.error(f"--run: got {args.run}; expected 0-{len(cfgs) - 1}")
        cfg, name = cfgs[args.run], f"job {args.run}"
    fault = cfg.faults[0]
    print(f"{name}: {cfg.gpus} GPUs, {cfg.model}, {fault.kind} {fault.pattern}, seed {cfg.seed}")
    Engine._frame = _frame_with_twin
    ops = simulate(cfg).ops
    feats = build_features(ops)
    model = default_model()
    flagged = np.asarray(model.predict(feats.loc[:, list(FEATURE_COLUMNS)])).astype(bool)
    frame = pd.DataFrame({
        "kind": ops["group_kind"].astype(str).to_numpy(),
        "op": ops["op"].astype(str).to_numpy(),
        "abnormal": ops["abnormal"].to_numpy(dtype=bool),
        "flagged": flagged,
    })
    frame["caught"] = frame["abnormal"] & frame["flagged"]
    frame["false_alarm"] = ~frame["abnormal"] & frame["flagged"]
    table = frame.groupby(["kind", "op"]).agg(
        abnormal=("abnormal", "sum"), caught=("caught", "sum"),
        false_alarms=("false_alarm", "sum"))
    table = table[(table["abnormal"] > 0) | (table["false_alarms"] > 0)]
    table["recall"] = (table["caught"] / table["abnormal"].where(table["abnormal"] > 0)).round(3)
    print(table.to_string())
    misses = table["abnormal"] - table["caught"]
    if not (misses > 0).any():
        print("no abnormal copy missed")
        return
    kind, op = args.op.split("/", 1) if args.op else misses.idxmax()
    same = (frame["kind"] == kind) & (frame["op"] == op)
    missed = same & frame["abnormal"] & ~frame["flagged"]
    if not missed.any():
        print(f"no abnormal {kind} {op} copy missed")
        return
    # normal copies as far out against their stage's same step as the typical missed one
    z = feats["stage_step_z"].to_numpy()
    far = same & ~frame["abnormal"] & (z >= np.median(z[missed.to_numpy()]))
    groups = {"caught": same & frame["caught"], "missed": missed,
              "normal": same & ~frame["abnormal"], "normal, as far out": far}
    medians = pd.DataFrame({name: feats.loc[mask.to_numpy(), list(SHOWN)].median()
                            for name, mask in groups.items()})
    print(f"\nmedian features of {kind} {op} copies")
    print(medians.round(3).to_string())
    print("copies: " + ", ".join(f"{name} {int(mask.sum())}" for name, mask in groups.items()))
    # by iteration: the missed copies start with the fault; the far-out normal ones (jitter's
    # waits) come in every iteration, the fault-free ones before it included
    it = ops["iteration"].to_numpy()
    start = fault.start_iteration
    for name in ("missed", "normal, as far out"):
        mask = groups[name].to_numpy()
        print(f"{name} by iteration: {int((mask & (it < start)).sum())} before the fault's "
              f"start (iteration {start}), {int((mask & (it >= start)).sum())} from it on")
    # iteration by iteration: a persistent fault's copies against their own history, which
    # takes the new level in within its window
    hist = feats["hist_ratio"].to_numpy()
    rows = {}
    for i in range(start, int(it.max()) + 1):
        at = same.to_numpy() & (it == i) & frame["abnormal"].to_numpy()
        if at.any():
            c, m = at & frame["flagged"].to_numpy(), at & ~frame["flagged"].to_numpy()
            rows[i] = {"abnormal": int(at.sum()), "caught": int(c.sum()),
                       "hist_ratio_caught": float(np.median(hist[c])) if c.any() else np.nan,
                       "hist_ratio_missed": float(np.median(hist[m])) if m.any() else np.nan}
    print(f"\nabnormal {kind} {op} copies by iteration, and their median hist_ratio")
    print(pd.DataFrame(rows).T.round(3).to_string())
    _by_prolongation(ops, feats, frame)


def _by_prolongation(ops: pd.DataFrame, feats: pd.DataFrame, frame: pd.DataFrame) -> None:
    """Every copy by how much the fault prolonged it: abnormal and normal copies, how many of
    each the detector flags, and the features of both in the band with the most misses."""
    ratio = (ops["duration_us"] / ops["clean_duration_us"].clip(lower=1e-9)).to_numpy()
    band = pd.cut(ratio, BANDS)
    caught, false_alarm = frame["caught"].to_numpy(), frame["false_alarm"].to_numpy()
    abnormal = frame["abnormal"].to_numpy()
    # copies outside their step's usual range without the fault already (jitter's waits),
    # which the fault lengthened: the log shows a wait like the job's other ones
    already = (ops["clean_duration_us"] > ops["clean_step_usual_us"]).to_numpy()
    table = pd.DataFrame({"band": band, "copies": 1, "abnormal": abnormal, "caught": caught,
                          "missed_not_already": abnormal & ~caught & ~already,
                          "normal": ~abnormal, "normal_flagged": false_alarm}).groupby(
        "band", observed=True).sum()
    table["recall"] = (table["caught"] / table["abnormal"].where(table["abnormal"] > 0)).round(3)
    print("\nevery copy by the fault's prolongation (duration over the fault-free twin's; "
          "missed_not_already: missed copies inside their step's usual range in the twin)")
    print(table.to_string())
    print("outside their op step's usual range in the twin already: "
          f"{int((abnormal & already).sum())} abnormal copies (caught "
          f"{int((caught & already).sum())}, missed {int((abnormal & ~caught & already).sum())} "
          f"of the {int((abnormal & ~caught).sum())} missed), {int((~abnormal & already).sum())} "
          f"normal ones (flagged {int((false_alarm & already).sum())})")
    missed = abnormal & ~caught
    if not missed.any():
        return
    worst = pd.Series(missed).groupby(band, observed=True).sum().idxmax()
    inside = np.asarray(band == worst)
    groups = {"abnormal, caught": inside & caught, "abnormal, missed": inside & missed,
              "normal": inside & ~abnormal}
    medians = pd.DataFrame({name: feats.loc[mask, list(SHOWN)].median()
                            for name, mask in groups.items()})
    print(f"\nmedian features of the copies the fault prolonged {worst}x")
    print(medians.round(3).to_string())


if __name__ == "__main__":
    main()
