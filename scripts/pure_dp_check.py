"""Pure data-parallel jobs, healthy and faulty: what the iteration timing changes.

Simulates 64-GPU jobs with ``tp=1 pp=1`` (one gradient all-reduce after each step's compute),
20 iterations, and localizes them with the bundled model:

* ``healthy``: seeds ``--first-seed`` on, each at 3 % and 10 % jitter; prints the irregular
  iterations, the jobs with any, and the jobs given a suspect (a false alarm);
* ``faulty``: each seed with a slow GPU, a host stall and a slow NIC, persistent or a spike from
  iteration 8, at ``--severity`` (the simulator's default when omitted); prints per fault how
  often the top suspect is the faulty device or tied with it, and each NIC job's slowdown end to
  end and by the all-reduce's span against the same seed without the fault.

Run it on another checkout with ``PYTHONPATH=<checkout> .venv/bin/python
scripts/pure_dp_check.py ...`` to compare. docs/verdict.md quotes ``healthy --first-seed 200 --jobs
60`` and ``faulty --first-seed 300 --jobs 10`` (and ``--severity 2``).
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from holmes_ml.features import iteration_table
from holmes_ml.io import without_labels
from holmes_ml.pipeline import analyze
from holmes_ml.simulator import FaultSpec, SimConfig, simulate


def _sim(seed: int, jitter: float = 0.03, fault: str | None = None):  # noqa: ANN202
    faults = (FaultSpec.parse(fault),) if fault else ()
    return simulate(SimConfig(gpus=64, tp=1, pp=1, iterations=20, seed=seed, jitter=jitter,
                              faults=faults))


def healthy(first: int, jobs: int) -> None:
    irregular = with_any = suspects = 0
    for seed in range(first, first + jobs):
        for jitter in (0.03, 0.1):
            res = _sim(seed, jitter)
            v = analyze(without_labels(res.ops), res.topology)
            irregular += len(v.irregular_iterations)
            with_any += bool(v.irregular_iterations)
            suspects += bool(v.candidates)
    print(f"{2 * jobs} healthy jobs: {irregular} irregular iterations, {with_any} jobs with any, "
          f"{suspects} jobs given a suspect")


def faulty(first: int, jobs: int, severity: float | None) -> None:
    hits: Counter[str] = Counter()
    runs: Counter[str] = Counter()
    sev = "" if severity is None else f",severity={severity:g}"
    for seed in range(first, first + jobs):
        twin = iteration_table(_sim(seed).ops)
        for kind in ("gpu_slow", "host_stall", "nic_slow"):
            for pattern in ("persistent", "spike"):
                res = _sim(seed, fault=f"{kind}:pattern={pattern},start=8{sev}")
                truth = res.faults[0].to_dict()["devices"][0]
                v = analyze(without_labels(res.ops), res.topology)
                top = v.candidates[0] if v.candidates else None
                ok = top is not None and (top.device == truth or truth in top.tied_with)
                key = f"{kind} {pattern}"
                runs[key] += 1
                hits[key] += ok
                if kind == "nic_slow":
                    t = iteration_table(res.ops)
                    e2e = float((np.diff(t["end_ns"]) / np.diff(twin["end_ns"])).max())
                    span = float(((t["end_ns"] - t["start_ns"])
                                  / (twin["end_ns"] - twin["start_ns"])).max())
                    print(f"seed {seed} {key}: {truth} slows the job x{e2e:.3f} end to end, "
                          f"x{span:.3f} by the span; top suspect "
                          f"{top.device if top else None} "
                          f"(tied with {len(top.tied_with) if top else 0}): {ok}")
    print("named (top suspect, or tied with it):",
          ", ".join(f"{k} {hits[k]}/{runs[k]}" for k in runs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("which", choices=("healthy", "faulty"))
    ap.add_argument("--first-seed", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=60, help="seeds (healthy: two jobs each)")
    ap.add_argument("--severity", type=float, help="faulty: fault severity")
    args = ap.parse_args()
    if args.which == "healthy":
        healthy(args.first_seed, args.jobs)
    else:
        faulty(args.first_seed, args.jobs, args.severity)


if __name__ == "__main__":
    main()
