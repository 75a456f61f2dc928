"""What a node's summary costs to compute, and a digest of what it holds, so that a change to
:func:`holmes_ml.pipeline.summarize` can be timed against another checkout and shown to leave
every summary as it was (``PYTHONPATH=<checkout> python scripts/node_summary_cost.py``).

For simulated faulty jobs of 64, 256 and 1,024 GPUs (three fault kinds, two layouts), it prints
the CPU seconds of :func:`~holmes_ml.pipeline.summarize_per_host` (each host on its own, as the
node agents and ``holmes bench localize``'s ``holmes, per node`` run it) and of one
:func:`~holmes_ml.pipeline.summarize` of the whole job, each the best of ``--repeats`` runs,
the milliseconds per host, and a SHA-256 digest of every summary's tables (values, dtypes,
column names and order). Two checkouts that print the same digests built the same summaries.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from functools import partial

import pandas as pd

from holmes_ml.io.schema import without_labels
from holmes_ml.localize import LocalizeConfig
from holmes_ml.pipeline import NodeSummary, summarize, summarize_per_host
from holmes_ml.simulator import FaultSpec, SimConfig, simulate

JOBS = (
    (64, "llama2-7b", "gpu_slow:rank=5,severity=0.5,start=10"),
    (256, "llama2-13b", "nic_slow:rank=37,severity=0.5,start=8"),
    (256, "llama2-70b", "link_slow:rank=100,severity=0.5,start=8"),
    (1024, "llama2-70b", "host_stall:rank=300,severity=0.5,start=12"),
)


def _digest(summaries: list[NodeSummary]) -> str:
    h = hashlib.sha256()
    for s in summaries:
        for frame in (s.iterations, s.abnormal, s.groups, s.ranks):
            if frame is None:
                h.update(b"none")
                continue
            h.update(repr([(c, str(t)) for c, t in frame.dtypes.items()]).encode())
            h.update(pd.util.hash_pandas_object(frame, index=True).to_numpy().tobytes())
    return h.hexdigest()[:16]


def _best(work, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.process_time()
        out = work()
        best = min(best, time.process_time() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=30)
    args = ap.parse_args()
    cfg = LocalizeConfig()
    total_hosts = total_per_host = total_whole = 0.0
    for gpus, model, fault in JOBS:
        res = simulate(SimConfig(gpus=gpus, model=model, iterations=args.iterations, seed=1,
                                 faults=(FaultSpec.parse(fault),)))
        ops = without_labels(res.ops)
        hosts = int(ops["host"].nunique())
        per_host_s, nodes = _best(partial(summarize_per_host, ops, None, cfg), args.repeats)
        whole_s, whole = _best(lambda ops=ops: [summarize(ops, None, cfg)], args.repeats)
        total_hosts += hosts
        total_per_host += per_host_s
        total_whole += whole_s
        print(f"{gpus:>5} GPUs {model:<10} {fault.split(':')[0]:<10} {len(ops):>9,} ops "
              f"{hosts:>4} hosts: per host {per_host_s:6.2f} s ({1e3 * per_host_s / hosts:5.1f} "
              f"ms a host), whole job {whole_s:5.2f} s; digests {_digest(nodes)} "
              f"{_digest(whole)}")
    print(f"all: per host {total_per_host:.2f} s ({1e3 * total_per_host / total_hosts:.1f} ms "
          f"a host), whole jobs {total_whole:.2f} s")


if __name__ == "__main__":
    main()
