"""PyTorch Flight Recorder dumps (one per rank) into the CommOps table, plus hang localization.

A dump (``torch._C._distributed_c10d._dump_fr_trace_json``) is a JSON object with
``pg_config`` (process group name -> ``{"name", "desc", "ranks"}``) and ``entries``, one per
operator: ``collective_seq_id``, ``p2p_seq_id``, ``profiling_name`` (``nccl:all_reduce``),
``process_group`` (``[name, desc]``), ``input_sizes``/``input_dtypes``/``output_sizes``/
``output_dtypes``, ``time_created_ns``, ``time_discovered_started_ns``,
``time_discovered_completed_ns``, ``duration_ms`` (NCCL with ``TORCH_NCCL_ENABLE_TIMING=1``) and
``state`` (``scheduled``/``started``/``completed``).

The rank is the dump's ``rank`` field, else the number in the file name. Pickled dumps (the
default of older torch) are only read with ``trust_pickle=True`` because unpickling runs code
from the file.

Ops table: ``start_ns`` is ``time_discovered_started_ns`` (else ``time_created_ns``); duration is
``duration_ms`` (else completed - started discovery times). Entries with neither (gloo dumps,
unfinished ops) have no duration and are left out of the table, but :func:`hang_report` uses them.
"""

from __future__ import annotations

import logging
import pickle
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from holmes_ml.io._common import (
    dtype_bytes,
    head_bytes,
    load_json,
    open_bytes,
    parse_rank_list,
    rank_from_name,
    ranks_str,
    require_op,
)
from holmes_ml.io.schema import P2P_OPS, SchemaError

logger = logging.getLogger(__name__)

_PEER_RE = re.compile(r"(\d+)\s*(->|<-)\s*(\d+)")


@dataclass(frozen=True)
class HangFinding:
    """Members of a group that never reached a collective the others entered.

    Attributes
    ----------
    group:
        Process group name.
    seq:
        First ``collective_seq_id`` some members reached and others did not.
    op:
        Operator the members that got there were running.
    missing_ranks:
        Ranks whose last recorded collective in this group is before ``seq``.
    reached_ranks:
        Ranks that recorded ``seq``.
    """

    group: str
    seq: int
    op: str
    missing_ranks: tuple[int, ...]
    reached_ranks: tuple[int, ...]

    def to_dict(self) -> dict:
        return {"group": self.group, "seq": self.seq, "op": self.op,
                "missing_ranks": list(self.missing_ranks),
                "reached_ranks": list(self.reached_ranks)}


def load_dump(path: str | Path, trust_pickle: bool = False) -> dict:
    """Load one Flight Recorder dump (JSON; pickle only when ``trust_pickle``)."""
    p = Path(path)
    if head_bytes(p, 1)[:1] == b"\x80":
        if not trust_pickle:
            raise SchemaError(
                "refusing to unpickle a Flight Recorder dump: unpickling runs code stored in the "
                "file", source=str(p), parameter="trust_pickle", value=False,
                expected="a JSON dump (TORCH_FR_DUMP_JSON / _dump_fr_trace_json) or "
                "--trust-pickle for a file you produced yourself",
            )
        try:
            doc = pickle.loads(open_bytes(p))  # noqa: S301 - explicitly trusted by the caller
        except Exception as exc:  # any unpickling failure is a bad input file
            raise SchemaError(f"cannot unpickle: {exc}", source=str(p)) from exc
    else:
        doc = load_json(p, what="a Flight Recorder JSON dump (or a pickled one with "
                        "trust_pickle)")
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise SchemaError("not a Flight Recorder dump", source=str(p), column="entries",
                          expected="an object with an 'entries' list")
    if doc.get("rank") is None:
        rank = rank_from_name(p)
        if rank is None:
            m = re.search(r"(\d+)$", p.name)
            rank = int(m.group(1)) if m else None
        if rank is None:
            raise SchemaError("cannot tell which rank this dump belongs to", source=str(p),
                              column="rank", expected="a 'rank' field or a file name ending in it")
        doc = {**doc, "rank": rank}
    return doc


def _group_of(entry: dict) -> str:
    pg = entry.get("process_group")
    if isinstance(pg, (list, tuple)) and pg:
        return str(pg[0])
    return str(pg if pg is not None else entry.get("pg_id", "default"))


def _nbytes(entry: dict) -> int:
    best = 0
    for sizes_key, types_key in (("input_sizes", "input_dtypes"), ("output_sizes", "output_dtypes")):
        sizes, types = entry.get(sizes_key) or [], entry.get(types_key) or []
        total = 0
        for shape, dt in zip(sizes, types, strict=False):
            width = dtype_bytes(dt) or 0
            total += int(np.prod(shape)) * width if isinstance(shape, list) else 0
        best = max(best, total)
    return best


def _rows(doc: dict, source: str) -> list[dict[str, Any]]:
    rank = int(doc["rank"])
    pg_ranks = {str(k): parse_rank_list((v or {}).get("ranks")) if isinstance(v, dict) else None
                for k, v in (doc.get("pg_config") or {}).items()}
    rows = []
    skipped = 0
    for i, e in enumerate(doc["entries"]):
        if not isinstance(e, dict):
            raise SchemaError("entry is not an object", source=source, row=i, column="entries",
                              value=type(e).__name__, expected="a JSON object")
        name = str(e.get("profiling_name", ""))
        op = require_op(name.split(" ")[0], source, f"entries[{i}].profiling_name")
        start = e.get("time_discovered_started_ns") or e.get("time_created_ns")
        dur_ms = e.get("duration_ms")
        if dur_ms is None and e.get("time_discovered_completed_ns") and e.get(
                "time_discovered_started_ns"):
            dur_ms = (e["time_discovered_completed_ns"] - e["time_discovered_started_ns"]) / 1e6
        if dur_ms is None or start is None:
            skipped += 1
            continue
        group = _group_of(e)
        peer = -1
        if op in P2P_OPS:
            m = _PEER_RE.search(name)
            if m:
                a, b = int(m.group(1)), int(m.group(3))
                # "send 0->1" / "recv 1<-0": the peer is the number that is not this rank.
                peer = b if a == rank else a
        is_p2p = op in P2P_OPS or bool(e.get("is_p2p"))
        rows.append({
            "iteration": 0,
            "rank": rank,
            "op": op,
            "group": group,
            "seq": e.get("p2p_seq_id" if is_p2p else "collective_seq_id", 0),
            "nbytes": _nbytes(e),
            "start_ns": int(start),
            "duration_us": float(dur_ms) * 1000.0,
            "group_ranks": ranks_str(pg_ranks.get(group)),
            "peer": peer,
            "state": str(e.get("state", "")),
        })
    if skipped:
        logger.warning("%s: %d of %d entries have no duration (gloo or unfinished) and are "
                       "not in the ops table", source, skipped, len(doc["entries"]))
    return rows


def read_flight_recorder(
    paths: Sequence[str | Path] | str | Path, trust_pickle: bool = False
) -> pd.DataFrame:
    """Read Flight Recorder dumps (one per rank) into an unvalidated CommOps table.

    Raises
    ------
    SchemaError
        Pickle without ``trust_pickle``, malformed dump, unknown op, or no timed entry at all.

    Examples
    --------
    >>> ops = read_flight_recorder("fr_dumps/")  # doctest: +SKIP
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    rows: list[dict] = []
    for p in paths:
        rows.extend(_rows(load_dump(p, trust_pickle), str(p)))
    if not rows:
        raise SchemaError(
            "no entry has a duration", source=str(paths[0]) if paths else None,
            column="duration_ms",
            expected="NCCL dumps recorded with TORCH_NCCL_ENABLE_TIMING=1 (gloo dumps carry no "
            "durations; use hang_report for them)",
        )
    return pd.DataFrame.from_records(rows)


def hang_report(
    dumps: Sequence[str | Path] | Mapping[int, Sequence[dict]],
    trust_pickle: bool = False,
) -> list[HangFinding]:
    """Find ranks that never reached a collective other members of its group entered.

    Parameters
    ----------
    dumps:
        Dump files (one per rank), or ``{rank: entries}``.
    trust_pickle:
        See :func:`load_dump`.

    Returns
    -------
    list of HangFinding
        One finding per group where members stopped at different collectives, ordered by group.

    Examples
    --------
    >>> e = lambda s: {"collective_seq_id": s, "profiling_name": "nccl:all_reduce",
    ...                "process_group": ["0", ""]}
    >>> hang_report({0: [e(1), e(2)], 1: [e(1)]})[0].missing_ranks
    (1,)
    """
    if isinstance(dumps, Mapping):
        per_rank = {int(r): list(v) for r, v in dumps.items()}
        pg_ranks: dict[str, list[int] | None] = {}
    else:
        per_rank, pg_ranks = {}, {}
        for p in dumps:
            doc = load_dump(p, trust_pickle)
            per_rank[int(doc["rank"])] = doc["entries"]
            for k, v in (doc.get("pg_config") or {}).items():
                if isinstance(v, dict):
                    pg_ranks[str(k)] = parse_rank_list(v.get("ranks"))
    rows = []
    for rank, entries in per_rank.items():
        for e in entries:
            name = str(e.get("profiling_name", ""))
            if e.get("is_p2p") or require_op(name.split(" ")[0], f"rank {rank}",
                                             "profiling_name") in P2P_OPS:
                continue
            rows.append((rank, _group_of(e), int(e.get("collective_seq_id", 0)), name))
    if not rows:
        return []
    df = pd.DataFrame(rows, columns=["rank", "group", "seq", "name"])
    last = df.groupby(["group", "rank"])["seq"].max()
    findings = []
    for group, per in last.groupby(level="group"):
        per = per.droplevel("group")
        members = pg_ranks.get(str(group)) or []
        # Members listed by the group config but with no entry at all never reached anything.
        absent = [r for r in members if r not in per.index and r in per_rank]
        low, top = int(per.min()), int(per.max())
        if low == top and not absent:
            continue
        # The first collective some members entered and the stragglers never reached.
        first_missing = low + 1 if low < top else int(df.loc[df["group"] == group, "seq"].min())
        behind = sorted({int(r) for r in per.index[per < first_missing]} | set(absent))
        reached = tuple(sorted(int(r) for r in per.index[per >= first_missing]))
        sub = df[(df["group"] == group) & (df["seq"] == first_missing)]
        findings.append(HangFinding(
            group=str(group), seq=first_missing,
            op=str(sub["name"].iloc[0]) if len(sub) else "",
            missing_ranks=tuple(behind), reached_ranks=reached,
        ))
    return findings
