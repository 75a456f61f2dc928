"""How often does a healthy job get a suspect, on fresh jobs no constant was chosen on?

``holmes bench localize`` measures it on its healthy sweep (300 seeded jobs), and the
localizer's floors were set while reading that sweep's alarms. This script draws other healthy
jobs of the same kind (every layout, 64-256 GPUs, 10-24 iterations, jitter 0.01-0.1, compute
and transfer drift; another draw seed and other simulator seeds), localizes each with the
bundled model and prints the share given a suspect, with its Wilson 95 % interval, by jitter,
and the jobs flagged. Run it with ``PYTHONPATH`` at another checkout to compare versions on the
very same jobs; a checkout older than ``f4a9e89`` (whose ``healthy_sweep`` takes no draw) needs
this version's ``holmes_ml/bench/localize.py`` copied in (it decides the jobs, not the verdicts).

Usage: ``.venv/bin/python scripts/healthy_holdout.py --jobs 200`` (about 10 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
from collections import Counter

from tqdm import tqdm

from holmes_ml.bench.localize import _sim_config, _wilson, healthy_sweep
from holmes_ml.io.schema import without_labels
from holmes_ml.localize import LocalizeConfig
from holmes_ml.pipeline import analyze
from holmes_ml.simulator import simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200, help="healthy jobs (default 200)")
    parser.add_argument("--draw", type=int, default=7001,
                        help="seed of the knob draw (default 7001; the bench uses 2026)")
    parser.add_argument("--first-seed", type=int, default=5000,
                        help="simulator seed of the first job (default 5000; the bench: 2000)")
    args = parser.parse_args()
    jobs = healthy_sweep(False, draw=args.draw, first_seed=args.first_seed, n=args.jobs)
    flagged: list[tuple[dict, str]] = []
    seen: Counter = Counter()
    hit: Counter = Counter()
    for sc in tqdm(jobs, desc="healthy jobs", unit="job"):
        res = simulate(_sim_config(sc))
        verdict = analyze(without_labels(res.ops), res.topology, config=LocalizeConfig())
        seen[sc["jitter"]] += 1
        if verdict.candidates:
            hit[sc["jitter"]] += 1
            flagged.append((sc, ",".join(c.device for c in verdict.candidates[:2])))
    k, n = sum(hit.values()), len(jobs)
    lo, hi = _wilson(k, n)
    print(f"healthy jobs given a suspect: {k} of {n} ({k / n:.1%}, 95 % CI {lo:.1%}-{hi:.1%})")
    for j in sorted(seen):
        print(f"  jitter {j:g}: {hit[j]} of {seen[j]}")
    for sc, named in flagged:
        print(f"  seed {sc['seed']}: {sc['gpus']} GPUs {sc['dims']}, jitter {sc['jitter']}, "
              f"drift {sc['drift']}, transfer drift {sc['comm_drift']}: {named}")


if __name__ == "__main__":
    main()
