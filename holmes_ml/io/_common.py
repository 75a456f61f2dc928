"""Small helpers shared by the readers: opening files, JSON with line numbers, op/dtype names.

Nothing here knows about a particular input format; each reader module owns its own format.
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import logging
import math
import re
import stat
import sys
import zlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

from holmes_ml._text import shown
from holmes_ml.io.schema import OP_TYPES, SchemaError

logger = logging.getLogger(__name__)

#: Bytes per element for the dtype spellings seen in PyTorch traces and Flight Recorder dumps.
DTYPE_BYTES: dict[str, int] = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "uint32": 4, "unsigned int": 4,
    "double": 8, "float64": 8, "long": 8, "long int": 8, "int64": 8, "uint64": 8,
    "long long": 8, "unsigned long": 8, "complexfloat": 8, "complex64": 8,
    "half": 2, "float16": 2, "bfloat16": 2, "c10::half": 2, "c10::bfloat16": 2, "short": 2,
    "int16": 2, "short int": 2, "uint16": 2,
    "char": 1, "signed char": 1, "unsigned char": 1, "byte": 1, "bool": 1, "int8": 1,
    "uint8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "c10::float8_e4m3fn": 1,
    "c10::float8_e5m2": 1, "complexdouble": 16, "complex128": 16,
}

#: Whether the files being read get a progress bar (:func:`showing_progress`).
_PROGRESS: ContextVar[bool] = ContextVar("holmes_io_progress", default=False)
_T = TypeVar("_T")


@contextmanager
def showing_progress(show: bool) -> Iterator[None]:
    """While inside, :func:`each_file` shows a progress bar (or not: ``show``)."""
    token = _PROGRESS.set(show)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


@contextmanager
def stage(text: str, show: bool | None = None) -> Iterator[None]:
    """While inside, a spinner on stderr saying ``text`` (what runs now, when it is long enough
    to leave the user wondering: the check of many files after their progress bar, a job's
    scoring), cleared on the way out; only inside ``showing_progress(True)`` unless ``show``
    says otherwise. Warnings logged meanwhile are printed above it, not into its line."""
    if not (_PROGRESS.get() if show is None else show):
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(text):
        # the root logger's handlers write to the stderr they were given; rich's own (which
        # it has now) prints their lines above the spinner
        moved = [h for h in logging.getLogger().handlers
                 if type(h) is logging.StreamHandler and h.stream is sys.__stderr__]
        for handler in moved:
            handler.setStream(sys.stderr)
        try:
            yield
        finally:
            for handler in moved:
                handler.setStream(sys.__stderr__)


def each_file(paths: Sequence[_T]) -> Iterable[_T]:
    """``paths`` to read one by one: with a progress bar on stderr inside
    ``showing_progress(True)`` when there are several, once reading takes over a second."""
    if not _PROGRESS.get() or len(paths) < 2:
        return paths
    from tqdm.auto import tqdm

    return tqdm(paths, desc="reading", unit="file", leave=False, delay=1.0)


# Spellings of communication operators in PyTorch/NCCL/gloo, reduced to a key by _op_key().
_OP_ALIASES: dict[str, str] = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "allgatherintotensor": "all_gather",
    "allgatherbase": "all_gather",
    "reducescatter": "reduce_scatter",
    "reducescattertensor": "reduce_scatter",
    "reducescatterbase": "reduce_scatter",
    "alltoall": "all_to_all",
    "alltoallv": "all_to_all",
    "alltoallbase": "all_to_all",
    "alltoallsingle": "all_to_all",
    "broadcast": "broadcast",
    "bcast": "broadcast",
    "reduce": "reduce",
    "barrier": "barrier",
    "send": "send",
    "isend": "send",
    "recv": "recv",
    "irecv": "recv",
    "recvanysource": "recv",
    # NCCL implements point-to-point (and all-to-all) with one SendRecv kernel whose direction
    # is not in its name; with no other context we report it as a send (documented in kineto).
    "sendrecv": "send",
    # gather/scatter are not in the canonical op list; they move data like reduce/broadcast
    # (many-to-one / one-to-many rooted trees), which is what the detector cares about.
    "gather": "reduce",
    "scatter": "broadcast",
    # ProcessGroupNCCL's names for a barrier (an all-reduce of one element) and for
    # out-of-place broadcast / reduce
    "allreducebarrier": "barrier",
    "broadcastoop": "broadcast",
    "reduceoop": "reduce",
    # uneven ("v") variants, and gloo's barrier that names the rank that did not arrive
    "allgatherv": "all_gather",
    "reducescatterv": "reduce_scatter",
    "monitoredbarrier": "barrier",
}
_SUFFIXES = ("coalesced", "tensor", "base", "single", "into")


def _op_key(name: str) -> str:
    key = name.strip().lower()
    for prefix in ("nccl:", "gloo:", "c10d::", "nccl::", "mpi:", "ucc:"):
        if key.startswith(prefix):
            key = key[len(prefix):]
    key = re.sub(r"[^a-z0-9]", "", key)
    # Drop implementation suffixes repeatedly ("allgather_into_tensor_coalesced").
    changed = True
    while changed:
        changed = False
        for suffix in _SUFFIXES:
            if key.endswith(suffix) and key[: -len(suffix)] in _OP_ALIASES:
                key = key[: -len(suffix)]
                changed = True
    return key


def canonical_op(name: str) -> str | None:
    """Map an operator spelling (``nccl:_all_gather_base``, ``allreduce``...) to a schema op.

    Returns ``None`` when the name is not a known communication operator.

    Examples
    --------
    >>> canonical_op("nccl:_all_gather_base"), canonical_op("all_to_allv"), canonical_op("Foo")
    ('all_gather', 'all_to_all', None)
    >>> canonical_op("nccl:all_reduce_barrier"), canonical_op("nccl:_broadcast_oop")
    ('barrier', 'broadcast')
    """
    key = _op_key(name)
    if key in _OP_ALIASES:
        return _OP_ALIASES[key]
    if name.strip().lower() in OP_TYPES:
        return name.strip().lower()
    return None


def require_op(name: str, source: str, where: str) -> str:
    """Like :func:`canonical_op` but raise a :class:`SchemaError` naming file and field."""
    op = canonical_op(name)
    if op is None:
        raise SchemaError(
            "unknown communication operator", source=source, column=where, value=name,
            expected="a collective or P2P name such as allreduce, all_gather_into_tensor, "
            "reduce_scatter, alltoall, broadcast, reduce, barrier, send, recv",
        )
    return op


def dtype_bytes(dtype: str | None) -> int | None:
    """Size in bytes of one element of ``dtype`` (``'Float'``, ``'c10::BFloat16'``...)."""
    if not dtype:
        return None
    key = str(dtype).strip().lower()
    if key.startswith("torch."):
        key = key[len("torch."):]
    return DTYPE_BYTES.get(key)


def rank_from_name(path: str | Path) -> int | None:
    """Guess a rank from a file name: ``rank-3``, ``rank3``, ``rank_3``, ``worker3``, ``x_3.json``.

    Examples
    --------
    >>> rank_from_name("trace_rank-12.json.gz"), rank_from_name("worker3_step_12.123.pt.trace.json")
    (12, 3)
    """
    name = Path(path).name
    for pattern in (r"rank[-_]?(\d+)", r"worker[-_]?(\d+)", r"_(\d+)\.(?:json|pkl|pickle|jsonl)"):
        m = re.search(pattern, name, flags=re.IGNORECASE)
        if m:
            return int(m.group(1))
    return None


def regular_file(path: str | Path, expected: str) -> Path:
    """``path`` when it is a regular file (links followed); otherwise a :class:`SchemaError`
    naming it and ``expected``: a FIFO would block a read forever, ``/dev/zero`` never end it,
    and a directory or a loop of symbolic links fails with an error that names neither."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        raise SchemaError("file not found", source=str(p), expected=expected) from None
    except OSError as exc:  # a loop of links, a name too long, a component not a directory
        raise SchemaError(f"cannot open: {exc.strerror}", source=str(p),
                          expected=expected) from None
    if stat.S_ISDIR(mode):
        raise SchemaError("a directory, not a file", source=str(p), expected=expected)
    if not stat.S_ISREG(mode):
        raise SchemaError("not a regular file (a FIFO, socket or device)", source=str(p),
                          expected=expected)
    return p


def open_bytes(path: str | Path) -> bytes:
    """Whole file content, transparently gunzipped when it is gzip-compressed."""
    p = Path(path)
    if not p.exists():
        raise SchemaError("file not found", source=str(p), expected="an existing file or directory")
    raw = p.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise SchemaError(f"corrupt or truncated gzip data: {exc}", source=str(p),
                              expected="a complete gzip file") from exc
    return raw


def head_bytes(path: str | Path, n: int = 1 << 20) -> bytes:
    """First ``n`` bytes of the (decompressed) file, for content sniffing."""
    p = Path(path)
    with p.open("rb") as fh:
        magic = fh.read(2)
    if magic != b"\x1f\x8b":
        with p.open("rb") as fh:
            return fh.read(n)
    try:
        with gzip.open(p, "rb") as fh:
            return fh.read(n)
    except (OSError, EOFError, zlib.error) as exc:
        # A gzip stream that ends (or breaks) within the sniffed head: sniffing nothing would
        # end in "cannot tell the format", which hides the real problem.
        raise SchemaError(f"corrupt or truncated gzip data: {exc}", source=str(p),
                          expected="a complete gzip file") from exc


def content_kind(raw: bytes) -> str | None:
    r"""What content that failed to parse as JSON looks like, or None when it does look like JSON.

    Used to tell "you named the wrong format" apart from "this JSON is broken".

    Examples
    --------
    >>> content_kind(b"PAR1..."), content_kind(b"a,b,c\n1,2,3"), content_kind(b'{"a": ')
    ('Parquet', 'CSV', None)
    """
    if raw[:4] == b"PAR1":
        return "Parquet"
    if raw[:1] == b"\x80":
        return "a pickle"
    if raw[257:262] == b"ustar":
        return "a tar archive"
    if raw[:4] == b"PK\x03\x04":
        return "a zip archive"
    if raw.lstrip()[:1] in (b"{", b"["):
        return None
    if b"\x00" in raw[:1024]:
        return "binary data"
    if raw.split(b"\n", 1)[0].count(b",") >= 2:
        return "CSV"
    return "text that is not JSON"


def decode_text(raw: bytes, path: str | Path) -> str:
    """``raw`` as UTF-8 text (a byte-order mark dropped). Bytes that are not UTF-8 (a kernel or
    process-group name cut mid-character by a profiler) are read as U+FFFD rather than lose the
    file, and a warning names the file, line and first such byte."""
    bom = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        return raw[bom:].decode("utf-8")
    except UnicodeDecodeError as exc:
        at = bom + exc.start
        logger.warning("%s, line %d: bytes that are not UTF-8 (the first 0x%02x at offset %d) "
                       "read as U+FFFD", path, raw.count(b"\n", 0, at) + 1, raw[at], at)
        return raw[bom:].decode("utf-8", errors="replace")


def _refuse_binary(raw: bytes, path: str | Path, kind_expected: str, what: str) -> None:
    """Refuse a file whose first bytes say what it is (Parquet, a pickle, an archive) before
    its bytes are decoded as text, which would warn of each."""
    kind = content_kind(raw)
    if kind in ("Parquet", "a pickle", "a tar archive", "a zip archive"):
        raise SchemaError(f"not {kind_expected}: this looks like {kind}", source=str(path),
                          expected=what)


def load_json(path: str | Path, what: str = "a valid JSON document") -> Any:
    """Parse a JSON document; a syntax error names the file, line and column.

    ``what`` names the expected input in the error when the file is not JSON at all (another
    format was named).
    """
    raw = open_bytes(path)
    _refuse_binary(raw, path, "JSON", what)
    try:
        # (decode_text drops the byte-order mark editors on Windows save JSON with)
        return json.loads(decode_text(raw, path))
    except RecursionError:
        raise SchemaError("JSON nested too deeply", source=str(path),
                          expected="a valid JSON document") from None
    except json.JSONDecodeError as exc:
        kind = content_kind(raw)
        if kind is not None:
            raise SchemaError(f"not JSON: this looks like {kind}", source=str(path),
                              expected=what) from exc
        # at its end, or a string never closed (the parser ran to the end looking for its
        # quote): the rest never came
        if not exc.doc[exc.pos:].strip() or exc.msg.startswith("Unterminated string"):
            raise SchemaError(
                f"cut short: the JSON ends at line {exc.lineno}, column {exc.colno} within a "
                "value (a file still being written, or a copy or download interrupted?)",
                source=str(path), expected="a complete JSON document") from exc
        raise SchemaError(
            f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
            source=str(path), expected="a valid JSON document",
        ) from exc


def _one_document(text: str) -> str | None:
    """What a text whose first line is no JSON object is, when the whole of it is one JSON
    document (pretty-printed over lines), else None."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    if isinstance(doc, dict) and "traceEvents" in doc:
        return "a Kineto (PyTorch profiler) trace; read it with --format kineto or auto"
    if isinstance(doc, dict) and "entries" in doc:
        return "a Flight Recorder dump (as JSON); read it with --format flight-recorder or auto"
    return ("one JSON document spread over lines, not an object per line; another format "
            "(--format auto tells them apart)")


def iter_jsonl(
    path: str | Path, what: str = "one JSON object per line"
) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)`` for each non-empty line of a JSON Lines file.

    ``what`` names the expected input in the error when the file is not JSON at all. A last
    line without its end that is not JSON (yet) is left out with a warning: the normal state
    of a log still being written, which an operator reads while the job runs.
    """
    raw = open_bytes(path)
    _refuse_binary(raw, path, "JSON Lines", what)
    text = decode_text(raw, path)
    first = True
    # the number of the last line when it has no end (io.StringIO splits as it counts)
    unfinished = text.count("\n") + 1 if text and not text.endswith(("\n", "\r")) else 0
    for lineno, line in enumerate(io.StringIO(text), start=1):
        line = line.strip()
        if not line:
            continue
        if lineno == unfinished and not first:
            try:
                json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                logger.warning("%s, line %d: no end of line and not JSON yet (%d characters): "
                               "a line still being written? Left out", path, lineno, len(line))
                return
        try:
            obj = json.loads(line)
        except RecursionError:
            raise SchemaError("JSON nested too deeply", source=str(path), row=lineno - 1,
                              line=lineno, expected="one JSON object per line") from None
        except json.JSONDecodeError as exc:
            kind = content_kind(raw) if first else None
            if first and kind is None:
                kind = _one_document(text)
            if kind is not None:
                raise SchemaError(f"not JSON Lines: this looks like {kind}", source=str(path),
                                  expected=what) from exc
            raise SchemaError(
                f"malformed JSON at column {exc.colno}: {exc.msg}",
                source=str(path), row=lineno - 1, line=lineno, expected="one JSON object per line",
            ) from exc
        first = False
        if not isinstance(obj, dict):
            raise SchemaError(
                "not a JSON object", source=str(path), row=lineno - 1, line=lineno,
                value=kind_name(obj), expected="one JSON object per line",
            )
        yield lineno, obj


#: Largest world size (and so rank + 1) a log may claim: far above any real job, small
#: enough that lists sized by it fit in memory.
MAX_WORLD = 1 << 20

#: Columns a converter adds to each row it makes: the file it came from and the record of
#: that file (a ``traceEvents`` / ``entries`` index, a line number), so that what only the
#: joined table shows (a negative duration, ranks that disagree) is reported there.
#: :func:`holmes_ml.io.readers.read_ops` takes them off before it validates.
SOURCE_FILE = "_source_file"
SOURCE_RECORD = "_source_record"

_MISSING = object()


def kind_name(value: Any) -> str:
    """A JSON value's type as a message names it (``null`` for None)."""
    return "null" if value is None else type(value).__name__


def cut(text: str, limit: int = 40) -> str:
    """``text`` cut to ``limit`` characters for an error message.

    >>> cut("x" * 50)[-5:]
    'xx...'
    """
    return text if len(text) <= limit else text[:limit] + "..."


def check_unicode(text: str, field: str, source: str | None, line: int | None = None) -> str:
    """``text`` when a table can hold it: JSON escapes such as ``\\ud800`` make lone
    surrogates, which (Arrow) string columns refuse with a UnicodeEncodeError; a
    :class:`SchemaError` naming ``field`` (and ``line``) otherwise."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise SchemaError("not valid Unicode text (a lone surrogate)", source=source,
                              parameter=field, value=cut(text), expected="UTF-8 text",
                              row=None if line is None else line - 1, line=line) from None
    return text


def as_int(value: Any, field: str, source: str | None, *, lo: int | None = None,
           hi: int | None = None, default: Any = _MISSING) -> int:
    """``value`` of JSON field ``field`` as an int in ``[lo, hi]``, or a :class:`SchemaError`
    naming the file, the field and the value.

    Integral floats (``3.0``) and decimal strings (``"3"``) are ints; booleans, fractions,
    NaN and numbers beyond int64 are not. ``default`` stands in for a missing (None) value.

    >>> as_int("7", "rank", "t.json"), as_int(2.0, "seq", None)
    (7, 2)
    >>> as_int(1.5, "rank", "t.json")
    Traceback (most recent call last):
    ...
    holmes_ml.io.schema.SchemaError: t.json, rank: not an integer (got 1.5; expected an integer)
    """
    if value is None and default is not _MISSING:
        return default  # type: ignore[no-any-return]
    bounds = "an integer" + (f" >= {lo}" if lo is not None and hi is None else "") + (
        f" in [{lo}, {hi}]" if lo is not None and hi is not None else "")
    out: int | None = None
    if isinstance(value, bool) or value is None:
        out = None
    elif isinstance(value, int):
        out = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        out = int(value)
    elif isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        text = value.strip()
        # int() of thousands of digits is refused by Python itself (and slow before that)
        out = int(text) if len(text.lstrip("-")) <= 19 else (1 << 64)
    if out is not None and not -(1 << 63) <= out < (1 << 63):
        raise SchemaError("out of range", source=source, parameter=field,
                          value=shown(value), expected=bounds + " within 64 bits")
    if out is None:
        raise SchemaError("not an integer", source=source, parameter=field,
                          value="null" if value is None else shown(value), expected=bounds)
    if (lo is not None and out < lo) or (hi is not None and out > hi):
        raise SchemaError("out of range", source=source, parameter=field, value=out,
                          expected=bounds)
    return out


def as_float(value: Any, field: str, source: str | None, *, lo: float | None = None,
             default: Any = _MISSING) -> float:
    """``value`` of JSON field ``field`` as a finite float (``>= lo``), or a
    :class:`SchemaError` naming the file, the field and the value. Numeric strings count;
    booleans do not.

    >>> as_float("2.5", "dur", None)
    2.5
    """
    if value is None and default is not _MISSING:
        return default  # type: ignore[no-any-return]
    expected = "a finite number" + (f" >= {lo}" if lo is not None else "")
    out: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            out = float(value)
        except OverflowError:
            out = None
    elif isinstance(value, str):
        try:
            out = float(value)
        except ValueError:
            out = None
    if out is None or not math.isfinite(out):
        shown = value if isinstance(value, (float, str)) and len(str(value)) <= 40 \
            else kind_name(value)
        raise SchemaError("not a number", source=source, parameter=field, value=shown,
                          expected=expected)
    if lo is not None and out < lo:
        raise SchemaError("out of range", source=source, parameter=field, value=out,
                          expected=expected)
    return out


def as_obj(value: Any, field: str, source: str | None, kind: type = dict,
           default: Any = _MISSING) -> Any:
    """``value`` of JSON field ``field`` when it is a ``kind`` (dict, list or str), else a
    :class:`SchemaError` naming the file, the field and what it was. ``default`` stands in
    for a missing (None) value.

    >>> as_obj([], "args", "t.json")
    Traceback (most recent call last):
    ...
    holmes_ml.io.schema.SchemaError: t.json, args: wrong type (got 'list'; expected a JSON object)
    """
    if value is None and default is not _MISSING:
        return default
    if isinstance(value, kind):
        return value
    names: dict[type, str] = {dict: "a JSON object", list: "a JSON list", str: "a string"}
    expected = names.get(kind, kind.__name__)
    raise SchemaError("wrong type", source=source, parameter=field, value=kind_name(value),
                      expected=expected)


def parse_rank_list(value: Any) -> list[int] | None:
    """Ranks from ``[0, 1]``, ``"[0, 1]"``, ``"0 1"`` or ``"0,1"``; None when absent/unparsable."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        try:
            return [int(v) for v in value]
        except (TypeError, ValueError):
            return None
    nums = re.findall(r"-?\d+", str(value))
    return [int(v) for v in nums] if nums else None


def ranks_str(ranks: Iterable[int] | None) -> str:
    """Canonical ``group_ranks`` spelling: space-separated global ranks."""
    return " ".join(str(int(r)) for r in ranks) if ranks else ""
