"""NCCL Inspector profiler-plugin JSON Lines into the CommOps table.

What the plugin writes (NVIDIA/nccl ``ext-profiler/inspector`` and, later,
``plugins/profiler/inspector``; one file per process, ``<hostname>-pid<pid>.log``, one compact
JSON object per line):

* every operation is one object with ``header`` (``id`` = communicator hash string such as
  ``"0x7f8c496ae9f661"``, ``comm_name`` from later v4.0 builds on, ``rank`` = rank *inside that
  communicator*, ``n_ranks``, ``nnodes``), ``metadata`` (``inspector_output_format_version``,
  ``git_rev``, ``rec_mechanism``, ``dump_timestamp_us`` = wall clock of the dump in µs since
  the epoch, ``hostname``, ``pid``) and one payload:

  - ``coll_perf``: ``coll`` (``AllReduce``, ``AllGather``, ``ReduceScatter``, ``Broadcast``,
    ``Reduce``), ``coll_sn``, ``coll_msg_size_bytes``, ``coll_exec_time_us`` (integer µs: the
    longest kernel channel, GPU timer when available), ``coll_timing_source`` (``kernel_gpu``,
    ``kernel_cpu``, ``collective_cpu``), ``coll_algobw_gbs``, ``coll_busbw_gbs``; from v4.2 also
    ``coll_algo`` / ``coll_proto``; with ``NCCL_INSPECTOR_DUMP_VERBOSE=1`` also
    ``event_trace_sn`` and ``event_trace_ts`` (``coll_start_ts``, ``coll_stop_ts`` and
    ``kernel_events[{channel_id, kernel_start_ts, kernel_stop_ts, kernel_record_ts}]``, µs
    since the epoch);
  - ``p2p_perf`` (when P2P tracking is on): the same with the ``p2p_`` prefix (``p2p`` =
    ``Send``/``Recv``, ``p2p_sn``, ``p2p_peer`` = peer rank inside the communicator,
    ``p2p_msg_size_bytes``, ``p2p_exec_time_us``...; verbose ``p2p_start_ts``/``p2p_stop_ts``);
  - ``proxy_trace`` (v4.3, opt-in): network proxy steps; ignored here.

* v4.1 and v4.2 add one ``dump_stats`` object per communicator and dump (``header``,
  ``metadata`` and ``dump_stats`` = ``{coll_records, coll_dropped_total,
  coll_dropped_since_last_dump, p2p_records, ...}``); the operation lines stay self-contained.
* v4.3 writes ``header`` and ``metadata`` only on that ``dump_stats`` marker: the next
  ``coll_records + p2p_records + proxy_records`` lines each hold a single payload key and
  belong to the marker.

Mapping: ``group`` = ``comm-<header.id>``; ``rank`` = the process's rank in a communicator that
spans the whole job (``n_ranks`` = the largest seen), else processes are numbered by
(hostname, pid) with a warning; ``group_ranks`` is filled when every member of a communicator
appears in the input; ``coll_sn`` counts per operation type (NCCL keeps one counter per
function), so ``seq`` = ``sn * 16 + op code`` keeps different collectives of one communicator
apart while staying identical across its members (the raw number is in ``nccl_sn``).
``duration_us`` = the exec time; the start is the first kernel start of the verbose trace, else
the operation start event, else the dump time minus the duration (approximate: the extra
column ``start_exact`` is False). Iteration is 0 (the plugin does not know training steps).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import pandas as pd

from holmes_ml.io._common import iter_jsonl, require_op
from holmes_ml.io.schema import OP_TYPES, SchemaError

logger = logging.getLogger(__name__)

#: Payload keys of an operation line, and the prefix of their fields.
_PAYLOADS: dict[str, str] = {"coll_perf": "coll", "p2p_perf": "p2p"}
#: Every key that may carry a record body (``proxy_trace`` is counted, not read).
_BODIES: tuple[str, ...] = ("coll_perf", "p2p_perf", "proxy_trace")
#: ``dump_stats`` count announcing how many lines of each body follow a v4.3 marker.
_COUNT_KEYS: dict[str, str] = {"coll_perf": "coll_records", "p2p_perf": "p2p_records",
                               "proxy_trace": "proxy_records"}
#: Multiplier of the per-type NCCL sequence number in the canonical ``seq``.
SEQ_STRIDE = 16
_OP_CODE = {op: i for i, op in enumerate(OP_TYPES)}


def _version(metadata: dict) -> tuple[int, int]:
    m = re.match(r"v?(\d+)\.(\d+)", str(metadata.get("inspector_output_format_version", "")))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)


class _File:
    """Parse state of one file: the open v4.3 dump (marker line, context, counts left)."""

    def __init__(self, path: Path) -> None:
        self.source = str(path)
        self.marker_line = 0
        self.header: dict | None = None
        self.metadata: dict | None = None
        self.remaining: dict[str, int] = {}
        self.dropped: dict[tuple, int] = {}

    def fail(self, message: str, lineno: int, field: str, value: Any = None,
             expected: str | None = None) -> SchemaError:
        return SchemaError(message, source=self.source, row=lineno - 1, line=lineno,
                           column=field, value=value, expected=expected)

    def check_closed(self, lineno: int) -> None:
        left = {k: n for k, n in self.remaining.items() if n}
        if left:
            raise self.fail("dump has fewer records than its dump_stats marker announced",
                            self.marker_line, "dump_stats." + _COUNT_KEYS[next(iter(left))],
                            value=f"{sum(left.values())} missing before line {lineno}",
                            expected="the announced number of records after the marker")

    def context(self, obj: dict, lineno: int) -> tuple[dict, dict]:
        header, metadata = obj.get("header"), obj.get("metadata")
        if not isinstance(header, dict):
            raise self.fail("no header object", lineno, "header", type(header).__name__,
                            "a JSON object with id, rank, n_ranks")
        if not isinstance(metadata, dict):
            raise self.fail("no metadata object", lineno, "metadata", type(metadata).__name__,
                            "a JSON object with dump_timestamp_us, hostname, pid")
        for key, ok, what in (("id", lambda v: isinstance(v, str) and v, "a hash string"),
                              ("rank", _is_int, "an integer"), ("n_ranks", _is_int, "an integer")):
            if not ok(header.get(key)):
                raise self.fail("bad or missing header field", lineno, f"header.{key}",
                                header.get(key), what)
        if not _is_int(metadata.get("dump_timestamp_us")):
            raise self.fail("bad or missing metadata field", lineno,
                            "metadata.dump_timestamp_us", metadata.get("dump_timestamp_us"),
                            "an integer (µs since the epoch)")
        return header, metadata

    def marker(self, obj: dict, lineno: int) -> None:
        self.check_closed(lineno)
        header, metadata = self.context(obj, lineno)
        stats = obj["dump_stats"]
        if not isinstance(stats, dict):
            raise self.fail("dump_stats is not an object", lineno, "dump_stats",
                            type(stats).__name__, "a JSON object of record counts")
        key = (metadata.get("hostname"), metadata.get("pid"), header["id"], header["rank"])
        for name in ("coll_dropped_total", "p2p_dropped_total"):
            if _is_int(stats.get(name)):
                self.dropped[key + (name,)] = max(self.dropped.get(key + (name,), 0),
                                                  stats[name])
        self.header = self.metadata = None
        self.remaining = {}
        if _version(metadata) >= (4, 3):
            counts: dict[str, int] = {}
            for body, count_key in _COUNT_KEYS.items():
                n = stats.get(count_key, 0 if body == "proxy_trace" else None)
                if not _is_int(n) or n < 0:
                    raise self.fail("bad record count", lineno, f"dump_stats.{count_key}", n,
                                    "a non-negative integer")
                counts[body] = n
            self.header, self.metadata, self.remaining = header, metadata, counts
            self.marker_line = lineno

    def record(self, obj: dict, lineno: int) -> tuple[str, dict, dict, dict] | None:
        bodies = [k for k in _BODIES if k in obj]
        if len(bodies) != 1:
            raise self.fail("not an NCCL Inspector record", lineno, "coll_perf",
                            ",".join(sorted(obj)) or "{}",
                            "exactly one of coll_perf, p2p_perf, proxy_trace or dump_stats")
        body = bodies[0]
        if "header" in obj or "metadata" in obj:  # v4.0 - v4.2: self-contained line
            self.check_closed(lineno)
            self.header = self.metadata = None
            header, metadata = self.context(obj, lineno)
        elif self.header is None:
            raise self.fail("record without header or metadata", lineno, "header",
                            expected="a header on the line or a preceding v4.3 dump_stats "
                            "marker")
        else:
            if len(obj) != 1:
                raise self.fail("unexpected fields beside the payload of a v4.3 record",
                                lineno, ",".join(sorted(obj)), expected=body + " only")
            if self.remaining.get(body, 0) <= 0:
                raise self.fail("more records than the dump_stats marker announced", lineno,
                                "dump_stats." + _COUNT_KEYS[body],
                                expected=f"the marker on line {self.marker_line} to count it")
            self.remaining[body] -= 1
            assert self.metadata is not None  # set together with self.header
            header, metadata = self.header, self.metadata
        if body == "proxy_trace":
            return None
        perf = obj[body]
        if not isinstance(perf, dict):
            raise self.fail(f"{body} is not an object", lineno, body, type(perf).__name__,
                            "a JSON object")
        return body, perf, header, metadata


def _start_us(perf: dict, prefix: str) -> int | float | None:
    trace = perf.get("event_trace_ts")
    if not isinstance(trace, dict):
        return None
    kernels = [k.get("kernel_start_ts") for k in trace.get("kernel_events") or []
               if isinstance(k, dict)]
    starts = [s for s in kernels if _is_num(s) and s > 0]
    if starts:
        return min(starts)
    s = trace.get(f"{prefix}_start_ts")
    return s if _is_num(s) and s > 0 else None


def _us_to_ns(us: Any) -> int:
    # Epoch ns exceed float64's exact range: convert the integral µs part exactly.
    whole = int(us)
    return whole * 1000 + int(round((float(us) - whole) * 1000.0))


def _read_one(path: Path) -> list[dict[str, Any]]:
    state = _File(path)
    rows: list[dict[str, Any]] = []
    lineno = 0
    for lineno, obj in iter_jsonl(path, what="NCCL Inspector JSON Lines"):
        if "dump_stats" in obj:
            state.marker(obj, lineno)
            continue
        got = state.record(obj, lineno)
        if got is None:
            continue
        body, perf, header, metadata = got
        p = _PAYLOADS[body]
        name = perf.get(p)
        if not isinstance(name, str):
            raise state.fail("bad or missing field", lineno, f"{body}.{p}", name,
                             "an NCCL function name such as AllReduce")
        op = require_op(name, state.source, f"{body}.{p} (line {lineno})")
        fields = {"sn": f"{p}_sn", "size": f"{p}_msg_size_bytes", "exec": f"{p}_exec_time_us"}
        for what, key in fields.items():
            v = perf.get(key)
            ok = _is_num(v) if what == "exec" else _is_int(v)
            if not ok or not isinstance(v, (int, float)) or v < 0:
                raise state.fail("bad or missing field", lineno, f"{body}.{key}", v,
                                 "a non-negative number (µs)" if what == "exec"
                                 else "a non-negative integer")
        peer = -1
        if body == "p2p_perf":
            got = perf.get("p2p_peer")
            if not _is_int(got) or got < 0:
                raise state.fail("bad or missing field", lineno, "p2p_perf.p2p_peer", got,
                                 "a rank inside the communicator")
            peer = got
        exec_us = perf[fields["exec"]]
        start = _start_us(perf, p)
        exact = start is not None
        start_ns = (_us_to_ns(start) if exact else
                    metadata["dump_timestamp_us"] * 1000 - int(round(float(exec_us) * 1000)))
        host, pid = metadata.get("hostname"), metadata.get("pid")
        rows.append({
            "op": op,
            "comm_id": header["id"],
            "comm_rank": header["rank"],
            "group_size": header["n_ranks"],
            "nnodes": header.get("nnodes", -1),
            "comm_name": str(header.get("comm_name", "")),
            "nccl_sn": perf[fields["sn"]],
            "nbytes": perf[fields["size"]],
            "duration_us": float(exec_us),
            "start_ns": start_ns,
            "start_exact": exact,
            "comm_peer": peer,
            "timing_source": str(perf.get(f"{p}_timing_source", "")),
            "algo": str(perf.get("coll_algo", "")),
            "proto": str(perf.get("coll_proto", "")),
            "host": str(host if host is not None else ""),
            "process": f"{host}/{pid}" if host is not None and pid is not None
            else state.source,
        })
    state.check_closed(lineno + 1)
    lost = sum(state.dropped.values())
    if lost:
        logger.warning("%s: the plugin dropped %d records (ring buffer overrun, see dump_stats);"
                       " raise NCCL_INSPECTOR_DUMP_COLL_RING_SIZE or dump more often", path, lost)
    return rows


def _global_ranks(df: pd.DataFrame) -> np.ndarray:
    """Job-wide rank of each row (see the module docstring)."""
    world = int(df["group_size"].max())
    on_world = (df["group_size"] == world).to_numpy()
    rank = np.where(on_world, df["comm_rank"].to_numpy(), -1)
    per_proc = df.loc[on_world].groupby("process")["comm_rank"].unique()
    single = {p: int(r[0]) for p, r in per_proc.items() if len(r) == 1}
    missing = ~on_world
    rank[missing] = df.loc[missing, "process"].map(single).fillna(-1).to_numpy(np.int64)
    if (rank < 0).any():
        unresolved = sorted(set(df.loc[rank < 0, "process"]))
        start = int(rank.max()) + 1
        number = {p: start + i for i, p in enumerate(unresolved)}
        logger.warning("%d process(es) were seen on no job-wide communicator: their ranks are"
                       " numbered by host/pid from %d", len(unresolved), start)
        rank[rank < 0] = df.loc[rank < 0, "process"].map(number).to_numpy(np.int64)
    return rank.astype(np.int64)


def _membership(df: pd.DataFrame) -> tuple[pd.Series, dict[str, np.ndarray]]:
    """``group_ranks`` per row and, per complete communicator, global rank by comm rank."""
    members = df.groupby(["comm_id", "comm_rank"])["rank"].unique()
    complete: dict[str, np.ndarray] = {}
    for comm, sub in members.groupby(level=0):
        size = int(df.loc[df["comm_id"] == comm, "group_size"].iloc[0])
        local = sub.index.get_level_values(1).to_numpy()
        if len(sub) == size and sub.map(len).eq(1).all() and set(local) == set(range(size)):
            order = np.argsort(local)
            complete[comm] = np.array([int(sub.iloc[i][0]) for i in order], dtype=np.int64)
    text = {c: " ".join(map(str, r)) for c, r in complete.items()}
    return df["comm_id"].map(text).fillna(""), complete


def read_nccl_inspector(paths: Sequence[str | Path] | str | Path) -> pd.DataFrame:
    """Read NCCL Inspector JSONL files (any number of processes) into an unvalidated table.

    Parameters
    ----------
    paths:
        One or more ``<hostname>-pid<pid>.log`` files (plain or ``.gz``) of one job.

    Returns
    -------
    pandas.DataFrame
        Canonical columns plus ``group_ranks``, ``peer``, ``host`` and the extra columns
        ``group_size``, ``comm_rank``, ``comm_name``, ``nccl_sn``, ``start_exact``,
        ``timing_source``, ``algo``, ``proto``.

    Raises
    ------
    SchemaError
        A line that is not an Inspector record, a missing or mistyped field (named with file
        and line), an unknown operation name, or a v4.3 dump whose record count does not
        match its marker.

    Examples
    --------
    >>> ops = read_nccl_inspector("nccl-inspector-123/node0-pid4242.log")  # doctest: +SKIP
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    rows = [r for p in paths for r in _read_one(Path(p))]
    if not rows:
        raise SchemaError("no coll_perf or p2p_perf records",
                          source=str(paths[0]) if paths else None,
                          expected="NCCL Inspector JSON Lines with operation records")
    df = pd.DataFrame.from_records(rows)
    df["rank"] = _global_ranks(df)
    df["group_ranks"], complete = _membership(df)
    codes = df["op"].map(_OP_CODE).to_numpy(np.int64)
    df["seq"] = df["nccl_sn"].to_numpy(np.int64) * SEQ_STRIDE + codes
    df["group"] = "comm-" + df["comm_id"].astype(str)
    df["iteration"] = np.int64(0)
    # P2P peers: comm rank -> global rank when the communicator's members are known.
    peer = np.full(len(df), -1, dtype=np.int64)
    is_p2p = (df["comm_peer"] >= 0).to_numpy()
    world = int(df["group_size"].max())
    for comm, idx in df.index[is_p2p].groupby(df.loc[is_p2p, "comm_id"]).items():
        local = df.loc[idx, "comm_peer"].to_numpy(np.int64)
        if comm in complete and (local < len(complete[comm])).all():
            peer[idx] = complete[comm][local]
        elif int(df.loc[idx[0], "group_size"]) == world:
            peer[idx] = local
    df["peer"] = peer
    for col in ("group_size", "comm_rank", "nccl_sn", "nnodes", "comm_peer"):
        df[col] = df[col].astype(np.int64)
    return df.drop(columns=["comm_id", "process"])
