"""One entry point for every input: :func:`read_ops` detects the format and validates the result.

Native files are CSV (plain or ``.gz``), Parquet and JSON Lines (plain or ``.gz``) already in
the canonical schema. A directory means "all files inside" (per-rank files, mixed gz/plain);
all files of one call must share a format. A tar archive (``.tar.gz`` ...) reads like the
directory it holds.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from holmes_ml.io._common import head_bytes, iter_jsonl
from holmes_ml.io.schema import REQUIRED_COLUMNS, SchemaError, validate

logger = logging.getLogger(__name__)

#: Formats :func:`read_ops` understands.
FORMATS: tuple[str, ...] = ("native", "kineto", "flight-recorder", "nccl-inspector", "bytedance")
_SKIP_SUFFIXES = (".yaml", ".yml", ".md", ".png", ".jpg", ".svg", ".html")


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
    SchemaError
        When the content matches none of them.

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
    if head[:4] == b"PAR1":
        from holmes_ml.io.bytedance import looks_like_bytedance

        return "bytedance" if looks_like_bytedance(p) else "native"
    if name.endswith((".pkl", ".pickle")) or head[:1] == b"\x80":
        return "flight-recorder"
    text = head.decode("utf-8", errors="replace").lstrip()
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
    if name.endswith((".csv", ".jsonl", ".ndjson")) or text.split("\n", 1)[0].count(",") >= 7:
        return "native"
    raise SchemaError(
        "cannot tell the format of this file", source=str(p),
        expected="one of " + ", ".join(FORMATS) + " (pass format= explicitly)",
    )


def read_native(path: str | Path) -> pd.DataFrame:
    """Read one canonical CSV / Parquet / JSON Lines file (gz allowed) without validating it."""
    p = Path(path)
    name = _strip_gz(p.name.lower())
    head = head_bytes(p, 4)
    try:
        if head[:4] == b"PAR1":
            return pd.read_parquet(p)
        if name.endswith((".jsonl", ".ndjson", ".json")) or head[:1] == b"{":
            rows = [obj for _, obj in iter_jsonl(p)]
            return pd.DataFrame.from_records(rows)
        return pd.read_csv(p, compression="infer" if p.name.endswith(".gz") else None)
    except SchemaError:
        raise
    except (ValueError, OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SchemaError(f"cannot parse file: {exc}", source=str(p),
                          expected="CSV, Parquet or JSON Lines in the CommOps schema") from exc


#: Archive names :func:`read_ops` unpacks (into a temporary directory) before reading.
ARCHIVE_SUFFIXES: tuple[str, ...] = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


def _unpack(archive: Path, into: Path) -> Path:
    """Extract a tar archive with the ``data`` filter (no absolute paths, links out, devices)."""
    import tarfile

    try:
        with tarfile.open(archive) as tf:
            tf.extractall(into, filter="data")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise SchemaError(f"cannot unpack archive: {exc}", source=str(archive),
                          expected="a readable tar archive of trace files") from exc
    return into


def _expand(
    paths: str | Path | Sequence[str | Path], scratch: Callable[[], Path] | None = None
) -> list[Path]:
    if isinstance(paths, (str, Path)):
        paths = [paths]
    out: list[Path] = []
    for item in paths:
        p = Path(item)
        if p.is_file() and p.name.lower().endswith(ARCHIVE_SUFFIXES) and scratch is not None:
            root = _unpack(p, scratch())
            files = sorted(f for f in root.rglob("*") if f.is_file()
                           and not f.name.startswith(".")
                           and not f.name.lower().endswith(_SKIP_SUFFIXES))
            if not files:
                raise SchemaError("empty archive", source=str(p), expected="trace files")
            out.extend(files)
        elif p.is_dir():
            files = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith(".")
                           and not f.name.lower().endswith(_SKIP_SUFFIXES)
                           and not f.name.startswith(("result-", "meta-")))
            if not files:
                raise SchemaError("empty directory", source=str(p), expected="trace files")
            out.extend(files)
        elif p.exists():
            out.append(p)
        else:
            raise SchemaError("file not found", source=str(p), expected="an existing file or dir")
    if not out:
        raise SchemaError("no input given", expected="at least one file or directory")
    return out


def read_ops(
    paths: str | Path | Sequence[str | Path],
    format: str = "auto",
    trust_pickle: bool = False,
) -> pd.DataFrame:
    """Read CommOps logs of any supported format into one validated canonical table.

    Parameters
    ----------
    paths:
        A file, a directory (all files inside: per-rank files), a tar archive of such files
        (``.tar``, ``.tar.gz``, ``.tgz``, ...; unpacked to a temporary directory) or a list of them.
    format:
        ``"auto"`` (detect per file; all must agree) or one of :data:`FORMATS`.
    trust_pickle:
        Allow pickled Flight Recorder dumps. Unpickling runs code from the file: only for
        files you produced yourself.

    Returns
    -------
    pandas.DataFrame
        The canonical table (see :mod:`holmes_ml.io.schema`), with format-specific extra columns.

    Raises
    ------
    SchemaError
        Unknown format, unparsable file, or a table that breaks the schema; the message names
        the file, column, row/value and what was expected.

    Examples
    --------
    >>> ops = read_ops("logs/", format="auto")  # doctest: +SKIP
    """
    with tempfile.TemporaryDirectory(prefix="holmes-read-") as tmp:
        counter = iter(range(1 << 30))
        files = _expand(paths, lambda: Path(tmp) / f"archive-{next(counter)}")
        return _read_files(files, format, trust_pickle)


def _read_files(files: list[Path], format: str, trust_pickle: bool) -> pd.DataFrame:
    if format != "auto" and format not in FORMATS:
        raise SchemaError("unknown format", column="format", value=format,
                          expected="auto or one of " + ", ".join(FORMATS))
    if format == "auto":
        kinds = {f: detect_format(f) for f in files}
        found = sorted(set(kinds.values()))
        if len(found) > 1:
            raise SchemaError(
                "files of different formats in one input", source=str(files[0]),
                value=", ".join(f"{f.name}={k}" for f, k in list(kinds.items())[:6]),
                expected="files of a single format",
            )
        format = found[0]
    logger.info("reading %d file(s) as %s", len(files), format)
    source = str(files[0]) if len(files) == 1 else f"{files[0].parent} ({len(files)} files)"

    if format == "kineto":
        from holmes_ml.io.kineto import read_kineto

        return validate(read_kineto(files), source=source)
    if format == "flight-recorder":
        from holmes_ml.io.flight_recorder import read_flight_recorder

        return validate(read_flight_recorder(files, trust_pickle=trust_pickle), source=source)
    if format == "nccl-inspector":
        from holmes_ml.io.nccl_inspector import read_nccl_inspector

        return validate(read_nccl_inspector(files), source=source)
    if format == "bytedance":
        from holmes_ml.io.bytedance import read_bytedance

        if len(files) != 1:
            # Several what-if traces are several jobs: read them one at a time.
            raise SchemaError("one what-if trace per call", source=source,
                              value=len(files), expected="a single trace-*.parquet")
        return validate(read_bytedance(files[0]), source=source)
    # Native: validate each file so errors name it, then concatenate.
    frames = [validate(read_native(f), source=str(f)) for f in files]
    ops = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    return validate(ops, source=source) if len(frames) > 1 else ops
