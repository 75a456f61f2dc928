"""The node agent: follow local CommOps logs, summarize them, ship summaries through an outbox.

Each poll the agent (1) reads what its ranks' log files gained — in the followed directory and
its subdirectories, hidden ones aside; a CSV or JSON-lines table that is not a CommOps log, or
a JSON file in none of the trace formats (a config), is ignored with a warning — (``*.jsonl``
and ``*.csv`` are
read incrementally, and so are ``*.arrows`` (Arrow IPC streams: the batches written whole
since the last poll); ``*.parquet`` files (once closed) and compressed logs (``*.jsonl.gz``,
``*.csv.gz``: archives of rotated logs) are read whole, a few at a time, again when changed;
traces in the other supported formats — Kineto, Flight Recorder, NCCL Inspector, ByteDance
what-if Parquet — are re-read together through
:func:`holmes_ml.io.read_ops` whenever one of them changes), (2) takes the iterations that are
*complete* (a rank has logged a later iteration, or the agent is flushing), scores them with
``holmes_ml.pipeline.summarize`` over a few earlier iterations of context, and (3) writes the
resulting batch — iteration summaries, abnormal operators, group membership — into a SQLite
outbox *in the same transaction* that advances its per-rank watermark. A sender then posts the
outbox in order, gzip-compressed, retrying with exponential back-off, and forgets a batch only
once the service acknowledged it. A crash of the agent or of the service loses nothing: a
restarted agent reads each log on from a point the outbox kept with the watermarks (one before
which every row was queued and is older than the context later iterations need; a log rotated
while no agent ran is found by its inode there), or, without one, from its start, and skips what
the watermarks say was already queued.

A few rows of a followed log that break the schema (an unknown op, a value of the wrong type, a
torn line) are set aside with a WARNING naming each by its line of the file, and the rows after
them ship. A log file the agent cannot read (a Parquet file without its footer: a running
job's, or one whose writer was killed; a chunk half of whose rows are bad, a missing column) is
logged as an ERROR naming the file and set aside until it changes; the other files keep being
shipped (the other traces read together with a bad one too). A line
still being written (no newline yet) is simply not read yet.

Given ``since_s`` (``holmes agent --since``), the agent leaves out the files last written before
that many seconds before it started (each is read from its start once written again), so an
agent started beside a long-running job does not read every archive kept beside its logs.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import io
import json
import logging
import math
import os
import re
import socket
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from holmes_ml._text import few, span
from holmes_ml.features import stream_context
from holmes_ml.io.readers import ArrowStreamTail, json_lines_frame, read_arrow_stream_tail
from holmes_ml.io.schema import (
    FACTS,
    REQUIRED_COLUMNS,
    SchemaError,
    concat_ops,
    facts_by_part,
    facts_of,
    job_of,
    member_ranks,
    validate,
)
from holmes_ml.serve import check_name, hold_lock, plain_http_hint
from holmes_ml.serve.store import connect_sqlite
from holmes_ml.topology import GPUS_PER_HOST, assumed_host, local_index

logger = logging.getLogger(__name__)

PATTERNS = ("*.jsonl", "*.csv", "*.parquet", "*.arrows")
#: Logs re-read whole when they change (their rows replace those read before).
_REREAD_SUFFIXES = (".parquet",)
#: Suffixes of the logs followed by offset (read on where reading stopped): the others.
_FOLLOWED = tuple(p[1:] for p in PATTERNS if p[1:] not in _REREAD_SUFFIXES)
#: Whole-file formats, read with :func:`holmes_ml.io.read_ops` (format detected per file).
WHOLE_FILE_PATTERNS = ("*.json", "*.json.gz", "*.jsonl.gz", "*.csv.gz", "*.pkl", "*.pickle")
_WHOLE = "<whole-file traces>"
#: The kind of a compressed CommOps log (an archive of a rotated log, ``rank0-20261204.jsonl.gz``):
#: read whole, apart from the other traces, once per version (read with them, every archive was
#: read again each time a log was rotated).
_ARCHIVE = "archive"
_ARCHIVE_SUFFIXES = (".jsonl.gz", ".csv.gz")
#: Kinds of the files re-read whole when they change (their rows replace those read before).
_REREAD_KINDS = (*_REREAD_SUFFIXES, _ARCHIVE)
_ABNORMAL_COLUMNS = ("iteration", "rank", "op", "group", "seq", "nbytes", "start_ns",
                     "duration_us", "score")


@dataclass(frozen=True)
class AgentConfig:
    """Configuration of one node agent.

    Parameters
    ----------
    follow:
        Directory holding this node's per-rank CommOps log files.
    server:
        Base URL of ``holmes serve`` (e.g. ``http://127.0.0.1:8787``).
    job:
        Job name the batches are filed under.
    token:
        Bearer token of the service (``None`` when it runs without one).
    source:
        Name of this agent in the service (default: the host name).
    outbox:
        SQLite outbox file (default ``<follow>/.holmes-agent.db``). It ships one ``job`` as
        one ``source``: started with another of either, the agent is refused
        (:meth:`Outbox.claim`).
    history:
        Earlier iterations given to the feature builder as context (default: as many as the
        default features read, :func:`~holmes_ml.features.stream_context`, so that a
        batch's features are the whole log's).
    poll_s:
        Seconds between polls of the log directory.
    backoff_s, backoff_max_s:
        First and largest wait between retries while the service is unreachable.
    timeout_s:
        HTTP timeout per request.
    once_retry_s:
        With ``run(once=True)``: how long to keep retrying an unreachable service before giving
        up (the batches stay in the outbox for the next run). Following never gives up.
    flush_after_s:
        Following: once no log has grown for this many seconds, each rank's last iteration
        (held back until the rank logs a later one) is shipped as it stands; rows of it logged
        later ship it again, whole (the service replaces it).
    resend_rejected:
        Queue the batches the service refused in earlier runs again before sending (once the
        cause is fixed on the service's side, e.g. a job that held raw records deleted), as
        ``source`` (:meth:`Outbox.requeue_rejected`).
    since_s:
        Read only the files last written in the ``since_s`` seconds before the agent started
        (``None``: every file). An agent started beside a job that has run for days ships its
        recent iterations, not every archive of rotated logs kept beside them (which it would
        otherwise read, summarize and hold until queued). A file left out is read, from its
        start, once it is written again; the logs the outbox kept read points for are read on
        whatever their age.
    """

    follow: Path
    server: str
    job: str
    token: str | None = None
    source: str | None = None
    outbox: Path | None = None
    history: int = stream_context()
    poll_s: float = 2.0
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0
    timeout_s: float = 30.0
    once_retry_s: float = 30.0
    flush_after_s: float = 30.0
    resend_rejected: bool = False
    since_s: float | None = None

    def check(self) -> None:
        """Refuse impossible numbers (raises ``ValueError`` naming the option and the value)."""
        def positive(option: str, value: float) -> None:
            # NaN compares false with everything, so it is caught by the finiteness test
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{option} {value:g}: expected a finite number of seconds > 0")

        from urllib.parse import urlsplit

        # httpx would refuse such a URL at every retry, forever: say it once, now
        url = urlsplit(self.server)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ValueError(f"--server {self.server!r}: expected a URL like "
                             "http://HOST:8787 (the service's 'listening on' address)")
        check_name("--job", self.job)
        if self.token is not None and not self.token.strip():
            raise ValueError(f"--token {self.token!r} (or HOLMES_SERVE_TOKEN): expected a "
                             "non-empty token; leave both unset for a service without one")
        if self.source is not None:
            check_name("--source", self.source)
        positive("--poll", self.poll_s)
        positive("backoff_s", self.backoff_s)
        positive("backoff_max_s", self.backoff_max_s)
        positive("timeout_s", self.timeout_s)
        positive("--flush-after", self.flush_after_s)
        if self.since_s is not None:
            positive("--since", self.since_s)
        if not (math.isfinite(self.once_retry_s) and self.once_retry_s >= 0):
            raise ValueError(f"--retry-for {self.once_retry_s:g}: expected a finite number of "
                             "seconds >= 0")
        if self.history < 0:
            raise ValueError(f"history {self.history}: expected iterations >= 0")

    @property
    def source_name(self) -> str:
        return self.source or socket.gethostname().split(".")[0] or "agent"

    @property
    def outbox_path(self) -> Path:
        return self.outbox or Path(self.follow) / ".holmes-agent.db"


# ----------------------------------------------------------------------------- outbox
class Outbox:
    """Durable queue of batches plus the agent's watermarks (one SQLite file, WAL mode)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._lock = _lock_outbox(self.path)
        try:
            self.db = connect_sqlite(self.path, "a holmes agent outbox", "outbox", "--outbox",
                                     isolation_level=None)
        except BaseException:
            if self._lock is not None:
                self._lock.close()
            raise
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        #: the read points as :meth:`enqueue` last wrote them (None: not read yet)
        self._points: dict[str, str] | None = None
        self.db.executescript(
            """
            CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY, batch_id TEXT NOT NULL,
                body BLOB, state TEXT NOT NULL DEFAULT 'queued', created_at REAL NOT NULL,
                error TEXT);
            CREATE TABLE IF NOT EXISTS watermark (rank INTEGER PRIMARY KEY,
                iteration INTEGER NOT NULL);
            CREATE TABLE IF NOT EXISTS sent_groups (name TEXT PRIMARY KEY);
            CREATE TABLE IF NOT EXISTS sent_ranks (rank INTEGER PRIMARY KEY);
            CREATE TABLE IF NOT EXISTS placed (rank INTEGER PRIMARY KEY, host TEXT NOT NULL,
                gpu INTEGER NOT NULL);
            CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS flushed (rank INTEGER PRIMARY KEY,
                iteration INTEGER NOT NULL, rows INTEGER NOT NULL);
            CREATE TABLE IF NOT EXISTS read_point (path TEXT PRIMARY KEY, point TEXT NOT NULL);
            """
        )

    def close(self) -> None:
        self.db.close()
        if self._lock is not None:
            self._lock.close()  # (releases the lock)

    def claim(self, job: str, source: str) -> None:
        """Tie the outbox to ``job`` and ``source``; refuse (``ValueError``) one that serves
        another job, or ships as another source.

        Its watermarks say what was shipped *to that job*: reused for another one, it would
        ship nothing the other job has not seen — silently. They also say what was queued *as
        that source*, and the service keeps each rank as the source's that sent it first:
        under another ``--source`` the rows past the watermarks would be refused (409), and a
        later run under the right one would skip them — lost. So a source is refused here,
        before anything is queued, as a job is.
        """
        self.db.execute("INSERT OR IGNORE INTO meta VALUES ('job', ?)", (job,))
        owner = self.db.execute("SELECT value FROM meta WHERE key='job'").fetchone()[0]
        if owner != job:
            raise ValueError(
                f"--outbox {self.path}: this outbox ships job {owner!r}, not --job {job!r} "
                f"(its watermarks would skip what job {owner!r} was sent); give job {job!r} "
                "its own --outbox FILE, or delete this one once its batches are sent")
        # An outbox of an earlier version recorded no source: its batches' ids say which
        # (the last one the service took, else the last one queued).
        self.db.execute("INSERT OR IGNORE INTO meta VALUES ('source', ?)",
                        (self._source_of_batches() or source,))
        shipper = self.db.execute("SELECT value FROM meta WHERE key='source'").fetchone()[0]
        if shipper != source:
            raise ValueError(
                f"--outbox {self.path}: this outbox ships job {job!r} as source {shipper!r}, "
                f"not as source {source!r} (--source, HOLMES_AGENT_SOURCE, else the host "
                f"name): the service keeps the ranks it sent as {shipper!r}'s and refuses them "
                f"from another source, and its watermarks would skip what was queued as "
                f"{shipper!r}; run the agent with --source {shipper!r}, or give source "
                f"{source!r} (other ranks) its own --outbox FILE")
        self._relabel("queued", source)  # (refused ones: by --resend-rejected)

    def _source_of_batches(self) -> str | None:
        """The source of the last batch the service acknowledged, else of the last batch
        queued (None: the outbox holds none); read from its id, ``<source>-<seq>``."""
        row = self.db.execute(
            "SELECT batch_id FROM outbox ORDER BY state='acked' DESC, seq DESC LIMIT 1"
        ).fetchone()
        return None if row is None else str(row[0]).rsplit("-", 1)[0]

    def meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def next_seq(self) -> int:
        # Seqs start at the clock (ms) of the first batch, so a fresh outbox keeps growing past
        # what the service saw from an outbox that was deleted.
        row = self.db.execute("SELECT max(seq) FROM outbox").fetchone()
        return max(int(row[0]) + 1 if row[0] is not None else 0, int(time.time() * 1000))

    def watermarks(self) -> dict[int, int]:
        return dict(self.db.execute("SELECT rank, iteration FROM watermark").fetchall())

    def flushed(self) -> dict[int, tuple[int, int]]:
        """Per rank, the last iteration shipped by a flush before it was known complete, with
        how many of its rows were shipped then."""
        return {int(r): (int(i), int(n)) for r, i, n in
                self.db.execute("SELECT rank, iteration, rows FROM flushed")}

    def sent_groups(self) -> set[str]:
        return {r[0] for r in self.db.execute("SELECT name FROM sent_groups")}

    def sent_ranks(self) -> set[int]:
        return {int(r[0]) for r in self.db.execute("SELECT rank FROM sent_ranks")}

    def forget_sent(self, ranks: Sequence[int], groups: Sequence[str] | None) -> None:
        """Send ``ranks``' placement and ``groups`` (None: every communicator) again with the
        next batch: the service says its job does not know them."""
        self.db.executemany("DELETE FROM sent_ranks WHERE rank=?", [(int(r),) for r in ranks])
        if groups is None:
            self.db.execute("DELETE FROM sent_groups")
        else:
            self.db.executemany("DELETE FROM sent_groups WHERE name=?", [(g,) for g in groups])

    def placed(self) -> dict[int, tuple[str, int]]:
        """Per rank, the host and GPU index this outbox sent for it."""
        return {int(r): (str(h), int(g)) for r, h, g in
                self.db.execute("SELECT rank, host, gpu FROM placed")}

    def next_gpus(self) -> dict[str, int]:
        """Per host, the first GPU index not yet given to a rank this outbox sent: a rank
        first seen in a later batch (its log appeared late) takes the next one, not 0 again."""
        return {str(h): int(g) + 1 for h, g in
                self.db.execute("SELECT host, max(gpu) FROM placed GROUP BY host")}

    def read_points(self) -> list[tuple[str, str]]:
        """(path, point) of each followed log as :meth:`enqueue` last kept them."""
        return [(str(p), str(t)) for p, t in
                self.db.execute("SELECT path, point FROM read_point ORDER BY path")]

    def enqueue(self, source: str, batch: dict, marks: dict[int, int], groups: list[str],
                ranks: list[int], flushed: dict[int, tuple[int, int]] | None = None,
                read_points: dict[str, str] | None = None) -> int:
        """Queue ``batch`` and advance the watermarks atomically; returns its seq.

        ``flushed`` replaces the record of iterations shipped before they were known complete
        (ranks not in it keep theirs unless their watermark passed it); ``read_points``, when
        given, replaces the points a restarted agent reads each log on from (path relative to
        the followed directory -> :meth:`_ReadPoint.dumps`), kept with the watermarks they
        were chosen by.
        """
        self.db.execute("BEGIN IMMEDIATE")
        try:
            seq = self.next_seq()
            batch = {**batch, "source": source, "seq": seq, "batch_id": f"{source}-{seq}"}
            body = gzip.compress(json.dumps(batch, separators=(",", ":")).encode(), 6)
            self.db.execute("INSERT INTO outbox (seq, batch_id, body, created_at) "
                            "VALUES (?,?,?,?)", (seq, batch["batch_id"], body, time.time()))
            self.db.executemany("INSERT OR REPLACE INTO watermark VALUES (?,?)",
                                list(marks.items()))
            self.db.executemany("INSERT OR IGNORE INTO sent_groups VALUES (?)",
                                [(g,) for g in groups])
            self.db.executemany("INSERT OR IGNORE INTO sent_ranks VALUES (?)",
                                [(r,) for r in ranks])
            if batch.get("ranks"):
                placed = batch["ranks"]
                self.db.executemany("INSERT OR IGNORE INTO placed VALUES (?,?,?)",
                                    zip(placed["rank"], placed["host"], placed["gpu"],
                                        strict=True))
            self.db.executemany("INSERT OR REPLACE INTO flushed VALUES (?,?,?)",
                                [(r, i, n) for r, (i, n) in (flushed or {}).items()])
            self.db.execute("DELETE FROM flushed WHERE iteration <= (SELECT w.iteration FROM "
                            "watermark w WHERE w.rank = flushed.rank)")
            if read_points is not None:
                # only the points that changed: a long run's archives may hold thousands
                if self._points is None:
                    self._points = dict(self.read_points())
                self.db.executemany("DELETE FROM read_point WHERE path = ?",
                                    [(k,) for k in self._points.keys() - read_points.keys()])
                self.db.executemany("INSERT OR REPLACE INTO read_point VALUES (?,?)",
                                    [(k, v) for k, v in read_points.items()
                                     if self._points.get(k) != v])
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        if read_points is not None:
            self._points = dict(read_points)
        return seq

    def pending(self) -> list[tuple[int, str, bytes]]:
        return self.db.execute(
            "SELECT seq, batch_id, body FROM outbox WHERE state='queued' ORDER BY seq"
        ).fetchall()

    def n_pending(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM outbox WHERE state='queued'")
                   .fetchone()[0])

    def mark(self, seq: int, state: str, error: str | None = None) -> None:
        # The body is dropped once acknowledged: the service has it durably.
        self.db.execute("UPDATE outbox SET state=?, error=?, body=CASE WHEN ?='acked' "
                        "THEN NULL ELSE body END WHERE seq=?", (state, error, state, seq))

    def counts(self) -> dict[str, int]:
        return dict(self.db.execute("SELECT state, count(*) FROM outbox GROUP BY state"))

    def last_rejection(self) -> str | None:
        """The service's answer to the latest batch it refused (None when it refused none)."""
        row = self.db.execute("SELECT error FROM outbox WHERE state='rejected' "
                              "ORDER BY seq DESC LIMIT 1").fetchone()
        return None if row is None else str(row[0])

    def requeue_rejected(self, source: str) -> int:
        """Queue the batches the service refused again (their bodies are kept), as ``source``
        (:meth:`_relabel`); returns how many. They go first, in their order: a seq the service
        has passed is renumbered when it says so, as for any queued batch."""
        self._relabel("rejected", source)
        cur = self.db.execute("UPDATE outbox SET state='queued', error=NULL "
                              "WHERE state='rejected'")
        return int(cur.rowcount)

    def _relabel(self, state: str, source: str) -> int:
        """Give the batches in ``state`` queued as another source than ``source`` (the one
        :meth:`claim` tied the outbox to) that source, and a batch id of it; returns how many.

        An outbox of an earlier version, which did not refuse another ``--source``, may hold
        such batches, queued or refused for that reason (409: the ranks are another
        source's), whose rows the watermarks skip: sent as they were, they would be refused
        (again), and their rows never arrive.
        """
        self.db.execute("BEGIN IMMEDIATE")
        try:
            rows = self.db.execute("SELECT seq, body FROM outbox WHERE state=? AND body IS NOT "
                                   "NULL AND batch_id != ? || '-' || seq",
                                   (state, source)).fetchall()
            for seq, body in rows:
                batch = json.loads(gzip.decompress(body))
                batch["source"], batch["batch_id"] = source, f"{source}-{seq}"
                body = gzip.compress(json.dumps(batch, separators=(",", ":")).encode(), 6)
                self.db.execute("UPDATE outbox SET batch_id=?, body=? WHERE seq=?",
                                (batch["batch_id"], body, seq))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return len(rows)

    def renumber(self, after: int) -> int:
        """Give the queued batches seqs (and batch ids) greater than ``after`` and than every
        seq of the outbox, in their order; returns the first new seq.

        The service refuses a seq not above the last one it took from this source (an outbox
        deleted and begun again, a clock set back): renumbered, the batches are new to it.
        """
        self.db.execute("BEGIN IMMEDIATE")
        try:
            top = self.db.execute("SELECT max(seq) FROM outbox").fetchone()[0]
            first = seq = max(after + 1, int(top) + 1, int(time.time() * 1000))
            rows = self.db.execute("SELECT seq, body FROM outbox WHERE state='queued' "
                                   "ORDER BY seq").fetchall()
            for old, body in rows:
                batch = json.loads(gzip.decompress(body))
                batch["seq"], batch["batch_id"] = seq, f"{batch['source']}-{seq}"
                body = gzip.compress(json.dumps(batch, separators=(",", ":")).encode(), 6)
                self.db.execute("UPDATE outbox SET seq=?, batch_id=?, body=? WHERE seq=?",
                                (seq, batch["batch_id"], body, old))
                seq += 1
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return first


def _lock_outbox(path: str) -> Any:
    """Hold ``<path>.lock`` while the outbox is open (:func:`~holmes_ml.serve.hold_lock`): a
    second agent on the same outbox (two agents following one directory side by side) would
    ship the same ranks twice under one source, racing for its seqs."""
    return hold_lock(path, lambda pid: (
        f"--outbox {path}: in use by another holmes agent (pid {pid}); expected one agent per "
        "outbox (two following one directory would ship its ranks twice): stop that one "
        "first, or give this one its own --outbox and --source"))


# ----------------------------------------------------------------------------- file following
@dataclass(frozen=True)
class _ReadPoint:
    """Where reading a followed log stood once a chunk of it was kept, and what the rows before
    that held: a point a restarted agent can read the log on from, once every row before it
    was queued and is older than the context later iterations need (:meth:`Agent._keep_points`).
    """

    offset: int
    lines: int
    header: tuple[str, ...] | None
    mark: bytes
    arrow: ArrowStreamTail | None
    inode: int | None
    #: the latest iteration, and the ranks, of the rows before the point
    top: int
    ranks: frozenset[int]
    #: an archive read whole (:data:`_ARCHIVE`): (size, mtime) of the file as read (None: a log
    #: followed)
    stamp: tuple[int, int] | None = None

    def dumps(self, kind: str, rotated: bool, history: int) -> str:
        """The point as JSON text (bytes in base64), with the log's format (``kind``),
        whether it is a rotated log followed under a name the logs may not match, and the
        ``history`` it was chosen for."""
        def b64(b: bytes | None) -> str | None:
            return None if b is None else base64.b64encode(b).decode()

        a = self.arrow
        return json.dumps({
            "version": 1, "kind": kind, "rotated": rotated, "history": history,
            "offset": self.offset, "lines": self.lines, "header": self.header,
            "mark": b64(self.mark), "inode": self.inode, "top": self.top,
            "ranks": sorted(self.ranks), "stamp": self.stamp,
            "arrow": None if a is None else {
                "offset": a.offset, "head": b64(a.head), "ended": a.ended, "rows": a.rows,
                "mark": b64(a.mark),
                "dictionaries": [[i, [b64(m) for m in ms]] for i, ms in a.dictionaries]}})

    @staticmethod
    def loads(text: str) -> tuple[_ReadPoint, str, bool, int]:
        """(point, kind, rotated, history) of :meth:`dumps`' text; ``ValueError`` (or
        ``KeyError``, ``TypeError``) for text it did not write."""
        d = json.loads(text)
        if d.get("version") != 1:
            raise ValueError(f"read point of version {d.get('version')!r}")
        a = d["arrow"]
        arrow = None if a is None else ArrowStreamTail(
            offset=int(a["offset"]),
            head=None if a["head"] is None else base64.b64decode(a["head"]),
            dictionaries=tuple((int(i), tuple(base64.b64decode(m) for m in ms))
                               for i, ms in a["dictionaries"]),
            ended=bool(a["ended"]), rows=int(a["rows"]), mark=base64.b64decode(a["mark"]))
        point = _ReadPoint(
            offset=int(d["offset"]), lines=int(d["lines"]),
            header=None if d["header"] is None else tuple(map(str, d["header"])),
            mark=base64.b64decode(d["mark"]), arrow=arrow,
            inode=None if d["inode"] is None else int(d["inode"]), top=int(d["top"]),
            ranks=frozenset(int(r) for r in d["ranks"]),
            stamp=None if d.get("stamp") is None else (int(d["stamp"][0]),
                                                       int(d["stamp"][1])))
        return point, str(d["kind"]), bool(d["rotated"]), int(d["history"])


@dataclass
class _FileState:
    offset: int = 0
    header: list[str] | None = None
    #: what the file(s) looked like when last read: (size, mtime) of one file, or
    #: (path, size, mtime) of each whole-file trace
    stamp: tuple[Any, ...] | None = None
    #: complete lines read so far (to name the line of a malformed record)
    lines: int = 0
    #: (size, mtime) of the file when it could not be read: skipped until that changes
    bad: tuple[Any, ...] | None = None
    #: file line of the first row of the chunk read last (None for Parquet: rows, not lines)
    chunk_line: int | None = None
    #: file lines of that chunk that gave no row (torn, or more fields than the header)
    chunk_skipped: list[int] = field(default_factory=list)
    #: a table that is not a CommOps log (another tool's CSV): never read
    ignored: bool = False
    #: the file's inode when read last: another one under the name is a rotated log
    inode: int | None = None
    #: an Arrow IPC stream (``.arrows``): where its reading stopped (``offset`` is its end)
    arrow: ArrowStreamTail | None = None
    #: row of the file of the chunk's first row (a binary log's rows have no line)
    chunk_row: int = 0
    #: the log's last bytes before ``offset``: other bytes there mean another file was written
    #: under the name (a restarted writer's, which may get the old inode and outgrow it)
    mark: bytes = b""
    #: the suffix of the name the log was found under (``.jsonl``, ``.csv``, ``.arrows``):
    #: its format once rotated to a name that does not say it (``rank0.jsonl.1``)
    kind: str = ""
    #: the latest iteration, and the ranks, of the rows kept so far
    top: int = -1
    ranks: frozenset[int] = frozenset()
    #: points a restarted agent could read on from, oldest first (after the one kept)
    points: tuple[_ReadPoint, ...] = ()
    #: the point the outbox keeps for the log (None: none yet, read it from its start)
    kept: _ReadPoint | None = None

    def point(self) -> _ReadPoint:
        """Where reading stands now, as a point to read on from."""
        return _ReadPoint(self.offset, self.lines,
                          None if self.header is None else tuple(self.header), self.mark,
                          self.arrow, self.inode, self.top, self.ranks,
                          self.stamp if self.kind == _ARCHIVE else None)

    @classmethod
    def at(cls, point: _ReadPoint, kind: str) -> _FileState:
        """A log's state read on from ``point``."""
        return cls(offset=point.offset, lines=point.lines,
                   header=None if point.header is None else list(point.header),
                   mark=point.mark, arrow=point.arrow, inode=point.inode, kind=kind,
                   top=point.top, ranks=point.ranks, kept=point, stamp=point.stamp)


def _written_anew(path: Path, state: _FileState) -> bool:
    """Whether ``path`` no longer holds, before ``state.offset``, the bytes read there."""
    return _holds_what_was_read(path, state) is False


def _holds_what_was_read(path: Path, state: _FileState) -> bool | None:
    """Whether ``path`` holds, before ``state.offset``, the bytes read there (None when that
    cannot be told: nothing kept of them, or ``path`` gone or unreadable)."""
    if not state.mark:
        return None
    try:
        with path.open("rb") as fh:
            fh.seek(state.offset - len(state.mark))
            return fh.read(len(state.mark)) == state.mark
    except OSError:
        return None  # gone, or unreadable: reading it says which


def _read_increment(path: Path, state: _FileState, st: os.stat_result, limit: int = 0
                    ) -> pd.DataFrame | None:
    """New rows of ``path`` (whose status this poll is ``st``) since ``state`` (``None`` when
    nothing new); advances ``state``. At most ``limit`` bytes are read (0: :data:`_MAX_CHUNK`);
    the rest waits for the next read. A file read whole is read again only when it changed
    (its caller passes it over otherwise).

    The caller passes a copy and keeps it only when the rows were accepted, so a chunk that
    fails to parse is read again (from the same offset) once the file changes.
    """
    suffix = state.kind or path.suffix
    if suffix in _REREAD_KINDS:
        state.stamp = (st.st_size, st.st_mtime_ns)
        from holmes_ml.io.readers import read_native, unfinished_parquet

        if suffix == _ARCHIVE:  # (its rows named by row: blank lines are no rows)
            state.chunk_line, state.chunk_row = None, 0
            return read_native(path)

        unfinished = unfinished_parquet(path)  # a running job's log: said as such, tried again
        if unfinished is not None:
            raise unfinished
        return pd.read_parquet(path)  # whole file: the watermark drops what was shipped
    if st.st_size <= state.offset:
        return None
    limit = limit or _MAX_CHUNK
    if suffix == ".arrows":  # a stream: the batches whole since the last read
        # (a stream written anew under the name was told by its mark before: read_new)
        tail = state.arrow if state.arrow is not None else ArrowStreamTail()
        # (a compressed stream holds many more rows per byte than text: bounded alike in rows)
        table, state.arrow = read_arrow_stream_tail(path, tail, limit // _ARROW_DENSITY)
        state.offset, state.mark = state.arrow.offset, state.arrow.mark
        state.chunk_line, state.chunk_row = None, tail.rows
        return None if table is None else table.to_pandas()
    with path.open("rb") as fh:
        fh.seek(state.offset)
        # at most a chunk per poll: a huge file is caught up over a few polls, and a file
        # without line breaks is not read whole again at every poll
        data = fh.read(min(st.st_size - state.offset, limit))
    end = data.rfind(b"\n")
    if end < 0:
        if len(data) == limit:
            raise ValueError(f"line {state.lines + 1}: no line break in {limit / 2**20:g} MiB; "
                             "expected one operator per line")
        return None  # a line still being written
    data = data[: end + 1]
    state.mark = (state.mark + data)[-64:]
    begun = state.offset == 0
    first_line = state.lines + 1
    state.offset += len(data)
    state.lines += data.count(b"\n")
    state.chunk_line = first_line
    state.chunk_skipped = []
    if suffix == ".jsonl":
        fast = json_lines_frame(data, threads=False)  # (beside a training job: one core)
        if fast is not None:
            return fast
        try:
            return pd.read_json(io.BytesIO(data), lines=True, dtype=False)
        except ValueError as exc:
            # lines that are no JSON object are skipped, each named by its line of the file
            records = _json_lines_skipping_torn(path, data, first_line, state.chunk_skipped)
            if records is None:  # every line is one: pandas' own reason stands
                raise ValueError(str(exc)) from exc
            return records
    if begun and state.header is not None:
        # truncated in place, the header it had kept: a writer that starts the file again
        # with a header (the same, or other columns) gives it anew
        names = data.partition(b"\n")[0].decode(errors="replace").strip().split(",")
        if names == state.header or set(REQUIRED_COLUMNS) <= set(names):
            state.header = None
    if state.header is None:
        first, _, data = data.partition(b"\n")
        state.header = first.decode().strip().split(",")
        state.chunk_line = first_line = first_line + 1
        if not data.strip():
            return None
    try:
        with warnings.catch_warnings():
            # more fields than the header on the first line: pandas would take the first ones
            # as an index (shifting every column), or with index_col=False drop the rest
            warnings.simplefilter("error", pd.errors.ParserWarning)
            return pd.read_csv(io.BytesIO(data), names=state.header, header=None,
                               index_col=False)
    except (pd.errors.ParserError, pd.errors.ParserWarning):
        # a line of more fields than the header (two records run together when a writer
        # died mid-line): skipped, named by its line of the file, rather than the whole chunk
        return _csv_skipping_ragged(path, data, state.header, first_line, state.chunk_skipped)


def _blank_lines(path: Path, start: int, end: int, first_line: int) -> list[int]:
    """The file lines of ``path``'s bytes ``start`` to ``end`` (complete lines, the first being
    ``first_line``) that hold no text: the readers skip them, so the rows after them sit that
    many lines further. Read again on the error path only (a bad row to name), as finding them
    in every chunk read would cost a tenth of its parse."""
    try:
        with path.open("rb") as fh:
            fh.seek(start)
            data = fh.read(end - start)
    except OSError:
        return []  # gone since: the rows keep the lines counted without blank ones
    return [n for n, line in enumerate(data.split(b"\n")[:-1], first_line) if not line.strip()]


def _csv_skipping_ragged(path: Path, data: bytes, header: list[str], first_line: int,
                         skipped: list[int]) -> pd.DataFrame:
    """The rows of CSV lines ``data`` without the lines holding more fields than ``header``
    (or no text), each named in a warning and appended to ``skipped``; raises the parser's
    error when there is none such."""
    import csv

    kept = []
    for number, line in enumerate(data.split(b"\n"), first_line):
        if not line.strip():
            continue
        try:
            fields = next(csv.reader([line.decode()]))
        except (UnicodeDecodeError, csv.Error):
            fields = None
        if fields is None or len(fields) > len(header):
            skipped.append(number)
        else:
            kept.append(line)
    if not skipped:
        return pd.read_csv(io.BytesIO(data), names=header, header=None, index_col=False)
    logger.warning("agent: %s: %d line(s) of more fields than the header's %d (or not text) "
                   "skipped (line %s): torn when a writer died?", path, len(skipped),
                   len(header), ", ".join(map(str, skipped[:5]))
                   + (" ..." if len(skipped) > 5 else ""))
    if not kept:
        return pd.DataFrame(columns=header)
    return pd.read_csv(io.BytesIO(b"\n".join(kept) + b"\n"), names=header, header=None,
                       index_col=False)


#: Bytes of a followed log read at most per poll, and of all of them together: each of n logs
#: is read up to the larger of a share of it and :data:`_MIN_CHUNK`, so that an agent catching
#: up on its node's logs (started after its job, or on logs without read points) holds about
#: one chunk's rows at a time beside the training job, not one per log.
_MAX_CHUNK = 64 << 20
_MIN_CHUNK = 4 << 20
#: How many times more rows a byte of an Arrow stream log holds than a byte of JSON lines (the
#: logger's zstd streams: about 20 times, `holmes bench follow`'s ``*_mb``): its chunks are
#: this much smaller, for as many rows.
_ARROW_DENSITY = 16
#: Archives of rotated logs read, then checked together (a check has a fixed cost of its own,
#: which small archives' rows cost many times over one by one), at most: so many files, or
#: about so many rows.
_ARCHIVES_AT_ONCE = 64
_ARCHIVE_ROWS_AT_ONCE = 1 << 18
#: Read points held per log at most (one per chunk kept, until one qualifies): beyond, every
#: other one is dropped.
_MAX_POINTS = 1024


#: Reasons kept per file for rows set aside (the count goes on): what ``--once`` prints.
_KEEP_ASIDE = 20
#: Rows of one chunk of a followed log set aside at most (and fewer than half of it): more, and
#: the chunk is refused whole, the file set aside until it changes (not a log of this schema).
_MAX_SET_ASIDE = 20


@dataclass
class _Read:
    """What one followed log gained at a poll, before its rows are checked and kept."""

    path: Path
    #: the file's state before this read, and the state it gets once the rows are kept
    state: _FileState
    trial: _FileState
    inode: int
    #: (size, mtime) of the file as read: set aside until that changes if it cannot be
    stamp: tuple[int, int]
    df: pd.DataFrame | None

    def file_lines(self) -> np.ndarray | None:
        """The file line of each row read (None: a binary file's, by row), blank lines
        counted: read again from the file, for the error path only."""
        trial = self.trial
        if trial.kind == _ARCHIVE:
            from holmes_ml.io.readers import file_lines

            try:
                lines = file_lines(self.path)
            except (OSError, SchemaError):
                return None  # gone, or changed since: its rows keep their numbers
            return None if lines is None else np.asarray(lines)
        if trial.chunk_line is None or self.df is None:
            return None
        blank = _blank_lines(self.path, self.state.offset, trial.offset, self.state.lines + 1)
        return _file_lines(len(self.df), trial.chunk_line, [*trial.chunk_skipped, *blank])


def _validate_together(reads: Sequence[_Read]) -> list[tuple[pd.DataFrame, dict] | None]:
    """Each read's rows checked against the schema (:func:`~holmes_ml.io.schema.validate`)
    together with the other files' rows of the same columns and types, in one call rather than
    one per file, and the facts (:func:`~holmes_ml.io.schema.facts_of`) they hold. None for a
    read whose rows were not checked so: no rows, none other of its schema, or rows that
    together break it; each of those files is then checked alone, which names its file and
    line and sets its few bad rows aside.

    Rows that pass together pass alone (the check of rows together asks all that it asks of
    each file, and that the files agree with each other) and come out with the values they
    would alone (a categorical column with the categories of all the files).
    """
    out: list[tuple[pd.DataFrame, dict] | None] = [None] * len(reads)
    by_schema: dict[frozenset, list[int]] = {}
    for i, read in enumerate(reads):
        # the chunks of one schema together: a column one of them lacked would be missing
        # values, one of another type would be of a third (object)
        if read.df is not None and not read.df.empty:
            by_schema.setdefault(_schema_of(read.df), []).append(i)
    for members in by_schema.values():
        if len(members) < 2:
            continue
        frames = [reads[i].df for i in members]
        sizes = np.array([len(f) for f in frames if f is not None])
        try:
            ops = validate(concat_ops([f for f in frames if f is not None]),
                           source=_names([reads[i].path for i in members]))
        except Exception:  # noqa: BLE001 - each file alone says which, and why
            continue
        facts = facts_by_part(ops, np.repeat(np.arange(len(members)), sizes), len(members))
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        for k, i in enumerate(members):
            out[i] = (ops.iloc[bounds[k]:bounds[k + 1]].reset_index(drop=True), facts[k])
    return out


def _schema_of(df: pd.DataFrame) -> frozenset:
    """The columns of ``df`` and their types (a categorical one as such, whatever its
    categories: each file's dictionary of a column is its own)."""
    return frozenset((c, "category" if isinstance(t, pd.CategoricalDtype) else str(t))
                     for c, t in df.dtypes.items())


def _file_lines(n: int, first_line: int, skipped: Sequence[int] = ()) -> np.ndarray:
    """The file line of each of ``n`` rows read from a chunk whose first line is
    ``first_line`` and whose lines ``skipped`` gave no row."""
    lines = np.arange(n) + first_line
    for line in sorted(skipped):  # the rows after a line that gave none sit a line further
        lines[lines >= line] += 1
    return lines


def _valid_rows(df: pd.DataFrame, path: Path, first_line: int | None,
                skipped: Sequence[int] = (), first_row: int = 0,
                file_lines: Callable[[], np.ndarray | None] | None = None
                ) -> tuple[pd.DataFrame, list[str], np.ndarray | None]:
    """``df`` validated; why each of its few bad rows (an unknown op, a torn line's missing
    fields, a value of the wrong type) was set aside, naming it by its line of the file; and
    the file line (None for Parquet and Arrow: by row) of each row kept (``first_line``: the file
    line of the chunk's first row, ``skipped`` the chunk's lines that gave no row;
    ``first_line`` None: a binary file, by row, the chunk's first being ``first_row``).
    ``file_lines`` gives the file line of each row exactly (blank lines counted, an archive's
    rows by line), reading the file again: called once, at the first bad row.

    Left in, one bad row would keep the file unread from it on, whatever its writer adds.
    Raises the first error when it is no row's (a missing column) or when more than
    :data:`_MAX_SET_ASIDE` rows, or half a chunk of more than two rows, are bad.
    """
    lines = _file_lines(len(df), first_line if first_line is not None else first_row, skipped)
    by_line = first_line is not None
    aside: list[str] = []
    first: SchemaError | None = None
    while True:
        try:
            out = validate(df, source=str(path))
            break
        except SchemaError as exc:
            if first is None and file_lines is not None:  # (no row dropped yet)
                exact = file_lines()
                if exact is not None and len(exact) == len(lines):
                    lines, by_line = exact, True
            if first is None:
                first = exc if not by_line or exc.row is None or exc.line is not None \
                    or not 0 <= exc.row < len(lines) else exc.at(line=int(lines[exc.row]))
            rows = len(lines) + len(aside)  # of the chunk as read
            # (a chunk of a row or two - a live writer's - may lose them all; a longer one
            # bad in half its rows or more is no log of this schema)
            if (exc.row is None or not 0 <= exc.row < len(df) or len(aside) >= _MAX_SET_ASIDE
                    or rows > 2 and len(aside) >= rows // 2):
                raise first from None
            aside.append(str(SchemaError(
                exc.message, column=exc.column, value=exc.value, expected=exc.expected,
                line=int(lines[exc.row]) if by_line else None,
                row=None if by_line else int(lines[exc.row]))))
            keep = np.ones(len(df), dtype=bool)
            keep[exc.row] = False
            df = df[keep].reset_index(drop=True)
            lines = lines[keep]
    return out, aside, lines if by_line else None


def _json_lines_skipping_torn(path: Path, data: bytes, first_line: int, skipped: list[int]
                              ) -> pd.DataFrame | None:
    """The records of complete JSON lines ``data``, the lines that are no JSON object (a
    record torn when its writer died, then the restarted writer's lines after it) skipped
    with a warning naming each: left in, the file would stay unread from that line on.
    ``None`` when every line is a JSON object."""
    records, torn = [], []
    for number, line in enumerate(data.split(b"\n"), first_line):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:  # malformed, or not UTF-8
            record = None
        if isinstance(record, dict):
            records.append(record)
        else:
            torn.append(number)
    if not torn:
        return None
    skipped += torn
    logger.warning("agent: %s: %d line(s) that are no JSON object skipped (line %s): torn "
                   "when a writer died?", path, len(torn), ", ".join(map(str, torn[:5]))
                   + (" ..." if len(torn) > 5 else ""))
    return pd.DataFrame.from_records(records)


#: Statuses with which holmes serve refuses what a request holds (with its JSON ``detail``
#: and ``field``): sending the same batch again would get the same answer.
_CONTENT_REFUSALS = (400, 409, 413, 415, 422)


def _refusal(r: Any) -> dict | None:
    """The body of answer ``r`` when it is holmes serve refusing the content of the request
    (``detail`` and ``field``), else None: a 404 or 405 (a --server with a path, a proxy in
    the way), or a body that is no answer of the service, says nothing of the batch."""
    if r.status_code not in _CONTENT_REFUSALS:
        return None
    try:
        body = r.json()
    except ValueError:
        return None
    if (isinstance(body, dict) and isinstance(body.get("detail"), str)
            and isinstance(body.get("field"), str)):
        return body
    return None


def _answer_of(r: Any, key: str, value: Any = None) -> bool:
    """Whether the 2xx answer ``r`` is the service's: a JSON object with ``key`` (equal to
    ``value`` unless None). A redirect or a proxy's page is no acknowledgement."""
    if not 200 <= r.status_code < 300:
        return False
    try:
        body = r.json()
    except ValueError:
        return False
    return isinstance(body, dict) and key in body and (value is None or body[key] == value)


def _last_seq(refusal: dict) -> int | None:
    """The service's last seq of this source, as a seq conflict (409, field ``seq``) names
    it ("expected more than N"); None for any other refusal."""
    if refusal.get("field") != "seq":
        return None
    m = re.search(r"expected more than (-?\d+)", refusal["detail"])
    return int(m.group(1)) if m else None


def _names(paths: Sequence[Path], root: Path | None = None) -> str:
    """``paths`` named in a message: the first few (relative to ``root``), and how many
    more."""
    return few((p.relative_to(root) if root else p for p in paths), 3, ", ")


def _culprit(paths: list[Path], exc: BaseException) -> tuple[Path, BaseException] | None:
    """The one of ``paths`` (read together) that cannot be read, with why, given ``exc``
    from reading them together: the first that fails read alone (the file ``exc`` names
    tried first); None when each reads alone (files of two formats: none is to blame)."""
    from holmes_ml.io import read_ops

    named = [p for p in paths if str(p) == getattr(exc, "source", None)]
    for path in named + [p for p in paths if p not in named]:
        try:
            read_ops([str(path)])
        except (SchemaError, ValueError, OSError) as alone:
            return path, alone
    return None


def _describe(exc: BaseException) -> str:
    # A SchemaError (or one of our ValueErrors) reads as a sentence already; a reader's
    # exception (ArrowInvalid, ParserError, ...) needs its name to mean anything.
    if isinstance(exc, SchemaError) or type(exc) is ValueError:
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _default_summarize(model: Any = None) -> Callable[[pd.DataFrame], Any]:
    from holmes_ml import pipeline

    return lambda ops: pipeline.summarize(ops, model=model)


@dataclass
class AgentStats:
    raw_bytes: int = 0
    sent_bytes: int = 0
    batches_sent: int = 0
    batches_queued: int = 0
    ops_read: int = 0
    failures: int = 0
    batches_rejected: int = 0


@dataclass
class Agent:
    """Follows ``config.follow`` and ships summaries to ``config.server``.

    Parameters
    ----------
    config:
        See :class:`AgentConfig`.
    summarize:
        ``ops -> NodeSummary`` (``iterations``, ``abnormal``, ``groups`` tables); default
        :func:`holmes_ml.pipeline.summarize` with ``model``.
    model:
        Detector used by the default ``summarize``.
    say:
        Where the lines an operator wants to see go: what the agent follows and where it
        sends when it starts, its first delivery, and delivery resuming after an outage
        (default: this module's logger at INFO; ``holmes agent`` prints them on stderr).
    """

    config: AgentConfig
    summarize: Callable[[pd.DataFrame], Any] | None = None
    model: Any = None
    stats: AgentStats = field(default_factory=AgentStats)
    say: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        self.config.check()
        self._summarize = self.summarize or _default_summarize(self.model)
        self.outbox = Outbox(self.config.outbox_path)
        try:
            self.outbox.claim(self.config.job, self.config.source_name)
        except ValueError:
            self.outbox.close()
            raise
        self._files: dict[Path, _FileState] = {}
        #: the files found by the last poll's walk of the directory followed
        self._tree = _Tree(None)
        since = self.config.since_s
        #: files last written before this (ns since the epoch) are not read (None: all are)
        self.since_ns = None if since is None else time.time_ns() - int(since * 1e9)
        #: files left out for it: path -> when last written (ns since the epoch)
        self.too_old: dict[Path, int] = {}
        self._old_said = 0  # (how many of them the agent said it left out)
        self._recent: set[Path] = set()  # files found written since then: read from now on
        #: logs rotated to another name (``rank0.jsonl.1``, one the logs may not match),
        #: followed there while they exist: their writer may append to them until it opens
        #: the new file
        self._rotated: set[Path] = set()
        #: each kept point as text, with what it was made of (:meth:`_keep_points`)
        self._point_texts: dict[Path, tuple[_ReadPoint, bool, str, str]] = {}
        #: logs read on from where an earlier run stopped (the outbox's read points)
        self.resumed = self._restore_points()
        #: whether the last poll left rows unread in a log (read up to its limit)
        self.behind = False
        self._buffer: list[pd.DataFrame] = []
        self._ops = pd.DataFrame()
        #: whether rows of followed logs were read (whole-file traces read after may hold
        #: them: a rotated log compressed, see _drop_copies)
        self._followed_held = self._copies_said = False
        self._retry_at = 0.0
        self._backoff = self.config.backoff_s
        self._client: Any = None
        self._topology: dict | None = None
        self._topology_sent: dict | None = None  # sent again if the job loses it
        #: the service's answer when it refused the attached topology
        self.topology_refused: str | None = None
        #: the service's answer when it refused the token (401/403) at the last attempt:
        #: a setting to fix, not bad data, so the batches stay queued
        self.auth_refused: str | None = None
        #: the answer at the last attempt when it was none of holmes serve's to a batch (a
        #: 404 or 405, a proxy's page): --server is wrong, the batches stay queued
        self.misconfigured: str | None = None
        #: batches the service refused before this agent started (kept as 'rejected')
        self.rejected_before = self.outbox.counts().get("rejected", 0)
        self._deadline: float | None = None
        self._empty_said = False
        self._say = self.say or logger.info
        #: whether a batch was delivered, and whether attempts failed since the last one
        self._delivered = False
        self._failing_for = 0  # failed attempts since the last delivery
        self._job_said = False  # (a job column naming another job than --job was told)
        self._hostless_said = False  # (the placement of hostless ranks by rank was told)
        #: files that could not be read, with why (cleared when a file reads again)
        self.bad_files: dict[Path, str] = {}
        #: rows of the followed logs that could not be read (the rest of their files was),
        #: with why, each naming its line of the file (the first :data:`_KEEP_ASIDE` of a file)
        self.rows_set_aside: dict[Path, list[str]] = {}
        #: how many rows of each file were set aside since the agent started, and the latest why
        self.n_set_aside: dict[Path, int] = {}
        self._aside_last: dict[Path, str] = {}
        self._aside_reported = False  # (a report went out: later batches carry one too)
        #: what the rows read so far say of each rank's host and each communicator's members
        #: and kind (:data:`~holmes_ml.io.schema.FACTS`): fact -> key -> (value, file)
        self._facts: dict[str, dict[str, tuple[str, str]]] = {}
        #: whole-file traces as last sniffed: (size, mtime) -> their format (None: in no
        #: known format; "?": it could not be told, a corrupt gzip stream)
        self._sniffed: dict[Path, tuple[tuple[int, int], str | None]] = {}
        #: whole-file traces that could not be read: (size, mtime) then, set aside until
        #: that changes
        self._bad_traces: dict[Path, tuple[int, int]] = {}
        #: Parquet files as last sniffed: (size, mtime) -> a what-if trace (read whole)
        self._whatif: dict[Path, tuple[tuple[int, int], bool]] = {}
        #: why the service could not be reached at the last attempt (None once it answered)
        self.last_error: str | None = None

    def close(self) -> None:
        self.outbox.close()
        if self._client is not None:
            self._client.close()

    # -------------------------------------------------------------- reading
    def read_new(self) -> int:
        """Read what the log files gained; returns the number of new rows.

        Every file's new rows are read first, then checked against the schema together (a
        check has a fixed cost of its own, a few ms, which once per file and poll was most of
        a poll's). When the rows read together break it, each file's are checked alone, so
        that the error names its file and line and the other files' rows are read.
        """
        n = 0
        whatif: list[Path] = []  # what-if traces: read whole, with the other traces
        reads: list[_Read] = []
        root = Path(self.config.follow)
        tree = self._tree = _Tree(root, self._tree)
        paths = [p for pattern in PATTERNS for p in tree.found[pattern]]
        read_whole = tree.whole
        if self.since_ns is not None:
            old = self._too_old([*paths, *read_whole])
            paths = [p for p in paths if p not in old]
            read_whole = [p for p in read_whole if p not in old]
        traces = self._traces(read_whole)
        archives = [p for p in traces if self._is_archive(p)]
        followed = self._follow_rotated(paths)
        limit = max(_MIN_CHUNK, _MAX_CHUNK // max(1, len(followed)))
        for path in followed:
            if path.suffix == ".parquet" and self._is_whatif(path):
                whatif.append(path)
                continue
            read = self._read_file(path, limit)
            if read is not None:
                reads.append(read)
        found = set(archives)
        for gone in [path for path, state in self._files.items()
                     if state.kind == _ARCHIVE and path not in found]:
            del self._files[gone]  # (removed: its point is no longer kept either)
        # a log read on up to its limit has more: read on at once (no pause between polls)
        self.behind = any(r.state.offset < r.trial.offset < r.stamp[0]
                          and (r.state.kind or r.path.suffix) in _FOLLOWED for r in reads)
        for read, checked in zip(reads, _validate_together(reads), strict=True):
            n += self._accept(read, checked)
        archived = 0  # rows of archives and other traces read whole: copies, maybe
        marks: pd.Series | None = None
        group: list[_Read] = []  # archives read, to be checked together
        rows = 0  # (theirs)
        for k, path in enumerate(archives):
            if self._files.setdefault(path, _FileState(kind=_ARCHIVE)).kind == _ARCHIVE:
                # (not: a log followed under that name, rotated to it uncompressed)
                read = self._read_file(path)
                if read is not None:
                    group.append(read)
                    rows += 0 if read.df is None else len(read.df)
            if group and (k == len(archives) - 1 or len(group) == _ARCHIVES_AT_ONCE
                          or rows >= _ARCHIVE_ROWS_AT_ONCE):
                # a few at a time, their rows queued already dropped before the next are
                # read: an agent started on many archives does not hold them all at once
                if marks is None:
                    marks = pd.Series(self.outbox.watermarks(), dtype=np.int64)
                for read, checked in zip(group, _validate_together(group), strict=True):
                    archived += self._accept(read, checked, marks)
                group, rows = [], 0
        n += archived
        whole = self._read_whole_files(
            sorted(set(traces) - set(archives) | set(self._traces(whatif))))
        n += whole
        archived += whole
        self._say_if_empty()
        for gone in [p for p in self.bad_files if not p.exists()]:
            del self.bad_files[gone]  # a bad file removed is no longer a problem to report
        if self._buffer:
            self._followed_held = self._followed_held or n > archived
            self._ops = concat_ops([self._ops, *self._buffer])
            self._buffer.clear()
            if archived:
                n -= self._drop_copies()
        self.stats.ops_read += n
        return n

    def read_all(self) -> int:
        """Read every log to its end, a chunk at a time (:meth:`read_new` while a log is
        behind), queueing the complete iterations between chunks so that what was read is
        trimmed; returns the number of new rows."""
        n = self.read_new()
        while self.behind:
            self.queue_ready()
            n += self.read_new()
        return n

    def _drop_copies(self) -> int:
        """Drop the rows of archives and other whole-file traces that are operators read
        already from the logs followed (the same rank, communicator, sequence number and
        start), or from another archive: a rotated log compressed under a name the traces
        match (``rank0-20261204.jsonl.gz``, logrotate's ``dateext``, ``extension`` and
        ``compress``) holds rows read as they were written, which were otherwise shipped
        twice. Rows older than the context the next batches need (what :meth:`_trim` keeps),
        which were queued already, are dropped too. Returns the number dropped.

        Run when archives or whole-file traces were read (again): rows the logs followed hold
        were read as they were written, before any archive of them.
        """
        ops = self._ops
        archives = [_WHOLE, *(str(p) for p, s in self._files.items() if s.kind == _ARCHIVE)]
        whole = ops["_file"].isin(archives).to_numpy()
        order = np.argsort(whole, kind="stable")  # a followed row first, whichever came first
        seen = ops[["rank", "group", "seq", "start_ns"]].iloc[order].duplicated().to_numpy()
        copy = np.empty(len(ops), dtype=bool)
        copy[order] = seen
        copy &= whole
        n = int(copy.sum())
        marks = self.outbox.watermarks()
        if marks:
            copy |= whole & self._past_context(ops, pd.Series(marks))
        if copy.any():
            self._ops = ops[~copy]
        if n and not self._copies_said:
            self._copies_said = True
            logger.warning("agent: %d operator(s) of the whole-file traces (%s) were read "
                           "already from the logs followed: archives of rotated logs? "
                           "Each is shipped once", n, ", ".join(WHOLE_FILE_PATTERNS))
        return int(copy.sum())

    def _stat(self, path: Path) -> os.stat_result:
        """``path``'s status, taken once a poll for the files the poll's walk found."""
        return self._tree.stat(path)

    def _too_old(self, found: list[Path]) -> set[Path]:
        """The files of ``found`` not to read: last written before :attr:`since_ns` and not
        read (nor given a read point) since the agent started. Said when there are more of
        them than were said before."""
        assert self.since_ns is not None
        listed = set(found)
        for path in [p for p in self.too_old if p not in listed]:
            del self.too_old[path]  # gone
        self._recent &= listed
        for path in found:
            if path in self._recent or path in self._files:
                continue
            try:
                written = self._stat(path).st_mtime_ns
            except OSError:
                continue  # gone since the listing, or unreadable: reading it says which
            if written >= self.since_ns:
                self._recent.add(path)  # (written again since: read from its start)
                self.too_old.pop(path, None)
            else:
                self.too_old[path] = written
        if len(self.too_old) > self._old_said:
            from datetime import datetime, timezone

            at = datetime.fromtimestamp(self.since_ns / 1e9, tz=timezone.utc)
            line = (f"--since {span(self.config.since_s or 0)}: {len(self.too_old)} file(s) "
                    f"last written before {at:%Y-%m-%d %H:%M:%S} UTC not read ("
                    + few(sorted(p.name for p in self.too_old), 3, ", ")
                    + "); each is read from its start if written again")
            (self._say if not self._old_said else logger.info)(line)
        self._old_said = len(self.too_old)
        return set(self.too_old)

    def _follow_rotated(self, paths: list[Path]) -> list[Path]:
        """``paths`` (the logs found) and the rotated logs still to follow; each log rotated
        since the last poll followed on under its new name.

        A log rotated by renaming (logrotate's default) may have gained rows after the last
        poll, and its writer goes on appending to it until it opens the new file: the file
        read until now is found beside its old name (``rank0.jsonl.1``) by its inode and the
        bytes before where reading stopped, and read on from there for as long as it is
        there; the new file under the name is read from its start. A log truncated in place
        (``copytruncate``) was copied first: the copy, found by those bytes, holds the rows it
        gained, and is read on from there. Without this those rows were lost, or (rotated to a
        name the logs match, ``rank0-20261204.jsonl``) the whole file was read again and its
        rows shipped twice.
        """
        found = set(paths)
        listing = _Listing()
        for path, state in list(self._files.items()):
            if state.inode is None or not state.offset or state.kind not in _FOLLOWED:
                continue
            try:
                st = path.stat()
            except FileNotFoundError:
                st = None
            except OSError:
                continue  # unreadable: reading it says why
            if st is not None and st.st_ino == state.inode:
                if st.st_size >= state.offset:
                    continue  # not rotated (written anew in place: _read_file tells)
                copy = next((f for inode, f in listing.files(path.parent).items()
                             if inode != st.st_ino and f not in self._files
                             and _is_copy(f, state)), None)
                if copy is not None:  # (none: _read_file says it was truncated)
                    self._move(path, copy)
                    # a CSV truncated in place goes on without a header: its writer wrote it
                    self._files[path] = _FileState(header=state.header, kind=state.kind)
                    logger.info("agent: %s was copied to %s and truncated in place: read on "
                                "there from where reading stopped, and %s from its start",
                                path, copy.name, path.name)
                continue
            to = listing.files(path.parent).get(state.inode)
            if to is not None and (to in self._files
                                   or _holds_what_was_read(to, state) is False):
                to = None  # followed already, or the inode is another file's now
            was_rotated = path in self._rotated
            if to is not None:
                self._move(path, to)
                logger.info("agent: %s was rotated to %s: read on there from where reading "
                            "stopped%s", path, to.name,
                            f"; the new {path.name} from its start" if st else "")
                continue
            del self._files[path]
            self._rotated.discard(path)
            self.bad_files.pop(path, None)  # (what is under the name now is another file)
            if was_rotated:
                logger.info("agent: %s, a rotated log read on, is gone", path)
            elif st is not None:
                logger.warning(
                    "agent: %s was replaced (rotated?): reading it again from its start; the "
                    "file read until now is not beside it (compressed at once, moved elsewhere "
                    "or removed?), so rows it gained since the last poll, if any, are lost "
                    "unless a compressed copy read whole (a name ending .jsonl.gz or .csv.gz) "
                    "holds them (logrotate's delaycompress keeps a rotated log as it is for a "
                    "cycle)", path)
            else:
                logger.warning("agent: %s is gone (removed, or moved out of %s): rows it "
                               "gained since the last poll, if any, are not read", path,
                               path.parent)
        return paths + sorted(self._rotated - found)

    def _move(self, path: Path, to: Path) -> None:
        """Follow the log read as ``path`` on as ``to`` (a name the logs may not match: it is
        followed while it is there)."""
        state = self._files[to] = self._files.pop(path)
        with contextlib.suppress(OSError):  # (gone since: reading it finds that)
            state.inode = to.stat().st_ino  # (a copy's own)
        self._rotated.discard(path)
        self._rotated.add(to)
        why = self.bad_files.pop(path, None)  # (what is under the name now is another file)
        if why is not None:
            self.bad_files[to] = why

    def _read_file(self, path: Path, limit: int = 0) -> _Read | None:
        """What ``path`` gained since the last poll, not yet checked against the schema (None
        when it is not to be read: not a log, gone, set aside and unchanged, or unreadable,
        which is reported)."""
        state = self._files.setdefault(path, _FileState(kind=path.suffix))
        if state.ignored or (state.offset == 0 and state.header is None
                             and state.kind != _ARCHIVE and self._not_a_log(path, state)):
            return None
        try:
            st = self._stat(path)
        except FileNotFoundError:
            return None  # removed since the glob
        if ((state.kind or path.suffix) in _REREAD_KINDS
                and state.stamp == (st.st_size, st.st_mtime_ns)):
            return None  # read whole already, and unchanged
        if state.offset and (st.st_ino != state.inode or st.st_size < state.offset
                             or _written_anew(path, state)):
            # rotated (another file under the name), truncated (copytruncate) or
            # written anew in place: the offset points into other data; read what is
            # there now from its start
            rotated = st.st_ino != state.inode
            # a CSV truncated in place goes on without a header (its writer wrote it
            # once): its rows keep the columns the header named (a header it has
            # after all is read as one)
            header = None if rotated else state.header
            how = ("replaced (rotated?)" if rotated else "truncated"
                   if st.st_size < state.offset else "written anew (a restarted writer?)")
            logger.warning("agent: %s was %s: reading it again from its start%s", path,
                           how, " with the columns of its header" if header else "")
            state = self._files[path] = _FileState(header=header, kind=state.kind)
        stamp = (st.st_size, st.st_mtime_ns)
        if state.bad == stamp:
            return None  # could not be read and has not changed since
        trial = replace(state, bad=None, chunk_line=None, chunk_skipped=[])
        try:
            df = _read_increment(path, trial, st, limit)
        except Exception as exc:  # noqa: BLE001 - one bad file must not stop the agent
            self._set_bad(path, _describe(exc))
            state.bad = stamp
            return None
        return _Read(path, state, trial, st.st_ino, stamp, df)

    def _accept(self, read: _Read, checked: tuple[pd.DataFrame, dict] | None,
                marks: pd.Series | None = None) -> int:
        """Check ``read``'s rows against the schema (``checked``: its rows as checked together
        with the other files', and the facts they hold) and what earlier rows said; keep
        them, advancing its file's state, or set the file aside naming why. Returns the
        number of rows kept (of an archive, less those the watermarks ``marks`` say no later
        batch needs)."""
        path, state, trial, df = read.path, read.state, read.trial, read.df
        lines: np.ndarray | None = None  # the file line of each row kept
        aside: list[str] = []
        try:
            facts: dict[str, dict[str, str]] = {}
            if checked is not None:
                df, new = checked
                facts = self._new_facts(df, path, new)
            elif df is not None and not df.empty:
                df, aside, lines = _valid_rows(df, path, trial.chunk_line,
                                               trial.chunk_skipped, trial.chunk_row,
                                               read.file_lines)
                facts = self._new_facts(df, path)
        except SchemaError as exc:
            if exc.row is not None and exc.line is None and df is not None:
                # a row of the rows as read (checked together, or none of them set aside):
                # its line read again, blank lines counted
                if not aside or lines is None:
                    lines = read.file_lines()
                if lines is not None and len(lines) == len(df) and 0 <= exc.row < len(df):
                    exc = exc.at(line=int(lines[exc.row]))  # the file's line
            self._set_bad(path, _describe(exc))
            state.bad = read.stamp
            return 0
        except Exception as exc:  # noqa: BLE001 - one bad file must not stop the agent
            self._set_bad(path, _describe(exc))
            state.bad = read.stamp
            return 0
        trial.inode = read.inode
        self._files[path] = state = trial
        self._keep_facts(facts, path)
        self._set_good(path)
        if aside:
            logger.warning("agent: %s: %d row(s) set aside, the rest read: %s", path,
                           len(aside), "; ".join(aside))
        # lines that gave no row (torn: warned of as they were read) count as set aside
        aside = [f"line {n}: " + ("more fields than the header's" if
                                  (state.kind or path.suffix) == ".csv" else "no JSON object")
                 + " (torn when its writer died?)" for n in trial.chunk_skipped] + aside
        if aside:
            kept = self.rows_set_aside.setdefault(path, [])
            kept.extend(aside[:max(0, _KEEP_ASIDE - len(kept))])
            self.n_set_aside[path] = self.n_set_aside.get(path, 0) + len(aside)
            self._aside_last[path] = aside[-1]
        if df is None or df.empty:
            return 0
        if (state.kind or path.suffix) in _REREAD_KINDS:
            # A re-read file's rows replace those read from it before.
            df["_file"] = str(path)
            if len(self._ops) and "_file" in self._ops.columns:
                self._ops = self._ops[self._ops["_file"] != str(path)]
            self.stats.raw_bytes += path.stat().st_size
            if state.kind == _ARCHIVE:
                # a point once all its rows were queued: a restarted agent does not read it again
                state.top = int(df["iteration"].max())
                state.ranks = frozenset(pd.unique(df["rank"]).tolist())
                state.points, state.kept = (state.point(),), None
                if marks is not None and len(marks):
                    df = df[~self._past_context(df, marks)]
        else:
            df["_file"] = str(path)
            # (a file read again from its start: all it holds now is new; ``read.state`` is
            # the state reading began from)
            before = read.state.offset
            self.stats.raw_bytes += state.offset - (before if state.offset >= before else 0)
            state.top = max(state.top, int(df["iteration"].max()))
            state.ranks = state.ranks | frozenset(pd.unique(df["rank"]).tolist())
            state.points = (*state.points, state.point())
            if len(state.points) > _MAX_POINTS:  # (its ranks' watermarks stand still)
                state.points = state.points[::2]  # the earliest kept: the first to qualify
        if len(df):
            self._buffer.append(df)
        return len(df)

    def _read_whole_files(self, paths: list[Path]) -> int:
        """Re-read every non-incremental trace (``paths``: those in a known format, archives
        of CommOps logs aside, and the what-if traces) when any of them changed (ranks of a
        Kineto or Flight Recorder job are matched across files, so they are read together).

        A trace that cannot be read (cut short, malformed) is reported naming it and set aside
        until it changes; the others are read together without it."""
        from holmes_ml.io import read_ops

        root = Path(self.config.follow)
        for gone in [p for p in self._bad_traces if p not in paths]:
            del self._bad_traces[gone]  # removed, or no longer a trace: not set aside
        if not paths:
            self.bad_files.pop(root, None)
            return 0
        stats = {p: p.stat() for p in paths}
        usable = [p for p in paths
                  if self._bad_traces.get(p) != (stats[p].st_size, stats[p].st_mtime_ns)]
        stamp = tuple((str(p), stats[p].st_size, stats[p].st_mtime_ns) for p in usable)
        state = self._files.setdefault(root / _WHOLE, _FileState())
        if stamp in (state.stamp, state.bad):
            return 0
        df = None
        while usable:
            try:
                df = read_ops([str(p) for p in usable])
                facts = self._new_facts(df, _names(usable))
                break
            except (SchemaError, ValueError, OSError) as exc:
                # A trace still being written, or a bad file: say which, read the others
                # without it, try it again when it changes.
                culprit = _culprit(usable, exc)
                if culprit is None:  # each reads alone: together they do not
                    self._set_bad(root, f"its traces {_names(usable, root)} read together: "
                                  f"{_describe(exc)}")
                    state.bad = stamp
                    return 0
                bad, why = culprit
                self._set_bad(bad, _describe(why))
                self._bad_traces[bad] = (stats[bad].st_size, stats[bad].st_mtime_ns)
                usable.remove(bad)
        self._set_good(root, f"the traces in {root} read together again")
        state.stamp = tuple((str(p), stats[p].st_size, stats[p].st_mtime_ns) for p in usable)
        for path in usable:
            self._set_good(path)
        if df is None:
            return 0  # every trace is set aside: what was read of them before stays
        self._keep_facts(facts, _names(usable))
        df = df.assign(_file=_WHOLE)
        if len(self._ops) and "_file" in self._ops.columns:
            self._ops = self._ops[self._ops["_file"] != _WHOLE]
        self.stats.raw_bytes += sum(stats[p].st_size for p in usable)
        self._buffer.append(df)
        return len(df)

    def _is_whatif(self, path: Path) -> bool:
        """Whether the Parquet file ``path`` is a ByteDance what-if trace (one job's ranks in
        one file, each step's compute time beside its operators): read whole with the other
        traces, not as a rank's CommOps log. Its schema is read once per version of the file."""
        from holmes_ml.io.bytedance import looks_like_bytedance

        try:
            st = path.stat()
        except FileNotFoundError:
            return False
        stamp = (st.st_size, st.st_mtime_ns)
        seen = self._whatif.get(path)
        if seen is None or seen[0] != stamp:
            seen = self._whatif[path] = (stamp, looks_like_bytedance(path))
        return seen[1]

    def _is_archive(self, path: Path) -> bool:
        """Whether the trace ``path`` is a compressed CommOps log (``*.jsonl.gz``,
        ``*.csv.gz``: an archive of a rotated log, most often), read apart from the other
        traces; one whose gzip stream is cut short (still being compressed) too, set aside
        alone."""
        seen = self._sniffed.get(path)
        return (seen is not None and seen[1] in ("native", "?")
                and path.name.lower().endswith(_ARCHIVE_SUFFIXES))

    def _traces(self, paths: list[Path]) -> list[Path]:
        """``paths`` less the files whose format cannot be told (another tool's JSON beside
        the traces, such as the config.json of a ``holmes simulate`` directory): skipped with
        a warning, and looked at again when they change (a trace just begun may not show its
        format yet). Empty files are skipped silently."""
        from holmes_ml.io.readers import FORMATS, UnknownFormatError, detect_format

        out = []
        for path in paths:
            try:
                st = self._stat(path)
            except FileNotFoundError:
                continue  # removed since the glob
            stamp = (st.st_size, st.st_mtime_ns)
            if not st.st_size:
                continue
            seen = self._sniffed.get(path)
            if seen is None or seen[0] != stamp:  # a file's head is read once per version
                known: str | None
                try:
                    known = detect_format(path)
                except UnknownFormatError:
                    if seen is None or seen[1]:
                        logger.warning("agent: %s is in none of the trace formats (%s): "
                                       "ignored until it changes%s", path, ", ".join(FORMATS),
                                       "; a job's topology is given with --topology"
                                       if path.name == "topology.json" else "")
                    known = None
                except SchemaError:
                    known = "?"  # a corrupt gzip stream: reading it says so, naming the file
                seen = self._sniffed[path] = (stamp, known)
            if seen[1]:
                out.append(path)
        return out

    def _new_facts(self, df: pd.DataFrame, path: Path | str,
                   new: dict[str, dict[str, str]] | None = None) -> dict[str, dict[str, str]]:
        """The facts of ``df`` (``new``, when known), rows new from ``path``; :class:`SchemaError`
        at the first row that contradicts what rows read before said (a rank on another host,
        a communicator with other members or another kind).

        A poll's rows are validated without those of earlier polls; without this a rank that
        two files (or two runs in one file) put on two hosts would be shipped on the first one.
        """
        new = dict(facts_of(df) if new is None else new)
        job = self._job_of(df, path)
        if job is not None:
            new["job"] = {"": job}
        for fact, values in new.items():
            if fact == "job":
                continue
            seen = self._facts.get(fact, {})
            for key, value in values.items():
                if key in seen and seen[key][0] != value:
                    owner, subject = FACTS[fact]
                    row = int(np.flatnonzero((df[owner].astype(str) == key).to_numpy())[0])
                    raise SchemaError(
                        f"{subject.format(key=key)} is {seen[key][0]!r} in {seen[key][1]}",
                        source=str(path), column=fact, row=row, value=value,
                        expected=f"one value per {owner} (a job restarted on other hosts: "
                        "another --job, and a --follow of its own logs)",
                    )
        return new

    def _job_of(self, df: pd.DataFrame, path: Path | str) -> str | None:
        """The job ``df`` names (validated: one at most), None when it names none;
        :class:`SchemaError` when rows read before named another (the logs of two jobs in
        the followed directory would be shipped as one job's)."""
        found = job_of(df)
        if found is None:
            return None
        row, job = found
        seen = self._facts.get("job", {}).get("")
        if seen is not None and seen[0] != job:
            raise SchemaError(
                f"logs of a second job: {seen[0]!r} in {seen[1]}", source=str(path),
                column="job", row=row, value=job,
                expected="one job per agent (another job: another --job, and a --follow of "
                "its own logs)")
        return job

    def _keep_facts(self, facts: dict[str, dict[str, str]], path: Path | str) -> None:
        job = facts.get("job", {}).get("")
        if job is not None and job != self.config.job and not self._job_said:
            # (shipped anyway: --job is the name the operator gave the job in the service)
            self._job_said = True
            logger.warning("agent: the logs' job column says %r (%s), but they are shipped as "
                           "--job %r: is it the job you meant? (give --job %r to file them "
                           "under the name they carry)", job, path, self.config.job, job)
        for fact, values in facts.items():
            seen = self._facts.setdefault(fact, {})
            for key, value in values.items():
                seen.setdefault(key, (value, str(path)))

    @staticmethod
    def _not_a_log(path: Path, state: _FileState) -> bool:
        # Decided once the first line is complete (a header half written reads as no log);
        # a JSON array at once.
        from holmes_ml.io.readers import looks_like_native_log

        if path.exists() and not path.is_file():
            # a FIFO would block the agent in open() until someone writes to it
            state.ignored = True
            logger.warning("agent: %s is no regular file (a FIFO, socket or device): ignored",
                           path)
            return True
        try:
            with path.open("rb") as fh:
                head = fh.read(1 << 16)
        except OSError:
            return False  # gone, or unreadable: reading it says which
        if head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"["):
            # one JSON array is whole only once written: it cannot be read as it grows
            state.ignored = True
            logger.warning("agent: %s holds one JSON array, which cannot be followed as it "
                           "grows: ignored (write JSON lines, one object per operator per "
                           "line; `holmes localize` reads the array once it is complete)", path)
            return True
        if b"\n" not in head or looks_like_native_log(path):
            return False
        state.ignored = True
        logger.warning("agent: %s is not a CommOps log (its first line names few of the "
                       "columns %s): ignored", path, ", ".join(REQUIRED_COLUMNS))
        return True

    def _say_if_empty(self) -> None:
        # A --follow typo or a job that has not started yet looks the same: say it once.
        if self.n_log_files or self.bad_files or self.too_old:
            self._empty_said = False
            return
        if not self._empty_said:
            logger.warning("agent: %s", self.no_logs_message)
        self._empty_said = True

    @property
    def starting_message(self) -> str:
        """What the agent follows, for which job, as whom and where it sends."""
        queued = self.outbox.n_pending()
        return (f"following {self.config.follow} (and its subdirectories) for job "
                f"{self.config.job!r} as source {self.config.source_name!r} on host "
                f"{socket.gethostname()!r} (that of its ranks whose logs name none, up to "
                f"{GPUS_PER_HOST}); sending to "
                f"{self.config.server} (outbox {self.config.outbox_path}"
                + (f", {queued} batch(es) queued" if queued else "")
                + (f"; {self.resumed} log(s) read on from where its last run stopped"
                   if self.resumed else "") + ")")

    @property
    def n_log_files(self) -> int:
        """Log files found so far (tables that are not CommOps logs not counted)."""
        return sum(not st.ignored for st in self._files.values())

    @property
    def no_logs_message(self) -> str:
        return (f"--follow {self.config.follow}: no CommOps log files (yet) there or in its "
                "subdirectories; expected " + ", ".join(PATTERNS + WHOLE_FILE_PATTERNS))

    def _set_bad(self, path: Path, why: str) -> None:
        # Logged once per problem, not at every poll that finds the file unchanged (or still
        # broken at the same place while it grows). The file is named once, by the caller.
        for sep in (", ", ": "):
            why = why.removeprefix(f"{path}{sep}")
        if self.bad_files.get(path) != why:
            logger.error("agent: cannot read %s (skipped until it changes): %s", path, why)
        self.bad_files[path] = why

    def _set_good(self, path: Path, saying: str | None = None) -> None:
        if self.bad_files.pop(path, None) is not None:
            logger.warning("agent: %s", saying or f"{path} is readable again")

    # -------------------------------------------------------------- summarizing
    def queue_ready(self, flush: bool = False) -> int | None:
        """Summarize complete iterations not yet queued; returns the new batch seq or None.

        An iteration is complete once its rank logged a later one. ``flush`` also ships each
        rank's last iteration, which may still be growing: its watermark is not advanced past
        it; the outbox remembers how many of its rows went out, and the iteration is shipped
        again (the service replaces it) if more rows of it turn up later.
        """
        ops = self._ops
        if ops.empty:
            return None
        marks = self.outbox.watermarks()
        flushed = self.outbox.flushed()
        rank = ops["rank"].to_numpy()
        it = ops["iteration"].to_numpy()
        ranks = np.unique(rank)
        last = pd.Series(it).groupby(rank).max()
        complete = last - 1
        ready = last if flush else complete
        mark = pd.Series({r: marks.get(int(r), -1) for r in ranks}, dtype=np.int64)
        ready_row = ready.reindex(rank).to_numpy()
        mark_row = mark.reindex(rank).to_numpy()
        new = (it > mark_row) & (it <= ready_row)
        if flushed:
            # a flushed iteration that has not grown since is not shipped again
            rows = pd.Series(1, index=pd.MultiIndex.from_arrays([rank, it])).groupby(
                level=[0, 1]).size()
            for r, (i, n) in flushed.items():
                if rows.get((r, i), 0) == n:
                    new &= ~((rank == r) & (it == i))
        if not new.any():
            self._trim(mark)
            return None
        context = (it > mark_row - self.config.history) & (it <= ready_row)
        sub = ops.loc[context].drop(columns=["_file"]).reset_index(drop=True)
        is_new = new[context]
        summary = self._summarize(sub)
        new_pairs = pd.MultiIndex.from_arrays([it[new], rank[new]]).unique()
        batch = self._batch(sub, is_new, summary, new_pairs)
        grew = complete[complete > mark.reindex(complete.index)]
        advanced = {int(r): int(v) for r, v in grew.items()}
        partial: dict[int, tuple[int, int]] = {}
        if flush:
            at_last = it == last.reindex(rank).to_numpy()
            counts = pd.Series(rank[at_last & new]).value_counts()
            partial = {int(r): (int(last[r]), int(n)) for r, n in counts.items()}
        batch_groups = [g["name"] for g in batch.get("groups", [])]
        batch_ranks = batch["ranks"]["rank"] if batch.get("ranks") else []
        seq = self.outbox.enqueue(self.config.source_name, batch, advanced, batch_groups,
                                  batch_ranks, partial, self._keep_points({**marks, **advanced}))
        self.stats.batches_queued += 1
        self._trim(pd.Series({**mark.to_dict(), **advanced}))
        return seq

    def _keep_points(self, marks: dict[int, int]) -> dict[str, str]:
        """The point each followed log is to be read on from by a restarted agent, given the
        watermarks ``marks`` (path relative to the followed directory -> the point as text).

        A point qualifies once every row before it was queued and is no later than the
        context the next iterations need (``history`` iterations before each rank's
        watermark: what :meth:`_trim` drops), so that a restarted agent builds the same
        batches as one that never stopped; the latest such point is kept (points are kept in
        the order read: later ones hold later rows, so those that qualify come first).
        """
        history = self.config.history
        kept: dict[str, str] = {}
        root = Path(self.config.follow)
        texts: dict[Path, tuple[_ReadPoint, bool, str, str]] = {}
        for path, state in self._files.items():
            n = 0
            for point in state.points:
                if not all(point.top <= marks.get(r, -1) - history for r in point.ranks):
                    break
                n += 1
            if n:
                state.kept, state.points = state.points[n - 1], state.points[n:]
            if state.kept is None:
                continue
            rotated = path in self._rotated
            # (a point as text is made once: the archives of a long run may hold thousands)
            text = self._point_texts.get(path)
            if text is None or text[0] is not state.kept or text[1] != rotated:
                if not path.is_relative_to(root):
                    continue
                text = (state.kept, rotated, str(path.relative_to(root)),
                        state.kept.dumps(state.kind, rotated, history))
            texts[path] = text
            kept[text[2]] = text[3]
        self._point_texts = texts
        return kept

    def _restore_points(self) -> int:
        """Read each log on from the point the outbox kept for it (:meth:`_keep_points`);
        returns how many. A log rotated or truncated since is found as a running agent finds
        it (:meth:`_follow_rotated`); one written anew is read from its start. Points kept for
        a shorter ``history`` (too little context), or by another version, are not used."""
        root = Path(self.config.follow)
        for rel, text in self.outbox.read_points():
            try:
                point, kind, rotated, history = _ReadPoint.loads(text)
            except (ValueError, KeyError, TypeError) as exc:
                logger.info("agent: no read point for %s (%s): read from its start", rel, exc)
                continue
            if history < self.config.history:
                continue
            path = root / rel
            self._files[path] = _FileState.at(point, kind)
            if rotated:
                self._rotated.add(path)
        # (an archive whose rows were all queued is not read again while it is unchanged)
        return sum(state.kind != _ARCHIVE for state in self._files.values())

    def _trim(self, mark: pd.Series) -> None:
        # Keep only the rows later batches may still need (history context and unshipped).
        if self._ops.empty or not len(mark):
            return
        self._ops = self._ops[~self._past_context(self._ops, mark)]

    def _past_context(self, df: pd.DataFrame, mark: pd.Series) -> np.ndarray:
        """Which rows of ``df`` no later batch needs, given the watermarks ``mark`` (rank ->
        the last iteration queued): queued already, and older than the ``history`` iterations
        of context before their rank's watermark."""
        keep_from = mark.reindex(df["rank"].to_numpy()).fillna(-1).to_numpy()
        return df["iteration"].to_numpy() <= keep_from - self.config.history

    def _batch(self, sub: pd.DataFrame, is_new: np.ndarray, summary: Any,
               new_pairs: pd.MultiIndex) -> dict:
        iters = summary.iterations
        key = pd.MultiIndex.from_arrays([iters["iteration"], iters["rank"]])
        iters = iters[key.isin(new_pairs)]
        ab = summary.abnormal
        if len(ab):
            akey = pd.MultiIndex.from_arrays([ab["iteration"], ab["rank"]])
            ab = ab[akey.isin(new_pairs)]
        batch: dict[str, Any] = {
            "iterations": {
                "iteration": iters["iteration"].astype(int).tolist(),
                "rank": iters["rank"].astype(int).tolist(),
                "start_ns": iters["start_ns"].astype(int).tolist(),
                "end_ns": iters["end_ns"].astype(int).tolist(),
                "comm_us": iters["comm_us"].astype(float).round(3).tolist(),
                "n_ops": iters["n_ops"].astype(int).tolist(),
            },
            "abnormal": {c: _plain(ab[c]) for c in _ABNORMAL_COLUMNS} if len(ab) else None,
        }
        if "compute_us" in iters.columns and iters["compute_us"].notna().any():
            # (JSON has no NaN: a rank whose logs carry no compute time sends null)
            batch["iterations"]["compute_us"] = [
                None if np.isnan(v) else v
                for v in iters["compute_us"].astype(float).round(3).tolist()]
        if batch["abnormal"] is not None:
            for c in ("peer", "host", "group_kind", "excess_us"):
                if c in ab.columns:
                    batch["abnormal"][c] = _plain(ab[c])
        if batch["abnormal"] is not None:
            batch["abnormal"]["score"] = [min(1.0, max(0.0, s)) for s in
                                          batch["abnormal"]["score"]]
        report = self.set_aside_report()
        if report is not None:
            batch["set_aside"] = report
        sent_groups = self.outbox.sent_groups()
        groups = summary.groups
        if len(groups):
            groups = groups[~groups["group"].astype(str).isin(sent_groups)]
            batch["groups"] = [
                {"name": str(g), "kind": str(k) or "other", "ranks": list(members)}
                for g, k, members in zip(groups["group"], groups["group_kind"],
                                         map(member_ranks, groups["group_ranks"]), strict=True)
                if members
            ]
        sent_ranks = self.outbox.sent_ranks()
        seen = sorted(set(map(int, sub["rank"].unique())) - sent_ranks)
        if seen:
            if "host" in sub.columns:
                hosts = sub.groupby("rank")["host"].first().astype(str)
            else:
                hosts = pd.Series(dtype=str)
            # a rank sent again (the service lost it) keeps the place it was given; a new
            # one takes the GPU its launcher block gives, else its host's next GPU index
            placed = self.outbox.placed()
            first = self.outbox.next_gpus()
            taken = set(placed.values())
            by_rank = self._hostless_by_rank(
                [r for r in seen if r not in placed and not hosts.get(r, "")])
            # the GPU of a rank whose log names its host: by the launcher's blocks, as
            # `holmes localize` numbers them, so a rank that has not logged (yet) does not move
            # the others of its host onto its GPU
            known = {r: h for r, (h, _) in placed.items()}
            known.update({r: hosts[r] for r in seen if r not in placed and hosts.get(r, "")})
            ordered = sorted(known)
            local = dict(zip(ordered, map(int, local_index(pd.DataFrame(
                {"rank": ordered, "host": [known[r] for r in ordered]}), GPUS_PER_HOST,
                seen_first=True)), strict=True)) if ordered else {}
            host: list[str] = []
            gpu: list[int] = []
            for r in seen:
                if r in placed:
                    h, g = placed[r]
                else:
                    # logs without a host: where --topology puts the rank (the service
                    # refuses a batch contradicting it), else, of more ranks than one host
                    # holds, where `holmes localize` puts them, else this machine
                    h = hosts.get(r, "") or self._topology_host(r) or ""
                    g = local.get(r, -1) if hosts.get(r, "") else -1
                    if not h and by_rank:
                        h, g = assumed_host(r)
                    h = h or socket.gethostname()
                    if g < 0 or (h, g) in taken:
                        g = first.get(h, 0)
                    first[h] = max(first.get(h, 0), g + 1)
                taken.add((h, g))
                host.append(h)
                gpu.append(g)
            batch["ranks"] = {"rank": seen, "host": host, "gpu": gpu}
            for c in ("dp", "pp", "tp", "cp", "ep"):
                if c in sub.columns:
                    v = sub.groupby("rank")[c].first().reindex(seen).fillna(-1)
                    batch["ranks"][c] = v.astype(np.int64).tolist()
        return batch

    def set_aside_report(self) -> dict | None:
        """What this agent could not read of its logs, for the service
        (:class:`~holmes_ml.serve.schemas.SetAside`): rows set aside since it started, by file,
        and the files it refuses whole now; None while there was never anything to report."""
        if not (self.n_set_aside or self.bad_files or self._aside_reported):
            return None
        root = Path(self.config.follow)

        def name(path: Path) -> str:
            try:
                return _clip(str(path.relative_to(root)) if path != root else str(root))
            except ValueError:
                return _clip(str(path))

        files = sorted(self.n_set_aside.items(), key=lambda kv: -kv[1])[:_REPORTED_FILES]
        self._aside_reported = True
        return {
            "rows": sum(self.n_set_aside.values()),
            "files": [{"file": name(p), "rows": n, "why": _clip(self._aside_last[p])}
                      for p, n in files],
            "refused": [{"file": name(p), "why": _clip(why)}
                        for p, why in list(self.bad_files.items())[:_REPORTED_FILES]],
        }

    def _hostless_by_rank(self, new: list[int]) -> bool:
        """Whether ranks whose logs name no host (``new``: those of the batch not yet placed)
        are placed by rank, as ``holmes localize`` places them (rank r on host-{r // 8}), rather
        than on this machine: when the logs read name no host for more ranks than one host
        holds (a shared directory of a whole job, a what-if trace), they are not all this
        machine's. Decided once for the outbox, so placements stay stable across batches and
        restarts (the service refuses a rank moved to another host)."""
        new = sorted(set(new) - set(self._topology_ranks()))
        if not new:
            return self.outbox.meta("hostless") == "by-rank"
        ops = self._ops
        if "host" in ops.columns:
            ops = ops[ops["host"].isna() | (ops["host"].astype(str) == "")]
        hostless = (set(map(int, ops["rank"].unique())) | set(new)) - set(self._topology_ranks())
        if self.outbox.meta("hostless") != "by-rank":
            if len(hostless) <= GPUS_PER_HOST:
                return False
            self.outbox.set_meta("hostless", "by-rank")
        if self._hostless_said:
            return True
        self._hostless_said = True
        logger.warning(
            "agent: the logs under %s name no host for %d ranks, more than one host holds "
            "(%d GPUs): they are not all this machine's (%s), so rank r is placed on "
            "host-{r // %d} (GPU r %% %d), as `holmes localize` places them; give their real "
            "placement with --topology FILE (a topology.json as `holmes simulate` writes it) "
            "or a host column in the logs", self.config.follow, len(hostless), GPUS_PER_HOST,
            socket.gethostname(), GPUS_PER_HOST, GPUS_PER_HOST)
        return True

    def _topology_ranks(self) -> list[int]:
        """The ranks the attached topology places (none without one)."""
        topology = self._topology or self._topology_sent
        cols = (topology or {}).get("ranks") or {}
        return [int(r) for r in cols.get("rank") or ()]

    def _topology_host(self, rank: int) -> str | None:
        """The host the attached topology places ``rank`` on (None: no topology, or not
        placed by it)."""
        topology = self._topology or self._topology_sent
        cols = (topology or {}).get("ranks") or {}
        for r, h in zip(cols.get("rank") or (), cols.get("host") or (), strict=False):
            if int(r) == rank:
                return str(h)
        return None

    # -------------------------------------------------------------- sending
    def _http(self) -> Any:
        if self._client is None:
            import httpx

            headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
            if self.config.token:
                headers["Authorization"] = f"Bearer {self.config.token}"
            self._client = httpx.Client(base_url=self.config.server.rstrip("/"),
                                        headers=headers, timeout=self.config.timeout_s)
        return self._client

    def send_pending(self) -> int:
        """Post queued batches in order; returns how many the service acknowledged.

        Stops at the first transport error, 5xx, refused token (401/403: the token is wrong or
        was rotated, which the next attempt may not repeat), 408 or 429, or answer that is
        not holmes serve's to a batch (a 404 or 405, a page of a proxy, a 2xx that does not
        acknowledge it: ``--server`` is wrong), and waits (exponential back-off) before the
        next attempt, the batch still queued. Only the service refusing what the batch holds
        (400, 409, 413, 415 or 422 with its JSON ``detail``) marks the batch ``rejected`` and
        moves on; a seq conflict (409 naming the service's last seq of this source) gives the
        queued batches seqs after it instead.
        """
        if time.monotonic() < self._retry_at:
            return 0
        import httpx

        if self._topology is not None and not self._send_topology():
            return 0
        acked = 0
        url = f"/v1/jobs/{self.config.job}/batches"
        renumbered: set[int] = set()
        queue = self.outbox.pending()
        while queue:
            seq, batch_id, body = queue.pop(0)
            try:
                r = self._http().post(url, content=body, timeout=self._timeout())
            except httpx.HTTPError as exc:
                self._fail(f"{type(exc).__name__}: {exc}")
                break
            if self._retry_later(r):
                break
            if r.status_code >= 300 or not _answer_of(r, "batch_id", batch_id):
                refusal = _refusal(r)
                if refusal is None:
                    self._misconfigured(r, f"batch {batch_id}")
                    break
                last = _last_seq(refusal)
                if last is not None and last >= seq and seq not in renumbered:
                    first = self.outbox.renumber(last)
                    logger.warning("the service took seqs up to %d from source %r already "
                                   "(an outbox begun again?): the %d queued batch(es) from %s "
                                   "on are sent again as seq %d on", last,
                                   self.config.source_name, len(queue) + 1, batch_id, first)
                    renumbered.add(first)
                    queue = self.outbox.pending()
                    continue
                logger.error("batch %s refused by the service (HTTP %s): %s", batch_id,
                             r.status_code, refusal["detail"][:500])
                self.outbox.mark(seq, "rejected", r.text[:2000])
                self.stats.batches_rejected += 1
                continue
            self.outbox.mark(seq, "acked")
            if not self._delivered or self._failing_for:
                self._say_delivered(len(queue))
            self._resend_facts(r)
            self.last_error = None
            self.stats.sent_bytes += len(body)
            self.stats.batches_sent += 1
            acked += 1
            self._backoff = self.config.backoff_s
        return acked

    def _say_delivered(self, queued: int) -> None:
        """Say the first delivery, and delivery resuming after failed attempts (once each,
        not at every batch)."""
        more = f"; {queued} more queued" if queued else ""
        if not self._delivered:
            # (said by every run: worded so a restarted agent's does not read as a new job)
            self._say(f"delivering to {self.config.server}: this agent's first batch since "
                      f"it started (job {self.config.job!r}) was acknowledged{more}")
        else:
            self._say(f"delivering to {self.config.server} again: the service answered "
                      f"after {self._failing_for} failed attempt(s){more}")
        self._delivered = True
        self._failing_for = 0

    def _resend_facts(self, r: Any) -> None:
        """Queue the ranks' placement and the communicators again (and PUT the topology again)
        when acknowledgement ``r`` says the job lacks them: it was deleted under the agent, or
        the batch that carried them was refused."""
        try:
            ack = r.json()
            ranks = [int(x) for x in ack.get("unknown_ranks") or ()]
            groups = [str(x) for x in ack.get("unknown_groups") or ()]
        except (ValueError, TypeError, AttributeError):
            return  # an older service: it does not say
        if not ranks and not groups:
            return
        logger.warning("job %r of the service does not know %d of this agent's ranks and %d "
                       "of its communicators (deleted and begun again?): sending them again "
                       "with the next batch", self.config.job, len(ranks), len(groups))
        self.outbox.forget_sent(ranks, None if ranks else groups)
        if ranks and self._topology_sent is not None:
            self._topology = self._topology_sent

    def _timeout(self) -> float:
        # Under a --once deadline a request to a black-holed service must not outlast it.
        if self._deadline is None:
            return self.config.timeout_s
        return max(0.5, min(self.config.timeout_s, self._deadline - time.monotonic()))

    def _send_topology(self) -> bool:
        """PUT the attached topology; False when the service is unreachable (retry later)."""
        import httpx

        body = gzip.compress(json.dumps(self._topology).encode())
        try:
            r = self._http().put(f"/v1/jobs/{self.config.job}/topology", content=body,
                                 timeout=self._timeout())
        except httpx.HTTPError as exc:
            self._fail(f"{type(exc).__name__}: {exc}")
            return False
        if self._retry_later(r):
            return False
        if not _answer_of(r, "job") and _refusal(r) is None:
            self._misconfigured(r, "the topology")
            return False
        if r.status_code >= 300:
            # Sending it again would get the same answer: say so and go on with the batches.
            logger.error("topology refused by the service (HTTP %s): %s", r.status_code,
                         r.text[:500])
            self.topology_refused = r.text[:500]
        else:
            if self._topology_sent is None:  # (sent again after a job was deleted: quietly)
                ranks = (self._topology or {}).get("ranks") or {}
                hosts = ranks.get("host") or []
                self._say(f"topology of job {self.config.job!r} accepted by the service: "
                          f"{len(ranks.get('rank') or [])} rank(s) on {len(set(hosts))} "
                          "host(s)")
            self._topology_sent = self._topology
        self._topology = None
        self.last_error = None
        return True

    def _misconfigured(self, r: Any, what: str) -> None:
        """Record answer ``r`` to ``what``, none of holmes serve's (``--server`` is wrong, or
        a proxy answers for the service), and wait before the next attempt: what was sent
        stays queued."""
        kind = r.headers.get("content-type", "no content type").split(";")[0]
        self.misconfigured = f"HTTP {r.status_code}, {kind}: {r.text[:200]!r}"
        logger.error("%s got an answer that is not holmes serve's from --server %s (%s): "
                     "expected the service's 'listening on' URL (no path); batches stay "
                     "queued", what, self.config.server, self.misconfigured)
        self._fail(self.misconfigured, "answered as no holmes serve")

    def _retry_later(self, r: Any) -> bool:
        """Whether answer ``r`` says to try again later (a failure is then recorded)."""
        status = r.status_code
        self.auth_refused = None
        self.misconfigured = None
        if status in (401, 403):
            self.auth_refused = f"HTTP {status}: {r.text[:300]}"
            # one line per attempt (an ERROR, then a WARNING saying the same, before)
            logger.error("service %s refused the token (%s): check --token / "
                         "HOLMES_SERVE_TOKEN; batches stay queued; retrying in %.1fs",
                         self.config.server, self.auth_refused, self._backoff)
            self._fail(self.auth_refused, "refused the token", say=False)
            return True
        if status >= 500 or status in (408, 429):
            self._fail(f"HTTP {status}", "busy or failing")
            return True
        return False

    def _fail(self, why: str, state: str = "unreachable", say: bool = True) -> None:
        """Record a failed request (``state``: what the service is, as the log says, unless
        the caller said it: ``say`` false) and wait longer before the next."""
        hint = plain_http_hint(self.config.server, why)
        why += f"; {hint}" if hint else ""
        self.last_error = why
        self.stats.failures += 1
        self._failing_for += 1
        if say:
            logger.warning("service %s %s (%s); retrying in %.1fs", self.config.server, state,
                           why, self._backoff)
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.config.backoff_max_s)

    def attach_topology(self, topology: dict) -> None:
        """Send ``topology`` (``Topology.to_dict()``) before the next batches, retrying like
        them while the service is unreachable (it is not kept in the outbox: the agent is given
        it again when restarted)."""
        self._topology = topology
        self.topology_refused = None

    @property
    def topology_pending(self) -> bool:
        return self._topology is not None

    def put_topology(self, topology: dict) -> None:
        """Attach a topology (``Topology.to_dict()``) to the job now (raises on failure)."""
        body = gzip.compress(json.dumps(topology).encode())
        r = self._http().put(f"/v1/jobs/{self.config.job}/topology", content=body)
        r.raise_for_status()

    # -------------------------------------------------------------- loop
    def step(self, flush: bool = False) -> None:
        """One poll: read, queue complete iterations, send."""
        self.read_new()
        self.queue_ready(flush=flush)
        self.send_pending()

    def run(self, once: bool = False, stop: Callable[[], bool] | None = None) -> None:
        """Poll until ``stop()`` is true (or once, flushing and sending everything).

        Following, each rank's last iteration is shipped once the logs have been idle for
        ``config.flush_after_s``; when ``stop()`` turns true (the CLI's SIGTERM or SIGINT) what
        was read is flushed to the outbox and sent once more before returning.
        """
        self._say(self.starting_message)
        if self.rejected_before and self.config.resend_rejected:
            last = (self.outbox.last_rejection() or "")[:300]
            n = self.outbox.requeue_rejected(self.config.source_name)
            self._say(f"sending again {n} batch(es) the service refused in earlier runs "
                      f"(the last refusal: {last})")
        elif self.rejected_before:
            logger.warning("the outbox %s holds %d batch(es) the service refused in earlier "
                           "runs, not sent again (the last: %s); fix the cause on the "
                           "service's side and run the agent with --resend-rejected to send "
                           "them", self.config.outbox_path, self.rejected_before,
                           (self.outbox.last_rejection() or "")[:300])
        if once:
            self._empty_said = True  # no logs at all: the caller of a one-shot run says so
            self.read_all()
            self.queue_ready(flush=True)
            # Bounded: "ship everything now and exit" must exit even when the service is down;
            # what was not sent stays in the outbox for the next run.
            self._deadline = time.monotonic() + self.config.once_retry_s
            try:
                self.send_pending()
                while self.outbox.n_pending() or self._topology is not None:
                    if (self._retry_at > self._deadline or self.auth_refused
                            or self.misconfigured):
                        break  # (a token or URL refused now is refused again in this run)
                    _sleep(self._retry_at - time.monotonic(), stop)
                    if self.send_pending() == 0 and stop is not None and stop():
                        break
            finally:
                self._deadline = None
            return
        grew_at = time.monotonic()
        while not (stop is not None and stop()):
            if self.read_new():
                grew_at = time.monotonic()
            idle = time.monotonic() - grew_at >= self.config.flush_after_s
            self.queue_ready(flush=idle)
            self.send_pending()
            if not self.behind:  # (catching up: the next chunk at once)
                _sleep(self.config.poll_s, stop)
        self.flush_and_send()

    def flush_and_send(self) -> None:
        """Read what the logs gained, queue it all (each rank's last iteration too) and try
        once to send the outbox, within ``timeout_s`` and at most 5 s: what a stopping agent
        does. What is not sent stays in the outbox for the next run."""
        self.read_new()
        self.queue_ready(flush=True)
        self._retry_at = 0.0  # a back-off in progress must not skip the last attempt
        self._deadline = time.monotonic() + min(self.config.timeout_s, 5.0)
        try:
            self.send_pending()
        finally:
            self._deadline = None


def _sleep(seconds: float, stop: Callable[[], bool] | None) -> None:
    """Sleep ``seconds``, in short naps when ``stop`` is given, returning once it is true."""
    if stop is None:
        time.sleep(max(0.0, seconds))
        return
    until = time.monotonic() + seconds
    while not stop() and (left := until - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))



def _is_copy(path: Path, state: _FileState) -> bool:
    """Whether ``path`` is a copy of the log read as ``state``, made before that was truncated
    in place: it holds the bytes read, where they were read."""
    try:
        return (path.stat().st_size >= state.offset
                and _holds_what_was_read(path, state) is True)
    except OSError:
        return False  # gone since, or unreadable


class _Listing:
    """The regular files of directories, each directory listed once (at most once a poll:
    thousands of logs replaced at once, a restarted job's, are each looked for in one pass)."""

    def __init__(self) -> None:
        self._files: dict[Path, dict[int, Path]] = {}

    def files(self, directory: Path) -> dict[int, Path]:
        """The regular files in ``directory``, by inode."""
        if directory not in self._files:
            found: dict[int, Path] = {}
            try:
                with os.scandir(directory) as entries:
                    for entry in entries:
                        try:
                            if entry.is_file(follow_symlinks=False):
                                found[entry.inode()] = Path(entry.path)
                        except OSError:
                            continue  # gone since, or unreadable
            except OSError:
                pass  # gone, or unreadable: nothing there to find
            self._files[directory] = found
        return self._files[directory]


#: Each pattern of the logs and traces with the end of the names it matches (each is "*END").
_SUFFIXES = tuple((p, p[1:]) for p in (*PATTERNS, *WHOLE_FILE_PATTERNS))
assert all(p == "*" + end for p, end in _SUFFIXES)


class _Tree:
    """The files under a followed directory (subdirectories included, hidden ones not) that
    the logs' and traces' patterns match, found in one walk a poll (not one per pattern), each
    file's status taken at most once in it."""

    def __init__(self, root: Path | None, before: _Tree | None = None) -> None:
        #: each pattern's files (of PATTERNS and WHOLE_FILE_PATTERNS), each list sorted
        self.found: dict[str, list[Path]] = {p: [] for p in (*PATTERNS, *WHOLE_FILE_PATTERNS)}
        self._entries: dict[Path, os.DirEntry] = {}
        #: the path of each file found, by its name: those ``before`` found are reused (made
        #: once, a path keeps its hash: a poll over thousands of archives looks each up a few
        #: times)
        self.paths: dict[str, Path] = {}
        known = before.paths if before is not None else {}
        found: dict[str, list[tuple[list[str], Path]]] = {p: [] for p in self.found}
        todo = [] if root is None else [root]
        while todo:
            try:
                listing = os.scandir(todo.pop())
            except OSError:
                continue  # gone, or unreadable: nothing there to follow
            with listing:
                for entry in listing:
                    if entry.name.startswith("."):
                        continue
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            todo.append(Path(entry.path))
                            continue
                    except OSError:
                        continue
                    for pattern, suffix in _SUFFIXES:
                        if entry.name.endswith(suffix):
                            path = self.paths[entry.path] = (known.get(entry.path)
                                                             or Path(entry.path))
                            found[pattern].append((entry.path.split(os.sep), path))
                            self._entries[path] = entry
        for pattern, items in found.items():  # (sorted as paths are: by their parts)
            self.found[pattern] = [path for _, path in sorted(items, key=lambda i: i[0])]
        #: the files of WHOLE_FILE_PATTERNS, sorted
        self.whole = [path for _, path in sorted(
            (item for pattern in WHOLE_FILE_PATTERNS for item in found[pattern]),
            key=lambda i: i[0])]

    def stat(self, path: Path) -> os.stat_result:
        """``path``'s status: taken once for a file the walk found, each time for another."""
        entry = self._entries.get(path)
        return entry.stat() if entry is not None else path.stat()


#: Files a set-aside report names at most (those with the most rows set aside first).
_REPORTED_FILES = 100


def _clip(text: str, limit: int = 256) -> str:
    """``text`` cut to the service's limit for a reason or a file name, marked when cut."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _plain(s: pd.Series) -> list:
    if s.dtype.kind in "iu":
        return s.astype(np.int64).tolist()
    if s.dtype.kind == "f":
        return s.astype(np.float64).round(3).tolist()
    return s.astype(str).tolist()
