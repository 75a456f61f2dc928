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
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import pandas as pd

from holmes_ml._text import shown
from holmes_ml.io._common import (
    MAX_WORLD,
    SOURCE_FILE,
    SOURCE_RECORD,
    canonical_op,
    check_unicode,
    cut,
    each_file,
    iter_jsonl,
    kind_name,
)
from holmes_ml.io.schema import OP_TYPES, P2P_OPS, SchemaError

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
_I64_MAX = (1 << 63) - 1
#: Largest µs time or duration whose value in ns fits an int64 (``start_ns``).
_MAX_US = _I64_MAX // 1000 - 1
#: Largest NCCL sequence number whose ``seq`` (``sn * SEQ_STRIDE + op code``) fits an int64.
_MAX_SN = _I64_MAX // SEQ_STRIDE - 1


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> TypeGuard[int | float]:
    # An int is finite at any size; math.isfinite(int) would overflow converting it to float.
    return _is_int(v) or (isinstance(v, float) and math.isfinite(v))


class _File:
    """Parse state of one file: the open v4.3 dump (marker line, context, counts left)."""

    def __init__(self, path: Path) -> None:
        self.source = str(path)
        self.marker_line = 0
        #: (header, metadata) of the open v4.3 dump, which its records take.
        self.open: tuple[dict, dict] | None = None
        self.remaining: dict[str, int] = {}
        self.dropped: dict[tuple, int] = {}

    def fail(self, message: str, lineno: int, field: str, value: Any = None,
             expected: str | None = None) -> SchemaError:
        return SchemaError(message, source=self.source, row=lineno - 1, line=lineno,
                           parameter=field, value=value, expected=expected)

    def integer(self, value: Any, lineno: int, field: str, lo: int = 0,
                hi: int = _I64_MAX) -> int:
        """``value`` of ``field`` as an integer in ``[lo, hi]``. The plugin writes JSON
        integers: a string or a float there means a broken file, not a spelling to accept."""
        if not _is_int(value):
            raise self.fail("bad or missing field", lineno, field, shown(value),
                            f"an integer in [{lo}, {hi}]")
        if not lo <= value <= hi:
            raise self.fail("out of range", lineno, field, value, f"an integer in [{lo}, {hi}]")
        return value

    def number(self, value: Any, lineno: int, field: str) -> int | float:
        """``value`` of ``field`` as a finite number in ``[0, _MAX_US]`` (µs)."""
        if not _is_num(value):
            raise self.fail("bad or missing field", lineno, field, shown(value),
                            "a finite number >= 0 (µs)")
        if not 0 <= value <= _MAX_US:
            raise self.fail("out of range", lineno, field, value,
                            f"a number of µs in [0, {_MAX_US}]")
        return value

    def text(self, value: Any, lineno: int, field: str) -> str:
        """String field ``field`` ("" when null) as text a table can hold: JSON escapes such as
        ``\\ud800`` make lone surrogates, which (Arrow) string columns refuse with a
        UnicodeEncodeError."""
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self.fail("wrong type", lineno, field, kind_name(value), "a string")
        return check_unicode(value, field, self.source, lineno)

    def version(self, metadata: dict, lineno: int) -> tuple[int, int]:
        """``inspector_output_format_version`` as (major, minor); (0, 0) when it has none."""
        text = str(metadata.get("inspector_output_format_version", ""))
        m = re.match(r"v?(\d+)\.(\d+)", text)
        if m is None:
            return (0, 0)
        # int() refuses more than 4,300 digits (ValueError); no real version comes close.
        if max(len(m.group(1)), len(m.group(2))) > 6:
            raise self.fail("format version out of range", lineno,
                            "metadata.inspector_output_format_version", shown(text),
                            "a version such as v4.3")
        return int(m.group(1)), int(m.group(2))

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
            raise self.fail("no header object", lineno, "header", kind_name(header),
                            "a JSON object with id, rank, n_ranks")
        if not isinstance(metadata, dict):
            raise self.fail("no metadata object", lineno, "metadata", kind_name(metadata),
                            "a JSON object with dump_timestamp_us, hostname, pid")
        comm = header.get("id")
        if not isinstance(comm, str) or not comm:
            raise self.fail("bad or missing header field", lineno, "header.id", shown(comm),
                            "a hash string")
        self.text(comm, lineno, "header.id")
        n = self.integer(header.get("n_ranks"), lineno, "header.n_ranks", lo=1, hi=MAX_WORLD)
        # rank is the rank inside the communicator: below its n_ranks.
        self.integer(header.get("rank"), lineno, "header.rank", hi=n - 1)
        if header.get("nnodes") is not None:
            self.integer(header["nnodes"], lineno, "header.nnodes", lo=1, hi=n)
        self.text(header.get("comm_name"), lineno, "header.comm_name")
        self.integer(metadata.get("dump_timestamp_us"), lineno, "metadata.dump_timestamp_us",
                     hi=_MAX_US)
        # hostname and pid name the process (several files, one rank): keys, so no containers.
        self.text(metadata.get("hostname"), lineno, "metadata.hostname")
        pid = metadata.get("pid")
        if isinstance(pid, str):
            self.text(pid, lineno, "metadata.pid")
        elif pid is not None and not _is_int(pid):
            raise self.fail("wrong type", lineno, "metadata.pid", kind_name(pid),
                            "an integer (process id)")
        return header, metadata

    def marker(self, obj: dict, lineno: int) -> None:
        self.check_closed(lineno)
        header, metadata = self.context(obj, lineno)
        stats = obj["dump_stats"]
        if not isinstance(stats, dict):
            raise self.fail("dump_stats is not an object", lineno, "dump_stats",
                            kind_name(stats), "a JSON object of record counts")
        key = (metadata.get("hostname"), metadata.get("pid"), header["id"], header["rank"])
        for name in ("coll_dropped_total", "p2p_dropped_total"):
            if _is_int(stats.get(name)):
                self.dropped[key + (name,)] = max(self.dropped.get(key + (name,), 0),
                                                  stats[name])
        self.open = None
        self.remaining = {}
        if self.version(metadata, lineno) >= (4, 3):
            counts: dict[str, int] = {}
            for body, count_key in _COUNT_KEYS.items():
                n = stats.get(count_key, 0 if body == "proxy_trace" else None)
                if not _is_int(n) or n < 0:
                    raise self.fail("bad record count", lineno, f"dump_stats.{count_key}",
                                    shown(n), "a non-negative integer")
                counts[body] = n
            self.open, self.remaining = (header, metadata), counts
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
            self.open = None
            header, metadata = self.context(obj, lineno)
        elif self.open is None:
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
            header, metadata = self.open
        if body == "proxy_trace":
            return None
        perf = obj[body]
        if not isinstance(perf, dict):
            raise self.fail(f"{body} is not an object", lineno, body, kind_name(perf),
                            "a JSON object")
        return body, perf, header, metadata

    def start_us(self, perf: dict, body: str, lineno: int) -> int | float | None:
        """Start of an operation in the verbose trace: its first kernel, else its start event;
        None without a trace. A 0 timestamp is one the plugin did not record."""
        trace = perf.get("event_trace_ts")
        if trace is None:
            return None
        where = f"{body}.event_trace_ts"
        if not isinstance(trace, dict):
            raise self.fail("wrong type", lineno, where, kind_name(trace), "a JSON object")
        events = trace.get("kernel_events")
        if events is not None and not isinstance(events, list):
            raise self.fail("wrong type", lineno, f"{where}.kernel_events", kind_name(events),
                            "a JSON list")
        starts = []
        for j, event in enumerate(events or ()):
            if not isinstance(event, dict):
                raise self.fail("wrong type", lineno, f"{where}.kernel_events[{j}]",
                                kind_name(event), "a JSON object")
            s = event.get("kernel_start_ts")
            if s is not None and self.number(
                    s, lineno, f"{where}.kernel_events[{j}].kernel_start_ts") > 0:
                starts.append(s)
        if starts:
            return min(starts)
        key = _PAYLOADS[body] + "_start_ts"
        s = trace.get(key)
        return s if s is not None and self.number(s, lineno, f"{where}.{key}") > 0 else None


def _us_to_ns(us: Any) -> int:
    # Epoch ns exceed float64's exact range: convert the integral µs part exactly.
    whole = int(us)
    return whole * 1000 + int(round((float(us) - whole) * 1000.0))


def _read_one(path: Path, file: int) -> list[dict[str, Any]]:
    """Rows of one file; ``file`` (its index among the inputs) and ``line`` locate each row
    for errors found across files."""
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
            raise state.fail("bad or missing field", lineno, f"{body}.{p}", shown(name),
                             "an NCCL function name such as AllReduce")
        op = canonical_op(name)
        if op is None:
            raise state.fail("unknown communication operator", lineno, f"{body}.{p}", name,
                             "an NCCL function name such as AllReduce, AllGather, "
                             "ReduceScatter, Broadcast, Reduce, Send, Recv")
        if (op in P2P_OPS) != (body == "p2p_perf"):
            raise state.fail(f"{name} in {body}", lineno, f"{body}.{p}", name,
                             "Send or Recv in p2p_perf, a collective in coll_perf")
        sn = state.integer(perf.get(f"{p}_sn"), lineno, f"{body}.{p}_sn", hi=_MAX_SN)
        size = state.integer(perf.get(f"{p}_msg_size_bytes"), lineno,
                             f"{body}.{p}_msg_size_bytes")
        exec_us = state.number(perf.get(f"{p}_exec_time_us"), lineno,
                               f"{body}.{p}_exec_time_us")
        peer = -1
        if body == "p2p_perf":
            peer = state.integer(perf.get("p2p_peer"), lineno, "p2p_perf.p2p_peer",
                                 hi=header["n_ranks"] - 1)
        start = state.start_us(perf, body, lineno)
        exact = start is not None
        if start is not None:
            start_ns = _us_to_ns(start)
        else:
            start_ns = metadata["dump_timestamp_us"] * 1000 - int(round(float(exec_us) * 1000))
            if start_ns < 0:
                raise state.fail("operation longer than the time from the epoch to its dump",
                                 lineno, f"{body}.{p}_exec_time_us", exec_us,
                                 "at most metadata.dump_timestamp_us "
                                 f"({metadata['dump_timestamp_us']} µs)")
        host, pid = metadata.get("hostname"), metadata.get("pid")
        rows.append({
            "op": op,
            "comm_id": header["id"],
            "comm_rank": header["rank"],
            "group_size": header["n_ranks"],
            "nnodes": header["nnodes"] if header.get("nnodes") is not None else -1,
            "comm_name": header.get("comm_name") or "",
            "nccl_sn": sn,
            "nbytes": size,
            "duration_us": float(exec_us),
            "start_ns": start_ns,
            "start_exact": exact,
            "comm_peer": peer,
            "timing_source": state.text(perf.get(f"{p}_timing_source"), lineno,
                                        f"{body}.{p}_timing_source"),
            "algo": state.text(perf.get("coll_algo"), lineno, f"{body}.coll_algo"),
            "proto": state.text(perf.get("coll_proto"), lineno, f"{body}.coll_proto"),
            "host": str(host if host is not None else ""),
            # Without host and pid the file stands for the process (one file per process).
            "process": f"{host}/{pid}" if host is not None and pid is not None
            else f"{_NO_HOST_PID} {file}",
            "file": file,
            "line": lineno,
        })
    state.check_closed(lineno + 1)
    lost = sum(state.dropped.values())
    if lost:
        logger.warning("%s: the plugin dropped %d records (ring buffer overrun, see dump_stats);"
                       " raise NCCL_INSPECTOR_DUMP_COLL_RING_SIZE or dump more often", path, lost)
    return rows


#: ``process`` of a line whose metadata lacks hostname or pid: this text and the file index.
_NO_HOST_PID = "no hostname/pid, file"


def _check_communicators(df: pd.DataFrame, sources: list[str]) -> None:
    """Refuse processes that disagree about a communicator: on its size (one wrong n_ranks
    would renumber every process) or on who holds one of its ranks (two processes claiming a
    rank would be merged into one)."""
    file, line = df["file"].to_numpy(), df["line"].to_numpy()
    comm, size = df["comm_id"].to_numpy(), df["group_size"].to_numpy()
    rank, proc = df["comm_rank"].to_numpy(), df["process"].to_numpy()

    def where(i: int) -> str:
        return f"{sources[file[i]]} line {line[i]}"

    def who(i: int) -> str:
        return "a line without hostname/pid" if proc[i].startswith(_NO_HOST_PID) else \
            cut(proc[i], 80)

    # Each row against the first row of its communicator (of its comm rank): vectorized.
    odd = size != df.groupby("comm_id", sort=False)["group_size"].transform("first").to_numpy()
    if odd.any():
        i = int(odd.argmax())
        j = int((comm == comm[i]).argmax())
        raise SchemaError(
            f"processes disagree on the size of communicator {comm[i]}: {size[i]} here, "
            f"{size[j]} in {where(j)}", source=sources[file[i]], line=int(line[i]),
            parameter="header.n_ranks", value=int(size[i]),
            expected="one n_ranks per communicator in every file")
    holder = df.groupby(["comm_id", "comm_rank"], sort=False)["process"].transform("first")
    odd = proc != holder.to_numpy()
    if odd.any():
        i = int(odd.argmax())
        j = int(((comm == comm[i]) & (rank == rank[i])).argmax())
        raise SchemaError(
            f"two processes claim rank {rank[i]} of communicator {comm[i]}: {who(i)} here, "
            f"{who(j)} in {where(j)}", source=sources[file[i]], line=int(line[i]),
            parameter="header.rank", value=int(rank[i]),
            expected="one process per rank of a communicator")


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
    sizes = df.groupby("comm_id")["group_size"].first()  # one per comm: _check_communicators
    complete: dict[str, np.ndarray] = {}
    for comm, sub in members.groupby(level=0):
        size = int(sizes[comm])
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
        A line that is not an Inspector record, a missing, mistyped or out-of-range field
        (named with file and line), an unknown operation name, a v4.3 dump whose record count
        does not match its marker, or files that disagree on a communicator's size or on which
        process holds one of its ranks.

    Examples
    --------
    >>> ops = read_nccl_inspector("nccl-inspector-123/node0-pid4242.log")  # doctest: +SKIP
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    sources = [str(p) for p in paths]
    rows = [r for i, p in enumerate(each_file(paths)) for r in _read_one(Path(p), i)]
    if not rows:
        raise SchemaError("no coll_perf or p2p_perf records",
                          source=sources[0] if sources else None,
                          expected="NCCL Inspector JSON Lines with operation records")
    df = pd.DataFrame.from_records(rows)
    _check_communicators(df, sources)
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
    df[SOURCE_FILE] = np.asarray(sources, dtype=object)[df["file"].to_numpy(np.int64)]
    return df.drop(columns=["comm_id", "process", "file"]).rename(columns={"line": SOURCE_RECORD})
