"""Workload causes, not faults: does the verdict keep devices out of them, and name a heavier
pipeline stage?

Draws fresh jobs like the healthy sweep of ``holmes bench localize`` (every layout, 64-256 GPUs,
10-24 iterations, jitter 1-10 %, compute and transfer drift) and gives each a workload instead
of a fault: every other job a pipeline stage whose compute is 1.15, 1.3 or 1.6 times the
others' (``SimConfig.stage_weights``), the rest (and the jobs of one-stage layouts) data-parallel
replicas whose compute differs from step to step by up to 20 or 50 % (``seq_imbalance``). Both carry no
``abnormal`` label. Each job is localized with the bundled model twice: from its operator log
alone (with the job's placement, and without it, as from a logger that records no parallel
coordinates: stages are then read off the send/recv pairs), and with each rank's compute time per
step (``step_compute_us``, as the ByteDance what-if traces record it; without it the localizer
reads compute as the time outside communication).
Prints, for each, how many verdicts blamed a device, how many heavy stages were named (and
whether the right one), and any stage named in a job without one.

Usage: ``.venv/bin/python scripts/workload_check.py --jobs 60`` (5-10 minutes on 2 cores);
``--draw`` and ``--first-seed`` give other jobs; ``--set KEY=VALUE`` a localizer setting
(``quiet_persistence=0``: without the quiet-window NIC rule).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
from tqdm import tqdm

from holmes_ml.bench.localize import LAYOUTS, _draw_job, _draw_noise, _wilson
from holmes_ml.cli._checks import config_overrides
from holmes_ml.io import without_labels
from holmes_ml.localize import LocalizeConfig
from holmes_ml.pipeline import analyze
from holmes_ml.simulator import SimConfig, simulate

STAGE_WEIGHTS = (1.15, 1.3, 1.6)
SEQ_IMBALANCE = (0.2, 0.5)


def _job(rng: np.random.Generator, i: int, seed: int) -> tuple[SimConfig, str, int | None]:
    """The ``i``-th job, its workload (text) and its heavy stage (None: sequence imbalance)."""
    dims, gpus, iterations = _draw_job(rng, i)
    lay = dict(LAYOUTS[dims])
    model = lay.pop("model", "llama2-7b")
    cfg = SimConfig(gpus=gpus, model=model, iterations=iterations, seed=seed, log_compute=True,
                    **lay, **_draw_noise(rng))
    pp = cfg.layout.pp
    weight = float(rng.choice(STAGE_WEIGHTS))
    stage = int(rng.integers(pp))
    if i % 2 == 0 and pp > 1:
        weights = tuple(weight if s == stage else 1.0 for s in range(pp))
        return (replace(cfg, stage_weights=weights),
                f"{dims} {gpus} GPUs jitter {cfg.jitter:g}: stage {stage} x{weight:g}", stage)
    spread = float(rng.choice(SEQ_IMBALANCE))
    return (replace(cfg, seq_imbalance=spread),
            f"{dims} {gpus} GPUs jitter {cfg.jitter:g}: sequence imbalance {spread:g}", None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--draw", type=int, default=4101, help="seed of the job draw")
    ap.add_argument("--first-seed", type=int, default=4100, help="first job's simulator seed")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a LocalizeConfig setting, as for holmes localize")
    args = ap.parse_args()
    config = LocalizeConfig(**config_overrides(args.set, LocalizeConfig))
    rng = np.random.default_rng(args.draw)
    modes = ("log only", "log only, no placement", "with compute")
    blamed: dict[str, list[str]] = {m: [] for m in modes}
    named = dict.fromkeys(modes, 0)
    wrong = dict.fromkeys(modes, 0)
    stray: dict[str, list[str]] = {m: [] for m in modes}
    heavy = 0
    for i in tqdm(range(args.jobs), desc="jobs", unit="job"):
        cfg, said, stage = _job(rng, i, args.first_seed + i)
        res = simulate(cfg)
        ops = without_labels(res.ops)
        heavy += stage is not None
        plain = ops.drop(columns="step_compute_us")
        for name, table, topology in zip(modes, (plain, plain, ops),
                                         (res.topology, None, res.topology), strict=True):
            verdict = analyze(table, topology, config=config)
            if verdict.candidates:
                top = verdict.candidates[0]
                blamed[name].append(f"{said}: {top.kind.value} {top.device}")
            found = [w.coords.get("pp") for w in verdict.workload_findings
                     if w.kind == "stage-imbalance" and w.coords]
            if stage is None:
                stray[name] += [f"{said}: stage {s} named" for s in found]
            else:
                named[name] += stage in found
                wrong[name] += any(s != stage for s in found)
    n = args.jobs
    for name in modes:
        lines = blamed[name]
        lo, hi = _wilson(len(lines), n)
        print(f"{name}: a device blamed in {len(lines)} of {n} workload jobs "
              f"(95 % CI {lo:.1%}-{hi:.1%})")
        for line in lines:
            print("   ", line)
        lo, hi = _wilson(named[name], heavy)
        print(f"{name}: heavier stage named in {named[name]} of {heavy} "
              f"(95 % CI {lo:.1%}-{hi:.1%}); a wrong stage in {wrong[name]}")
        print(f"{name}: a stage named in a job without one: {len(stray[name])} of {n - heavy}")
        for line in stray[name]:
            print("   ", line)

if __name__ == "__main__":
    main()
