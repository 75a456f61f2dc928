"""One rank of the drill job: ``python -m holmes_ml.drill.job CONFIG_JSON`` (rank from ``RANK``).

A tiny model step per iteration: per microbatch a forward pass (receive activations from the
previous pipeline stage, a matmul plus ``compute_s`` of simulated compute, tensor-parallel
all_reduce, send to the next stage), the backward pass in reverse, then the data-parallel
all_reduce of gradients. Ranks are laid out in
Megatron order (tp fastest, then dp, then pp). Each rank also writes ``sched-rankNNNNN.json``
next to its log directory: per iteration the total oversleep of its compute sleeps, an independent
measure of the time the OS scheduler kept it waiting
(see :func:`holmes_ml.drill.runner.machine_pauses`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def layout_groups(tp: int, pp: int, dp: int) -> tuple[list[list[int]], list[list[int]]]:
    """Global ranks of every tensor-parallel and data-parallel group, in creation order."""
    tp_groups = [[p * tp * dp + d * tp + t for t in range(tp)] for p in range(pp) for d in range(dp)]
    dp_groups = [[p * tp * dp + d * tp + t for d in range(dp)] for p in range(pp) for t in range(tp)]
    return tp_groups, dp_groups


def _compute(seconds: float) -> float:
    """Sleep ``seconds`` (simulated compute); return the oversleep, a probe of how long the OS
    scheduler kept this rank waiting for a CPU."""
    t0 = time.perf_counter()
    time.sleep(seconds)
    return max(0.0, time.perf_counter() - t0 - seconds)


def run(cfg: dict[str, Any], rank: int) -> None:
    """Run the job on this rank (torch.distributed env vars must be set)."""
    import torch
    import torch.distributed as dist

    from holmes_ml.collect import CommOpsLogger, LoggerConfig

    torch.set_num_threads(1)
    torch.manual_seed(cfg["seed"] + rank)
    tp, pp, dp = cfg["tp"], cfg["pp"], cfg["dp"]
    world = tp * pp * dp
    dist.init_process_group("gloo", rank=rank, world_size=world)
    tp_ranks, dp_ranks = layout_groups(tp, pp, dp)
    names: dict[tuple[int, ...], str] = {}
    kinds: dict[tuple[int, ...], str] = {}
    my_tp = my_dp = None
    for kind, all_ranks in (("tp", tp_ranks), ("dp", dp_ranks)):
        for i, ranks in enumerate(all_ranks):
            g = dist.new_group(ranks)  # every rank creates every group, in the same order
            names[tuple(ranks)] = f"{kind}-{i}"
            kinds[tuple(ranks)] = kind
            if rank in ranks:
                if kind == "tp":
                    my_tp = g
                else:
                    my_dp = g
    stage = rank // (tp * dp)
    prev_rank, next_rank = rank - tp * dp, rank + tp * dp
    hidden, mb = cfg["hidden"], cfg["microbatch_size"]
    weight = torch.randn(hidden, hidden) / hidden**0.5
    grad = torch.zeros(hidden, hidden)
    act = torch.zeros(mb, hidden)
    fault, target = cfg["fault"], cfg["rank"]
    # The layer's real compute is tiny; a real step spends most of its time computing. The rest
    # of each microbatch pass is a sleep: it keeps the iteration long against OS scheduler
    # jitter (a CPU-starved rank of a loaded machine) without loading the CPU.
    compute_s = float(cfg.get("compute_s", 0.0))
    pauses: list[float] = []
    log_cfg = LoggerConfig(
        out_dir=cfg["out"], fmt="parquet", group_names=names, group_kinds=kinds,
        job="drill",
        host=f"{cfg['host']}-ns{rank}" if cfg.get("host_per_rank") else cfg.get("host"),
    )
    dist.barrier()
    with CommOpsLogger(log_cfg) as log:
        for it in range(cfg["iterations"]):
            lost = 0.0  # oversleep in this iteration: time the OS kept this rank off a CPU
            slow = ((fault == "straggler" and rank == target and it >= cfg["start_iteration"])
                    or (fault == "heavy_stage" and stage == target // (tp * dp)))
            if fault == "stall" and rank == target and it == cfg["stall_iteration"]:
                time.sleep(cfg["stall_s"])
            for _ in range(cfg["microbatches"]):  # forward
                x = torch.randn(mb, hidden)
                if stage > 0:
                    dist.recv(act, src=prev_rank)
                    x = act.clone()
                y = x @ weight
                lost += _compute(compute_s + (cfg["straggler_s"] if slow else 0.0))
                if tp > 1:
                    dist.all_reduce(y, group=my_tp)
                if stage < pp - 1:
                    dist.send(y.contiguous(), dst=next_rank)
            for _ in range(cfg["microbatches"]):  # backward
                g = torch.randn(mb, hidden)
                if stage < pp - 1:
                    dist.recv(act, src=next_rank)
                    g = act.clone()
                gx = g @ weight.T
                grad += x.T @ g
                lost += _compute(compute_s + (cfg["straggler_s"] if slow else 0.0))
                if tp > 1:
                    dist.all_reduce(gx, group=my_tp)
                if stage > 0:
                    dist.send(gx.contiguous(), dst=prev_rank)
            if dp > 1:
                dist.all_reduce(grad, group=my_dp)
            pauses.append(lost)
            log.step()
    dist.barrier()
    sched = Path(cfg["out"]).parent / f"sched-rank{rank:05d}.json"
    sched.write_text(json.dumps({"rank": rank, "oversleep_s": pauses}))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    cfg = json.loads(args[0])
    run(cfg, int(os.environ["RANK"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
