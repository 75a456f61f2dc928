"""Would the rise of an op signature's level since its best iterations close the 256-4,096 GPU
gap of ``holmes bench detector``?

The idea: if a persistent fault added about the same delay ``d`` to a signature's copies (rank,
communicator, op, position in the iteration, size) iteration after iteration while jitter draws
a new duration each time, then, since the simulator calls a copy abnormal only when ``d`` is
over 15 % of its fault-free duration (and the copy is outside its step's usual range), among
copies prolonged alike the *shorter* ones would be the abnormal ones: the label would turn on
``d`` over the duration, which none of the detector's columns estimates. This script estimates
``d`` per copy from earlier iterations only, as the signature's recent level (median of its last
5 copies) less its lowest level so far (the lowest rolling median of 10: a fault that began
after the log did has not reached it), and gives four columns: ``sig_shift_frac`` (that rise
over the copy's duration), ``sig_now_frac`` (the copy's own excess over the lowest level, over
its duration), ``sig_lowest_ratio`` (duration over the lowest level) and ``sig_recent_lowest``
(recent level over the lowest). It trains the shipped detector's trees
(``scale_free_estimator``, seed 0) on the default training mix with and without them and prints
the bench's per-scale F1 on the bench's held-out rows (its first row reproduces the bench's
shipped row) and each variant's per-run table.
``scripts/persistence_check.py`` gives the same rise's separation (``shift_frac``) of the
missed copies from their normal look-alikes.

``--delays`` looks at the estimate itself on the bench's three persistent network-fault jobs
(held-out runs 2, 4 and 6): for the pipeline receives and tensor-parallel all_reduces the fault
prolonged (``affected``) from iteration 8 on, the correlation of ``sig_shift_frac`` with the
true delay over the duration (the duration less the fault-free twin's, which the simulator
computes for its labels and this mode has it keep as a column), the median coefficient of
variation of the true delay over a signature's iterations, and the true ratio's median for the
abnormal copies and for the others; then where the abnormal copies sit from the fault's onset on:
how many signatures hold one, what share of those signatures' copies are abnormal, and what share
of the normal copies outside their step's usual range on the stage (``stage_step_z`` >= 3) sit
on signatures that hold none. (What it finds: the delay varies from one iteration to the next,
and a signature's copies are abnormal in a few of its iterations; ``docs/results.md``.)

``--oracle`` gives the trees, instead of the level columns, where each job's fault truly is
(:func:`location_columns`): what a second pass driven by a perfect localizer could tell them
about the copies its delay reaches.

Usage: ``.venv/bin/python scripts/level_shift.py`` (6 minutes on 2 cores; ``--quick``: the
tiny preset and the bench's quick held-out jobs, a smoke test; ``--delays``: a minute or two;
``--oracle``: 3 minutes).

The figures docs/results.md quotes from this script were made at ``828d6be``, before the
detector's columns took in the lowest level (``level_rise_frac``, ``level_excess_frac``) and
the default training mix every kind in every pattern from the plain and the noisy mix; run it
in a checkout of that commit to reproduce them.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pandas as pd

from holmes_ml.bench.detector import (
    _per_run_rows,
    _scores_row,
    heldout_dataset,
    heldout_scenarios,
)
from holmes_ml.features import FEATURE_COLUMNS, build_features
from holmes_ml.features.build import signature_codes
from holmes_ml.models.training import make_dataset, scale_free_estimator, scenarios
from holmes_ml.simulator import engine, simulate

SHIFT = ("sig_shift_frac", "sig_now_frac", "sig_lowest_ratio", "sig_recent_lowest")
LOCATION = ("at_fault_group", "at_fault_hops")
VARIANTS = {"detector's columns": (), "+ the four level columns": SHIFT,
            "+ sig_shift_frac, sig_now_frac": SHIFT[:2]}


def level_columns(ops: pd.DataFrame, recent: int = 5, level: int = 10) -> pd.DataFrame:
    """The four columns of the module docstring per row of ``ops`` (0 before a signature has
    three earlier copies). A signature's copies form one column of an iterations x signatures
    matrix, so the rolling medians run over all signatures at once."""
    o = ops.reset_index(drop=True)
    it = o["iteration"].to_numpy(np.int64)
    it = it - it.min()
    sig = signature_codes(o)
    dur = o["duration_us"].to_numpy(np.float64)
    grid = np.full((int(it.max()) + 1, int(sig.max()) + 1), np.nan)
    grid[it, sig] = dur
    before = pd.DataFrame(grid).shift(1)  # earlier iterations only
    lowest = before.rolling(level, min_periods=3).median().cummin().to_numpy()[it, sig]
    now = before.rolling(recent, min_periods=3).median().to_numpy()[it, sig]
    d = np.maximum(dur, 1.0)
    low = np.maximum(lowest, 1.0)
    return pd.DataFrame({
        "sig_shift_frac": np.clip(now - lowest, 0, None) / d,
        "sig_now_frac": np.clip(dur - lowest, 0, None) / d,
        "sig_lowest_ratio": dur / low,
        "sig_recent_lowest": now / low,
    }).fillna(0.0).astype(np.float32)


def location_columns(ops: pd.DataFrame, faults) -> pd.DataFrame:
    """``--oracle``: where the faults are, as the simulator resolved them (their ranks: a
    faulty GPU's or host's, the ranks on a slow NIC, the ranks whose traffic crosses a slow link
    or switch). ``at_fault_group``: the op's communicator holds one of them;
    ``at_fault_hops``: how many communicators away the op's rank is from one (0 for one of
    them, 9 beyond 4 hops or without a fault)."""
    bad = {int(r) for f in faults for r in f.ranks}
    members = [[int(r) for r in c.split()] for c in ops["group_ranks"].cat.categories]
    world = int(ops["rank"].max()) + 1
    near: list[set[int]] = [set() for _ in range(world)]
    for m in members:
        for r in m:
            if r < world:
                near[r].update(x for x in m if x < world)
    hops = np.full(world, 9.0)
    ring = [r for r in bad if r < world]
    hops[ring] = 0
    for step in range(1, 5):
        ring = [x for r in ring for x in near[r] if hops[x] > step]
        hops[ring] = step
    holds = np.array([any(r in bad for r in m) for m in members], dtype=np.float32)
    return pd.DataFrame({"at_fault_group": holds[ops["group_ranks"].cat.codes.to_numpy()],
                         "at_fault_hops": hops[ops["rank"].to_numpy()]}).astype(np.float32)


@contextmanager
def twin_durations() -> Iterator[None]:
    """While inside, simulated ops carry ``twin_us``: each copy's duration in the fault-free
    twin, which the engine computes for the labels and does not write."""
    frame = engine.Engine._frame

    def with_twin(self, it, out):
        df = frame(self, it, out)
        if self.S >= 2:
            df["twin_us"] = np.concatenate([c.dur0 for c in out])
        return df

    engine.Engine._frame = with_twin  # type: ignore[method-assign]
    try:
        yield
    finally:
        engine.Engine._frame = frame  # type: ignore[method-assign]


def delays() -> None:
    """``--delays``: the estimate against the true delay (module docstring)."""
    cfgs = heldout_scenarios()
    for run in (2, 4, 6):
        with twin_durations():
            ops = simulate(cfgs[run]).ops.reset_index(drop=True)
        dur = ops["duration_us"].to_numpy(np.float64)
        true = (dur - ops["twin_us"].to_numpy(np.float64)) / np.maximum(dur, 1.0)
        est = level_columns(ops)["sig_shift_frac"].to_numpy()
        sig = signature_codes(ops)
        y = ops["abnormal"].to_numpy(dtype=bool)
        prolonged = ops["affected"].to_numpy(dtype=bool) & (ops["iteration"].to_numpy() >= 8)
        kind, op = ops["group_kind"].astype(str), ops["op"].astype(str)
        far = np.nan_to_num(build_features(ops)["stage_step_z"].to_numpy()) >= 3
        onset = ops["iteration"].to_numpy() >= cfgs[run].faults[0].start_iteration
        print(f"job {run}: {cfgs[run].gpus} GPUs, {cfgs[run].faults[0].kind}")
        for k, o in (("pp", "recv"), ("tp", "all_reduce")):
            m = onset & (kind == k).to_numpy() & (op == o).to_numpy()
            share = pd.Series(y[m]).groupby(sig[m]).mean()
            normal_far = share.reindex(sig[m & far & ~y]).to_numpy()
            print(f"  {k} {o}: {int((share > 0).sum())} of its {len(share)} signatures hold an "
                  f"abnormal copy, {np.median(share[share > 0]):.2f} of their copies (median); "
                  f"{np.mean(normal_far == 0):.2f} of its {len(normal_far)} normal copies with "
                  "stage_step_z >= 3 sit on signatures without one")
            m = prolonged & (kind == k).to_numpy() & (op == o).to_numpy()
            delay = pd.Series(dur[m] * true[m]).groupby(sig[m])
            cv = (delay.std() / delay.mean())[delay.size() >= 5]
            print(f"  {k} {o}: {int(m.sum())} prolonged copies ({int((m & y).sum())} abnormal); "
                  f"corr(sig_shift_frac, true delay / duration) "
                  f"{np.corrcoef(est[m], true[m])[0, 1]:.2f}; the delay's variation over a "
                  f"signature's iterations (median CV) {cv.median():.2f}; true delay / duration "
                  f"abnormal {np.median(true[m & y]):.3f}, the others {np.median(true[m & ~y]):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test in a minute")
    parser.add_argument("--delays", action="store_true",
                        help="the estimate against the true delay, on three held-out jobs")
    parser.add_argument("--oracle", action="store_true",
                        help="the faults' true location as columns instead")
    args = parser.parse_args()
    if args.delays:
        delays()
        return
    def columns(res) -> pd.DataFrame:
        ops = res.ops.reset_index(drop=True)
        return location_columns(ops, res.faults) if args.oracle else level_columns(ops)

    X, y, run, w = make_dataset(scenarios("tiny" if args.quick else "default", 0),
                                return_weights=True, progress=True, columns=columns)
    cfgs = heldout_scenarios(args.quick)
    Xh, yh, runh, wh = heldout_dataset(args.quick, columns=columns)
    scales = sorted({c.gpus for c in cfgs})
    scale_of = np.array([cfgs[r].gpus for r in runh])
    variants = ({"detector's columns": (), "+ the faults' location": LOCATION} if args.oracle
                else VARIANTS)
    for name, extra in variants.items():
        cols = [*FEATURE_COLUMNS, *extra]
        model = scale_free_estimator(0).fit(X[cols], y, groups=run, threshold_weights=w)
        pred = np.asarray(model.predict(Xh[cols])).astype(bool)
        print(_scores_row(name, yh, pred, scale_of, scales, wh), flush=True)
        for r in _per_run_rows(yh, pred, runh, cfgs, wh):
            print("   ", r)


if __name__ == "__main__":
    main()
