"""GPU or host: which kind does the verdict give a single-rank straggler, layout by layout?

A slow GPU (``gpu_slow``, 1.5x compute) or a pause of one rank's host (``host_stall``, half an
iteration) on a random rank, from iteration 3 of 12 (``analyze`` with the default model). Pure
data parallelism (2 operators a step) cannot tell them apart (``LocalizeConfig.kind_min_ops``):
the verdict should name the rank's GPU tied with its host. With pipeline or tensor parallelism
it should name the kind injected. Prints one line per job and the counts; the closing note of
session 37 quotes ``python scripts/gpu_or_host.py`` (30 jobs, seconds).
"""

from __future__ import annotations

import argparse

from holmes_ml.io import without_labels
from holmes_ml.pipeline import analyze
from holmes_ml.simulator import FaultSpec, SimConfig, simulate

#: (GPUs, tp, pp) of the jobs: pure data parallelism at two sizes, then pipeline and tensor
LAYOUTS = ((16, 1, 1), (64, 1, 1), (32, 1, 2), (32, 1, 4), (32, 2, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = ap.parse_args()
    counts = {"pure DP: right rank, gpu tied with its host": [0, 0],
              "pipeline/tensor: right rank and kind": [0, 0]}
    for gpus, tp, pp in LAYOUTS:
        for kind in ("gpu_slow", "host_stall"):
            for seed in args.seeds:
                res = simulate(SimConfig(
                    gpus=gpus, model="llama2-7b", tp=tp, pp=pp, iterations=12, seed=seed,
                    faults=(FaultSpec.parse(f"{kind}:severity=0.5,start=3"),)))
                verdict = analyze(without_labels(res.ops), res.topology)
                fault = res.faults[0]
                top = verdict.candidates[0] if verdict.candidates else None
                rank_ok = top is not None and set(top.ranks) == {int(r) for r in fault.ranks}
                host = f"host:{res.topology.ranks.set_index('rank').loc[int(fault.ranks[0]), 'host']}"
                if tp == pp == 1:
                    key = "pure DP: right rank, gpu tied with its host"
                    ok = rank_ok and top.kind.value == "gpu" and top.tied_with == (host,)
                else:
                    key = "pipeline/tensor: right rank and kind"
                    ok = rank_ok and top.kind.value == kind.split("_")[0] and not top.tied_with
                counts[key][0] += bool(ok)
                counts[key][1] += 1
                named = "-" if top is None else f"{top.kind.value} {top.device} {top.tied_with}"
                print(f"{gpus:>3} GPUs tp{tp} pp{pp} {kind:<10} seed {seed}: {named}"
                      f" (injected {fault.devices[0]}) {'ok' if ok else 'MISS'}", flush=True)
    for key, (ok, n) in counts.items():
        print(f"{key}: {ok} of {n}")


if __name__ == "__main__":
    main()
