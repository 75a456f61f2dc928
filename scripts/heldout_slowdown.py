"""Did the fault of each held-out job of ``holmes bench detector`` slow the job at all?

The detector bench scores op-level F1 on ten held-out jobs (two per scale, 64 ... 8,192 GPUs),
whose faults have a fixed severity (0.5) rather than one sized to slow the job. This script
simulates each job and its fault-free twin (the same seed without the fault) and prints, per
job, the slowest iteration's time over the twin's (``peak``), the iterations the irregularity
monitor flags at the default delta, and the operator copies labelled ``abnormal``: a fault
whose operators are slower while no iteration is (the slower transfers hide behind compute or
pipeline bubbles) is one the iteration monitor never reports.

Usage: ``.venv/bin/python scripts/heldout_slowdown.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

from dataclasses import replace

from holmes_ml.bench.detector import heldout_scenarios
from holmes_ml.features import detect_irregular, iteration_table
from holmes_ml.simulator import simulate


def main() -> None:
    print("gpus  model       fault             pattern     peak    irregular  abnormal ops")
    for cfg in heldout_scenarios():
        fault = cfg.faults[0]
        res = simulate(cfg)
        times = iteration_table(res.ops)
        twin = iteration_table(simulate(replace(cfg, faults=())).ops)["duration_s"]
        peak = float((times["duration_s"] / twin).max())
        irregular = int(detect_irregular(times)["irregular"].sum())
        print(f"{cfg.gpus:>5} {cfg.model:<11} {fault.kind:<17} {fault.pattern:<11} "
              f"{peak:6.3f}x {irregular:>3} of {len(times):<4} {int(res.ops['abnormal'].sum()):>9,}")


if __name__ == "__main__":
    main()
