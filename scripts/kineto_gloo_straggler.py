"""Real PyTorch-profiler traces of a gloo job with one straggler, localized: how often is it named?

Four gloo processes (CPU torch) run ``--steps`` profiled steps of all_reduce, broadcast and
all_gather after a little compute; from step ``--fault-from`` rank 2 sleeps 30 ms before its
collectives. Each run's Kineto traces go through ``holmes localize``; the script prints each
run's top suspect and how many runs named rank 2. docs/results.md quotes
``python scripts/kineto_gloo_straggler.py --steps 16 --fault-from 9 --runs 8`` and
``--steps 38 --fault-from 21 --runs 4``; ``--keep-misses DIR`` keeps the traces of the runs that
did not name rank 2, ``--keep DIR`` those of every run, and ``--analyze DIR`` localizes kept runs
again without running a job (another holmes_ml on ``PYTHONPATH`` compares versions on the same
traces). ``--layout grid`` runs the collectives on row and column subgroups of a
2 x 2 grid instead of the world (the reader tells gloo groups apart by their worker threads);
``--layout pipeline`` makes the four ranks pipeline stages that send microbatches on (the
reader takes a gloo send's peer from its dispatch).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

STRAGGLER = 2


def _step(rank: int, world: int, layout: str, slow: bool, groups: tuple) -> None:
    """One training step of ``layout``; ``slow``: this rank is the straggler in this step."""
    import torch
    import torch.distributed as dist

    if layout == "pipeline":
        # 4 stages, 4 microbatches: receive from the stage before, compute, send to the next
        # (gloo runs a send/recv on the calling thread; the profiler records its peer in the
        # dispatch's arguments), then a 4-byte loss all_reduce over the world
        t = torch.ones(1 << 14)
        for _ in range(4):
            if rank > 0:
                dist.recv(t, src=rank - 1)
            x = torch.randn(192, 192)
            for _ in range(2):
                x = x @ x.T / 192
            if slow:
                time.sleep(0.03 / 4)
            if rank < world - 1:
                dist.send(t, dst=rank + 1)
        dist.all_reduce(torch.ones(1))
        return
    row, col = groups
    t = torch.ones(1 << 16)
    x = torch.randn(256, 256)
    for _ in range(3):
        x = x @ x.T / 256
    if slow:
        time.sleep(0.03)
    dist.all_reduce(t, group=row)
    dist.broadcast(t, src=rank - rank % 2 if layout == "grid" else 0, group=row)
    n = 2 if layout == "grid" else world
    dist.all_gather([torch.zeros(1 << 16) for _ in range(n)], t, group=col)
    if layout == "grid":  # and a loss averaged over the world, so its group is not idle
        dist.all_reduce(torch.ones(1))


def _worker(rank: int, world: int, out: str, steps: int, fault_from: int, layout: str) -> None:
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    dist.init_process_group("gloo", store=dist.FileStore(f"{out}/store", world), rank=rank,
                            world_size=world)
    groups: tuple = (None, None)  # the world group
    if layout == "grid":  # 2 x 2: all_reduce along a row (tensor-parallel-like), all_gather
        # down a column
        groups = ([dist.new_group(r) for r in ([0, 1], [2, 3])][rank // 2],
                  [dist.new_group(r) for r in ([0, 2], [1, 3])][rank % 2])
    export = lambda p: p.export_chrome_trace(f"{out}/rank{rank}.pt.trace.json")  # noqa: E731
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=export,
                 record_shapes=layout == "pipeline",
                 schedule=schedule(wait=0, warmup=1, active=steps, repeat=1)) as prof:
        for step in range(steps + 2):
            _step(rank, world, layout, rank == STRAGGLER and step >= fault_from, groups)
            prof.step()
    dist.destroy_process_group()
    # No interpreter teardown: torch 2.13's profiler can abort there ("terminate called
    # without an active exception") after the trace is written; see test_io_kineto_torch.
    sys.stderr.flush()
    os._exit(0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=16, help="profiled steps")
    ap.add_argument("--fault-from", type=int, default=9, help="first slowed step")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--layout", choices=("world", "grid", "pipeline"), default="world",
                    help="world: all_reduce, broadcast, all_gather on the world group; grid: "
                    "2 x 2 subgroups, all_reduce and broadcast in rows {0,1} {2,3}, all_gather "
                    "in columns {0,2} {1,3}, a 4-byte all_reduce on the world; pipeline: 4 "
                    "stages, 4 microbatches sent stage to stage, the straggler's 30 ms spread "
                    "over them, traces recorded with shapes (default: world)")
    ap.add_argument("--keep-misses", type=Path, metavar="DIR",
                    help="copy the traces of runs that did not name the straggler to DIR/run<N>/")
    ap.add_argument("--keep", type=Path, metavar="DIR",
                    help="copy every run's traces to DIR/run<N>/ (to localize them again later)")
    ap.add_argument("--analyze", type=Path, metavar="DIR",
                    help="run no job: localize the runs kept in DIR/run*/ (e.g. with another "
                    "version of holmes_ml on PYTHONPATH, to compare on the same traces)")
    args = ap.parse_args()

    from holmes_ml.pipeline import analyze, read_paths

    def localize(run: int, traces: list[Path]) -> bool:
        verdict = analyze(read_paths(traces, "kineto"))
        top = verdict.candidates[0] if verdict.candidates else None
        print(f"run {run}: irregular {list(verdict.irregular_iterations)}; top suspect "
              f"{(str(top.kind.value), list(top.ranks)) if top else None}")
        return top is not None and list(top.ranks) == [STRAGGLER]

    named = runs = 0
    if args.analyze:
        kept_runs = sorted(args.analyze.glob("run*"), key=lambda d: int(d.name[3:]))
        for d in kept_runs:
            named += localize(int(d.name[3:]), sorted(d.glob("rank*.pt.trace.json")))
        print(f"rank {STRAGGLER} named in {named} of {len(kept_runs)} runs")
        return 0
    import torch.multiprocessing as mp

    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as out:
            mp.spawn(_worker, args=(4, out, args.steps, args.fault_from, args.layout), nprocs=4)
            traces = sorted(Path(out).glob("rank*.pt.trace.json"))
            hit = localize(run, traces)
            for keep in [args.keep] + ([args.keep_misses] if not hit else []):
                if keep:
                    kept = keep / f"run{run}"
                    kept.mkdir(parents=True, exist_ok=True)
                    for trace in traces:
                        shutil.copy(trace, kept / trace.name)
        named += hit
        runs += 1
    print(f"rank {STRAGGLER} named in {named} of {runs} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
