"""PyTorch profiler (Kineto) Chrome traces, one JSON file per rank, into the CommOps table.

What a trace holds and how it is used
-------------------------------------
* **NCCL kernels** (``ncclKernel_*``, ``ncclDevKernel_*``, ``ncclSymDevKernel_*``) on the GPU
  timeline. Their start is when the rank's stream reached the collective and their duration
  includes waiting for the slowest peer, which is exactly the canonical ``start_ns`` /
  ``duration_us``. They are linked to their CPU context through the launch's ``correlation`` id.
* **CPU context**: ``record_param_comms`` ops (2024+ traces carry "Collective name", "Process
  Group Name", "Process Group Ranks", "In msg nelems", "dtype", "Group size", sometimes "Seq"),
  ``nccl:<op>`` / ``gloo:<op>`` user annotations (older traces carry "Input Dims"/"Input type")
  and ``c10d::<op>_`` ops. Nested spans on one thread form one operator instance. The CPU
  context names the operator even when kernel names were anonymized (every kernel a
  ``SendRecv``).
* **gloo** collectives have no kernel: the ``gloo:<op>`` annotation runs on the gloo worker
  thread and its ``dur`` includes waiting for peers, so the CPU span is used (``clock='cpu'``).
  NCCL annotations whose kernels are absent from the trace also fall back to the CPU span.

Time: old traces have epoch microseconds in ``ts``; newer ones add ``baseTimeNanoseconds`` to
the header (absolute µs = baseTimeNanoseconds/1000 + ts). Iterations come from
``ProfilerStep#N`` spans (0 when there are none). The rank comes from ``distributedInfo.rank``,
else from the file name.

Matching across ranks: ``seq`` is the "Seq" argument when every op of a group has one, else
the instance (iteration, op, k-th of that op type in the group) numbered by median start time
(see :func:`assign_seq`). Instances missing on some ranks are reported in a warning.
"""

from __future__ import annotations

import bisect
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from holmes_ml.io._common import (
    canonical_op,
    dtype_bytes,
    load_json,
    parse_rank_list,
    rank_from_name,
    ranks_str,
    require_op,
)
from holmes_ml.io.schema import SchemaError

logger = logging.getLogger(__name__)

_KERNEL_RE = re.compile(r"^nccl(?:Dev|SymDev)?Kernel_([A-Za-z]+)")
_CPU_PREFIXES = ("nccl:", "gloo:", "c10d::")
# record_param_comms also wraps bookkeeping calls that move no data.
_NOT_COMM = frozenset({"wait", "waittensor", "coalesced", "init", "split", "commsplit",
                       "startcoalescing", "endcoalescing", "abort", "shrink"})
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass
class _Instance:
    """One communication operator on one rank: its CPU spans and the kernels it launched."""

    tid: Any
    ts: float
    end: float
    events: list[dict] = field(default_factory=list)
    kernels: list[dict] = field(default_factory=list)


def _is_comm_cpu(e: dict) -> bool:
    name = e.get("name", "")
    if name == "record_param_comms":
        return True
    if not name.startswith(_CPU_PREFIXES):
        return False
    # c10d::<op>_ ops that are not communication (e.g. c10d::wait) are dropped here.
    return name.startswith(("nccl:", "gloo:")) or canonical_op(name) is not None


def _instances_by_tid(cpu: list[dict]) -> dict[Any, list[_Instance]]:
    out: dict[Any, list[_Instance]] = {}
    cpu = sorted(cpu, key=lambda e: (str(e.get("tid")), float(e["ts"]), -float(e.get("dur", 0))))
    for e in cpu:
        ts, dur = float(e["ts"]), float(e.get("dur", 0) or 0)
        lst = out.setdefault(e.get("tid"), [])
        # Nested spans (c10d::allreduce_ > record_param_comms > nccl:all_reduce) share a parent.
        if lst and lst[-1].ts <= ts and ts + dur <= lst[-1].end + 1e-3:
            lst[-1].events.append(e)
        else:
            lst.append(_Instance(tid=e.get("tid"), ts=ts, end=ts + dur, events=[e]))
    return out


def _size_from_dims(args: dict) -> int | None:
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not dims or not types or not isinstance(dims, list) or not isinstance(types, list):
        return None
    first = dims[0]
    if not isinstance(first, list) or not first:
        return None
    size = dtype_bytes(types[0])
    if size is None:
        return None
    return int(np.prod([int(d) for d in first])) * size


def _describe(inst: _Instance, source: str) -> dict | None:
    """Op name, size, group and seq of one instance from its CPU spans and kernel args."""
    meta: dict[str, Any] = {}
    for e in [*inst.events, *inst.kernels]:
        for k, v in (e.get("args") or {}).items():
            if k not in meta and v not in (None, "", "[]"):
                meta[k] = v
    op: str | None = None
    where = ""
    if meta.get("Collective name"):
        op, where = str(meta["Collective name"]), "args['Collective name']"
    else:
        for e in inst.events:
            if e["name"].startswith(("nccl:", "gloo:")):
                op, where = e["name"], "event name"
                break
        if op is None:
            for e in inst.events:
                if e["name"].startswith("c10d::"):
                    op, where = e["name"], "event name"
                    break
    if op is None and inst.kernels:
        m = _KERNEL_RE.match(inst.kernels[0]["name"])
        if m:
            op, where = m.group(1), "kernel name"
    if op is None or re.sub(r"[^a-z]", "", op.lower().split(":")[-1]) in _NOT_COMM:
        # e.g. an old-style record_param_comms with only scalars, or a work.wait(): no transfer.
        return None
    if op.startswith("nccl:") and canonical_op(op) is None and inst.kernels:
        op = _KERNEL_RE.match(inst.kernels[0]["name"]).group(1)  # type: ignore[union-attr]
    canonical = require_op(op, source, where)

    nbytes = None
    # The full buffer is the larger side: the output of all_gather, the input of reduce_scatter.
    counts = [int(meta[k]) for k in ("In msg nelems", "Out msg nelems")
              if str(meta.get(k, "")).lstrip("-").isdigit()]
    if counts and dtype_bytes(meta.get("dtype")):
        nbytes = max(counts) * int(dtype_bytes(meta.get("dtype")) or 0)
    if nbytes is None:
        for e in inst.events:
            nbytes = _size_from_dims(e.get("args") or {})
            if nbytes is not None:
                break
    ranks = parse_rank_list(meta.get("Process Group Ranks"))
    pg = meta.get("Process Group Name")
    seq = meta.get("Seq")
    return {
        "op": canonical,
        "nbytes": int(nbytes or 0),
        "pg": None if pg in (None, "") else str(pg),
        "pg_desc": meta.get("Process Group Description"),
        "ranks": ranks,
        "seq_arg": None if seq in (None, "") else int(seq),
    }


def _read_one(path: Path) -> tuple[pd.DataFrame, int]:
    source = str(path)
    doc = load_json(path, what="a PyTorch profiler (Kineto) JSON trace")
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise SchemaError(
            "not a Kineto trace", source=source, column="traceEvents",
            expected="a JSON object with a 'traceEvents' list (PyTorch profiler export)",
        )
    info = doc.get("distributedInfo") or {}
    rank = info.get("rank")
    if rank is None:
        rank = rank_from_name(path)
    if rank is None:
        raise SchemaError(
            "cannot tell which rank this trace belongs to", source=source,
            column="distributedInfo.rank",
            expected="distributedInfo.rank in the trace or a file name like rank-3.json",
        )
    rank = int(rank)
    world = info.get("world_size")
    # Ops with no process-group metadata ran on the default group, which spans the whole world.
    world_ranks = list(range(int(str(world)))) if str(world or "").isdigit() else None
    base_ns = int(doc.get("baseTimeNanoseconds", 0) or 0)
    pg_ranks = {
        str(c.get("pg_name")): parse_rank_list(c.get("ranks"))
        for c in info.get("pg_config", []) or []
        if isinstance(c, dict)
    }

    cpu, kernels, steps = [], [], []
    runtime: dict[Any, dict] = {}
    for e in doc["traceEvents"]:
        if not isinstance(e, dict) or e.get("ph") != "X" or "ts" not in e:
            continue
        name, cat = e.get("name", ""), e.get("cat", "")
        if cat == "kernel":
            if _KERNEL_RE.match(name):
                kernels.append(e)
        elif cat in ("cuda_runtime", "cuda_driver"):
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                runtime[corr] = e
        elif cat in ("cpu_op", "user_annotation"):
            m = _STEP_RE.match(name)
            if m:
                steps.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)),
                              int(m.group(1))))
            elif _is_comm_cpu(e):
                cpu.append(e)

    by_tid = _instances_by_tid(cpu)
    starts = {tid: [i.ts for i in lst] for tid, lst in by_tid.items()}
    orphans: list[_Instance] = []
    for k in kernels:
        launch = runtime.get((k.get("args") or {}).get("correlation"))
        inst = None
        if launch is not None and launch.get("tid") in by_tid:
            lst = by_tid[launch["tid"]]
            j = bisect.bisect_right(starts[launch["tid"]], float(launch["ts"])) - 1
            if j >= 0 and lst[j].ts <= float(launch["ts"]) <= lst[j].end + 1e-3:
                inst = lst[j]
        if inst is None:
            orphans.append(_Instance(tid=None, ts=float(k["ts"]), end=float(k["ts"]), kernels=[k]))
        else:
            inst.kernels.append(k)

    steps.sort()
    step_starts = [s[0] for s in steps]
    rows = []
    for inst in [i for lst in by_tid.values() for i in lst] + orphans:
        d = _describe(inst, source)
        if d is None:
            continue
        if inst.kernels:
            t0 = min(float(k["ts"]) for k in inst.kernels)
            t1 = max(float(k["ts"]) + float(k.get("dur", 0) or 0) for k in inst.kernels)
            clock = "gpu"
        else:
            t0, t1, clock = inst.ts, inst.end, "cpu"
        # The CPU issue time decides the step: the GPU may run a step's last kernels after
        # the ProfilerStep span has closed.
        cpu_t = inst.ts if inst.events else t0
        iteration = 0
        if steps:
            j = max(bisect.bisect_right(step_starts, cpu_t) - 1, 0)
            iteration = steps[j][2]
        ranks = d["ranks"] or (pg_ranks.get(d["pg"]) if d["pg"] is not None else world_ranks)
        rows.append({
            "iteration": iteration,
            "rank": rank,
            "op": d["op"],
            "group": d["pg"] if d["pg"] is not None else "default",
            "seq_arg": d["seq_arg"],
            "nbytes": d["nbytes"],
            # Epoch ns exceed float64's exact range: convert the integral µs part exactly.
            "start_ns": base_ns + int(t0) * 1000 + int(round((t0 - int(t0)) * 1000.0)),
            "duration_us": max(t1 - t0, 0.0),
            "group_ranks": ranks_str(ranks),
            "peer": -1,
            "clock": clock,
        })
    df = pd.DataFrame(rows, columns=[
        "iteration", "rank", "op", "group", "seq_arg", "nbytes", "start_ns", "duration_us",
        "group_ranks", "peer", "clock",
    ])
    logger.debug("%s: rank %d, %d comm ops (%d kernels)", source, rank, len(df), len(kernels))
    return df, rank


def assign_seq(df: pd.DataFrame) -> pd.DataFrame:
    """Give every op a ``seq`` shared by all participants of one instance.

    Uses ``seq_arg`` when every op of a group has one. Otherwise an instance is identified by
    (iteration, op, k): the k-th op of that type the rank issued in that group and iteration.
    When members issue collectives in the same order this is the plain position in the group;
    when traces interleave op types differently (or one rank's window lost an op) the damage
    stays within one op type and one iteration. Instances are numbered per group in the order
    of their median start time. Warns when instances are missing on some ranks.
    """
    df = df.sort_values(["rank", "group", "start_ns"], kind="stable").reset_index(drop=True)
    k = df.groupby(["rank", "group", "iteration", "op"], sort=False).cumcount()
    keyed = df[["group", "iteration", "op", "start_ns"]].assign(k=k.to_numpy())
    inst = keyed.groupby(["group", "iteration", "op", "k"], sort=False)["start_ns"].median()
    inst = inst.rename("t").reset_index().sort_values(["group", "iteration", "t"], kind="stable")
    inst["ordinal"] = inst.groupby("group", sort=False).cumcount().astype(np.int64)
    ordinal = keyed.merge(inst, on=["group", "iteration", "op", "k"], how="left")["ordinal"]
    has_arg = df["seq_arg"].notna().groupby(df["group"]).transform("all")
    seq = np.where(has_arg, df["seq_arg"].fillna(-1).astype("int64"), ordinal.to_numpy())
    df = df.drop(columns=["seq_arg"]).assign(seq=seq.astype(np.int64))
    members = df.groupby("group")["rank"].nunique()
    per = df.groupby(["group", "seq"])["rank"].nunique()
    short = per[per.to_numpy() < members.reindex(per.index.get_level_values(0)).to_numpy()]
    if len(short):
        g, s_ = short.index[0]
        logger.warning(
            "%d op instance(s) are missing on some ranks (first: group %r seq %d): traces may "
            "cover different windows", len(short), g, s_,
        )
    return df


def read_kineto(paths: Sequence[str | Path] | str | Path) -> pd.DataFrame:
    """Read PyTorch profiler traces (one per rank) into an unvalidated CommOps table.

    Parameters
    ----------
    paths:
        Trace files (``.json`` or ``.json.gz``), one per rank.

    Returns
    -------
    pandas.DataFrame
        Canonical columns plus ``group_ranks``, ``peer`` and ``clock`` (``'gpu'`` when timed by
        the NCCL kernel, ``'cpu'`` for gloo or kernel-less annotations). Pass it through
        :func:`holmes_ml.io.schema.validate` (``read_ops`` does).

    Examples
    --------
    >>> from holmes_ml.io.readers import read_ops
    >>> ops = read_ops("traces/", format="kineto")  # doctest: +SKIP
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    frames: list[pd.DataFrame] = []
    seen: dict[int, str] = {}
    for p in paths:
        df, rank = _read_one(Path(p))
        if rank in seen:
            raise SchemaError(
                f"two traces claim rank {rank} (also {seen[rank]})", source=str(p),
                column="distributedInfo.rank", value=rank, expected="one trace per rank",
            )
        seen[rank] = str(p)
        frames.append(df)
    if not frames:
        raise SchemaError("no Kineto trace given", expected="at least one trace file")
    return assign_seq(pd.concat(frames, ignore_index=True))
