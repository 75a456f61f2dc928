"""Why the deployed path (each host scored on its own) flags almost none of a slow GPU's waits
when one host holds a whole tensor-parallel group, and what names the GPU all the same.

Simulates a LLaMA2-70B tp8 x pp8 job (every 8-GPU host is one tensor-parallel group) with one GPU
slowed from a later iteration, scores it twice - the whole job at once, as ``holmes localize``
does, and each host on its own, as the node agents do
(:func:`holmes_ml.pipeline.summarize_per_host`) - and prints, for the faulty host, how many of
the all_reduce copies the fault prolonged each scoring flags, and the verdicts: per host with and
without the comm-gap fallback (``LocalizeConfig.comm_gap_fallback``), which reads the waits off
the per-iteration communication times every node ships.
``--bench-trial GPUS SEED`` re-runs one of ``holmes bench localize``'s large-job GPU trials
instead (the ones listed in ``details.holmes_per_node_only_misses``).

Usage: ``.venv/bin/python scripts/per_node_gap.py`` (512 GPUs, GPU 234 slowed from iteration 4 of
10; about 10 s on 2 cores); ``--bench-trial 2048 11`` (about 25 s).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from holmes_ml.io.schema import without_labels
from holmes_ml.localize import LocalizeConfig
from holmes_ml.pipeline import _merge, localize_summaries, summarize, summarize_per_host
from holmes_ml.simulator import FaultSpec, SimConfig, simulate


def _job(args: argparse.Namespace):
    if args.bench_trial is None:
        return simulate(SimConfig(
            gpus=args.gpus, model="llama2-70b", tp=8, pp=8, iterations=10, seed=0,
            faults=(FaultSpec.parse(f"gpu_slow:rank={args.rank},severity=1.0,start=4"),))), 1.1
    from holmes_ml.bench.localize import _sim_config, _simulate_scenario, scenarios
    from holmes_ml.features import iteration_table

    gpus, seed = args.bench_trial
    sc = next((s for s in scenarios(False) if s["gpus"] == gpus and s["seed"] == seed
               and s["kind"] == "gpu_slow"), None)
    if sc is None:
        raise SystemExit(f"--bench-trial: no GPU trial at {gpus} GPUs, seed {seed}")
    twin = iteration_table(simulate(_sim_config(sc)).ops)["duration_s"]
    return _simulate_scenario(sc, twin)[0], sc["delta"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=512, help="job size (default 512)")
    parser.add_argument("--rank", type=int, default=234, help="the slowed GPU (default 234)")
    parser.add_argument("--bench-trial", type=int, nargs=2, metavar=("GPUS", "SEED"),
                        help="a large-job GPU trial of holmes bench localize instead")
    args = parser.parse_args()
    res, delta = _job(args)
    cfg = LocalizeConfig(delta=delta)
    ops = without_labels(res.ops)
    rank = int(res.faults[0].ranks[0])
    host = str(ops.loc[ops["rank"] == rank, "host"].iloc[0])
    on_host = (res.ops["host"].astype(str) == host).to_numpy()
    slowed = on_host & res.ops["abnormal"].to_numpy(bool) & (
        res.ops["op"].astype(str) == "all_reduce").to_numpy()
    print(f"{ops['rank'].nunique()} GPUs, GPU {rank} slowed, on {host}: "
          f"{int(slowed.sum()):,} abnormal all_reduce copies on that host")
    for name, parts in (("whole job", [summarize(ops, None, cfg)]),
                        ("per host", summarize_per_host(ops, None, cfg))):
        ab = _merge(parts).abnormal
        keys = set(zip(ab["rank"], ab["group"], ab["seq"], ab["iteration"], strict=True))
        rows = res.ops.loc[slowed, ["rank", "group", "seq", "iteration"]]
        caught = sum((int(r), str(g), int(s), int(i)) in keys
                     for r, g, s, i in rows.itertuples(index=False))
        print(f"  {name}: flags {caught:,} of them")
        for label, conf in (("", cfg), (", no comm-gap fallback",
                                        replace(cfg, comm_gap_fallback=False))):
            verdict = localize_summaries(parts, res.topology, conf)
            top = [(c.kind.value, list(c.ranks[:4]), c.evidence[0].rule if c.evidence else "")
                   for c in verdict.candidates[:2]]
            print(f"    verdict{label}: {top or 'empty'}")


if __name__ == "__main__":
    main()
