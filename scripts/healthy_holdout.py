"""How often does a healthy job get a suspect, on fresh jobs no constant was chosen on?

``holmes bench localize`` measures it on its healthy sweep (300 seeded jobs), and the
localizer's floors were set while reading that sweep's alarms. This script draws other healthy
jobs of the same kind (every layout, 64-256 GPUs, 10-24 iterations, jitter 0.01-0.1, compute
and transfer drift; another draw seed and other simulator seeds), localizes each with the
bundled model (or ``--model FILE``) and prints the share given a suspect, with its Wilson 95 %
interval, by jitter, and the jobs flagged. With ``--faulty`` it draws the bench's other sweep
instead, noisy jobs each with one fault (see ``noisy_sweep``), and prints the share whose top
suspect is the faulty device, by jitter and fault kind, and the misses. Run it with
``PYTHONPATH`` at another checkout to compare versions on the very same jobs; a checkout older
than ``7c3eecd`` (whose bench ``_trials`` takes no method subset or model) needs this version's
``holmes_ml/bench/localize.py`` copied in (it draws and scores the jobs; the verdicts stay the
checkout's).

Usage: ``.venv/bin/python scripts/healthy_holdout.py --jobs 200`` (about 10 minutes on 2 cores);
``--faulty --draw 8001 --first-seed 8000 --jobs 60 --model plain.holmes`` for a model trained
with ``holmes train --preset plain --out plain.holmes``; ``--faulty --kinds switch_congested
--draw 8003 --first-seed 8200 --jobs 60`` for congested switches on noisy clusters (a kind the
bench's noisy sweep does not draw).
"""

from __future__ import annotations

import argparse
from collections import Counter

from tqdm import tqdm

from holmes_ml.bench.localize import NOISY_KINDS, _trials, _wilson, healthy_sweep, noisy_sweep
from holmes_ml.models import load_model


def _rows(jobs: list[dict], model) -> list[dict]:
    """The bench's ``holmes`` rows for ``jobs`` (each its own fault-free twin), with ``model``;
    faults a layout cannot host or that never make an iteration irregular are skipped, as in
    the bench."""
    rows: list[dict] = []
    for sc in tqdm(jobs, desc="jobs", unit="job"):
        rows += _trials([sc], None, only=("holmes",), model=model)[0]
    return rows


def _faulty(jobs: list[dict], model) -> None:
    """Top-1 on faulty jobs drawn like the bench's noisy sweep (same scoring and skips)."""
    seen: Counter = Counter()
    hit: Counter = Counter()
    rows = _rows(jobs, model)
    for row in rows:
        for key in (("jitter", row["jitter"]), ("kind", row["kind"])):
            seen[key] += 1
            hit[key] += row["top1"]
    k, n = sum(r["top1"] for r in rows), len(rows)
    lo, hi = _wilson(k, n)
    print(f"faulty jobs with the fault on top: {k} of {n} ({k / max(n, 1):.1%}, "
          f"95 % CI {lo:.1%}-{hi:.1%})")
    for key in sorted(seen, key=str):
        print(f"  {key[0]} {key[1]}: {hit[key]} of {seen[key]}")
    for r in rows:
        if not r["top1"]:
            print(f"  seed {r['seed']}: {r['gpus']} GPUs {r['dims']}, {r['fault']}, jitter "
                  f"{r['jitter']}, transfer drift {r['comm_drift']}: "
                  f"{r['named'] or 'nothing named'}")


def _healthy(jobs: list[dict], model) -> None:
    """Share of healthy jobs given a suspect, by jitter, and the jobs flagged."""
    seen: Counter = Counter()
    hit: Counter = Counter()
    rows = _rows(jobs, model)
    for row in rows:
        seen[row["jitter"]] += 1
        hit[row["jitter"]] += row["flagged"]
    k, n = sum(hit.values()), len(rows)
    lo, hi = _wilson(k, n)
    print(f"healthy jobs given a suspect: {k} of {n} ({k / max(n, 1):.1%}, 95 % CI "
          f"{lo:.1%}-{hi:.1%})")
    for j in sorted(seen):
        print(f"  jitter {j:g}: {hit[j]} of {seen[j]}")
    for r in rows:
        if r["flagged"]:
            print(f"  seed {r['seed']}: {r['gpus']} GPUs {r['dims']}, jitter {r['jitter']}, "
                  f"drift {r['drift']}, transfer drift {r['comm_drift']}: {r['named']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200, help="jobs to draw (default 200)")
    parser.add_argument("--draw", type=int, default=7001,
                        help="seed of the knob draw (default 7001; the bench's sweeps: "
                             "2026 healthy, 2027 faulty)")
    parser.add_argument("--first-seed", type=int, default=5000,
                        help="simulator seed of the first job (default 5000; the bench's "
                             "sweeps: 2000, 3000)")
    parser.add_argument("--model", default=None,
                        help="model envelope to localize with (default: the bundled model)")
    parser.add_argument("--faulty", action="store_true",
                        help="draw faulty noisy jobs (the bench's noisy sweep) instead")
    parser.add_argument("--kinds", default=",".join(NOISY_KINDS),
                        help="with --faulty: comma-separated fault kinds to draw from (default "
                             f"the bench's: {','.join(NOISY_KINDS)}; also switch_congested)")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error(f"--jobs: got {args.jobs}; expected at least 1")
    model = load_model(args.model) if args.model else None
    if args.faulty:
        kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
        try:
            jobs = noisy_sweep(False, draw=args.draw, first_seed=args.first_seed, n=args.jobs,
                               kinds=kinds)
        except ValueError as exc:
            parser.error(f"--kinds {args.kinds}: {exc}")
        _faulty(jobs, model)
    else:
        _healthy(healthy_sweep(False, draw=args.draw, first_seed=args.first_seed, n=args.jobs),
                 model)


if __name__ == "__main__":
    main()
