"""Per-rank sink for CommOps rows: Parquet row groups, Arrow IPC stream batches or JSON Lines,
appended flush by flush.

The logger hands over plain column lists; this module owns the file format so the hot path never
touches pyarrow.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

logger = logging.getLogger(__name__)

#: Formats :class:`RowSink` writes, with their file suffix.
FORMATS: dict[str, str] = {"parquet": ".parquet", "arrow": ".arrows", "jsonl": ".jsonl"}

#: Column order and Arrow type of every file the logger writes (canonical schema + optionals).
ARROW_SCHEMA = pa.schema(
    [
        ("iteration", pa.int64()),
        ("rank", pa.int64()),
        ("op", pa.string()),
        ("group", pa.string()),
        ("seq", pa.int64()),
        ("nbytes", pa.int64()),
        ("start_ns", pa.int64()),
        ("duration_us", pa.float64()),
        ("group_ranks", pa.string()),
        ("group_kind", pa.string()),
        ("peer", pa.int64()),
        ("host", pa.string()),
        ("job", pa.string()),
    ]
)
COLUMNS: tuple[str, ...] = tuple(ARROW_SCHEMA.names)
#: What RowSink hands to the Parquet writer: string columns as dictionary arrays. Parquet
#: dictionary-encodes them anyway, so passing codes + values straight through skips building
#: every string (then hashing it back into a dictionary); the file stores plain UTF-8 columns and
#: no Arrow schema (``store_schema=False``), so reading it back gives ``ARROW_SCHEMA`` exactly.
_WRITE_SCHEMA = pa.schema(
    [pa.field(f.name, pa.dictionary(pa.int32(), f.type)) if f.type == pa.string() else f
     for f in ARROW_SCHEMA]
)
#: Parquet encodings chosen for the logger's data: dictionary pages only where values repeat
#: (strings, iteration, rank; timestamps and durations never do, and trying costs ~0.3 µs a row),
#: min/max statistics only on the columns readers filter by.
_PARQUET_OPTIONS: dict[str, Any] = {
    "use_dictionary": ["iteration", "rank", "op", "group", "group_ranks", "group_kind", "host",
                       "job"],
    "write_statistics": ["iteration", "rank", "start_ns"],
    "store_schema": False,
}


class Coded(NamedTuple):
    """A string column given as integer ``codes`` into a short list of ``values``.

    The logger's columns (op, group, host ...) repeat a handful of strings; handing them over
    coded lets Arrow build them in C instead of from thousands of Python strings.
    """

    codes: np.ndarray
    values: Sequence[str]

    def __len__(self) -> int:
        return len(self.codes)


def _arrow_column(values: Any, typ: pa.DataType) -> Any:
    if isinstance(values, Coded):
        codes = pa.array(np.asarray(values.codes, dtype=np.int32))
        dictionary = pa.array(list(values.values), type=typ.value_type)
        return pa.DictionaryArray.from_arrays(codes, dictionary)
    if pa.types.is_dictionary(typ):
        return pa.array(list(values), type=typ.value_type).dictionary_encode()
    return values


def _as_list(values: Any) -> list[Any]:
    if isinstance(values, Coded):
        return np.asarray(list(values.values), dtype=object)[np.asarray(values.codes)].tolist()
    tolist = getattr(values, "tolist", None)
    return tolist() if tolist is not None else list(values)


class RowSink:
    """Append column batches to one file; each Parquet batch becomes one row group, each Arrow
    batch one record batch of an IPC stream (``.arrows``).

    Parameters
    ----------
    path:
        Output file; its parent directory is created.
    fmt:
        ``"parquet"``, ``"arrow"`` or ``"jsonl"``.
    """

    def __init__(self, path: str | Path, fmt: str = "parquet") -> None:
        self._stream: Any = None  # "arrow": the open file and its IPC stream writer
        self._file: Any = None
        if fmt not in FORMATS:
            raise ValueError(f"fmt={fmt!r} is not a known log format; expected one of {list(FORMATS)}")
        self.path = Path(path)
        self.fmt = fmt
        self.rows_written = 0
        self._parquet: pq.ParquetWriter | None = None
        self._closed = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Start from an empty file: a stale log of an earlier run must not be mixed in.
        if self.path.exists():
            self.path.unlink()

    def write(self, columns: Mapping[str, Sequence[Any]]) -> None:
        """Append one batch (``column -> list, 1-d array or Coded``, all the same length)."""
        if self._closed:
            raise ValueError(f"{self.path}: sink already closed; cannot write more rows")
        n = len(columns["iteration"])
        if n == 0:
            return
        if self.fmt in ("parquet", "arrow"):
            table = pa.Table.from_pydict(
                {f.name: _arrow_column(columns[f.name], f.type) for f in _WRITE_SCHEMA},
                schema=_WRITE_SCHEMA,
            )
            if self.fmt == "arrow":
                self._open_stream().write_table(table)
                self._file.flush()  # readable up to here, by a reader or after a crash
            else:
                if self._parquet is None:
                    self._parquet = pq.ParquetWriter(self.path, _WRITE_SCHEMA,
                                                     **_PARQUET_OPTIONS)
                self._parquet.write_table(table)
        else:
            with self.path.open("a", encoding="utf-8") as fh:
                # numpy scalars are not JSON: go through plain Python values
                cols = [_as_list(columns[c]) for c in COLUMNS]
                for values in zip(*cols, strict=True):
                    fh.write(json.dumps(dict(zip(COLUMNS, values, strict=True))))
                    fh.write("\n")
        self.rows_written += n

    def _open_stream(self) -> Any:
        """The Arrow IPC stream writer, opened on first use. Each batch goes out whole with its
        dictionaries (no deltas), zstd-compressed: a stream needs no footer, so a reader sees
        every batch flushed so far and a crash loses at most the batch being written."""
        if self._stream is None:
            self._file = self.path.open("wb")
            self._stream = pa.ipc.new_stream(
                self._file, _WRITE_SCHEMA,
                options=pa.ipc.IpcWriteOptions(compression="zstd"))
        return self._stream

    def close(self) -> None:
        """Finish the file (Parquet footer). A sink that never got rows writes an empty table."""
        if self._closed:
            return
        self._closed = True
        if self.fmt == "arrow":
            self._open_stream().close()
            self._file.close()
        elif self.fmt == "parquet":
            if self._parquet is None:
                pq.write_table(ARROW_SCHEMA.empty_table(), self.path)
            else:
                self._parquet.close()
        elif not self.path.exists():
            self.path.touch()
        logger.debug("%s: closed after %d rows", self.path, self.rows_written)
