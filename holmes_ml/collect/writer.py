"""Per-rank sink for CommOps rows: Parquet row groups or JSON Lines, appended flush by flush.

The logger hands over plain column lists; this module owns the file format so the hot path never
touches pyarrow.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

logger = logging.getLogger(__name__)

#: Formats :class:`RowSink` writes, with their file suffix.
FORMATS: dict[str, str] = {"parquet": ".parquet", "jsonl": ".jsonl"}

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


class RowSink:
    """Append column batches to one file; each Parquet batch becomes one row group.

    Parameters
    ----------
    path:
        Output file; its parent directory is created.
    fmt:
        ``"parquet"`` or ``"jsonl"``.
    """

    def __init__(self, path: str | Path, fmt: str = "parquet") -> None:
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

    def write(self, columns: dict[str, list[Any]]) -> None:
        """Append one batch (``column -> list of values``, all lists the same length)."""
        if self._closed:
            raise ValueError(f"{self.path}: sink already closed; cannot write more rows")
        n = len(columns["iteration"])
        if n == 0:
            return
        if self.fmt == "parquet":
            table = pa.Table.from_pydict({c: columns[c] for c in COLUMNS}, schema=ARROW_SCHEMA)
            if self._parquet is None:
                self._parquet = pq.ParquetWriter(self.path, ARROW_SCHEMA)
            self._parquet.write_table(table)
        else:
            with self.path.open("a", encoding="utf-8") as fh:
                cols = [columns[c] for c in COLUMNS]
                for values in zip(*cols, strict=True):
                    fh.write(json.dumps(dict(zip(COLUMNS, values, strict=True))))
                    fh.write("\n")
        self.rows_written += n

    def close(self) -> None:
        """Finish the file (Parquet footer). A sink that never got rows writes an empty table."""
        if self._closed:
            return
        self._closed = True
        if self.fmt == "parquet":
            if self._parquet is None:
                pq.write_table(ARROW_SCHEMA.empty_table(), self.path)
            else:
                self._parquet.close()
        elif not self.path.exists():
            self.path.touch()
        logger.debug("%s: closed after %d rows", self.path, self.rows_written)
