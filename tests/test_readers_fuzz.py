"""Structure-aware fuzzing of every reader: whatever a log holds, reading it either gives a
table or raises one SchemaError naming the file, never another exception (a traceback for
the user) and never a hang.

Each case takes a small valid log of one format and replaces one value anywhere in it (a
JSON node, a CSV cell or a Parquet cell) with a value of another type or size. Seeded and
derandomized, so a failure reproduces; ``HOLMES_FUZZ_EXAMPLES=700 pytest
tests/test_readers_fuzz.py`` draws 700 random cases a format instead.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from test_io_bytedance import META as BYTEDANCE_META
from test_io_bytedance import _trace as bytedance_trace
from test_io_flight_recorder import _dump as fr_dump
from test_io_kineto import OPS as KINETO_OPS
from test_io_kineto import _trace as kineto_trace
from test_io_nccl_inspector import T0_US, WORLD, _coll, _header, _line, _meta, _p2p
from test_readers_native import _ops

from holmes_ml.io import SchemaError, read_ops

#: Values put in place of one node: every JSON type, the sizes and signs readers trip on.
ODD_VALUES = st.sampled_from([
    None, True, False, 0, -1, 1.5, -0.5, 2**31, 2**63, 2**70, -(2**70), 10**400,
    math.inf, -math.inf, math.nan, "", "x", "0", "-3", "1e400", "[0, 1, ...]", "\ud800",
    [], [[]], [["a"]], [1, "b"], {}, {"a": 1}, "9" * 5000,
])


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a node of a JSON document (the root excluded)."""
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node) \
        if isinstance(node, list) else ()
    for key, child in items:
        out.append((*prefix, key))
        out.extend(_paths(child, (*prefix, key)))
    return out


def _replaced(doc: Any, path: tuple, value: Any) -> Any:
    doc = json.loads(json.dumps(doc))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


def _json_files(tmp: Path, pick, docs: dict[int, Any], name: str) -> list[Path]:
    """``docs`` (rank -> JSON document) written as ``name.format(r=rank)``, one value of one of
    them replaced by an odd one."""
    victim = pick(st.sampled_from(sorted(docs)))
    path = pick(st.sampled_from(_paths(docs[victim])))
    docs[victim] = _replaced(docs[victim], path, pick(ODD_VALUES))
    files = []
    for r, doc in docs.items():
        files.append(tmp / name.format(r=r))
        files[-1].write_text(json.dumps(doc))
    return files


def _kineto(tmp: Path, pick) -> list[Path]:
    return _json_files(tmp, pick, {r: kineto_trace(r, KINETO_OPS) for r in range(3)},
                       "rank{r}.pt.trace.json")


def _flight_recorder(tmp: Path, pick) -> list[Path]:
    return _json_files(tmp, pick, {r: fr_dump(r) for r in range(4)}, "nccl_trace_rank_{r}")


def _nccl_inspector(tmp: Path, pick) -> list[Path]:
    lines = [{"header": _header(WORLD, r, 2), "metadata": _meta("v4.0", T0_US, 100 + r),
              "coll_perf": _coll("AllReduce", sn, 50 + r)}
             for r in range(2) for sn in range(3)]
    lines.append({"header": _header("0xpp", 0, 2), "metadata": _meta("v4.0", T0_US, 100),
                  "p2p_perf": _p2p("Send", 0, 1, 40)})
    k = pick(st.integers(0, len(lines) - 1))
    lines[k] = _replaced(lines[k], pick(st.sampled_from(_paths(lines[k]))), pick(ODD_VALUES))
    p = tmp / "node-0-pid100.log"
    p.write_text("\n".join(_line(o) for o in lines) + "\n")
    return [p]


def _cell(table: pd.DataFrame, pick) -> pd.DataFrame:
    """``table`` with one cell replaced by an odd value (its column becomes object)."""
    table = table.copy()
    row = pick(st.integers(0, len(table) - 1))
    column = pick(st.sampled_from(list(table.columns)))
    values = table[column].astype(object).tolist()
    values[row] = pick(ODD_VALUES)
    table[column] = pd.Series(values, index=table.index, dtype=object)
    return table


def _native(tmp: Path, pick) -> list[Path]:
    table = _cell(_ops(), pick)
    kind = pick(st.sampled_from(["csv", "jsonl", "parquet"]))
    p = tmp / f"ops.{kind}"
    try:
        if kind == "csv":
            table.to_csv(p, index=False)
        elif kind == "jsonl":
            rows = table.to_dict("records")
            p.write_text("\n".join(json.dumps(r, default=str) for r in rows) + "\n")
        else:
            table.to_parquet(p, index=False)
    except (ValueError, TypeError, OverflowError, ArithmeticError, UnicodeError):
        # a value the format cannot store (a lone surrogate in UTF-8 text, a mixed Parquet
        # column): no file, nothing for a reader to see
        reject()
    return [p]


def _bytedance(tmp: Path, pick) -> list[Path]:
    table = _cell(bytedance_trace(), pick)
    p = tmp / "trace-T.parquet"
    try:
        table.to_parquet(p, index=False)
    except (ValueError, TypeError, OverflowError, ArithmeticError, UnicodeError):
        reject()
    (tmp / "meta-T.yaml").write_text(BYTEDANCE_META)
    return [p]


#: HOLMES_FUZZ_EXAMPLES=N: N random (not derandomized) cases a format instead of the seeded 60.
FUZZ_EXAMPLES = int(os.environ.get("HOLMES_FUZZ_EXAMPLES", "0"))

FORMATS = {"kineto": _kineto, "flight-recorder": _flight_recorder,
           "nccl-inspector": _nccl_inspector, "native": _native, "bytedance": _bytedance}


@pytest.mark.parametrize("fmt", FORMATS)
def test_one_odd_value_anywhere_gives_a_table_or_one_schema_error(tmp_path_factory, fmt):
    @settings(max_examples=FUZZ_EXAMPLES or 60, deadline=None, derandomize=not FUZZ_EXAMPLES,
              database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def case(data):
        tmp = tmp_path_factory.mktemp(fmt)
        files = FORMATS[fmt](tmp, data.draw)
        try:
            ops = read_ops(files, format=fmt)
        except SchemaError as exc:
            message = str(exc)
            assert any(f.name in message for f in files) or str(tmp) in message, message
            assert "Traceback" not in message and len(message) < 2000, message
        else:
            assert isinstance(ops, pd.DataFrame)

    case()
