"""The comm-gap rule on tp8 hosts, scored per host as the node agents do: slow GPUs over several
seeds (from iteration 3, and from the first iteration, which makes no iteration irregular), and
healthy jobs at 3-10 % jitter (with and without drift) that must stay unblamed.

Each 8-GPU host of a LLaMA2-70B tp8 x pp8 job is one tensor-parallel group, the case the rule
exists for (see ``holmes_ml.localize.rules._comm_gap_candidates``). Prints, per job, the per-host
verdict's first candidates and the rule of their first evidence.

Usage: ``.venv/bin/python scripts/comm_gap_check.py`` (256 GPUs; under a minute on 2 cores);
``--seeds 2 10`` picks the faulty jobs' seed range.
"""

from __future__ import annotations

import argparse

import numpy as np

from holmes_ml.io import without_labels
from holmes_ml.localize import LocalizeConfig
from holmes_ml.pipeline import localize_summaries, summarize_per_host
from holmes_ml.simulator import FaultSpec, SimConfig, simulate


def _per_host(cfg: SimConfig, loc: LocalizeConfig) -> str:
    res = simulate(cfg)
    v = localize_summaries(summarize_per_host(without_labels(res.ops), None, loc), res.topology,
                           loc)
    named = [(list(c.ranks), c.evidence[0].rule if c.evidence else "") for c in v.candidates[:2]]
    return f"irregular {list(v.irregular_iterations)}; named {named or 'nothing'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=256)
    parser.add_argument("--seeds", type=int, nargs=2, default=(2, 10), metavar=("FIRST", "END"))
    args = parser.parse_args()
    loc = LocalizeConfig()
    for start in (3, 0):
        print(f"slow GPU (severity 1.0 from iteration {start} of 8):")
        for seed in range(*args.seeds):
            rank = int(np.random.default_rng(seed).integers(0, args.gpus))
            spec = FaultSpec.parse(f"gpu_slow:rank={rank},severity=1.0,start={start}")
            cfg = SimConfig(gpus=args.gpus, model="llama2-70b", tp=8, pp=8, iterations=8,
                            seed=seed, faults=(spec,))
            print(f"  seed {seed}, GPU {rank}: {_per_host(cfg, loc)}")
    print("healthy (10 iterations):")
    for i in range(6):
        jitter, drift = (0.03, 0.06, 0.1)[i % 3], 0.2 if i % 2 else 0.0
        cfg = SimConfig(gpus=args.gpus, model="llama2-70b", tp=8, pp=8, iterations=10,
                        seed=100 + i, jitter=jitter, drift=drift)
        print(f"  seed {100 + i}, jitter {jitter}, drift {drift}: {_per_host(cfg, loc)}")


if __name__ == "__main__":
    main()
