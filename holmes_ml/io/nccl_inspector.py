"""NCCL Inspector profiler-plugin JSON Lines into the CommOps table.

Two layouts are accepted:

* **v4.0 self-contained lines**: every line carries ``header`` (``id`` = communicator hash,
  ``rank``, ``n_ranks``), ``metadata`` (``dump_timestamp_us``, ``hostname``...) and
  ``coll_perf`` (``coll``, ``coll_sn``, ``coll_msg_size_bytes``, ``coll_exec_time_us`` and, in
  verbose mode, ``event_trace_ts``).
* **v4.3 marker style**: a ``dump_stats`` marker line (or a line with ``header``/``metadata``
  and no ``coll_perf``) opens a dump and sets the context; the ``coll_perf`` lines that follow
  inherit it until the next marker.

Mapping: ``group`` = ``comm-<header.id>`` (the communicator hash is shared by its members),
``seq`` = ``coll_sn``, ``nbytes`` = ``coll_msg_size_bytes``, ``duration_us`` =
``coll_exec_time_us``; the start is the first kernel start of the verbose trace, else
``coll_start_ts``, else the dump time minus the duration (approximate, flagged in the extra
column ``start_exact``). Iteration is 0 (the plugin does not know training steps). The group's
member list is not in the log, so ``group_ranks`` is left empty and ``group_size`` is added.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from holmes_ml.io._common import iter_jsonl, require_op
from holmes_ml.io.schema import SchemaError

logger = logging.getLogger(__name__)


def _context(obj: dict, ctx: dict) -> dict:
    new = dict(ctx)
    for key in ("header", "metadata"):
        if isinstance(obj.get(key), dict):
            new.update(obj[key])
    marker = obj.get("dump_stats")
    if isinstance(marker, dict):
        for key in ("header", "metadata"):
            if isinstance(marker.get(key), dict):
                new.update(marker[key])
        new.update({k: v for k, v in marker.items() if not isinstance(v, (dict, list))})
    return new


def _start_ns(perf: dict, ctx: dict) -> tuple[int | None, bool]:
    # Epoch ns exceed float64's exact range: convert the integral µs part exactly.
    def ns(us: float | int) -> int:
        whole = int(us)
        return whole * 1000 + int(round((float(us) - whole) * 1000.0))

    trace = perf.get("event_trace_ts")
    if isinstance(trace, dict):
        starts: list[float] = [
            k["kernel_start_ts"] for k in trace.get("kernel_events") or []
            if isinstance(k, dict) and k.get("kernel_start_ts") is not None]
        if starts:
            return ns(min(starts)), True
        if trace.get("coll_start_ts") is not None:
            return ns(trace["coll_start_ts"]), True
    dump = ctx.get("dump_timestamp_us")
    if dump is not None and perf.get("coll_exec_time_us") is not None:
        return ns(dump) - int(round(float(perf["coll_exec_time_us"]) * 1000.0)), False
    return None, False


def _read_one(path: Path) -> list[dict[str, Any]]:
    source = str(path)
    rows: list[dict[str, Any]] = []
    ctx: dict = {}
    for lineno, obj in iter_jsonl(path):
        perf = obj.get("coll_perf")
        if "dump_stats" in obj or perf is None:
            ctx = _context(obj, ctx if "dump_stats" not in obj else {})
            if perf is None:
                continue
        line_ctx = _context(obj, ctx)
        if not isinstance(perf, dict):
            raise SchemaError("coll_perf is not an object", source=source, row=lineno - 1,
                              column="coll_perf", value=type(perf).__name__,
                              expected="a JSON object")
        for key in ("coll", "coll_sn", "coll_exec_time_us"):
            if key not in perf:
                raise SchemaError("missing field", source=source, row=lineno - 1,
                                  column=f"coll_perf.{key}", expected="NCCL Inspector v4.x output")
        for key in ("rank", "id"):
            if key not in line_ctx:
                raise SchemaError("no header before this record", source=source,
                                  row=lineno - 1, column=f"header.{key}",
                                  expected="a header on the line or an earlier dump_stats marker")
        start, exact = _start_ns(perf, line_ctx)
        if start is None:
            raise SchemaError("no time for this record", source=source, row=lineno - 1,
                              column="metadata.dump_timestamp_us",
                              expected="event_trace_ts or dump_timestamp_us")
        rows.append({
            "iteration": 0,
            "rank": line_ctx["rank"],
            "op": require_op(str(perf["coll"]), source, f"coll_perf.coll (line {lineno})"),
            "group": f"comm-{line_ctx['id']}",
            "seq": perf["coll_sn"],
            "nbytes": perf.get("coll_msg_size_bytes", 0),
            "start_ns": start,
            "duration_us": perf["coll_exec_time_us"],
            "host": str(line_ctx.get("hostname", "")),
            "group_size": line_ctx.get("n_ranks", -1),
            "start_exact": exact,
        })
    return rows


def read_nccl_inspector(paths: Sequence[str | Path] | str | Path) -> pd.DataFrame:
    """Read NCCL Inspector JSONL files (any number of ranks) into an unvalidated CommOps table.

    Examples
    --------
    >>> ops = read_nccl_inspector("nccl-inspector-123/")  # doctest: +SKIP
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    rows = [r for p in paths for r in _read_one(Path(p))]
    if not rows:
        raise SchemaError("no coll_perf records", source=str(paths[0]) if paths else None,
                          expected="NCCL Inspector JSON Lines with coll_perf objects")
    df = pd.DataFrame.from_records(rows)
    df["group_size"] = df["group_size"].astype(np.int64)
    return df
