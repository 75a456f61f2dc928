"""How often does a healthy job get a suspect when its logs are read without a topology?

``holmes bench localize`` gives every job its placement (hosts, NICs, leaf and spine switches).
Logs read alone - the CommOps logger's, a Kineto trace, ``holmes localize`` with no
``topology.json`` - give hosts and communicators only: NICs are then the only network devices.
This script draws healthy jobs like the bench's healthy sweep (every layout, 64-256 GPUs, 10-24
iterations, jitter 1-10 %, compute and transfer drift; ``--draw`` and ``--first-seed`` give
fresh ones), localizes each with the bundled model twice, with the job's placement and without
it, and prints the share given a suspect by jitter, and the jobs flagged.

Usage: ``.venv/bin/python scripts/no_placement_check.py --jobs 60`` (about 5 minutes on one
core); ``--draw 7302 --first-seed 73020`` for a second draw; ``--set quiet_persistence=0`` for the
verdicts without the quiet-window NIC rule.
"""

from __future__ import annotations

import argparse
from collections import Counter

from tqdm import tqdm

from holmes_ml.bench.localize import _sim_config, _wilson, healthy_sweep
from holmes_ml.cli._checks import config_overrides
from holmes_ml.io import without_labels
from holmes_ml.localize import LocalizeConfig
from holmes_ml.pipeline import analyze
from holmes_ml.simulator import simulate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--draw", type=int, default=7301, help="seed of the job draw")
    ap.add_argument("--first-seed", type=int, default=7300, help="first job's simulator seed")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a LocalizeConfig setting, as for holmes localize (quiet_persistence=0: "
                    "the verdicts before that rule)")
    args = ap.parse_args()
    config = LocalizeConfig(**config_overrides(args.set, LocalizeConfig))
    modes = ("with placement", "without")
    seen: Counter = Counter()
    flagged: Counter = Counter()
    lines: list[str] = []
    jobs = healthy_sweep(False, draw=args.draw, first_seed=args.first_seed, n=args.jobs)
    for sc in tqdm(jobs, desc="jobs", unit="job"):
        cfg = _sim_config(sc)
        res = simulate(cfg)
        ops = without_labels(res.ops)
        for mode, topology in zip(modes, (res.topology, None), strict=True):
            verdict = analyze(ops, topology, config=config)
            seen[mode, cfg.jitter] += 1
            if verdict.candidates:
                flagged[mode, cfg.jitter] += 1
                top = verdict.candidates[0]
                lines.append(f"{mode}: {sc['dims']} {cfg.gpus} GPUs seed {cfg.seed} "
                             f"jitter {cfg.jitter:g} "
                             f"drift {cfg.drift:g} transfer drift {cfg.comm_drift:g}: "
                             f"{top.device} (score {top.score:.2f})")
    for mode in modes:
        k = sum(v for (m, _), v in flagged.items() if m == mode)
        n = sum(v for (m, _), v in seen.items() if m == mode)
        lo, hi = _wilson(k, n)
        by = ", ".join(f"jitter {j:g}: {flagged[mode, j]} of {seen[mode, j]}"
                       for (m, j) in sorted(seen) if m == mode)
        print(f"{mode}: a suspect in {k} of {n} healthy jobs (95 % CI {lo:.1%}-{hi:.1%}; {by})")
    for line in lines:
        print("   ", line)


if __name__ == "__main__":
    main()
