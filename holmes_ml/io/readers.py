"""One entry point for every input: :func:`read_ops` detects the format and validates the result.

Native files are CSV (plain or ``.gz``), Parquet and JSON Lines (plain or ``.gz``) already in
the canonical schema. A directory means "all files inside" (per-rank files, mixed gz/plain);
all files of one call must share a format. A tar archive (``.tar.gz`` ...) reads like the
directory it holds.

Inputs are read once: a path given twice is read once, and rows repeated exactly (every
canonical column equal) are dropped, each with a warning. Rows that share an op's identity
(rank, group, seq, op, iteration) but differ are kept, with a warning naming their files (two
runs read together?). Inside a directory or archive, files whose format cannot be identified
(notes, configs) are skipped with a warning; an archive inside a directory reads like the
archive.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import lzma
import os
import re
import struct
import tempfile
import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from holmes_ml._text import few
from holmes_ml.io._common import (
    SOURCE_FILE,
    SOURCE_RECORD,
    each_file,
    head_bytes,
    iter_jsonl,
    kind_name,
    load_json,
    open_bytes,
    showing_progress,
    stage,
)
from holmes_ml.io.schema import (
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    SchemaError,
    ValidationOptions,
    concat_ops,
    concat_validated,
    validate,
)

logger = logging.getLogger(__name__)

#: Formats :func:`read_ops` understands.
FORMATS: tuple[str, ...] = ("native", "kineto", "flight-recorder", "nccl-inspector", "bytedance")
_SKIP_SUFFIXES = (".yaml", ".yml", ".md", ".png", ".jpg", ".svg", ".html")


class UnknownFormatError(SchemaError):
    """The content of a file matches none of :data:`FORMATS` (raised by :func:`detect_format`)."""


class UnfinishedParquetError(SchemaError):
    """A Parquet file without its footer: its writer has not closed it yet, or died first
    (raised by :func:`unfinished_parquet`'s callers; a directory's other files are read)."""


#: What a Parquet file without its footer is expected to be instead.
UNFINISHED_PARQUET_EXPECTED = (
    "a closed Parquet file (its footer is written when its writer closes it: CommOpsLogger "
    "on exit); to read a running job's logs, or keep them through a crash, have the logger "
    "write an Arrow stream (LoggerConfig(fmt='arrow')) or JSON Lines (fmt='jsonl')")


def unfinished_parquet(path: str | Path) -> UnfinishedParquetError | None:
    """The error for a Parquet file whose footer is missing (it starts as Parquet does but
    does not end so: a writer still writing it, or killed before closing it), else ``None``.

    Reads 4 bytes at each end, so it is cheap enough to ask of every file of a directory.
    """
    p = Path(path)
    try:
        size = p.stat().st_size
        with p.open("rb") as fh:
            if fh.read(4) != b"PAR1":
                return None
            fh.seek(max(size - 4, 0))
            tail = fh.read(4)
    except OSError:
        return None  # the reader says what is wrong with it
    if tail == b"PAR1" and size >= 12:
        return None
    return UnfinishedParquetError(
        "a Parquet file without its footer: its writer has not closed it yet (a running "
        "job) or was killed before it could, so none of its rows can be read",
        source=str(p), value=f"{size:,} bytes", expected=UNFINISHED_PARQUET_EXPECTED)


#: How an Arrow IPC stream starts: the continuation marker of its schema message.
_ARROW_STREAM_HEAD = b"\xff\xff\xff\xff"


def _is_arrow_stream(name: str, head: bytes) -> bool:
    """Whether a file (lower-case ``name`` without ``.gz``, first bytes ``head``) is an Arrow
    IPC stream, as the logger writes with ``fmt="arrow"``."""
    return name.endswith(".arrows") or head[:4] == _ARROW_STREAM_HEAD


#: Bytes of an Arrow IPC stream below which it is decoded on the calling thread: the logger's
#: streams are zstd-compressed, and handing each of a small stream's buffers to Arrow's thread
#: pool cost more than decompressing them (a rank's log of a few hundred rows: 0.7 ms against
#: 0.3 ms, most of the time `holmes localize DIR` took over 8,192 such files).
_THREADED_STREAM_BYTES = 16 << 20


def _ipc_options(size: int) -> pa.ipc.IpcReadOptions:
    """How to read an Arrow IPC stream of ``size`` bytes (threads only for a large one)."""
    return pa.ipc.IpcReadOptions(use_threads=size >= _THREADED_STREAM_BYTES)


def read_arrow_stream(path: str | Path) -> pa.Table:
    """An Arrow IPC stream file (``.arrows``, the logger's ``fmt="arrow"``) as one table: every
    record batch complete in the file, string columns decoded but the member lists
    (``group_ranks``, kept dictionary-encoded as :func:`_plain_parquet` keeps them).

    A stream needs no footer: a file still being written, or whose writer was killed, reads up
    to its last whole batch, with a warning naming the file when a batch is cut short.
    Raises :class:`SchemaError` when not even the stream's schema can be read.
    """
    return _canonical_arrow(_stream_table(Path(path)))


def _stream_table(p: Path) -> pa.Table:
    """The Arrow IPC stream ``p`` as it is written (:func:`read_arrow_stream` without decoding
    its strings: many files' tables are decoded once, joined, by :func:`_as_frames`)."""
    batches = []
    try:
        with pa.OSFile(str(p), "rb") as fh:
            reader = pa.ipc.open_stream(fh, options=_ipc_options(fh.size()))
            schema = reader.schema
            try:
                for batch in reader:
                    batches.append(batch)
            except (pa.ArrowInvalid, OSError) as exc:
                logger.warning("%s: its last record batch is cut short (still being written, "
                               "or its writer was killed): the %d rows before it are read (%s)",
                               p, sum(len(b) for b in batches), exc)
    except (pa.ArrowInvalid, OSError) as exc:
        raise _not_an_arrow_stream(p, exc) from None
    return pa.Table.from_batches(batches, schema=schema)


def _not_an_arrow_stream(p: Path, exc: BaseException) -> SchemaError:
    return SchemaError(f"cannot read an Arrow IPC stream: {exc}", source=str(p),
                       expected="an Arrow IPC stream of CommOps rows (as CommOpsLogger writes "
                       "with fmt='arrow'), starting with its schema")


def _canonical_arrow(table: pa.Table) -> pa.Table:
    """``table`` with its dictionary-encoded string columns decoded, but ``group_ranks``
    (one dictionary over the table, each value once)."""
    plain = [pa.field(f.name, f.type.value_type) if pa.types.is_dictionary(f.type)
             and f.name != "group_ranks" else f for f in table.schema]
    table = table.cast(pa.schema(plain))
    at = table.schema.get_field_index("group_ranks")
    if at >= 0 and pa.types.is_dictionary(table.schema.field(at).type):
        # a batch's dictionary may hold a value twice (two groups of the same members), which
        # pandas refuses as categories: map each onto its first copy
        column = table.column(at)
        table = table.set_column(at, "group_ranks", pa.chunked_array(
            [_unique_dictionary(c) for c in column.chunks], type=column.type))
        table = table.unify_dictionaries()
    return table


@dataclass(frozen=True)
class ArrowStreamTail:
    """Where :func:`read_arrow_stream_tail` left an Arrow IPC stream that is still growing:
    the bytes read (``offset``, always the end of a whole message), the stream's schema message
    (``head``) and, per dictionary id, the messages that make its current dictionary (the
    last replacement and the deltas after it) - what a batch written later may refer to."""

    offset: int = 0
    head: bytes | None = None
    dictionaries: tuple[tuple[int, tuple[bytes, ...]], ...] = ()
    #: the stream's end-of-stream marker was read: its writer closed it
    ended: bool = False
    #: rows of the record batches read so far (the row number of the next one)
    rows: int = 0
    #: the last bytes before ``offset``: other bytes there mean another stream was written
    #: under the name (a restarted writer's file may get the old one's inode and outgrow it)
    mark: bytes = b""


class ArrowStreamRewritten(ValueError):
    """The file :func:`read_arrow_stream_tail` follows is no longer the stream it read: its
    bytes before where the reading stopped changed (a new stream written under the name)."""


def _flatbuffer_table(buf: bytes, at: int) -> tuple[int, int]:
    """(table, vtable) positions of the flatbuffer table the offset at ``at`` points to."""
    table = at + struct.unpack_from("<I", buf, at)[0]
    return table, table - struct.unpack_from("<i", buf, table)[0]


def _flatbuffer_field(buf: bytes, vtable: int, index: int) -> int:
    """Offset of field ``index`` within its table (0: absent, the default applies)."""
    at = 4 + 2 * index
    return struct.unpack_from("<H", buf, vtable + at)[0] \
        if at + 2 <= struct.unpack_from("<H", buf, vtable)[0] else 0


def _dictionary_batch(metadata: bytes) -> tuple[int, bool]:
    """(id, isDelta) of an Arrow IPC dictionary message, read off its flatbuffer metadata
    (Message.fbs: the message's ``header`` is field 2; a DictionaryBatch's ``id`` field 0,
    ``isDelta`` field 2)."""
    table, vtable = _flatbuffer_table(metadata, 0)
    header = _flatbuffer_field(metadata, vtable, 2)
    table, vtable = _flatbuffer_table(metadata, table + header)
    at_id = _flatbuffer_field(metadata, vtable, 0)
    at_delta = _flatbuffer_field(metadata, vtable, 2)
    return (struct.unpack_from("<q", metadata, table + at_id)[0] if at_id else 0,
            bool(metadata[table + at_delta]) if at_delta else False)


def read_arrow_stream_tail(path: str | Path, tail: ArrowStreamTail,
                           max_bytes: int = 64 << 20) -> tuple[pa.Table | None, ArrowStreamTail]:
    """The record batches an Arrow IPC stream gained since ``tail``, and where the next call
    starts: what a follower of a growing ``.arrows`` log reads at each poll, in time and memory
    proportional to what was added (not to the file).

    A message still being written is left for the next call; ``max_bytes`` bounds what one call
    reads (a message larger than it is read whole), so a long file is caught up over several.
    Returns ``(None, tail)`` when no whole batch was added. The table is as
    :func:`read_arrow_stream` gives it. Raises :class:`SchemaError` when the file does not
    start with a stream's schema.
    """
    p = Path(path)
    with p.open("rb") as fh:
        fh.seek(tail.offset - len(tail.mark))
        if fh.read(len(tail.mark)) != tail.mark:
            raise ArrowStreamRewritten(f"{p}: another Arrow stream was written under the name "
                                       f"since its first {tail.offset:,} bytes were read")
        if tail.ended:
            return None, tail
        data = fh.read(max_bytes)
        if len(data) == max_bytes:  # a message may go on past the bound: read it whole
            while (need := _message_size(data) - len(data)) > 0 and (more := fh.read(need)):
                data += more
    reader = pa.BufferReader(pa.py_buffer(data))
    head, ended = tail.head, False
    dictionaries = dict(tail.dictionaries)
    used = 0  # bytes of data that are whole messages
    start = 0  # bytes of data before this call's first dictionary or record batch
    batches = 0
    while used < len(data):
        try:
            message = pa.ipc.read_message(reader)
        except EOFError:  # the end-of-stream marker
            ended, used = True, len(data)
            break
        except (OSError, pa.ArrowInvalid) as exc:
            if head is None and len(data) >= 4 and data[:4] != _ARROW_STREAM_HEAD:
                raise _not_an_arrow_stream(p, exc) from None
            break  # cut short: still being written (or its writer was killed)
        end = reader.tell()
        if head is None:
            if message.type != "schema":
                raise _not_an_arrow_stream(p, ValueError(f"it starts with a {message.type} "
                                                         "message, not a schema"))
            head, start = data[:end], end
        elif message.type == "dictionary":
            key, delta = _dictionary_batch(message.metadata.to_pybytes())
            dictionaries[key] = (*dictionaries.get(key, ()), data[used:end]) if delta \
                else (data[used:end],)
        elif message.type == "record batch":
            batches += 1
        used = end
    mark = (tail.mark + data[:used])[-_MARK_BYTES:]
    new = ArrowStreamTail(offset=tail.offset + used, head=head,
                          dictionaries=tuple(sorted(dictionaries.items())), ended=ended,
                          rows=tail.rows, mark=mark)
    if not batches:
        return None, new
    assert head is not None  # a record batch follows a schema
    # the stream as a reader that had followed it would see it: the schema, the dictionaries
    # the new batches may refer to, then the new messages in their order
    stream = b"".join([head, *(m for _, ms in tail.dictionaries for m in ms),
                       data[start:used]])
    with pa.ipc.open_stream(pa.py_buffer(stream), options=_ipc_options(len(stream))) as reader_:
        table = reader_.read_all()
    return _canonical_arrow(table), replace(new, rows=new.rows + table.num_rows)


#: bytes an :class:`ArrowStreamTail` keeps of what it read last (a batch's end: its values)
_MARK_BYTES = 64


def _message_size(data: bytes) -> int:
    """Bytes of the IPC message ``data`` starts with, as its prefix and metadata say: at least
    ``len(data)``; up to the end of its metadata when ``data`` holds only part of that."""
    try:
        message = pa.ipc.read_message(pa.BufferReader(pa.py_buffer(data)))
    except (OSError, pa.ArrowInvalid, EOFError):
        pass
    else:  # the whole first message fits: nothing more is needed for it
        del message
        return len(data)
    offset = 8 if data[:4] == _ARROW_STREAM_HEAD else 4
    if len(data) < offset:
        return len(data)
    meta_len = struct.unpack_from("<i", data, offset - 4)[0]
    meta = data[offset:offset + meta_len]
    if len(meta) < meta_len:
        return offset + meta_len
    table, vtable = _flatbuffer_table(meta, 0)
    at_body = _flatbuffer_field(meta, vtable, 3)
    body = struct.unpack_from("<q", meta, table + at_body)[0] if at_body else 0
    return max(len(data), offset + meta_len + body)


def _unique_dictionary(chunk: pa.DictionaryArray) -> pa.DictionaryArray:
    """``chunk`` with each dictionary value once (work on the dictionary, not per row)."""
    values = chunk.dictionary.dictionary_encode()
    return pa.DictionaryArray.from_arrays(values.indices.take(chunk.indices), values.dictionary)


def _strip_gz(name: str) -> str:
    return name[:-3] if name.lower().endswith(".gz") else name


def detect_format(path: str | Path) -> str:
    """Guess the format of one file from its name and first bytes.

    Returns
    -------
    str
        One of :data:`FORMATS`.

    Raises
    ------
    UnknownFormatError
        When the content matches none of them (a :class:`SchemaError`).
    SchemaError
        When the file is missing or its gzip stream is corrupt.

    Examples
    --------
    >>> detect_format("ops.csv.gz")  # doctest: +SKIP
    'native'
    """
    p = Path(path)
    if not p.is_file():
        raise SchemaError("file not found", source=str(p), expected="an existing file")
    name = _strip_gz(p.name.lower())
    head = head_bytes(p, 1 << 16)
    if not head.strip():
        # (an UnknownFormatError: in a directory it is skipped, "an empty file", as before)
        raise UnknownFormatError("empty file", source=str(p),
                                 expected="a log in one of " + ", ".join(FORMATS))
    packed = _unread_archive(p.name.lower(), head)
    if packed is not None:
        raise UnknownFormatError(packed, source=str(p),
                                 expected="a log, or a tar archive of logs (" +
                                 ", ".join(ARCHIVE_SUFFIXES) + ")")
    if head[:4] == b"PAR1":
        from holmes_ml.io.bytedance import looks_like_bytedance

        return "bytedance" if looks_like_bytedance(p) else "native"
    if _is_arrow_stream(name, head):
        return "native"
    if name.endswith((".pkl", ".pickle")) or head[:1] == b"\x80":
        return "flight-recorder"
    if _looks_utf16(head):
        # read as UTF-8 its commas made it a "CSV" whose every header name was garbled; one
        # named as a log is refused even in a directory (where other unknown files are skipped)
        error = SchemaError if name.endswith((".csv", ".jsonl", ".ndjson")) else \
            UnknownFormatError
        raise error(_UTF16, source=str(p),
                    expected="UTF-8 text (save the file as UTF-8) or Parquet")
    text = head.decode("utf-8-sig", errors="replace").lstrip()
    if text.startswith("{"):
        first = text.split("\n", 1)[0]
        if '"traceEvents"' in text or '"schemaVersion"' in first or '"deviceProperties"' in text:
            return "kineto"
        if '"entries"' in text or '"collective_seq_id"' in text or '"pg_config"' in first:
            return "flight-recorder"
        # NCCL Inspector: every line (v4.0-v4.2) or every v4.3 dump_stats marker carries
        # metadata.inspector_output_format_version; payload lines are coll_perf / p2p_perf.
        if any(k in text for k in ('"inspector_output_format_version"', '"coll_perf"',
                                   '"p2p_perf"', '"dump_timestamp_us"')):
            return "nccl-inspector"
        if all(f'"{c}"' in first for c in REQUIRED_COLUMNS):
            return "native"
    if text.startswith("["):
        # one JSON array of records (pandas' to_json(orient="records")) whose first record has
        # every CommOps column: another table exported so (scores, a summary) beside the logs
        # is no log, and is skipped as before
        if all(f'"{c}"' in _first_array_record(text) for c in REQUIRED_COLUMNS):
            return "native"
    # The comma count spots a CSV without its extension; a one-line JSON object (a config,
    # topology.json) has commas too and is not a CSV.
    is_json = text.startswith(("{", "["))
    if name.endswith((".csv", ".jsonl", ".ndjson")) or (
            not is_json and text.split("\n", 1)[0].count(",") >= 7):
        return "native"
    raise UnknownFormatError(
        "cannot tell the format of this file", source=str(p),
        expected="one of " + ", ".join(FORMATS) + "; name it with --format (format= in Python)",
    )


#: How :func:`_unread_archive`'s answers start (a directory's skip warning repeats them).
_UNREAD_ARCHIVES = ("a zip archive", "zstd-compressed")


def _unread_archive(name: str, head: bytes) -> str | None:
    """What an archive of a kind holmes does not unpack is (a zip, a zstd tar), or None: said
    as such, not as a file whose format cannot be told (and --format then refusing it too)."""
    if head[:4] == b"PK\x03\x04" or name.endswith(".zip"):
        return "a zip archive, which holmes does not unpack: unzip it and give the directory"
    if head[:4] == b"\x28\xb5\x2f\xfd" or name.endswith((".zst", ".zstd")):
        return ("zstd-compressed, which holmes does not read: decompress it (zstd -d) and give "
                "the file or directory")
    return None


def _first_array_record(text: str) -> str:
    """The text of the first record of a JSON array of flat objects (``""`` if it has none)."""
    body = text.lstrip()[1:].lstrip()
    return body[:body.find("}") + 1] if body.startswith("{") else ""


_UTF16 = "UTF-16 text"


def _looks_utf16(head: bytes) -> bool:
    """Whether a file's first bytes are UTF-16 text: a byte-order mark, or ASCII characters
    whose every other byte is zero."""
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return True
    probe = head[:64]
    if len(probe) < 8:
        return False
    zeros = sorted((probe[0::2].count(0), probe[1::2].count(0)))
    return zeros[0] == 0 and zeros[1] >= 0.75 * (len(probe) // 2)


def looks_like_native_log(path: str | Path) -> bool:
    """Whether a CSV / JSON-lines file's header (or first record) names at least half of the
    required CommOps columns; other files (Parquet included) are given the benefit of the doubt.

    Tells a log missing a column (read, and refused naming the column) from a table of
    something else that shares a directory with the logs (skipped).
    """
    p = Path(path)
    name = _strip_gz(p.name.lower())
    if not name.endswith((".csv", ".jsonl", ".ndjson")):
        return True
    try:
        first = head_bytes(p, 1 << 16).decode("utf-8-sig", errors="replace").lstrip()
    except SchemaError:
        return True  # a corrupt file: let the reader say so
    if first.startswith("["):  # a JSON array of records, named as JSON lines or CSV
        record = _first_array_record(first)
        names = {c for c in REQUIRED_COLUMNS if f'"{c}"' in record}
        return 2 * len(names) >= len(REQUIRED_COLUMNS)
    first = first.split("\n", 1)[0]
    if first.startswith("{"):
        try:
            names = set(json.loads(first))
        except ValueError:
            return True  # malformed (or a line cut at the sniffed head): the reader says which
    else:
        # a log written with another separator is a log (read, and refused saying so)
        names = {c.strip().strip('"') for sep in (",", ";", "\t", "|")
                 for c in next(csv.reader([first], delimiter=sep), [])}
    return 2 * len(names & set(REQUIRED_COLUMNS)) >= len(REQUIRED_COLUMNS)


def read_native(path: str | Path) -> pd.DataFrame:
    """Read one canonical CSV / Parquet / JSON Lines / JSON array file (gz allowed) without
    validating it."""
    p = Path(path)
    name = _strip_gz(p.name.lower())
    head = head_bytes(p, 4)
    try:
        if head[:4] == b"PAR1":
            unfinished = unfinished_parquet(p)
            if unfinished is not None:
                raise unfinished
            return pd.read_parquet(p)
        if _is_arrow_stream(name, head):
            return read_arrow_stream(p).to_pandas()
        if _is_json_array(p):
            return _read_json_array(p)
        if name.endswith((".jsonl", ".ndjson", ".json")) or head[:1] == b"{":
            _refuse_endless_line(p, "JSON lines: one operator (a JSON object) per line")
            raw = open_bytes(p)
            fast = json_lines_frame(raw) if raw.endswith(b"\n") else None
            if fast is not None:
                return fast
            rows = [obj for _, obj in iter_jsonl(p)]
            return pd.DataFrame.from_records(rows)
        return _read_csv(p)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()  # no header either: the caller says "empty file"
    except SchemaError:
        raise
    except UnicodeDecodeError:
        raise _not_utf8(p) from None
    except pd.errors.ParserError as exc:
        m = re.search(r"EOF inside string starting at row (\d+)", str(exc))
        if m is not None:  # pandas counts rows from 0, header included
            raise SchemaError("a quoted field starting on this line is never closed",
                              source=str(p), line=int(m.group(1)) + 1,
                              expected='a closing " for every opening one') from None
        m = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(exc))
        if m is None:
            raise SchemaError(f"cannot parse file: {exc}", source=str(p),
                              expected="CSV, Parquet or JSON Lines in the CommOps schema") from exc
        header, line, saw = map(int, m.groups())
        raise SchemaError(f"has {saw} fields, the header {header}", source=str(p), line=line,
                          expected="one value per header column on every line") from None
    except (ValueError, OSError, EOFError, json.JSONDecodeError, KeyError,
            TypeError, zlib.error) as exc:
        # KeyError/TypeError: pyarrow/pandas reading a Parquet file whose pandas metadata is
        # broken; zlib.error: a gzip stream corrupt past the sniffed head
        text = f"{type(exc).__name__}: {exc}" if isinstance(exc, (KeyError, TypeError)) \
            else str(exc)
        raise SchemaError(f"cannot parse file: {text}", source=str(p),
                          expected="CSV, Parquet or JSON Lines in the CommOps schema") from exc


#: Arrow types of the schema's columns, which JSON lines are read with (:func:`json_lines_frame`).
_JSON_SCHEMA = pa.schema([(name, {"int": pa.int64(), "float": pa.float64(), "str": pa.string()}[t])
                          for name, t in {**REQUIRED_COLUMNS, **OPTIONAL_COLUMNS}.items()])
#: Types of the columns a table read so may hold (others are read with Python's json).
_PLAIN_TYPES = (pa.int64(), pa.float64(), pa.string(), pa.bool_())


def json_lines_frame(data: bytes, threads: bool = True) -> pd.DataFrame | None:
    """The rows of JSON lines ``data`` (one object per line), read by pyarrow: the schema's
    columns with their types, other fields as they come. None when it cannot read them so (a
    line that is no JSON object, a value of another type, a missing one, a field of an odd type
    such as a list or a date pyarrow would make a timestamp, bytes that are not UTF-8): read
    them with Python's json, which names what is wrong and where.

    Two to four times faster than pandas' reader (``scripts/json_lines_speed.py``), and gives
    the same table once validated (a field absent from every line is no column here either).
    ``threads``: parse on several cores (a node agent beside a training job reads on one).
    """
    import pyarrow.json as pa_json

    if not data.isascii():
        try:
            data.decode("utf-8")  # pyarrow takes bytes that are not UTF-8 into its strings
        except UnicodeDecodeError:
            return None
    try:
        table = pa_json.read_json(
            io.BytesIO(data), read_options=pa_json.ReadOptions(use_threads=threads),
            parse_options=pa_json.ParseOptions(explicit_schema=_JSON_SCHEMA,
                                               unexpected_field_behavior="infer"))
    except (pa.ArrowException, ValueError, OSError):
        return None
    keep = []
    for name, col in zip(table.column_names, table.columns, strict=True):
        if col.type not in _PLAIN_TYPES:
            return None
        if col.null_count == len(table) and name in _JSON_SCHEMA.names \
                and b'"' + name.encode() + b'"' not in data:
            continue  # a column of the schema no line has: none, as Python's json reads it
        if col.null_count:
            return None  # a value null or missing: said by the validation, naming its row
        keep.append(name)
    return table.select(keep).to_pandas()


def _is_json_array(p: Path) -> bool:
    """Whether the text file ``p`` holds one JSON array (of records, we expect)."""
    return head_bytes(p, 1 << 16).decode("utf-8-sig", errors="replace").lstrip()[:1] == "["


def _read_json_array(p: Path) -> pd.DataFrame:
    """A JSON array of one object per operator (``records[i]`` in errors), as a table."""
    records = load_json(p, what="a JSON array of operator records")
    if not isinstance(records, list):  # a file that only starts with "[" when sniffed
        raise SchemaError("not a JSON array", source=str(p), value=kind_name(records),
                          expected="a JSON array of operator records")
    if not records:
        raise SchemaError("an empty JSON array", source=str(p),
                          expected="one JSON object per operator")
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise SchemaError("not a JSON object", source=str(p), parameter=f"records[{i}]",
                              value=kind_name(r), expected="one JSON object per operator")
    return pd.DataFrame.from_records(records)


def _not_utf8(p: Path) -> SchemaError:
    """The error for a text file that is not UTF-8, naming the line and the first bad byte."""
    raw = open_bytes(p)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        at = exc.start
        return SchemaError("not UTF-8 text", source=str(p), line=raw.count(b"\n", 0, at) + 1,
                           value=f"byte 0x{raw[at]:02x} at offset {at}",
                           expected="UTF-8 text (CSV, JSON Lines) or Parquet")
    return SchemaError("cannot parse file: not UTF-8 text", source=str(p),
                       expected="UTF-8 text (CSV, JSON Lines) or Parquet")


def _head_records(p: Path) -> tuple[list[str], list[str], bool]:
    """The header and the first data record of a CSV, from its first 64 KiB, and whether
    that record ends there (a long one is cut); empty lists when the head does not parse."""
    text = head_bytes(p, 1 << 16).decode("utf-8-sig", errors="replace")
    try:
        # newline=None: files with \r line ends (old Mac) read like any other
        records = csv.reader(io.StringIO(text, newline=None))
        header, first = next(records, []), next(records, [])
        complete = next(records, None) is not None or text.endswith(("\n", "\r"))
    except csv.Error:
        return [], [], True  # pandas names the problem
    return header, first, complete


#: a CSV or JSON-lines log whose first line is longer than this is none (a header is well
#: under 1 kB, a record with the member list of an 8,192-rank communicator about 40 kB)
_MAX_FIRST_LINE = 1 << 20


def _refuse_endless_line(p: Path, expected: str) -> None:
    """Refuse a line-oriented file with no line break in its first MiB: its parser would hold
    the whole "line" several times over (gigabytes of zero bytes, a few megabytes gzipped,
    took 7x their size in memory before failing)."""
    head = head_bytes(p, _MAX_FIRST_LINE)
    if len(head) == _MAX_FIRST_LINE and b"\n" not in head and b"\r" not in head:
        raise SchemaError(f"no line break in the first {_MAX_FIRST_LINE >> 20} MiB",
                          source=str(p), line=1, expected=expected)


def _without_torn_last_line(p: Path, n_fields: int) -> io.BytesIO | None:
    """The CSV ``p`` without its last line when that line has no end and fewer fields than
    the header's ``n_fields`` (a line still being written, as a JSON Lines log's unfinished
    last line is left out), with a warning naming it; None when the last line is whole."""
    with open(p, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - (1 << 16)))
        tail = f.read()
    if not tail or tail.endswith((b"\n", b"\r")) or b"\n" not in tail:
        return None
    last = tail.rsplit(b"\n", 1)[1].decode("utf-8", errors="replace")
    try:
        fields = next(csv.reader([last]), [])
    except csv.Error:
        return None
    if len(fields) >= n_fields:
        return None
    data = p.read_bytes()
    kept = data[:data.rfind(b"\n") + 1]
    logger.warning("%s, line %d: %d of the header's %d fields and no end: a line still being "
                   "written? Left out", p, kept.count(b"\n") + 1, len(fields), n_fields)
    return io.BytesIO(kept)


def _read_csv(p: Path) -> pd.DataFrame:
    """A CSV with one dtype per column. pandas types a large file chunk by chunk (2**18 rows)
    and warns (``DtypeWarning``) when the chunks disagree, e.g. one odd value far down; such a
    file is read again as one piece, so the schema check names that value like any other. The
    second read costs 3-5x the first and about 20 % more memory, so only those files pay it."""
    with open(p, "rb") as f:  # gzip by its content, whatever the name says
        compression = "gzip" if f.read(2) == b"\x1f\x8b" else None
    _refuse_endless_line(p, "a CSV log: a header line, then one operator per line")
    header, first, complete = _head_records(p)
    twice = sorted({c.strip() for c in header if header.count(c) > 1})
    if twice:
        # pandas would rename the second one 'rank.1' and read the first as if alone
        raise SchemaError("column named twice in the header", source=str(p), line=1,
                          value=twice[0], expected="each column once")
    if header and len(first) > len(header):
        # pandas would take the first fields as an index and shift every column (and take
        # minutes over a line of 10^5 fields): say so before reading
        count = f"{len(first)}" if complete else f"over {len(first) - 1}"
        raise SchemaError(f"has {count} fields, the header {len(header)}", source=str(p),
                          line=2, expected="one value per header column on every line (a "
                          "delimiter at the end of each line?)")
    source: Path | io.BytesIO = p
    if compression is None and header:
        source = _without_torn_last_line(p, len(header)) or p
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", pd.errors.DtypeWarning)
        df = pd.read_csv(source, compression=compression)
    if any(issubclass(w.category, pd.errors.DtypeWarning) for w in caught):
        if isinstance(source, io.BytesIO):
            source.seek(0)
        df = pd.read_csv(source, compression=compression, low_memory=False)
    else:
        for w in caught:  # anything else pandas had to say still reaches the user
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if not isinstance(df.index, pd.RangeIndex):
        # Every line has more fields than the header: pandas takes the first ones as the
        # index and shifts every column by one
        raise SchemaError(f"has more fields than the header's {len(df.columns)}",
                          source=str(p), line=2,
                          expected="one value per header column on every line (a "
                          "delimiter at the end of each line?)")
    return df


#: Archive names :func:`read_ops` unpacks (into a temporary directory) before reading.
ARCHIVE_SUFFIXES: tuple[str, ...] = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


def _unpack(archive: Path, into: Path) -> Path:
    """Extract a tar archive with the ``data`` filter (no absolute paths, links out, devices)."""
    import tarfile

    try:
        with tarfile.open(archive) as tf:
            tf.extractall(into, filter="data")
    except (tarfile.TarError, OSError, EOFError, KeyError, lzma.LZMAError, zlib.error) as exc:
        # KeyError: a hard link to a member the archive does not hold
        text = f"missing member {exc}" if isinstance(exc, KeyError) else str(exc)
        raise SchemaError(f"cannot unpack archive: {text}", source=str(archive),
                          expected="a readable tar archive of trace files") from exc
    return into


@dataclass(frozen=True)
class _Input:
    """One file to read, and the directory or archive it was found in (None: named by the caller)."""

    path: Path
    container: str | None = None


def _members(root: Path) -> tuple[list[Path], list[str]]:
    """Candidate log files under ``root`` (the whole tree, sorted) and every file name seen."""
    files, seen = [], []
    # The whole tree, sorted: logs often sit in per-node or per-run subdirectories, and the
    # order must not depend on the file system.
    for f in sorted(root.rglob("*")):
        rel = f.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):
            continue
        if not f.is_file():
            if f.is_symlink() and not f.is_dir():  # its target gone (or a loop of links)
                logger.warning("%s: a symbolic link to nothing readable, skipped", f)
            continue
        seen.append(rel.as_posix())
        # Companions of a log set, never logs themselves (ByteDance meta-/result- files).
        if f.name.lower().endswith(_SKIP_SUFFIXES) or f.name.startswith(("result-", "meta-")):
            continue
        files.append(f)
    return files, seen


def _expand(
    paths: str | Path | Sequence[str | Path],
    scratch: Callable[[], Path] | None = None,
    shown: dict[str, str] | None = None,
) -> list[_Input]:
    """Files to read, each path once. ``shown`` collects scratch directory -> archive name."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    elif not isinstance(paths, Sequence) or isinstance(paths, bytes):
        raise TypeError(f"paths: got {type(paths).__name__}; expected a path (str or "
                        "os.PathLike) or a list of them")
    out: list[_Input] = []
    read: dict[Path, str] = {}
    repeats: dict[str, int] = {}

    def once(f: Path, label: str) -> bool:
        key = f.resolve()
        if key in read:
            # Reading it twice would double every op of its ranks and skew every statistic.
            repeats[read[key]] = repeats.get(read[key], 1) + 1
            return False
        read[key] = label
        return True

    def is_archive(f: Path) -> bool:
        return scratch is not None and f.is_file() and f.name.lower().endswith(ARCHIVE_SUFFIXES)

    def unpacked(archive: Path) -> list[_Input]:
        assert scratch is not None
        root = _unpack(archive, scratch())
        if shown is not None:
            shown[str(root)] = str(archive)
        files, seen = _members(root)
        if not files:
            raise SchemaError("no log files in archive" if seen else "empty archive",
                              source=str(archive), value=", ".join(seen[:8]) or None,
                              expected="trace files")
        return [_Input(f, str(archive)) for f in files]

    for item in paths:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"paths: got {type(item).__name__} {item!r}; expected a path (str "
                            "or os.PathLike) or a list of them")
        if str(item).strip() == "":
            # Path("") is the current directory: reading the whole tree by accident
            raise SchemaError("empty path", parameter="paths", value=str(item),
                              expected="a file or directory name")
        p = Path(item)
        if is_archive(p):
            if once(p, str(p)):
                out.extend(unpacked(p))
        elif p.is_dir():
            files, seen = _members(p)
            if not files:
                raise SchemaError("no log files in directory" if seen else "empty directory",
                                  source=str(p), value=", ".join(seen[:8]) or None,
                                  expected="trace files")
            for f in files:
                if not once(f, str(f)):
                    continue
                # A directory holding the archive of its traces (as published datasets do)
                # reads like the archive.
                out.extend(unpacked(f) if is_archive(f) else [_Input(f, str(p))])
        elif p.is_file():
            if once(p, str(p)):
                out.append(_Input(p))
        elif p.exists():
            # a fifo would block the read forever, /dev/zero never end it
            raise SchemaError("not a regular file", source=str(p),
                              expected="a log file, a directory or an archive")
        else:
            raise SchemaError("file not found", source=str(p), expected="an existing file or dir")
    for label, times in repeats.items():
        logger.warning("%s is given %s: read once", label,
                       "twice" if times == 2 else f"{times} times")
    if not out:
        raise SchemaError("no input given", expected="at least one file or directory")
    return out


def _check_format_name(format: str) -> None:
    if format != "auto" and format not in FORMATS:
        raise SchemaError("not a known format", parameter="format", value=format,
                          expected="one of auto, " + ", ".join(FORMATS))


def read_ops(
    paths: str | Path | Sequence[str | Path],
    format: str = "auto",
    trust_pickle: bool = False,
    progress: bool = False,
) -> pd.DataFrame:
    """Read CommOps logs of any supported format into one validated canonical table.

    Parameters
    ----------
    paths:
        A file, a directory (all files inside, subdirectories included: per-rank files), a tar
        archive of such files (``.tar``, ``.tar.gz``, ``.tgz``, ...; unpacked to a temporary
        directory) or a list of them. With ``format="auto"``, files of a directory or archive
        whose format cannot be identified are skipped with a warning.
    format:
        ``"auto"`` (detect per file; all must agree) or one of :data:`FORMATS` (in any case).
    trust_pickle:
        Allow pickled Flight Recorder dumps. Unpickling runs code from the file: only for
        files you produced yourself.
    progress:
        Show a progress bar over the files on stderr (when reading takes over a second).

    Returns
    -------
    pandas.DataFrame
        The canonical table (see :mod:`holmes_ml.io.schema`), with format-specific extra columns.
        A path given twice is read once; rows repeated exactly are dropped (both with a warning).

    Raises
    ------
    SchemaError
        Unknown format, unparsable file, or a table that breaks the schema; the message names
        the file (``archive.tar.gz:member`` inside an archive), column, line/row and value and
        what was expected.

    Examples
    --------
    >>> ops = read_ops("logs/", format="auto")  # doctest: +SKIP
    """
    if isinstance(format, str):
        format = format.strip().lower()  # "Kineto" is kineto
    _check_format_name(format)
    with tempfile.TemporaryDirectory(prefix="holmes-read-") as tmp:
        counter = iter(range(1 << 30))
        shown: dict[str, str] = {}
        try:
            files = _expand(paths, lambda: Path(tmp) / f"archive-{next(counter)}", shown)
            with showing_progress(progress):
                return _read_files(files, format, trust_pickle, shown)
        except SchemaError as exc:
            # Members of an archive live in a directory deleted on return: name them as
            # archive.tar.gz:member instead.
            _rename(exc, shown)
            raise


def _display(text: str, shown: dict[str, str]) -> str:
    for tmp, archive in shown.items():
        text = text.replace(tmp + os.sep, archive + ":").replace(tmp, archive)
    return text


def _rename(exc: SchemaError, shown: dict[str, str]) -> None:
    if not shown:
        return
    exc.args = tuple(_display(a, shown) if isinstance(a, str) else a for a in exc.args)
    for attr in ("source", "value", "expected", "message"):
        v = getattr(exc, attr, None)
        if isinstance(v, str):
            setattr(exc, attr, _display(v, shown))


def file_lines(path: Path) -> list[int] | None:
    """File line of each data row of a native CSV or JSON Lines file, gzipped or not (None for
    Parquet, Arrow and a JSON array, whose records are not lines).

    Only called on the error path, so it reads the file again rather than tracking lines always.
    """
    head = head_bytes(path, 4)[:4]
    name = _strip_gz(path.name.lower())
    if head == b"PAR1" or _is_arrow_stream(name, head):
        return None
    text = open_bytes(path).decode("utf-8-sig", errors="replace")
    if text.lstrip()[:1] == "[":
        return None  # a JSON array: its records are not lines (the error says records[i])
    if name.endswith((".jsonl", ".ndjson", ".json")) or text[:1] == "{":
        # the readers skip blank lines
        return [n for n, line in enumerate(io.StringIO(text), start=1) if line.strip()]
    # pandas skips blank lines and the first record is the header; the csv module counts
    # physical lines, so quoted fields spanning lines are counted right too.
    reader = csv.reader(io.StringIO(text, newline=None))  # \r line ends count as lines too
    lines: list[int] = []
    before = 0
    try:
        for record in reader:
            if record and (len(record) > 1 or record[0].strip()):  # (pandas skips "  " too)
                lines.append(before + 1)
            before = reader.line_num
    except csv.Error:
        pass  # a quote never closed: the rows after it keep their numbers
    return lines[1:]


def file_line_of(path: Path, row: int) -> int | None:
    """File line of data row ``row`` of a native CSV or JSON Lines file (:func:`file_lines`;
    None for Parquet, or a row it does not reach)."""
    lines = file_lines(path)
    return lines[row] if lines is not None and 0 <= row < len(lines) else None


def _read_native(f: Path, table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Native file ``f`` (already read: ``table``) validated, errors naming its line."""
    if table is None:
        table = _read_unvalidated(f)
    try:
        return validate(table, source=str(f))
    except SchemaError as exc:
        if exc.row is None or exc.line is not None:
            raise
        line = file_line_of(f, exc.row)
        if line is None:
            raise
        short = _short_csv_line(f, table, line)
        if short is not None:
            raise short from None
        # Editors and `sed -n Np` count file lines, not 0-based data rows.
        raise exc.at(line=line) from None


def _read_unvalidated(f: Path) -> pd.DataFrame:
    """:func:`read_native`, refusing a file with neither header nor record."""
    table = read_native(f)
    if table.empty and len(table.columns) == 0:
        # no header, no record: "missing columns" would send the user looking for a typo
        kind = _strip_gz(f.name.lower())
        raise SchemaError("empty file", source=str(f),
                          expected="a header line and one operator per line" if
                          kind.endswith(".csv") else "a Parquet table of operators"
                          if kind.endswith(".parquet") else "one JSON object "
                          "(operator) per line")
    return _lists_once(table)


def _lists_once(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with each distinct member list held once (categorical), as validate keeps
    them: held as text until all files are read, the 40 kB list of an 8,192-rank communicator
    on each of its rows would take gigabytes per thousand files."""
    members = table.get("group_ranks")
    # (a Series: not several columns of that name or a level of several)
    if isinstance(members, pd.Series) and isinstance(members.dtype, pd.StringDtype):
        codes, lists = pd.factorize(members, sort=False)
        table["group_ranks"] = pd.Categorical.from_codes(codes, categories=lists)
    return table


def _plain_parquet(f: Path) -> pa.Table | None:
    """``f`` as an Arrow table (member lists dictionary-encoded; an Arrow stream's other
    strings too, decoded by :func:`_as_frames` with the other files') when it is a Parquet
    file without pandas metadata or an Arrow IPC stream, as the logger writes them: turning
    each such file into a pandas table on its own costs more than reading it. None for any other
    file, or one that does not read so (:func:`read_native` then reads it, or says why it
    cannot)."""
    if f.name.lower().endswith(".arrows"):
        try:
            return _stream_table(f)  # (its strings decoded with the other files': _as_frames)
        except SchemaError:
            return None  # read_native says why
    if not f.name.lower().endswith(".parquet"):
        return None
    try:
        schema = pq.read_schema(f)  # not Parquet: raises
        if len(schema) == 0 or (schema.metadata and b"pandas" in schema.metadata):
            return None
        return pq.read_table(f, read_dictionary=[c for c in ("group_ranks",)
                                                  if c in schema.names])
    except (OSError, ValueError, TypeError, KeyError, pa.ArrowException):
        return None


def _as_frames(read: Sequence[pd.DataFrame | pa.Table]) -> list[pd.DataFrame]:
    """What files read as (:func:`_read_unvalidated` or :func:`_plain_parquet`) as pandas
    tables, in order; Arrow tables next to each other become one."""
    out: list[pd.DataFrame] = []
    run: list[pa.Table] = []
    for item in [*read, None]:
        if isinstance(item, pa.Table):
            run.append(item)
            continue
        if run:
            try:
                joined = [pa.concat_tables(run, promote_options="default")]
            except (pa.ArrowInvalid, pa.ArrowTypeError):  # columns of other types
                joined = run
            out += [_lists_once(_canonical_arrow(t).to_pandas()) for t in joined]
            run = []
        if item is not None:
            out.append(item)
    return out


def _in_file(
    exc: SchemaError, files: list[Path], names: list[str], origin: np.ndarray
) -> SchemaError:
    """``exc``, raised on the rows of several files read together, with its row (and the
    earlier row it contradicts, "as in row N") given as file and line."""

    def where(row: int) -> str:
        k = int(origin[row])
        local = row - int(np.searchsorted(origin, k))
        line = file_line_of(files[k], local)
        return f"{names[k]} row {local}" if line is None else f"{names[k]} line {line}"

    return _located(exc, where)


#: How each converter's :data:`SOURCE_RECORD` names the record of its file a row came from.
_RECORD_NAMES = {"kineto": "traceEvents[{}]", "flight-recorder": "entries[{}]",
                 "nccl-inspector": "line {}"}


def _record_finder(converted: pd.DataFrame, format: str, shown: dict[str, str]
                   ) -> Callable[[int], str] | None:
    """Takes the converter's :data:`SOURCE_FILE` / :data:`SOURCE_RECORD` columns off
    ``converted`` and returns what names row ``i``'s file and record (None without them)."""
    if SOURCE_FILE not in converted.columns or SOURCE_RECORD not in converted.columns:
        return None
    files = converted.pop(SOURCE_FILE).to_numpy()
    records = converted.pop(SOURCE_RECORD).to_numpy()
    template = _RECORD_NAMES.get(format, "record {}")

    def where(row: int) -> str:
        return f"{_display(str(files[row]), shown)}, {template.format(int(records[row]))}"

    return where


def _located(exc: SchemaError, where: Callable[[int], str]) -> SchemaError:
    """``exc`` with its row (and the earlier row it contradicts, "as in row N") given by
    ``where`` (file and line, or file and record)."""
    if exc.row is None:
        return exc
    expected = exc.expected
    if expected:
        expected = re.sub(r"as in row (\d+)", lambda m: "as in " + where(int(m.group(1))),
                          expected)
    return SchemaError(
        f"{exc.message} at {where(exc.row)}", source=exc.source, column=exc.column,
        value=exc.value, expected=expected,
    )


def _short_csv_line(f: Path, table: pd.DataFrame, line: int) -> SchemaError | None:
    """The error to give when CSV line ``line`` has fewer fields than the header (a file cut
    mid-line, most often: pandas fills the missing fields with NaN)."""
    if head_bytes(f, 1)[:1] == b"{":
        return None
    text = open_bytes(f).decode("utf-8-sig", errors="replace")
    lines = text.splitlines()
    if not 0 < line <= len(lines):
        return None
    fields = next(csv.reader([lines[line - 1]]), [])
    if len(fields) >= len(table.columns):
        return None
    cut = line == len(lines) and not text.endswith("\n")
    return SchemaError(
        f"has {len(fields)} of the header's {len(table.columns)} fields"
        + ("; the file ends in the middle of this line (truncated, or still being written?)"
           if cut else ""),
        source=str(f), line=line, expected="one value per header column on every line",
    )


#: Files of a ``holmes simulate`` (or ``holmes demo``) directory beside its log, read in a
#: directory or archive of it: said at INFO, not warned of as unknown logs.
_COMPANIONS = {"topology.json": "the job's topology", "faults.json": "the injected faults",
               "config.json": "the simulation's settings", "verdict.json": "a verdict"}


def _identify(files: list[_Input], shown: dict[str, str]) -> dict[Path, str]:
    """Format of each file; files of a directory/archive that match no format are skipped."""
    kinds: dict[Path, str] = {}
    skipped: dict[str, list[str]] = {}
    for f in files:
        try:
            kinds[f.path] = detect_format(f.path)
            if (f.container is not None and kinds[f.path] == "native"
                    and not looks_like_native_log(f.path)):
                # a table that is not a CommOps log (a detect output, a metrics export)
                # sitting among the logs; a log with a column missing is still read (and
                # refused naming the column)
                del kinds[f.path]
                raise UnknownFormatError("not a CommOps table")
        except UnknownFormatError as exc:
            if f.container is None:
                raise
            skipped.setdefault(f.container, []).append(f.path.name)
            if f.path.name in _COMPANIONS:  # what holmes simulate / demo write beside the log
                logger.info("%s: %s, not a log", _display(str(f.path), shown),
                            _COMPANIONS[f.path.name])
                continue
            empty = f.path.is_file() and f.path.stat().st_size == 0
            # (detect_format said why: no need to read the file again)
            logger.warning("%s: %s, skipped", _display(str(f.path), shown),
                           "an empty file" if empty else "UTF-16 text, not UTF-8"
                           if exc.message == _UTF16 else exc.message
                           if exc.message.startswith(_UNREAD_ARCHIVES)
                           else "not a log of a known format")
    for container, names in skipped.items():
        if not any(f.container == container and f.path in kinds for f in files):
            raise UnknownFormatError(
                "no file of a known format", source=container,
                value=few(names, 8, ", "),
                expected="files of one of " + ", ".join(FORMATS)
                + "; name the format with --format (format= in Python)",
            )
    return kinds


#: The columns the schema knows, in the order :func:`validate` gives them.
_SCHEMA_ORDER = [*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS]
#: Native files read before they are validated as one table: checking each file on its own
#: costs about 15 ms a file, three quarters of the time a directory of per-rank logs takes,
#: and holding every file as read until the end costs more memory than their validated parts.
_FILES_AT_ONCE = 256


def _validated_together(files: list[Path], read: list[pd.DataFrame | pa.Table], source: str,
                        alone: bool = True) -> tuple[pd.DataFrame, bool]:
    """The native files ``files`` (as read: ``read``) as one validated table, and whether
    it was validated as a whole. When that fails, each file is validated on its own, so that
    an error names the file and its line; what files say against each other is then left to
    the caller (``False``), as it is when the files are not all there are (not ``alone``:
    the caller checks that once, on all of them)."""
    try:
        ops = validate(concat_ops(_as_frames(read), one_chunk=True), source=source,
                       options=None if alone else ValidationOptions(check_groups=False))
    except Exception:  # any error: found and named below
        return concat_ops([_read_native(f, _as_frames([t])[0])
                           for f, t in zip(files, read, strict=True)]), False
    known = [c for c in _SCHEMA_ORDER if c in ops.columns]
    if list(ops.columns[:len(known)]) != known:
        # validate adds a missing peer column after the others the schema knows; files
        # validated one by one all have it by the time they are joined
        ops = ops[known + [c for c in ops.columns if c not in known]]
    return ops, True


def _of_format(inputs: list[_Input], format: str, shown: dict[str, str]) -> list[Path]:
    """The files of ``inputs`` to read as ``format`` (named with --format): all, but that a
    file found in a directory or archive which is plainly a log of another format is left out
    with a warning (a directory of Kineto traces and CSV logs: --format kineto refused the
    CSV, --format native the traces, and auto refused the mix); all when none is of
    ``format``, so that its reader says what they are."""
    files: list[tuple[Path, str | None]] = []
    other: list[tuple[Path, str | None]] = []
    for f in inputs:
        kind = None
        if f.container is not None:
            try:
                kind = detect_format(f.path)
            except SchemaError:
                pass  # (no format of its own: the reader of this one says what it is)
        (other if kind is not None and kind != format else files).append((f.path, kind))
    if not files:  # none of that format: its reader says what the first one is instead
        return [path for path, _ in other]
    for path, kind in other:
        logger.warning("%s: a %s log, not %s: skipped (--format %s reads it)",
                       _display(str(path), shown), kind, format, kind)
    return [path for path, _ in files]


def _read_files(
    inputs: list[_Input], format: str, trust_pickle: bool, shown: dict[str, str] | None = None
) -> pd.DataFrame:
    _check_format_name(format)
    if format == "auto":
        kinds = _identify(inputs, shown or {})
        files = [f.path for f in inputs if f.path in kinds]
        found = sorted(set(kinds.values()))
        if len(found) > 1:
            raise SchemaError(
                "files of different formats in one input", source=str(files[0]),
                value=", ".join(f"{f.name}={k}" for f, k in list(kinds.items())[:6]),
                expected="files of a single format; name one with --format (of a directory, "
                "the files of the others are then skipped)",
            )
        format = found[0]
    else:
        files = _of_format(inputs, format, shown or {})
    unread: list[str] = []
    if format == "native" and len(files) > 1:
        files, unread = _closed_parquet(files, shown or {})
    logger.info("reading %d file(s) as %s", len(files), format)
    source = str(files[0]) if len(files) == 1 else f"{files[0].parent} ({len(files)} files)"
    source = _display(source, shown or {})

    if format != "native":
        if format == "bytedance" and len(files) != 1:
            other = next((f for f in files if head_bytes(f, 4) != b"PAR1"), None)
            if other is not None:  # no what-if trace at all, most likely: say that first
                raise SchemaError("not Parquet", source=_display(str(other), shown or {}),
                                  expected="a ByteDance what-if trace-*.parquet (--format "
                                  "bytedance), or another --format")
            # Several what-if traces are several jobs: read them one at a time.
            listed = ", ".join(f.name for f in files)
            raise SchemaError(f"several what-if traces ({listed}): each is a job of its own",
                              source=source, value=len(files),
                              expected="one trace-*.parquet per read, one per agent directory")
        converted = _converted(format, files, trust_pickle, source)
        where = _record_finder(converted, format, shown or {})
        try:
            ops = validate(converted, source=source)
        except SchemaError as exc:
            if where is None:
                raise
            raise _located(exc, where) from None
        ops.attrs.update(converted.attrs)  # what the converter noticed (for the verdict's note)
        return _drop_duplicate_rows(ops, source)
    ops = _read_native_files(files, source, shown or {})
    if unread:
        ops.attrs["unread_files"] = unread  # for check and the verdict's note
    return ops


def _closed_parquet(files: list[Path], shown: dict[str, str]) -> tuple[list[Path], list[str]]:
    """``files`` without the Parquet files that have no footer yet, and those files' names
    (in a warning too): one rank's log still being written, or whose writer was killed, must
    not keep the other ranks' logs from being read. Raises the first one's error when no
    file is left."""
    unfinished = [(f, e) for f in files if (e := unfinished_parquet(f)) is not None]
    if not unfinished:
        return files, []
    names = [_display(str(f), shown) for f, _ in unfinished]
    if len(unfinished) == len(files):
        first = unfinished[0][1]
        raise UnfinishedParquetError(
            f"{len(files)} Parquet files, none with its footer ({few(names, 4, ', ')}): their "
            "writers have not closed them yet (a running job) or were killed before they "
            "could", source=first.source, expected=first.expected)
    logger.warning("%d Parquet log(s) without their footer skipped (%s): still being written "
                   "by a running job, or their writer was killed before closing them; their "
                   "rows are not read (expected %s)", len(names), few(names, 4, ', '),
                   UNFINISHED_PARQUET_EXPECTED)
    bad = {f for f, _ in unfinished}
    return [f for f in files if f not in bad], names


def _read_native_files(files: list[Path], source: str, shown: dict[str, str]) -> pd.DataFrame:
    """Native ``files`` as one validated table (errors naming the file and line)."""
    if len(files) == 1:
        try:
            return _drop_duplicate_rows(_read_native(files[0]), source)
        except SchemaError as exc:
            hinted = _format_hint(exc, "native", files)
            if hinted is exc:
                raise
            raise hinted from exc
    names = [_display(str(f), shown or {}) for f in files]
    counts: list[int] = []
    parts, checked = [], True
    some: list[Path] = []
    read: list[pd.DataFrame | pa.Table] = []
    for i, f in enumerate(each_file(files)):
        try:
            table = _plain_parquet(f)
            read.append(_read_unvalidated(f) if table is None else table)
        except SchemaError as exc:
            hinted = _format_hint(exc, "native", [f])
            if hinted is exc:
                raise
            raise hinted from exc
        some.append(f)
        counts.append(len(read[-1]))
        if len(some) == _FILES_AT_ONCE or i == len(files) - 1:
            part, whole = _validated_together(some, read, source,
                                              alone=len(files) <= _FILES_AT_ONCE)
            parts.append(part)
            checked &= whole
            some, read = [], []
    origin = np.repeat(np.arange(len(files)), counts)
    ops = parts[0]
    with stage(f"checking {len(files):,} files against each other"):
        if len(parts) > 1 or not checked:
            try:
                # what files say against each other, checked once for all parts; each row's
                # own values were checked with its part, unless a part holds files validated
                # one by one (perhaps of other columns)
                ops = concat_validated(parts, source=source) if checked \
                    else validate(concat_ops(parts), source=source)
            except SchemaError as exc:
                # name the file of the row
                raise _in_file(exc, files, names, origin) from None
        return _drop_duplicate_rows(ops, source, names, origin)


#: What a converter may raise on input its own checks let through (a field of an unexpected
#: type or size): reported as an input error naming the files, not as a crash.
_CONVERTER_SLIPS = (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError,
                    RecursionError, UnicodeError, zlib.error, lzma.LZMAError)


def _converted(format: str, files: list[Path], trust_pickle: bool, source: str) -> pd.DataFrame:
    """``files`` turned into a (not yet validated) CommOps table by the ``format`` converter.

    The converters check the fields they read and name file, field and value; anything that
    still slips through is reported as unreadable input naming the files, with the original
    exception chained (``holmes -v`` shows it), so a malformed log never ends in a traceback.
    """
    try:
        if format == "kineto":
            from holmes_ml.io.kineto import read_kineto

            return read_kineto(files)
        if format == "flight-recorder":
            from holmes_ml.io.flight_recorder import read_flight_recorder

            return read_flight_recorder(files, trust_pickle=trust_pickle)
        if format == "nccl-inspector":
            from holmes_ml.io.nccl_inspector import read_nccl_inspector

            return read_nccl_inspector(files)
        from holmes_ml.io.bytedance import read_bytedance

        return read_bytedance(files[0])
    except SchemaError as exc:
        hinted = _format_hint(exc, format, files)
        if hinted is exc:
            raise
        raise hinted from exc
    except _CONVERTER_SLIPS as exc:
        raise SchemaError(f"cannot read as {format}: {type(exc).__name__}: {exc}",
                          source=source, expected=f"well-formed {format} logs") from exc


#: What a file of each format is, for a hint that another --format reads it.
_FORMAT_NAMES = {
    "native": "a CommOps log", "kineto": "a Kineto (PyTorch profiler) trace",
    "flight-recorder": "a Flight Recorder dump", "nccl-inspector": "an NCCL Inspector log",
    "bytedance": "a ByteDance what-if trace",
}


def _format_hint(exc: SchemaError, format: str, files: list[Path]) -> SchemaError:
    """``exc`` (reading ``files`` as ``format``, named explicitly) with a hint when the file
    it names is of another format, as :func:`detect_format` sees it; else ``exc`` itself."""
    if "--format" in str(exc):
        return exc  # the reader said which format already
    named = [f for f in files if str(f) == exc.source]
    if not named and len(files) != 1:
        return exc
    try:
        found = detect_format((named or files)[0])
    except SchemaError:
        return exc
    if found == format:
        return exc
    hint = (f"it reads as {_FORMAT_NAMES.get(found, found)} with --format {found} or auto")
    return SchemaError(exc.message, source=exc.source, column=exc.column, row=exc.row,
                       value=exc.value, parameter=exc.parameter, line=exc.line,
                       expected=f"{exc.expected}; {hint}" if exc.expected else hint)


# Odd 64-bit multipliers (golden-ratio and splitmix constants) that spread the key columns
# over the whole word before they are mixed.
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def _drop_duplicate_rows(
    ops: pd.DataFrame,
    source: str,
    files: list[str] | None = None,
    origin: np.ndarray | None = None,
) -> pd.DataFrame:
    """``ops`` without exact copies of rows (:func:`_drop_exact_copies`), with a warning when
    rows still share an op's identity (:func:`warn_reused_keys`)."""
    dup = _exact_copies(ops, source, files, origin)
    if dup is not None:
        ops = ops.loc[~dup].reset_index(drop=True)
        origin = origin[~dup] if origin is not None else None
    # for the verdict's note (a warning on stderr is lost to a script reading the JSON); 0
    # too, so analyze knows the reader looked
    ops.attrs["reused_key_rows"] = warn_reused_keys(ops, source, files, origin)
    ops.attrs["key_checked_rows"] = len(ops)  # a concat of two tables keeps attrs: look again
    return ops


def _exact_copies(
    ops: pd.DataFrame,
    source: str,
    files: list[str] | None = None,
    origin: np.ndarray | None = None,
) -> np.ndarray | None:
    """Rows whose canonical columns all equal an earlier row's (logged), or None if none.

    An exact copy of an op is the same log line read twice (a copied file, a log appended
    twice), never a second op: it would double that op's weight in every statistic. Rows that
    share (rank, group, seq, op, iteration) but differ elsewhere are kept: that key is unique
    in the simulator's and the real traces, but a restarted job can reuse it legitimately.

    Parameters
    ----------
    ops:
        A validated CommOps table.
    source:
        Name of the input, for the warning.
    files, origin:
        Optionally the file names and, per row, the index of its file in ``files``, so the
        warning names the files the dropped rows came from.
    """
    if len(ops) < 2:
        return None
    # Screen cheaply first: exact copies share rank, seq, start and duration, so one hash pass
    # over a mixed 64-bit key leaves only a few candidates for the full comparison of every
    # canonical column (several times cheaper on millions of rows than comparing them all).
    dur = (ops["duration_us"].to_numpy(np.float64) + 0.0).view(np.uint64)  # -0.0 == 0.0
    key = (ops["start_ns"].to_numpy(np.int64).view(np.uint64)
           ^ ops["rank"].to_numpy(np.int64).view(np.uint64) * _MIX[0]
           ^ ops["seq"].to_numpy(np.int64).view(np.uint64) * _MIX[1]
           ^ dur * _MIX[2])
    # Sorting beats a hash table here (random 64-bit keys defeat its cache): ~0.1 s for 2M rows.
    ordered = np.sort(key)
    same = ordered[1:] == ordered[:-1]
    if not same.any():
        return None
    candidate = np.isin(key, ordered[1:][same])
    cols = [c for c in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if c in ops.columns]
    idx = np.flatnonzero(candidate)
    sub = ops.iloc[idx][cols]
    dup = np.zeros(len(ops), dtype=bool)
    dup[idx[sub.duplicated(keep="first").to_numpy()]] = True
    if not dup.any():
        return None
    first = int(np.flatnonzero(dup)[0])
    where = source
    if files is not None and origin is not None:
        # Name the files holding either copy: which one is dropped only depends on the order.
        involved = idx[sub.duplicated(keep=False).to_numpy()]
        where = ", ".join(files[i] for i in np.unique(origin[involved])[:4])
    logger.warning(
        "%s: dropped %d exact duplicate row(s) (every canonical column equal to an earlier row;"
        " first: rank %d, group %r, seq %d) - the same log read twice?",
        where, int(dup.sum()), int(ops["rank"].iloc[first]), str(ops["group"].iloc[first]),
        int(ops["seq"].iloc[first]),
    )
    return dup


#: What identifies one logged op: a rank's copy of step ``seq`` of ``op`` on ``group``.
_OP_KEY = ("rank", "group", "seq", "op", "iteration")


def warn_reused_keys(
    ops: pd.DataFrame,
    source: str,
    files: list[str] | None = None,
    origin: np.ndarray | None = None,
) -> int:
    """Warn when rows that differ share :data:`_OP_KEY`; returns how many do.

    That key is unique in the simulator's output and in every real trace at hand, so two rows
    with it are two runs read together (logs of an earlier run in a subdirectory) or a job
    restarted into the same files: kept, since a restart is legitimate, but every statistic of
    those ops would mix the two, so the user is told which files.
    """
    if len(ops) < 2:
        return 0
    group = pd.factorize(ops["group"])[0].astype(np.uint64)
    op = pd.factorize(ops["op"])[0].astype(np.uint64)
    key = (ops["rank"].to_numpy(np.int64).view(np.uint64) * _MIX[0]
           ^ ops["seq"].to_numpy(np.int64).view(np.uint64) * _MIX[1]
           ^ ops["iteration"].to_numpy(np.int64).view(np.uint64) * _MIX[2]
           ^ (group << np.uint64(8) | op))
    ordered = np.sort(key)
    same = ordered[1:] == ordered[:-1]
    if not same.any():
        return 0
    idx = np.flatnonzero(np.isin(key, ordered[1:][same]))
    shared = ops.iloc[idx].duplicated(list(_OP_KEY), keep=False).to_numpy()
    if not shared.any():
        return 0
    rows = idx[shared]
    first = int(rows[0])
    where = source
    if files is not None and origin is not None:
        where = ", ".join(files[i] for i in np.unique(origin[rows])[:4])
    logger.warning(
        "%s: %d row(s) share rank, group, seq, op and iteration with another row (first: rank "
        "%d, group %r, seq %d, iteration %d): two runs read together, or a job restarted into "
        "the same logs? Analyse one run at a time",
        where, len(rows), int(ops["rank"].iloc[first]), str(ops["group"].iloc[first]),
        int(ops["seq"].iloc[first]), int(ops["iteration"].iloc[first]),
    )
    return len(rows)
