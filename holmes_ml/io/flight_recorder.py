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

import pandas as pd

from holmes_ml.io._common import (
    MAX_WORLD,
    SOURCE_FILE,
    SOURCE_RECORD,
    as_float,
    as_int,
    as_obj,
    check_unicode,
    cut,
    dtype_bytes,
    each_file,
    head_bytes,
    load_json,
    open_bytes,
    rank_from_name,
    ranks_str,
    require_op,
)
from holmes_ml.io.schema import P2P_OPS, SchemaError

logger = logging.getLogger(__name__)

# "send 0->1" / "recv 1<-0". The look-behind lets a match start only at the first digit of a
# run: without it search() retries at every digit of a long run and backtracks over the rest
# each time (quadratic: a name with 80,000 digits took 76 s).
_PEER_RE = re.compile(r"(?<!\d)(\d+)\s*(->|<-)\s*(\d+)")
_I64_MAX = (1 << 63) - 1


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
    """Load one Flight Recorder dump (JSON; pickle only when ``trust_pickle``).

    Its ``rank`` is a checked int, taken from the file name when the dump has none.
    """
    p = Path(path)
    if head_bytes(p, 1)[:1] == b"\x80":
        if not trust_pickle:
            raise SchemaError(
                "refusing to unpickle a Flight Recorder dump: unpickling runs code stored in the "
                "file", source=str(p), parameter="trust_pickle", value=False,
                expected="a JSON dump (TORCH_FR_DUMP_JSON / _dump_fr_trace_json) or, for a "
                "file you produced yourself, --trust-pickle (holmes localize / detect / check; "
                "trust_pickle=True in Python)",
            )
        try:
            doc = pickle.loads(open_bytes(p))  # noqa: S301 - explicitly trusted by the caller
        except Exception as exc:  # any unpickling failure is a bad input file
            raise SchemaError(f"cannot unpickle: {exc}", source=str(p)) from exc
    else:
        doc = load_json(p, what="a Flight Recorder JSON dump (or a pickled one with "
                        "--trust-pickle)")
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise SchemaError("not a Flight Recorder dump", source=str(p), column="entries",
                          expected="an object with an 'entries' list")
    rank, field = doc.get("rank"), "rank"
    if rank is None:
        rank, field = rank_from_name(p), "rank (from the file name)"
        if rank is None:
            m = re.search(r"(\d+)$", p.name)
            rank = int(m.group(1)) if m else None
        if rank is None:
            raise SchemaError("cannot tell which rank this dump belongs to", source=str(p),
                              column="rank", expected="a 'rank' field or a file name ending in it")
    return {**doc, "rank": as_int(rank, field, str(p), lo=0, hi=MAX_WORLD - 1)}


def _claim(seen: dict[int, str], rank: int, source: str) -> None:
    """Note that ``source`` is the dump of ``rank``; a second dump of one rank is refused
    (merging them would mix two ranks' operators under one rank)."""
    if rank in seen:
        raise SchemaError(f"two dumps claim rank {rank} (also {seen[rank]})", source=source,
                          parameter="rank", value=rank, expected="one dump per rank")
    seen[rank] = source


def _text(value: Any, field: str, source: str) -> str:
    """``value`` as text a table can hold (see :func:`~holmes_ml.io._common.check_unicode`)."""
    return check_unicode(str(value), field, source)


def _members(value: Any, field: str, source: str) -> list[int] | None:
    """Global ranks of a process group from its ``ranks`` (``"[0, 1]"`` as torch writes it, or
    a list); None when none are given (``"[]"``, ``"all ranks"``)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = re.findall(r"-?\d+", value)
    ranks = [as_int(r, field, source, lo=0, hi=MAX_WORLD - 1)
             for r in as_obj(value, field, source, list)]
    return ranks or None


def _pg_members(doc: dict, source: str) -> dict[str, list[int] | None]:
    """Members of each process group of a dump's ``pg_config``, by group name."""
    config = as_obj(doc.get("pg_config"), "pg_config", source, dict, default={})
    members = {}
    for name, pg in config.items():
        where = f"pg_config[{cut(str(name))!r}]"
        members[str(name)] = _members(as_obj(pg, where, source, dict).get("ranks"),
                                      f"{where}.ranks", source)
    return members


def _group_of(entry: dict, at: str, source: str) -> str:
    """Name of an entry's process group: ``process_group`` is ``[name, desc]`` (else the
    ``pg_id``); a name that is not text or a number is refused."""
    pg = entry.get("process_group")
    if isinstance(pg, (list, tuple)) and pg:
        name, field = pg[0], "process_group[0]"
    elif pg is not None:
        name, field = pg, "process_group"
    else:
        name, field = entry.get("pg_id", "default"), "pg_id"
    if isinstance(name, (list, tuple, dict, bool)):
        raise SchemaError("wrong type", source=source, parameter=f"{at}.{field}",
                          value=type(name).__name__, expected="a process group name")
    return _text(name, f"{at}.{field}", source)


#: ``profiling_name`` of the entry ProcessGroupNCCL records after the operations of one
#: coalesced group (``batch_isend_irecv``, ``*_coalesced`` collectives): no operation itself.
COALESCED = "nccl:coalesced"


def _op_of(entry: Any, at: str, source: str) -> tuple[str, str]:
    """An entry's ``profiling_name`` and the schema op it names (``""`` for the entry closing a
    coalesced group)."""
    as_obj(entry, at, source, dict)
    name = as_obj(entry.get("profiling_name"), f"{at}.profiling_name", source, str)
    if name.strip() == COALESCED:
        return name, ""
    return name, require_op(name.split(" ")[0], source, f"{at}.profiling_name")


def _uint(value: Any, at: str, key: str, source: str, nullable: bool = True) -> int | None:
    """Entry field ``key`` as an int in [0, 2**63); None when it is null and ``nullable``."""
    if type(value) is int and 0 <= value <= _I64_MAX:  # the common case, no message built
        return value
    if value is None and nullable:
        return None
    return as_int(value, f"{at}.{key}", source, lo=0, hi=_I64_MAX)


def _flag(entry: dict, at: str, source: str) -> bool:
    """The entry's ``is_p2p`` (absent: false)."""
    value = entry.get("is_p2p")
    if value is None or isinstance(value, bool):
        return bool(value)
    raise SchemaError("wrong type", source=source, parameter=f"{at}.is_p2p",
                      value=cut(repr(value)), expected="true or false")


def _nbytes(entry: dict, at: str, source: str) -> int:
    """Bytes an entry moves: the larger of its inputs and its outputs (shape x dtype width)."""
    best = 0
    for sizes_key, types_key in (("input_sizes", "input_dtypes"), ("output_sizes", "output_dtypes")):
        sizes = as_obj(entry.get(sizes_key), f"{at}.{sizes_key}", source, list, default=[])
        types = as_obj(entry.get(types_key), f"{at}.{types_key}", source, list, default=[])
        total = 0
        for j, (shape, dt) in enumerate(zip(sizes, types, strict=False)):
            if not isinstance(shape, list):
                as_obj(shape, f"{at}.{sizes_key}[{j}]", source, list)  # raises
            n = 1
            for k, d in enumerate(shape):
                if type(d) is not int or not 0 <= d <= _I64_MAX:
                    d = as_int(d, f"{at}.{sizes_key}[{j}][{k}]", source, lo=0, hi=_I64_MAX)
                n *= d
            if not isinstance(dt, str):
                as_obj(dt, f"{at}.{types_key}[{j}]", source, str)  # raises
            total += n * (dtype_bytes(dt) or 0)
        if total > _I64_MAX:
            raise SchemaError("tensors larger than 2**63 bytes", source=source,
                              parameter=f"{at}.{sizes_key}", value=cut(str(sizes)),
                              expected="the shapes of real tensors")
        best = max(best, total)
    return best


def _peer(name: str, rank: int, members: list[int] | None, field: str, source: str) -> int:
    """Global rank of the peer of a P2P entry, from its name: ``nccl:send 0->1`` /
    ``nccl:recv 1<-0``, this process first and its peer last, both as ranks *in the process
    group* (ProcessGroupNCCL writes ``rank_`` and the group rank it was given). ``members``
    (the group's global ranks, from ``pg_config``) maps them to global ranks; without them, or
    when they do not put this process first, the names are read as global ranks. -1 when the
    name has no ranks.

    >>> _peer("nccl:send 1->0", 12, [4, 12], "f", "d.json"), _peer("nccl:recv 1<-0", 1, None, "f", "d.json")
    (4, 0)
    """
    m = _PEER_RE.search(name)
    if m is None:
        return -1
    # Compare lengths before int(): a name may hold more digits than int() converts.
    a, b = (int(g) if len(g.lstrip("0")) <= 7 else MAX_WORLD for g in (m.group(1), m.group(3)))
    if max(a, b) >= MAX_WORLD:
        raise SchemaError("rank in the operator name out of range", source=source,
                          parameter=field, value=cut(m.group(0)),
                          expected=f"ranks in [0, {MAX_WORLD - 1}] as in 'nccl:send 0->1'")
    if members and a < len(members) and b < len(members) and members[a] == rank:
        return members[b]
    return b if a == rank else a


def _timing(e: dict, at: str, source: str) -> tuple[int | None, float | None]:
    """An entry's start (epoch ns) and duration (ms); None where the dump has none."""
    started = _uint(e.get("time_discovered_started_ns"), at, "time_discovered_started_ns",
                    source)
    completed = _uint(e.get("time_discovered_completed_ns"), at, "time_discovered_completed_ns",
                      source)
    created = _uint(e.get("time_created_ns"), at, "time_created_ns", source)
    dur_ms = e.get("duration_ms")
    if dur_ms is not None:
        dur_ms = as_float(dur_ms, f"{at}.duration_ms", source)
        if dur_ms < 0:  # (named here, in the dump's field and unit, not as duration_us)
            raise SchemaError("negative duration", source=source, parameter=f"{at}.duration_ms",
                              value=e.get("duration_ms"), expected="milliseconds >= 0")
    elif completed and started:
        if completed < started:
            raise SchemaError("completed before it started", source=source,
                              parameter=f"{at}.time_discovered_completed_ns", value=completed,
                              expected="a time at or after time_discovered_started_ns "
                              f"({started})")
        dur_ms = (completed - started) / 1e6
    return started or created, dur_ms


def _identity(e: dict, op: str, at: str, source: str) -> tuple[bool, str, int]:
    """``(is_p2p, group, seq)`` of an entry: P2P entries count ``p2p_seq_id``, collectives
    ``collective_seq_id`` (the entry closing a coalesced group says which by ``is_p2p``)."""
    is_p2p = op in P2P_OPS or _flag(e, at, source)
    seq_key = "p2p_seq_id" if is_p2p else "collective_seq_id"
    seq = _uint(e.get(seq_key, 0), at, seq_key, source, nullable=False) or 0
    return is_p2p, _group_of(e, at, source), seq


def _rows(doc: dict, source: str) -> list[dict[str, Any]]:
    """Ops-table rows of one loaded dump (entries without a duration are left out)."""
    rank = doc["rank"]  # checked by load_dump
    pg_ranks = _pg_members(doc, source)
    rows = []
    skipped = 0
    # The operations of a coalesced group share its seq id and may carry no timing of their
    # own: the entry closing the group (recorded after them) times the whole group.
    named = [(i, f"entries[{i}]", e, *_op_of(e, f"entries[{i}]", source))
             for i, e in enumerate(doc["entries"])]
    group_times = {_identity(e, op, at, source): _timing(e, at, source)
                   for _, at, e, _, op in named if op == ""}
    for i, at, e, name, op in named:
        if op == "":
            continue
        # Every field is checked, also in entries left out below: a broken one means a broken
        # dump whether or not it has a duration.
        start, dur_ms = _timing(e, at, source)
        is_p2p, group, seq = _identity(e, op, at, source)
        state = _text(e.get("state", ""), f"{at}.state", source)
        nbytes = _nbytes(e, at, source)
        if dur_ms is None or start is None:
            start, dur_ms = group_times.get((is_p2p, group, seq), (start, dur_ms))
        if dur_ms is None or start is None:
            skipped += 1
            continue
        rows.append({
            "iteration": 0,
            "rank": rank,
            "op": op,
            "group": group,
            "seq": seq,
            "nbytes": nbytes,
            "start_ns": start,
            "duration_us": float(dur_ms) * 1000.0,
            "group_ranks": ranks_str(pg_ranks.get(group)),
            "peer": (_peer(name, rank, pg_ranks.get(group), f"{at}.profiling_name", source)
                     if op in P2P_OPS else -1),
            "state": state,
            SOURCE_FILE: source,
            SOURCE_RECORD: i,
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
        Pickle without ``trust_pickle``, malformed dump (the message names the file and the
        field, such as ``entries[3].input_sizes``), unknown op, two dumps of one rank, or no
        timed entry at all.

    Examples
    --------
    >>> ops = read_flight_recorder("fr_dumps/")  # doctest: +SKIP
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    rows: list[dict] = []
    seen: dict[int, str] = {}
    for p in each_file(paths):
        doc = load_dump(p, trust_pickle)
        _claim(seen, doc["rank"], str(p))
        rows.extend(_rows(doc, str(p)))
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
    pg_ranks: dict[str, list[int] | None] = {}
    sources: dict[int, str] = {}
    if isinstance(dumps, Mapping):
        per_rank = {int(r): list(v) for r, v in dumps.items()}
        sources = {r: f"rank {r}" for r in per_rank}
    else:
        per_rank = {}
        for p in dumps:
            doc = load_dump(p, trust_pickle)
            _claim(sources, doc["rank"], str(p))
            per_rank[doc["rank"]] = doc["entries"]
            pg_ranks.update(_pg_members(doc, str(p)))
    rows = []
    for rank, entries in per_rank.items():
        source = sources[rank]
        for i, e in enumerate(entries):
            at = f"entries[{i}]"
            name, op = _op_of(e, at, source)
            if op in P2P_OPS or _flag(e, at, source):
                continue
            seq = _uint(e.get("collective_seq_id", 0), at, "collective_seq_id", source,
                        nullable=False)
            rows.append((rank, _group_of(e, at, source), seq,
                         _text(name, f"{at}.profiling_name", source)))
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
