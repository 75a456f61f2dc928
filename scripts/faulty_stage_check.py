"""Does a faulty device ever read as a heavier pipeline stage?

A slow GPU, NIC, link or switch, or a pausing host, lengthens some ranks' steps, and with them the
time those ranks spend outside communication, from which a heavier stage is read when the logs
carry no compute time. This script simulates every fault kind and pattern on three small layouts
(64 GPUs tp2 pp4, 128 GPUs llama2-13b's default layout, 32 GPUs tp1 pp8; severity 1, 12
iterations), localizes each job with its placement and without it, and prints every
stage-imbalance finding (there should be none) beside the job's first suspect and its fault.

Usage: ``.venv/bin/python scripts/faulty_stage_check.py`` (about 30 seconds);
``--first-seed`` gives other jobs.
"""

from __future__ import annotations

import argparse
import itertools

from tqdm import tqdm

from holmes_ml.io import without_labels
from holmes_ml.pipeline import analyze
from holmes_ml.simulator import FaultSpec, SimConfig, simulate

KINDS = ("gpu_slow", "host_stall", "nic_slow", "link_slow", "switch_congested")
PATTERNS = ("persistent", "fluctuation", "spike")
LAYOUTS = (dict(gpus=64, model="llama2-7b", tp=2, pp=4), dict(gpus=128, model="llama2-13b"),
           dict(gpus=32, model="llama2-7b", tp=1, pp=8))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--first-seed", type=int, default=900, help="first job's simulator seed")
    args = ap.parse_args()
    jobs = list(itertools.product(KINDS, PATTERNS, LAYOUTS))
    found = verdicts = 0
    for i, (kind, pattern, layout) in enumerate(tqdm(jobs, desc="jobs", unit="job")):
        fault = FaultSpec.parse(f"{kind}:pattern={pattern},severity=1")
        res = simulate(SimConfig(iterations=12, seed=args.first_seed + i, faults=(fault,),
                                 **layout))
        for topology in (res.topology, None):
            verdict = analyze(without_labels(res.ops), topology)
            verdicts += 1
            stages = [w for w in verdict.workload_findings if w.kind == "stage-imbalance"]
            if stages:
                found += 1
                top = verdict.candidates[0].device if verdict.candidates else "no suspect"
                print(f"{kind} {pattern} {layout['gpus']} GPUs "
                      f"{'with' if topology is not None else 'without'} placement: "
                      f"{[(w.coords, w.basis) for w in stages]}; first suspect {top}; "
                      f"fault on {res.faults[0].devices}")
    print(f"{len(jobs)} faulty jobs, {verdicts} verdicts: a heavier stage named in {found}")


if __name__ == "__main__":
    main()
