"""Would any iteration of the bench's jobs be timed end to end?

``holmes_ml.features.iteration_times`` times an iteration end to end (from the previous
iteration's last end) only where its operators' span, or their part from the last rank's
arrival on, is less than ``SPAN_FRACTION`` (0.5) of that end-to-end time. This script simulates
the jobs of ``holmes bench localize`` (each with its fault at the grid's severity, and again at
``--boost`` times it, since the bench rescales severities toward a target) and prints, per sweep
and layout, the largest end-to-end time over span and over the part from the last arrival on
that any iteration reached, and how many iterations were timed end to end. A largest ratio below
``1 / SPAN_FRACTION`` (2) means every iteration of those jobs is timed by its span.

Usage: ``.venv/bin/python scripts/end_to_end_check.py`` (every job up to 1,024 GPUs, about 20
minutes on 2 cores); ``--max-gpus 256`` for a quicker pass; ``--sweep noisy``.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import pandas as pd
from joblib import Parallel, delayed
from tqdm import tqdm

from holmes_ml.bench.localize import _sim_config, healthy_sweep, noisy_sweep, scenarios
from holmes_ml.features import iteration_table
from holmes_ml.features.iterations import last_arrivals


def _one(sc: dict, boost: float) -> list[dict]:
    from holmes_ml.simulator import FaultSpec, simulate

    rows = []
    specs: list[tuple] = [()]
    if sc["fault"]:
        spec = FaultSpec.parse(sc["fault"])
        specs = [(spec,), (replace(spec, severity=spec.severity * boost),)]
    for faults in specs:
        try:
            ops = simulate(_sim_config(sc, faults)).ops
        except ValueError:  # a fault the job cannot host (the bench skips it too)
            continue
        t = iteration_table(ops)
        span = (t["end_ns"] - t["start_ns"]).to_numpy(dtype=np.float64)
        step = np.diff(t["end_ns"].to_numpy()) / np.maximum(np.diff(t.index.to_numpy()), 1)
        last = last_arrivals(ops["iteration"].to_numpy(np.int64),
                             ops["rank"].to_numpy(np.int64), ops["start_ns"].to_numpy(np.int64))[1]
        covered = (t["end_ns"].to_numpy() - last).astype(np.float64)
        rows.append({"sweep": sc.get("sweep", "grid"), "dims": sc["dims"], "gpus": sc["gpus"],
                     "kind": sc["kind"], "seed": sc["seed"],
                     "severity": faults[0].severity if faults else 0.0,
                     "max_step_over_span": float((step / span[1:]).max()) if len(step) else 0.0,
                     "max_step_over_last": (float((step / np.maximum(covered[1:], 1.0)).max())
                                            if len(step) else 0.0),
                     "end_to_end": int(t["end_to_end"].sum())})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep", choices=("all", "grid", "healthy", "noisy"), default="all")
    ap.add_argument("--max-gpus", type=int, default=1024)
    ap.add_argument("--boost", type=float, default=4.0,
                    help="also simulate each fault at this many times its severity")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    jobs = {"grid": [s for s in scenarios(False) if not s.get("sweep")],
            "healthy": healthy_sweep(False), "noisy": noisy_sweep(False)}
    picked = [s for name, js in jobs.items() if args.sweep in ("all", name) for s in js
              if s["gpus"] <= args.max_gpus]
    done = Parallel(n_jobs=args.workers, return_as="generator_unordered")(
        delayed(_one)(sc, args.boost) for sc in picked)
    out = list(tqdm(done, total=len(picked), desc="jobs"))
    df = pd.DataFrame([r for rows in out for r in rows])
    summary = df.groupby(["sweep", "dims"]).agg(
        simulations=("seed", "size"), max_step_over_span=("max_step_over_span", "max"),
        max_step_over_last=("max_step_over_last", "max"), end_to_end=("end_to_end", "sum"))
    print(summary.round(3).to_string())
    worst = df.loc[df["max_step_over_span"].idxmax()]
    print(f"\n{len(df)} simulations of {len(picked)} jobs; largest end-to-end time over span "
          f"{worst['max_step_over_span']:.3f} ({worst['sweep']}, {worst['dims']}, "
          f"{worst['gpus']} GPUs, {worst['kind']}, seed {worst['seed']}, severity "
          f"{worst['severity']:g}); largest over the part from the last arrival on "
          f"{df['max_step_over_last'].max():.3f}; iterations timed end to end: "
          f"{int(df['end_to_end'].sum())}")


if __name__ == "__main__":
    main()
