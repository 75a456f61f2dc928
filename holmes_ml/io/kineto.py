"""PyTorch profiler (Kineto) Chrome traces, one JSON file per rank, into the CommOps table.

What a trace holds and how it is used
-------------------------------------
* **NCCL kernels** (``ncclKernel_*``, ``ncclDevKernel_*``, ``ncclSymDevKernel_*``) on the GPU
  timeline. Their start is when the rank's stream reached the collective and their duration
  includes waiting for the slowest peer, which is exactly the canonical ``start_ns`` /
  ``duration_us``. They are linked to their CPU context through the launch's ``correlation`` id.
* **CPU context**: ``record_param_comms`` ops (2024+ traces carry "Collective name", "Process
  Group Name", "Process Group Ranks", "In msg nelems", "dtype", "Group size", sometimes "Seq",
  and for a send/recv the global rank at the other end, "Dst Rank"/"Src Rank": the ``peer``;
  member lists longer than 30 are cut by the profiler and then taken from ``pg_config``),
  ``nccl:<op>`` / ``gloo:<op>`` user annotations (older traces carry "Input Dims"/"Input type")
  and ``c10d::<op>_`` ops. Nested spans on one thread form one operator instance. The CPU
  context names the operator even when kernel names were anonymized (every kernel a
  ``SendRecv``).
* **gloo** collectives have no kernel: the ``gloo:<op>`` annotation runs on the gloo worker
  thread and its ``dur`` includes waiting for peers, so the CPU span is used (``clock='cpu'``);
  the main thread's ``c10d::<op>_`` dispatch span of the same operation is not a second one.
  Nothing in the trace names a gloo operation's process group; each gloo group has its own two
  worker threads, started in creation order, so a rank's worker thread ids in ascending order
  follow its gloo groups in ``pg_config`` (see :func:`_gloo_groups`; when the threads seen do
  not fit, a warning, and the operations are read as the world group). A gloo send/recv runs
  on the calling thread and stays in the world group; its peer is the destination/source in
  its ``c10d::send``/``c10d::recv_`` dispatch's "Concrete Inputs" (``record_shapes=True``),
  taken when the world is the rank's only gloo group (elsewhere it is a rank of a group the
  trace does not name).
  NCCL annotations whose kernels are absent from the trace also fall back to the CPU span.

Time: old traces have epoch microseconds in ``ts``; newer ones add ``baseTimeNanoseconds`` to
the header (absolute µs = baseTimeNanoseconds/1000 + ts). Iterations come from
``ProfilerStep#N`` spans (0 when there are none). N counts the steps since that rank's profiler
was created: a rank that created it some steps after the others numbers the same step lower,
and its numbers are shifted to match (by the "Seq" of its collectives, else by when they end;
see :func:`align_steps`); steps that only some ranks' traces hold (their windows differ) are
left out (see :func:`common_steps`), both with a warning. The rank comes from
``distributedInfo.rank``, else from the file name.

Matching across ranks: ``seq`` is the "Seq" argument when every op of a group has one, else
the instance (iteration, op, k-th of that op type in the group; the k-th recv goes with the
k-th send) numbered by median start time (see :func:`assign_seq`). Collective instances
missing on some ranks are reported in a warning.

Checks: every field the reader uses is checked where it is read, and a bad one raises
:class:`~holmes_ml.io.schema.SchemaError` naming the file, the field path
(``traceEvents[12].args.Seq``), the value and what was expected. Communication events need a
finite ``ts`` and a ``dur`` >= 0; ranks and group members must be below ``world_size``
(at most ``MAX_WORLD``), and all traces of one job must state the same ``world_size``. Events
the reader ignores (compute kernels, other CPU ops, launches of non-NCCL kernels) are not checked.
"""

from __future__ import annotations

import bisect
import collections
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from holmes_ml._text import spans
from holmes_ml.io._common import (
    MAX_WORLD,
    SOURCE_FILE,
    SOURCE_RECORD,
    as_float,
    as_int,
    as_obj,
    canonical_op,
    dtype_bytes,
    each_file,
    load_json,
    parse_rank_list,
    rank_from_name,
    ranks_str,
    require_op,
)
from holmes_ml.io.schema import P2P_OPS, SchemaError

logger = logging.getLogger(__name__)

_KERNEL_RE = re.compile(r"^nccl(?:Dev|SymDev)?Kernel_([A-Za-z]+)")
_CPU_PREFIXES = ("nccl:", "gloo:", "c10d::")
# record_param_comms also wraps bookkeeping calls that move no data.
_NOT_COMM = frozenset({"wait", "waittensor", "coalesced", "init", "split", "commsplit",
                       "startcoalescing", "endcoalescing", "abort", "shrink"})
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
#: How the profiler ends a list it cut (``"[0, 1, ..., 29, ...]"``, see format_list in
#: torch's ParamCommsUtils: at most 30 entries).
_TRUNCATED = re.compile(r"\.\.\.\s*\]?\s*$")
_INT64_MAX = (1 << 63) - 1


@dataclass(slots=True)
class _Event:
    """A trace event the reader uses, with the fields it reads already checked."""

    index: int  # position in traceEvents: names the event in error messages
    name: str
    ts: float
    dur: float
    tid: int | str | None
    args: dict


@dataclass
class _Instance:
    """One communication operator on one rank: its CPU spans and the kernels it launched."""

    tid: Any
    ts: float
    end: float
    events: list[_Event] = field(default_factory=list)
    kernels: list[_Event] = field(default_factory=list)


def _at(i: int, key: str) -> str:
    """Field path of ``key`` of event ``i``.

    >>> _at(3, "ts")
    'traceEvents[3].ts'
    """
    return f"traceEvents[{i}].{key}"


def _arg_at(i: int, key: str) -> str:
    """Field path of argument ``key`` of event ``i``.

    >>> _arg_at(3, "Seq"), _arg_at(3, "In msg nelems")
    ('traceEvents[3].args.Seq', "traceEvents[3].args['In msg nelems']")
    """
    return f"traceEvents[{i}].args" + (f".{key}" if key.isidentifier() else f"[{key!r}]")


def _name(e: dict, i: int, source: str) -> str:
    """``name`` of event ``i``, which must be a string."""
    name = e.get("name")
    if isinstance(name, str):  # the common case, without a call
        return name
    return as_obj(name, _at(i, "name"), source, str)  # type: ignore[no-any-return]


def _args(e: dict, i: int, source: str) -> dict:
    """``args`` of event ``i``: a JSON object, ``{}`` when absent."""
    args = e.get("args")
    if isinstance(args, dict):
        return args
    return as_obj(args, _at(i, "args"), source, dict, default={})  # type: ignore[no-any-return]


def _time(e: dict, key: str, i: int, source: str) -> float:
    """``ts`` or ``dur`` (µs) of event ``i``: present and finite, a duration also >= 0.

    A missing one is refused rather than skipped or read as 0: the event would silently vanish
    from the table or get a wrong duration.
    """
    what = "the start time in µs" if key == "ts" else "the duration in µs, a number >= 0"
    value = e.get(key)
    if value is None:
        raise SchemaError("missing", source=source, parameter=_at(i, key), expected=what)
    out = as_float(value, _at(i, key), source)
    if key == "dur" and out < 0:
        raise SchemaError("negative duration", source=source, parameter=_at(i, key), value=out,
                          expected=what)
    return out


def _tid(e: dict, i: int, source: str) -> int | str:
    """``tid`` of event ``i``: spans are grouped by it, so it must be an integer or a string."""
    tid = e.get("tid")
    if isinstance(tid, (int, str)) and not isinstance(tid, bool):
        return tid
    raise SchemaError("missing" if tid is None else "wrong type", source=source,
                      parameter=_at(i, "tid"), value=None if tid is None else type(tid).__name__,
                      expected="a thread id (an integer or a string)")


def _event(e: dict, i: int, source: str, name: str, with_tid: bool = True) -> _Event:
    """Event ``i`` with the fields the reader uses checked (kernels need no ``tid``)."""
    return _Event(i, name, _time(e, "ts", i, source), _time(e, "dur", i, source),
                  _tid(e, i, source) if with_tid else None, _args(e, i, source))


def _correlation(args: dict, i: int, source: str) -> int | None:
    """``args.correlation`` of event ``i`` (links a kernel to its launch), None when absent."""
    corr = args.get("correlation")
    if corr is None or (isinstance(corr, int) and not isinstance(corr, bool)):
        return corr
    return as_int(corr, _arg_at(i, "correlation"), source)


def _ranks(value: Any, where: str, source: str, world: int | None) -> list[int] | None:
    """Global ranks of a process group from a list or its string form (``"[0, 1]"``); None when
    empty. Every rank must be below the world size (``MAX_WORLD`` when it is unknown).

    >>> _ranks("[0, 2]", "ranks", "t.json", 4), _ranks([], "ranks", "t.json", None)
    ([0, 2], None)
    >>> _ranks("[0, 1, 2, ...]", "ranks", "t.json", None) is None  # cut by the profiler
    True
    """
    if isinstance(value, list):
        ranks = [as_int(r, f"{where}[{j}]", source) for j, r in enumerate(value)]
    elif isinstance(value, str):
        if _TRUNCATED.search(value):
            # PyTorch writes at most 30 members, then ", ...": the rest is unknown here (the
            # caller falls back to pg_config, else to the ranks seen logging the group)
            return None
        # PyTorch writes the list as text; "[]" (and "") mean "not recorded".
        ranks = parse_rank_list(value) or []
        if not ranks and value.strip() not in ("", "[]"):
            raise SchemaError("not a list of ranks", source=source, parameter=where,
                              value=value[:40], expected="a list of ranks such as '[0, 1, 2]'")
    else:
        raise SchemaError("wrong type", source=source, parameter=where,
                          value=type(value).__name__, expected="a list of ranks")
    limit = world if world is not None else MAX_WORLD
    bad = [r for r in ranks if not 0 <= r < limit]
    if bad:
        raise SchemaError(
            "rank out of range", source=source, parameter=where, value=bad[0],
            expected=f"ranks in [0, {limit - 1}]" + (
                f" (distributedInfo.world_size is {world})" if world is not None else ""))
    return ranks or None


def _is_comm_cpu(name: str) -> bool:
    if name == "record_param_comms":
        return True
    if not name.startswith(_CPU_PREFIXES):
        return False
    # c10d::<op>_ ops that are not communication (e.g. c10d::wait) are dropped here.
    return name.startswith(("nccl:", "gloo:")) or canonical_op(name) is not None


#: The dispatch of a send/recv; its third argument is the rank at the other end, in the
#: operation's process group (``c10d::send(tensors, process_group, dst, tag)``).
_DISPATCH_P2P = frozenset({"c10d::send", "c10d::recv_"})


def _drop_gloo_dispatch(by_tid: dict[Any, list[_Instance]]) -> None:
    """Drop the dispatcher side of gloo operations, which would count each one twice.

    With gloo the main thread records the dispatch (``c10d::allreduce_``, returning at once)
    and the gloo worker thread the operation itself (``gloo:all_reduce``, waiting for the
    peers): two instances on two threads. An instance made of ``c10d::`` spans alone, with no
    kernel, is such a dispatch when the trace has ``gloo:`` spans at all (NCCL dispatches hold
    their ``nccl:``/``record_param_comms`` spans and kernels, and stay). A send or recv runs on
    the calling thread, its ``gloo:`` span starting inside the dispatch and outlasting it; the
    dispatch's spans join it, for the peer in their arguments (:func:`_dispatch_peer`).
    """
    if not any(e.name.startswith("gloo:") for lst in by_tid.values() for i in lst
               for e in i.events):
        return
    for tid, lst in by_tid.items():
        kept: list[_Instance] = []
        p2p: _Instance | None = None  # the send/recv dispatch just dropped
        for i in lst:
            if not i.kernels and all(e.name.startswith("c10d::") for e in i.events):
                p2p = i if any(e.name in _DISPATCH_P2P for e in i.events) else None
                continue
            # A gloo send/recv runs on the calling thread: its gloo: span starts inside the
            # dispatch and outlasts it. The dispatch's arguments go with it (its peer).
            if p2p is not None and p2p.ts <= i.ts <= p2p.end + 1e-3:
                i.events.extend(p2p.events)
            p2p = None
            kept.append(i)
        by_tid[tid] = kept


def _instances_by_tid(cpu: list[_Event]) -> dict[Any, list[_Instance]]:
    out: dict[Any, list[_Instance]] = {}
    cpu = sorted(cpu, key=lambda e: (str(e.tid), e.ts, -e.dur))
    for e in cpu:
        lst = out.setdefault(e.tid, [])
        # Nested spans (c10d::allreduce_ > record_param_comms > nccl:all_reduce) share a parent.
        if lst and lst[-1].ts <= e.ts and e.ts + e.dur <= lst[-1].end + 1e-3:
            lst[-1].events.append(e)
        else:
            lst.append(_Instance(tid=e.tid, ts=e.ts, end=e.ts + e.dur, events=[e]))
    return out


def _nbytes(n: int, where: str, source: str) -> int:
    """A message size that fits the int64 ``nbytes`` column."""
    if n > _INT64_MAX:
        raise SchemaError("message size too large", source=source, parameter=where, value=n,
                          expected="a size below 2**63 bytes")
    return n


def _size_from_dims(e: _Event, source: str) -> int | None:
    """Bytes of the first input from old-style ``Input Dims``/``Input type``; None when absent."""
    dims, types = e.args.get("Input Dims"), e.args.get("Input type")
    if not dims or not types or not isinstance(dims, list) or not isinstance(types, list):
        return None
    first = dims[0]
    if not isinstance(first, list) or not first:
        return None
    size = dtype_bytes(types[0])
    if size is None:
        return None
    where = _arg_at(e.index, "Input Dims")
    # math.prod on Python ints: numpy's product would wrap around silently past 2**63.
    n = math.prod(as_int(d, f"{where}[0][{j}]", source, lo=0) for j, d in enumerate(first))
    return _nbytes(n * size, where, source)


def _describe(inst: _Instance, source: str, world: int | None) -> dict | None:
    """Op name, size, group and seq of one instance from its CPU spans and kernel args;
    ``world`` bounds the group's ranks."""
    meta: dict[str, Any] = {}
    origin: dict[str, int] = {}  # argument -> index of the event it was taken from
    for e in [*inst.events, *inst.kernels]:
        for k, v in e.args.items():
            if k not in meta and v not in (None, "", "[]"):
                meta[k] = v
                origin[k] = e.index

    def at(key: str) -> str:
        return _arg_at(origin[key], key)

    op: str | None = None
    where = ""
    if meta.get("Collective name"):
        op, where = str(meta["Collective name"]), at("Collective name")
    else:
        for e in inst.events:
            if e.name.startswith(("nccl:", "gloo:")):
                op, where = e.name, _at(e.index, "name")
                break
        if op is None:
            for e in inst.events:
                if e.name.startswith("c10d::"):
                    op, where = e.name, _at(e.index, "name")
                    break
    if op is None and inst.kernels:
        m = _KERNEL_RE.match(inst.kernels[0].name)
        if m:
            op, where = m.group(1), _at(inst.kernels[0].index, "name")
    if op is None or re.sub(r"[^a-z]", "", op.lower().split(":")[-1]) in _NOT_COMM:
        # e.g. an old-style record_param_comms with only scalars, or a work.wait(): no transfer.
        return None
    if op.startswith("nccl:") and canonical_op(op) is None and inst.kernels:
        op = _KERNEL_RE.match(inst.kernels[0].name).group(1)  # type: ignore[union-attr]
    canonical = require_op(op, source, where)

    dtype = meta.get("dtype")
    if dtype is not None and not isinstance(dtype, str):
        as_obj(dtype, at("dtype"), source, str)  # raises: a dtype is a name
    counts = [(as_int(meta[k], at(k), source, lo=0), k)
              for k in ("In msg nelems", "Out msg nelems") if k in meta]
    nbytes = None
    # The full buffer is the larger side: the output of all_gather, the input of reduce_scatter.
    if counts and dtype_bytes(dtype):
        n, k = max(counts)
        nbytes = _nbytes(n * int(dtype_bytes(dtype) or 0), at(k), source)
    if nbytes is None:
        for e in inst.events:
            nbytes = _size_from_dims(e, source)
            if nbytes is not None:
                break
    ranks = (_ranks(meta["Process Group Ranks"], at("Process Group Ranks"), source, world)
             if "Process Group Ranks" in meta else None)
    pg = meta.get("Process Group Name")
    if pg is not None and (isinstance(pg, bool) or not isinstance(pg, (str, int))):
        raise SchemaError("wrong type", source=source, parameter=at("Process Group Name"),
                          value=type(pg).__name__, expected="a process group name (a string)")
    # element counts without a size per element: the size is unknown (said once per trace)
    unsized = (f"dtype {dtype!r}" if dtype else "no dtype named") if nbytes is None and counts \
        else None
    return {
        "op": canonical,
        "unsized": unsized,
        "nbytes": int(nbytes or 0),
        "pg": None if pg is None else str(pg),
        "pg_desc": meta.get("Process Group Description"),
        "ranks": ranks,
        "seq_arg": as_int(meta["Seq"], at("Seq"), source, lo=0) if "Seq" in meta else None,
        "peer": _peer_of(canonical, meta, at, source, world),
    }


#: Where the profiler puts the other end of a send/recv, as a global rank (torch writes
#: ``groupRanks[rank]`` of the op's process group).
_PEER_KEYS = {"send": "Dst Rank", "recv": "Src Rank"}


def _peer_of(op: str, meta: dict, at: Any, source: str, world: int | None) -> int:
    """The global rank at the other end of a send/recv (-1: a collective, or not recorded:
    older profiles do not have it)."""
    key = _PEER_KEYS.get(op)
    if key is None or meta.get(key) is None:
        return -1
    limit = (world or MAX_WORLD) - 1
    return as_int(meta[key], at(key), source, lo=0, hi=limit)


def _dispatch_peer(inst: _Instance, source: str, world: int | None) -> int:
    """The other end of a send/recv from its ``c10d::`` dispatch's "Concrete Inputs" (traces
    recorded with ``record_shapes=True``), a rank of the operation's group; -1 when absent."""
    for e in inst.events:
        args = e.args.get("Concrete Inputs")
        if e.name in _DISPATCH_P2P and isinstance(args, list) and len(args) > 2 and args[2]:
            where = _arg_at(e.index, "Concrete Inputs") + "[2]"
            return as_int(args[2], where, source, lo=0, hi=(world or MAX_WORLD) - 1)
    return -1


def _rank(info: dict, path: Path, source: str, world: int | None) -> int:
    """The trace's rank: ``distributedInfo.rank``, else from the file name; below the world."""
    if info.get("rank") is not None:
        where = "distributedInfo.rank"
        rank = as_int(info["rank"], where, source, lo=0, hi=MAX_WORLD - 1)
    else:
        guess = rank_from_name(path)
        if guess is None:
            raise SchemaError(
                "cannot tell which rank this trace belongs to", source=source,
                column="distributedInfo.rank",
                expected="distributedInfo.rank in the trace or a file name like rank-3.json",
            )
        where = "rank in the file name"
        rank = as_int(guess, where, source, lo=0, hi=MAX_WORLD - 1)
    if world is not None and rank >= world:
        raise SchemaError("rank not below the world size", source=source, parameter=where,
                          value=rank, expected=f"a rank in [0, {world - 1}] "
                          f"(distributedInfo.world_size is {world})")
    return rank


def _pg_config(info: dict, source: str, world: int | None,
               rank: int) -> tuple[dict[str, list[int] | None], list[str]]:
    """Members of each process group named in ``distributedInfo.pg_config`` (PyTorch 2.2+),
    and the names of the gloo groups this rank is in, in the order of the list (the order the
    job created them; the default group first)."""
    configs = as_obj(info.get("pg_config"), "distributedInfo.pg_config", source, list,
                     default=[])
    out: dict[str, list[int] | None] = {}
    gloo: list[str] = []
    for j, c in enumerate(configs):
        where = f"distributedInfo.pg_config[{j}]"
        c = as_obj(c, where, source, dict)
        ranks = c.get("ranks")
        name = str(c.get("pg_name"))
        members = None if ranks is None else _ranks(ranks, f"{where}.ranks", source, world)
        out[name] = members
        backend = c.get("backend_config")
        on_gloo = ("gloo" in backend if isinstance(backend, str)
                   else info.get("backend") == "gloo")
        if on_gloo and (members is None or rank in members):
            gloo.append(name)
    return out, gloo


#: Worker threads of one gloo process group (``ProcessGroupGloo.Options`` default).
GLOO_THREADS = 2


def _gloo_groups(by_tid: dict[Any, list[_Instance]], gloo: list[str],
                 default: str | None) -> tuple[dict[Any, str | None], tuple[int, int] | None]:
    """The process group of each gloo worker thread, ``tid -> pg_name`` (None: the default
    group, read as ``"default"``), and None; or, when the trace cannot tell, ``{}`` and
    (gloo groups of this rank, worker threads seen).

    The profiler does not record which process group ran a ``gloo:`` operation. Each gloo
    group runs its collectives on its own :data:`GLOO_THREADS` worker threads, started when the
    group is created, so the threads' ids, in creation order, follow the groups' order in
    ``pg_config``. That is used only when the trace shows exactly ``GLOO_THREADS`` threads per
    gloo group of this rank, with integer ids; otherwise (a group idle in the window, a custom
    thread count) the caller reads the operations as one world communicator and warns. A gloo
    send or recv runs on the calling thread, so it is not counted here and keeps no group.
    """
    tids = {i.tid for lst in by_tid.values() for i in lst
            if any(e.name.startswith("gloo:") and canonical_op(e.name) not in P2P_OPS
                   for e in i.events)}
    if not tids or len(gloo) <= 1:
        # One gloo group runs every gloo operation; the default one stays "default".
        only = gloo[0] if gloo and gloo[0] != default else None
        return {t: only for t in tids}, None
    if (len(tids) != GLOO_THREADS * len(gloo)
            or not all(isinstance(t, int) and not isinstance(t, bool) for t in tids)):
        return {}, (len(gloo), len(tids))
    return {t: (None if gloo[j // GLOO_THREADS] == default else gloo[j // GLOO_THREADS])
            for j, t in enumerate(sorted(tids))}, None


def _warn_gloo_unresolved(unresolved: dict[int, tuple[str, int, int]]) -> None:
    """One warning for the traces whose gloo operations could not be given their groups
    (``rank -> (file, gloo groups, worker threads seen)``)."""
    if not unresolved:
        return
    ranks = sorted(unresolved)
    source, groups, seen = unresolved[ranks[0]]
    shown = ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")
    logger.warning(
        "gloo operations of %d trace(s) (rank %s) are read as one communicator of the whole "
        "world: the profiler does not record which process group ran a gloo operation, and "
        "telling a rank's groups apart needs %d worker threads per group in its trace (%s: "
        "%d gloo groups in pg_config, %d threads, %d needed). Instances of different groups "
        "may be matched with each other; the holmes_ml.collect logger records every "
        "operation's group.", len(ranks), shown, GLOO_THREADS, source, groups, seen,
        GLOO_THREADS * groups)


def _read_one(path: Path) -> tuple[pd.DataFrame, int, int | None, tuple[int, int] | None,
                                  set[int]]:
    """One rank's trace: its CommOps rows, its rank, its world size (None when unknown),
    when its gloo operations could not be given their process groups (gloo groups, worker
    threads seen), else None, and the numbers of its ``ProfilerStep#N`` spans (the steps its
    profiler recorded, with or without communication)."""
    source = str(path)
    doc = load_json(path, what="a PyTorch profiler (Kineto) JSON trace")
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise SchemaError(
            "not a Kineto trace", source=source, column="traceEvents",
            expected="a JSON object with a 'traceEvents' list (PyTorch profiler export)",
        )
    info = as_obj(doc.get("distributedInfo"), "distributedInfo", source, dict, default={})
    # Bounded: ops with no process-group metadata span range(world_size).
    world = as_int(info.get("world_size"), "distributedInfo.world_size", source, lo=1,
                   hi=MAX_WORLD, default=None)
    rank = _rank(info, path, source, world)
    base_ns = as_int(doc.get("baseTimeNanoseconds"), "baseTimeNanoseconds", source, lo=0,
                     default=0)
    pg_ranks, gloo_pgs = _pg_config(info, source, world, rank)

    cpu: list[_Event] = []
    kernels: list[_Event] = []
    steps: list[tuple[float, float, int]] = []
    odd_steps: list[str] = []
    # Launches by correlation id, checked only when an NCCL kernel refers to one: most
    # launches are of compute kernels, which the reader ignores.
    runtime: dict[int, tuple[int, dict]] = {}
    for i, e in enumerate(doc["traceEvents"]):
        if not isinstance(e, dict):
            as_obj(e, f"traceEvents[{i}]", source, dict)  # raises
        if e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat == "kernel":
            name = _name(e, i, source)
            if _KERNEL_RE.match(name):
                kernels.append(_event(e, i, source, name, with_tid=False))
        elif cat in ("cuda_runtime", "cuda_driver"):
            corr = _correlation(_args(e, i, source), i, source)
            if corr is not None:
                runtime[corr] = (i, e)
        elif cat in ("cpu_op", "user_annotation"):
            name = _name(e, i, source)
            m = _STEP_RE.match(name)
            if m:
                ts = _time(e, "ts", i, source)
                dur = as_float(e.get("dur"), _at(i, "dur"), source, default=0.0)
                step = int(m.group(1))
                if step > _INT64_MAX:
                    raise SchemaError("step number too large", source=source,
                                      parameter=_at(i, "name"), value=name[:40] + "...",
                                      expected="ProfilerStep#N with N below 2**63")
                steps.append((ts, ts + dur, step))
            elif _is_comm_cpu(name):
                cpu.append(_event(e, i, source, name))
            elif name.startswith("ProfilerStep#"):
                # its ops would fall into the step before: say so rather than merge quietly
                odd_steps.append(name)

    if odd_steps:
        logger.warning("%s: %d ProfilerStep span(s) not numbered (first: %r; expected "
                       "ProfilerStep#N): their ops are counted in the step before",
                       source, len(odd_steps), odd_steps[0][:60])
    numbers = collections.Counter(step for _, _, step in steps)
    again = sorted(n for n, times in numbers.items() if times > 1)
    if again:
        # (a profiler restarted, or two traces concatenated): one iteration holds both spans
        logger.warning("%s: %d ProfilerStep number(s) appear more than once (first: "
                       "ProfilerStep#%d, %d times): the ops of those spans are counted as one "
                       "iteration", source, len(again), again[0], numbers[again[0]])
    by_tid = _instances_by_tid(cpu)
    starts = {tid: [i.ts for i in lst] for tid, lst in by_tid.items()}
    orphans: list[_Instance] = []
    for k in kernels:
        launch = runtime.get(_correlation(k.args, k.index, source))  # type: ignore[arg-type]
        inst = None
        if launch is not None:
            li, le = launch
            ltid = _tid(le, li, source)
            if ltid in by_tid:
                lts = _time(le, "ts", li, source)
                lst = by_tid[ltid]
                j = bisect.bisect_right(starts[ltid], lts) - 1
                if j >= 0 and lst[j].ts <= lts <= lst[j].end + 1e-3:
                    inst = lst[j]
        if inst is None:
            orphans.append(_Instance(tid=None, ts=k.ts, end=k.ts, kernels=[k]))
        else:
            inst.kernels.append(k)

    _drop_gloo_dispatch(by_tid)
    default = next(iter(pg_ranks), None)
    gloo_pg, unresolved = _gloo_groups(by_tid, gloo_pgs, default)
    world_p2p = gloo_pgs in ([], [default])
    steps.sort()
    step_starts = [s[0] for s in steps]
    # group_ranks text per process group (None: the default group, the whole world), built
    # once: the text of a 2**20-rank world is 7 MB.
    members: dict[str | None, str] = {}
    rows = []
    unsized: dict[str, int] = {}
    for inst in [i for lst in by_tid.values() for i in lst] + orphans:
        d = _describe(inst, source, world)
        if d is None:
            continue
        if d["unsized"]:
            unsized[d["unsized"]] = unsized.get(d["unsized"], 0) + 1
        if d["pg"] is None and d["ranks"] is None:
            if d["op"] not in P2P_OPS:
                d["pg"] = gloo_pg.get(inst.tid)
            elif d["peer"] < 0 and world_p2p and any(e.name.startswith("gloo:")
                                                     for e in inst.events):
                # a gloo send/recv names no group; on a rank whose one gloo group is the
                # world, its dispatch's peer is a global rank
                d["peer"] = _dispatch_peer(inst, source, world)
        if inst.kernels:
            first = min(inst.kernels, key=lambda k: k.ts)
            t0 = first.ts
            t1 = max(k.ts + k.dur for k in inst.kernels)
            clock = "gpu"
        else:
            first = inst.events[0]
            t0, t1, clock = inst.ts, inst.end, "cpu"
        # Epoch ns exceed float64's exact range: convert the integral µs part exactly.
        start_ns = base_ns + int(t0) * 1000 + int(round((t0 - int(t0)) * 1000.0))
        if not 0 <= start_ns <= _INT64_MAX:
            raise SchemaError(
                "start time out of range", source=source, parameter=_at(first.index, "ts"),
                value=t0, expected="a time that, with baseTimeNanoseconds, falls within "
                "[0, 2**63) epoch ns")
        # The CPU issue time decides the step: the GPU may run a step's last kernels after
        # the ProfilerStep span has closed.
        cpu_t = inst.ts if inst.events else t0
        iteration = 0
        if steps:
            j = max(bisect.bisect_right(step_starts, cpu_t) - 1, 0)
            iteration = steps[j][2]
        if d["ranks"]:
            group_ranks = ranks_str(d["ranks"])
        else:
            if d["pg"] not in members:
                # Ops with no process-group metadata ran on the default group: the world.
                ranks = (pg_ranks.get(d["pg"]) if d["pg"] is not None
                         else range(world) if world is not None else None)
                members[d["pg"]] = ranks_str(ranks)
            group_ranks = members[d["pg"]]
        rows.append({
            "iteration": iteration,
            "rank": rank,
            "op": d["op"],
            "group": d["pg"] if d["pg"] is not None else "default",
            "seq_arg": d["seq_arg"],
            "nbytes": d["nbytes"],
            "start_ns": start_ns,
            # >= 0: durations are checked, and the kernels' end is at or after their start.
            "duration_us": t1 - t0,
            "group_ranks": group_ranks,
            "peer": d["peer"],
            "clock": clock,
            SOURCE_FILE: source,
            # the annotation carrying the op's metadata, else its first kernel
            SOURCE_RECORD: (inst.events[0] if inst.events else first).index,
        })
    df = pd.DataFrame(rows, columns=[
        "iteration", "rank", "op", "group", "seq_arg", "nbytes", "start_ns", "duration_us",
        "group_ranks", "peer", "clock", SOURCE_FILE, SOURCE_RECORD,
    ])
    for why, n in unsized.items():
        logger.warning("%s: %d op(s) count elements of %s, whose size is not known: their "
                       "message size is taken as 0 bytes", source, n, why)
    logger.debug("%s: rank %d, %d comm ops (%d kernels)", source, rank, len(df), len(kernels))
    return df, rank, world, unresolved, set(numbers)


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
    # The k-th recv of a group matches the k-th send: the two ends of one transfer
    op = df["op"].replace({"recv": "send"})
    k = df.assign(op=op).groupby(["rank", "group", "iteration", "op"], sort=False).cumcount()
    keyed = df[["group", "iteration", "start_ns"]].assign(op=op.to_numpy(), k=k.to_numpy())
    inst = keyed.groupby(["group", "iteration", "op", "k"], sort=False)["start_ns"].median()
    inst = inst.rename("t").reset_index().sort_values(["group", "iteration", "t"], kind="stable")
    inst["ordinal"] = inst.groupby("group", sort=False).cumcount().astype(np.int64)
    ordinal = keyed.merge(inst, on=["group", "iteration", "op", "k"], how="left")["ordinal"]
    has_arg = df["seq_arg"].notna().groupby(df["group"]).transform("all")
    seq = np.where(has_arg, df["seq_arg"].fillna(-1).astype("int64"), ordinal.to_numpy())
    df = df.drop(columns=["seq_arg"]).assign(seq=seq.astype(np.int64))
    members = df.groupby("group")["rank"].nunique()
    # a send/recv involves two ranks of its group, not all of them
    coll = df[~df["op"].isin(P2P_OPS)]
    per = coll.groupby(["group", "seq"])["rank"].nunique()
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
    world: tuple[int, str] | None = None  # the job's world size and the first file giving it
    unresolved: dict[int, tuple[str, int, int]] = {}
    steps: dict[int, set[int]] = {}  # per rank, the steps its traces so far hold
    windows: dict[int, set[int]] = {}  # per rank, the ProfilerStep numbers of its traces
    for p in each_file(paths):
        df, rank, size, gloo, recorded = _read_one(Path(p))
        windows.setdefault(rank, set()).update(recorded)
        if gloo is not None:
            unresolved[rank] = (str(p), *gloo)
        mine = set(map(int, pd.unique(df["iteration"]))) if len(df) else set()
        if rank in seen and (mine & steps[rank] or not mine):
            # (windows of one run, torch.profiler's schedule(repeat=N), hold other steps:
            # read together; traces of the same steps are two runs, or a copy)
            raise SchemaError(
                f"two traces claim rank {rank} (also {seen[rank]}) and its step(s) "
                f"{spans(sorted(mine & steps[rank]))}", source=str(p),
                column="distributedInfo.rank", value=rank,
                expected="one trace per rank, or traces of other steps (the windows of a "
                "profiler schedule with repeat)",
            )
        steps.setdefault(rank, set()).update(mine)
        if size is not None:
            if world is None:
                world = (size, str(p))
            elif size != world[0]:
                raise SchemaError(
                    f"world size disagrees with {world[1]}", source=str(p),
                    parameter="distributedInfo.world_size", value=size,
                    expected=f"the same world_size in every trace of one job ({world[0]} in "
                    f"{world[1]})",
                )
        seen[rank] = str(p)
        frames.append(df)
    if not frames:
        raise SchemaError("no Kineto trace given", expected="at least one trace file")
    _warn_gloo_unresolved(unresolved)
    if world is not None:
        # A trace without world_size of its own must still fit the job's world.
        for rank, p in seen.items():
            if rank >= world[0]:
                raise SchemaError(
                    "rank not below the world size", source=p, parameter="rank", value=rank,
                    expected=f"a rank in [0, {world[0] - 1}] (world_size {world[0]} in "
                    f"{world[1]})",
                )
    out, shift = align_steps(_shared_members(pd.concat(frames, ignore_index=True)), windows)
    steps = out["iteration"].nunique()
    out = assign_seq(common_steps(out, {r: {n + shift.get(r, 0) for n in w}
                                        for r, w in windows.items()}))
    left_out = steps - out["iteration"].nunique()
    # for the verdict's note and holmes check: a warning on stderr is lost to a script
    if unresolved:
        out.attrs["gloo_groups_merged_ranks"] = len(unresolved)
    if shift:
        out.attrs["kineto_renumbered_ranks"] = len(shift)
    if left_out:
        out.attrs["kineto_steps_left_out"] = int(left_out)
    return out


def _shared_members(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose group's members this trace could not tell (a list the profiler cut, no
    pg_config) take them from another rank's trace that could."""
    known = df.loc[df["group_ranks"] != "", ["group", "group_ranks"]].drop_duplicates("group")
    blank = (df["group_ranks"] == "").to_numpy()
    if blank.any() and len(known):
        fill = df.loc[blank, "group"].map(known.set_index("group")["group_ranks"]).fillna("")
        df.loc[blank, "group_ranks"] = fill.to_numpy()
    return df


def _step_votes(df: pd.DataFrame, ref: int) -> pd.DataFrame:
    """For the collectives of every rank but ``ref``, how far ``ref``'s step numbers run ahead
    of the rank's own: one vote (``rank``, ``vote``) per operation that can tell (see
    :func:`align_steps`)."""
    mine, theirs = df[df["rank"] != ref], df[df["rank"] == ref]
    keys = ["group", "seq_arg"]
    # the "Seq" argument counts a group's collectives on every member alike
    both = mine.dropna(subset=["seq_arg"]).merge(
        theirs.dropna(subset=["seq_arg"]).drop_duplicates(keys)[[*keys, "iteration"]],
        on=keys, suffixes=("", "_ref"))
    by_seq = pd.DataFrame({"rank": both["rank"].to_numpy(np.int64),
                           "vote": (both["iteration_ref"] - both["iteration"]).to_numpy(np.int64)})
    # by time, for the ranks "Seq" cannot place: a collective ends on all members together
    # (the last arrival releases them), so its end falls inside the reference rank's step
    # that ran it
    mine = mine[~mine["rank"].isin(by_seq["rank"].unique())]
    steps = theirs.assign(t0=theirs["start_ns"],
                          t1=theirs["start_ns"] + theirs["duration_us"] * 1000.0).groupby(
        "iteration").agg(t0=("t0", "min"), t1=("t1", "max")).sort_values("t0")
    t0, t1 = steps["t0"].to_numpy(np.float64), steps["t1"].to_numpy(np.float64)
    t = (mine["start_ns"] + mine["duration_us"] * 1000.0).to_numpy(np.float64)
    j = np.searchsorted(t0, t, side="right") - 1
    ok = (j >= 0) & (t <= t1[np.maximum(j, 0)]) if len(t0) else np.zeros(len(t), dtype=bool)
    by_time = pd.DataFrame({
        "rank": mine["rank"].to_numpy(np.int64)[ok],
        "vote": steps.index.to_numpy(np.int64)[j[ok]]
        - mine["iteration"].to_numpy(np.int64)[ok]})
    return pd.concat([by_seq, by_time], ignore_index=True)


def align_steps(df: pd.DataFrame, windows: dict[int, set[int]]
                ) -> tuple[pd.DataFrame, dict[int, int]]:
    """Renumber the steps of ranks whose profiler started at another step than the others'.

    ``ProfilerStep#N`` counts the steps since *that rank's* profiler was created: a rank that
    ran a few steps before creating it (or a schedule that differs across ranks) numbers the
    same training step differently, and its operations would be matched with those of another
    step (seq is numbered per step when the trace has no "Seq"; a (step, group, seq) names one
    instance). The reference is the rank with the most steps; for every other rank each
    collective votes for an offset: where both traces carry "Seq", the reference's step of the
    same (group, Seq); otherwise the reference's step whose span (its collectives' first start
    to last end) holds the collective's end, since a collective ends on all its members at
    once. An offset that more than half the votes give is applied, and said in a warning; then
    every rank is shifted alike so the rank whose profiler started first keeps its numbers.
    Traces of the same steps (offset 0) and ranks whose traces have no ``ProfilerStep#N``
    spans (``windows``: their numbers per rank) are left alone. Returns the table and what was
    added to each rank's step numbers (ranks left alone are not named).
    """
    stepped = [r for r, w in windows.items() if w]
    if len(df) == 0 or len(stepped) < 2:
        return df, {}
    coll = df[~df["op"].isin(P2P_OPS) & df["rank"].isin(stepped)]
    if len(coll) == 0:
        coll = df[df["rank"].isin(stepped)]
    count = coll.groupby("rank")["iteration"].nunique()
    ref = int(count.index[np.argmax(count.to_numpy())])  # the most steps; the lowest rank
    votes = _step_votes(coll, ref).groupby(["rank", "vote"]).size().rename("n").reset_index()
    # each rank's most common vote, if more than half of its votes give it
    votes["total"] = votes.groupby("rank")["n"].transform("sum")
    best = votes.sort_values(["rank", "n"], ascending=[True, False]).drop_duplicates("rank")
    best = best[(best["vote"] != 0) & (best["n"] * 2 > best["total"])]
    offsets = {int(r): int(v) for r, v in zip(best["rank"], best["vote"], strict=True)}
    if not offsets:
        return df, {}
    lowest = min(0, *offsets.values())
    # every rank with steps moves alike; one whose traces have none keeps its iteration 0
    moved = {r: offsets.get(r, 0) - lowest for r in sorted(stepped)}
    moved = {r: d for r, d in moved.items() if d}
    shift = df["rank"].map(moved).fillna(0).astype(np.int64)
    shown = ", ".join(f"rank {r} by {d:+d}" for r, d in list(moved.items())[:8])
    logger.warning(
        "the traces number the same steps differently (a profiler started at another step on "
        "some ranks): step numbers are shifted to match the rank whose profiler started "
        "first: %s%s (ProfilerStep#N of those ranks is read as iteration N + that)", shown,
        ", ..." if len(moved) > 8 else "")
    return df.assign(iteration=df["iteration"].to_numpy(np.int64) + shift.to_numpy()), moved


def common_steps(df: pd.DataFrame, windows: dict[int, set[int]]) -> pd.DataFrame:
    """Leave out the steps before the last rank's profiler began and after the first one's
    ended, with a warning: when the ranks' windows differ, those steps are in some traces only.

    Starting (and stopping, exporting) the profiler stalls its rank for a second or more, and
    the ranks already recording show that as one long wait in a step the stalled rank has no
    trace of; its missing copies would be read as the late arrival (an agent that stopped) and
    name the rank whose profiler started last, whoever the straggler is. A rank's window is
    its ``ProfilerStep#N`` spans (``windows``: their numbers per rank, aligned), whether or
    not its trace holds communication in each. Nothing is left out when the windows do not
    overlap, or when a trace has no steps.
    """
    if len(df) == 0 or len(windows) < 2 or not all(windows.values()):
        return df
    lo, hi = max(min(w) for w in windows.values()), min(max(w) for w in windows.values())
    if lo > hi:
        return df
    keep = df["iteration"].between(lo, hi).to_numpy()
    if keep.all():
        return df
    out = sorted(set(map(int, df.loc[~keep, "iteration"])))
    logger.warning(
        "step(s) %s are in the traces of some ranks only (their profilers recorded different "
        "windows): %d op(s) left out, the steps every trace holds (%d-%d) are analysed; "
        "starting or stopping a profiler stalls its rank, which the other ranks' traces show "
        "as a long wait", spans(out), int((~keep).sum()), lo, hi)
    return df[keep].reset_index(drop=True)
