"""Durable state of the central service: one SQLite database in WAL mode.

Every write is one transaction committed (``synchronous=FULL``) *before* the caller
acknowledges it, so a ``kill -9`` at any point keeps every acknowledged record and verdict: the
transaction either made it to the write-ahead log or the client never heard "accepted" and will
resend. Batches are keyed by ``(job, source, batch_id)``; a resend with the same content returns
the stored answer and stores nothing, a resend with different content is refused. Pruning
(:meth:`Store.prune`) keeps a long job's database from growing without forgetting which
batches it accepted.

This module is plain library code (sqlite3, pandas, pyarrow): it takes paths as arguments and
never reads the environment.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from holmes_ml._text import few
from holmes_ml.io.schema import FACTS, facts_of, job_of, member_ranks, members_key

logger = logging.getLogger(__name__)

#: 3: what agents send is stored packed, one row per iteration and agent: iteration summaries
#: (``iteration_blocks``) and abnormal operators (``abnormal_records``, their strings numbered
#: in ``names``); a database of version 1 or 2 is converted on opening (:meth:`Store._upgrade`).
SCHEMA_VERSION = 4
COORDS = ("dp", "pp", "tp", "cp", "ep")
#: A source that has not delivered for this long while the others of its job went on (4
#: flushes of an agent at its default ``--flush-after``), and is behind them, is ``lagging``.
LAG_SECONDS = 120.0

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    job TEXT PRIMARY KEY, created_at REAL NOT NULL, last_ingest_at REAL,
    records INTEGER NOT NULL DEFAULT 0, batches INTEGER NOT NULL DEFAULT 0,
    mode TEXT NOT NULL DEFAULT 'empty', topology TEXT, newest_ns INTEGER);
CREATE TABLE IF NOT EXISTS batches (
    job TEXT NOT NULL, source TEXT NOT NULL, batch_id TEXT NOT NULL, seq INTEGER,
    digest TEXT NOT NULL, records INTEGER NOT NULL, ack TEXT NOT NULL, received_at REAL NOT NULL,
    last_iteration INTEGER, PRIMARY KEY (job, source, batch_id));
CREATE TABLE IF NOT EXISTS sources (
    job TEXT NOT NULL, source TEXT NOT NULL, last_seq INTEGER NOT NULL,
    pruned_seq INTEGER NOT NULL DEFAULT -1, PRIMARY KEY (job, source));
CREATE TABLE IF NOT EXISTS source_activity (
    job TEXT NOT NULL, source TEXT NOT NULL, first_at REAL NOT NULL, last_at REAL NOT NULL,
    batches INTEGER NOT NULL, records INTEGER NOT NULL, last_iteration INTEGER,
    PRIMARY KEY (job, source));
CREATE TABLE IF NOT EXISTS ranks (
    job TEXT NOT NULL, rank INTEGER NOT NULL, host TEXT NOT NULL, gpu INTEGER NOT NULL,
    dp INTEGER NOT NULL DEFAULT -1, pp INTEGER NOT NULL DEFAULT -1,
    tp INTEGER NOT NULL DEFAULT -1, cp INTEGER NOT NULL DEFAULT -1,
    ep INTEGER NOT NULL DEFAULT -1, PRIMARY KEY (job, rank));
CREATE TABLE IF NOT EXISTS groups (
    job TEXT NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL, ranks TEXT NOT NULL,
    PRIMARY KEY (job, name));
CREATE TABLE IF NOT EXISTS iteration_blocks (
    job TEXT NOT NULL, iteration INTEGER NOT NULL, source TEXT NOT NULL, n INTEGER NOT NULL,
    rows BLOB NOT NULL, PRIMARY KEY (job, iteration, source));
CREATE TABLE IF NOT EXISTS compute_blocks (
    job TEXT NOT NULL, iteration INTEGER NOT NULL, source TEXT NOT NULL, n INTEGER NOT NULL,
    rows BLOB NOT NULL, PRIMARY KEY (job, iteration, source));
CREATE TABLE IF NOT EXISTS abnormal_records (
    job TEXT NOT NULL, iteration INTEGER NOT NULL, source TEXT NOT NULL, n INTEGER NOT NULL,
    rows BLOB NOT NULL, PRIMARY KEY (job, iteration, source));
CREATE TABLE IF NOT EXISTS names (
    job TEXT NOT NULL, text TEXT NOT NULL, id INTEGER NOT NULL, PRIMARY KEY (job, text));
CREATE TABLE IF NOT EXISTS facts (
    job TEXT NOT NULL, fact TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
    source TEXT NOT NULL, batch_id TEXT NOT NULL, PRIMARY KEY (job, fact, key));
CREATE TABLE IF NOT EXISTS raw (
    job TEXT NOT NULL, source TEXT NOT NULL, batch_id TEXT NOT NULL, n INTEGER NOT NULL,
    payload BLOB NOT NULL, PRIMARY KEY (job, source, batch_id));
CREATE TABLE IF NOT EXISTS raw_iterations (
    job TEXT NOT NULL, iteration INTEGER NOT NULL, PRIMARY KEY (job, iteration));
CREATE TABLE IF NOT EXISTS verdicts (
    job TEXT NOT NULL, version INTEGER NOT NULL, computed_at REAL NOT NULL,
    data_batches INTEGER NOT NULL, top TEXT, body TEXT NOT NULL,
    PRIMARY KEY (job, version));
"""
#: Columns added after databases were made with ``_DDL``: (table, column, declaration). A
#: database of an older holmes_ml gets them on opening; its old rows hold the default.
_ADDED_COLUMNS = (
    ("batches", "last_iteration", "INTEGER"),
    ("sources", "pruned_seq", "INTEGER NOT NULL DEFAULT -1"),
    # how many times the job's topology was set, and which of those a verdict was computed with
    # (one set after the verdict makes it stale: a topology names the devices and coordinates)
    ("jobs", "topology_version", "INTEGER NOT NULL DEFAULT 0"),
    ("verdicts", "topology_version", "INTEGER NOT NULL DEFAULT 0"),
    # what an agent could not read of its logs, its latest report (JSON; schemas.SetAside)
    ("source_activity", "set_aside", "TEXT"),
)

#: The columns of :meth:`Store.iteration_summaries`; a block's rows hold all but the first.
_SUMMARY_COLUMNS = ("iteration", "rank", "start_ns", "end_ns", "comm_us", "n_ops")
_SUMMARY_FIELDS = _SUMMARY_COLUMNS[1:]
#: One rank's summary of one iteration as ``iteration_blocks.rows`` packs it: the rows an agent
#: sent for an iteration, by rank, little-endian. A verdict over an 8,192-rank job's window
#: reads 200 x 1,024 such blobs in a fraction of a second, where 1.6 M rows of a table took
#: seconds to come out of SQLite as Python tuples.
_SUMMARY_ROW = np.dtype([(name, "<f8" if name == "comm_us" else "<i8")
                         for name in _SUMMARY_FIELDS])
#: A rank's compute time in one iteration as ``compute_blocks.rows`` packs it (for the agents
#: whose logs carry it, e.g. ``step_compute_us`` of the ByteDance traces; a table apart, so that
#: the summaries of the many jobs without it cost no more).
_COMPUTE_ROW = np.dtype([("rank", "<i8"), ("compute_us", "<f8")])
#: An abnormal operator as ``abnormal_records.rows`` holds it: the rows an agent sent for an
#: iteration, little-endian, each string (op, communicator, host, kind) as its number among the
#: job's ``names``. 88 bytes a row; an Arrow IPC stream took 1.7 kB for a block of one row.
_ABNORMAL_TEXT = ("op", "group", "host", "group_kind")
_ABNORMAL_COLUMNS = ("iteration", "rank", "op", "group", "seq", "nbytes", "start_ns",
                     "duration_us", "score", "peer", "host", "group_kind", "excess_us")
_ABNORMAL_ROW = np.dtype([
    (c, "<i4" if c in _ABNORMAL_TEXT else "<f8" if c in ("duration_us", "score", "excess_us")
     else "<i8") for c in _ABNORMAL_COLUMNS])
#: The value of each column an older agent leaves out.
_ABNORMAL_DEFAULTS: dict[str, Any] = {"peer": -1, "host": "", "group_kind": "", "excess_us": 0.0}

#: The first iteration of a window that holds every one (the smallest int64), and the last.
_EVERY_ITERATION = -(2**63)
_LAST_ITERATION = 2**63 - 1

#: Verdicts a job keeps when its old iterations are pruned (only the latest is served).
VERDICTS_KEPT = 100


class StoreError(ValueError):
    """A write the store refuses; ``field`` names the offending request field."""

    status = 400

    def __init__(self, message: str, field: str, status: int | None = None) -> None:
        super().__init__(message)
        self.field = field
        if status is not None:
            self.status = status


class DatabaseFileError(ValueError):
    """A database path (``holmes serve --db``, ``holmes agent --outbox``) that holds something
    else than the SQLite database expected there; the message names the file and what it is."""


def connect_sqlite(path: str | Path, kind: str, marker: str, option: str,
                   **kwargs: Any) -> sqlite3.Connection:
    """Open ``path`` as the SQLite database ``kind`` (whose tables include ``marker``).

    ``sqlite3.connect`` opens any file lazily and the first statement then fails with a bare
    "file is not a database"; worse, a valid SQLite file of another program would silently get
    our tables added to it. Both are refused here, with the file named.

    Raises
    ------
    DatabaseFileError
        ``path`` cannot be opened, is not SQLite, or is an SQLite database without ``marker``.
    """
    expected = f"expected {kind} (or a path that does not exist yet)"
    try:
        db = sqlite3.connect(str(path), **kwargs)
    except sqlite3.Error as exc:
        raise DatabaseFileError(f"{option} {path}: cannot open ({exc}); {expected}") from exc
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        db.close()
        raise DatabaseFileError(
            f"{option} {path}: not an SQLite database ({exc}); {expected}") from exc
    if tables and marker not in tables:
        db.close()
        raise DatabaseFileError(
            f"{option} {path}: an SQLite database of something else (tables "
            f"{', '.join(sorted(tables)[:5])}); {expected}")
    return db


class ConflictError(StoreError):
    """Same batch id with different content, a batch out of order, or a mode mix-up."""

    status = 409


def _placement(topology: dict) -> dict[str, str]:
    """Rank (as text, the facts' key) -> host of a ``Topology.to_dict()``."""
    cols = topology.get("ranks") or {}
    return {str(int(r)): str(h) for r, h in zip(cols.get("rank") or (), cols.get("host") or (),
                                                strict=False)}


class UnknownJobError(StoreError):
    status = 404


#: What one batch may not contradict in an earlier one: fact -> (its subject, what is
#: expected). A rank's agent and a communicator's kind (agent mode; agents send each
#: communicator once, as far as they saw it, and member lists add up); a rank's host, a
#: communicator's members and kind (raw mode).
_FACTS: dict[str, tuple[str, str]] = {
    "ranks": ("the agent sending rank {key}",
              "each rank from one agent: two agents following the same logs? (a job restarted "
              "on other hosts goes under a new job name)"),
    "host": (FACTS["host"][1],
             "one host per rank (a job restarted on other hosts goes under a new job name)"),
    "group_ranks": (FACTS["group_ranks"][1], "one member list per communicator"),
    "group_kind": (FACTS["group_kind"][1], "one kind per communicator"),
    "job": ("the job named in the records",
            "one job per service job: post another job's records under its own name"),
}


def _raw_facts(table: pa.Table) -> dict[str, dict[str, str]]:
    """:func:`~holmes_ml.io.schema.facts_of` a validated raw batch, and the job its
    ``job`` column names (one at most: validated)."""
    cols = [c for c in ("rank", "group", *FACTS, "job") if c in table.column_names]
    ops = table.select(cols).to_pandas()
    facts = facts_of(ops)
    found = job_of(ops)
    if found is not None:
        facts["job"] = {"": found[1]}
    return facts


#: What agents send, stored in blocks (one per job, iteration and agent): the name the store's
#: counts give their rows -> the table.
_BLOCKS = {"iterations": "iteration_blocks", "abnormal": "abnormal_records",
           "compute": "compute_blocks"}


def _rows_for_keys(db: sqlite3.Connection, sql: str, args: tuple, keys: Sequence[str]
                   ) -> Iterator[tuple]:
    """The rows of ``sql`` (``args``, then its ``IN ({})`` given ``keys``), 500 keys a query
    (SQLite's limit on bound variables)."""
    for i in range(0, len(keys), 500):
        chunk = keys[i:i + 500]
        yield from db.execute(sql.format(",".join("?" * len(chunk))), (*args, *chunk))


def _block_rows(db: sqlite3.Connection, table: str, where: str, args: tuple) -> int:
    """Rows the blocks of ``table`` (one of :data:`_BLOCKS`) hold where ``where``."""
    return int(db.execute(f"SELECT coalesce(sum(n), 0) FROM {table} WHERE {where}",
                          args).fetchone()[0])


def _delete_blocks(db: sqlite3.Connection, where: str, args: tuple) -> dict[str, int]:
    """Delete the blocks of what agents sent where ``where``; returns the rows they held, by
    the name the store's counts give them."""
    out = {}
    for name, table in _BLOCKS.items():
        out[name] = _block_rows(db, table, where, args)
        db.execute(f"DELETE FROM {table} WHERE {where}", args)
    return out


def _name_ids(db: sqlite3.Connection, job: str, texts: Sequence[str]) -> np.ndarray:
    """The numbers of ``texts`` among ``job``'s names, new ones numbered on."""
    wanted = sorted(set(texts))
    known: dict[str, int] = {}
    for i in range(0, len(wanted), 500):
        chunk = wanted[i:i + 500]
        known.update(db.execute(f"SELECT text, id FROM names WHERE job=? AND text IN "
                                f"({','.join('?' * len(chunk))})", (job, *chunk)).fetchall())
    new = [t for t in wanted if t not in known]
    if new:
        (start,) = db.execute("SELECT coalesce(max(id), -1) + 1 FROM names WHERE job=?",
                              (job,)).fetchone()
        db.executemany("INSERT INTO names VALUES (?,?,?)",
                       [(job, t, start + k) for k, t in enumerate(new)])
        known.update((t, start + k) for k, t in enumerate(new))
    return np.array([known[t] for t in texts], dtype=np.int32)


def _abnormal_rows(db: sqlite3.Connection, job: str, part: Mapping[str, Any]) -> np.ndarray:
    """Abnormal operators given by column (lists or arrays, as agents send them) as
    ``abnormal_records`` rows, their strings numbered (:func:`_name_ids`)."""
    k = len(part["iteration"])
    rows = np.empty(k, dtype=_ABNORMAL_ROW)
    for c in _ABNORMAL_COLUMNS:
        values = part.get(c)
        if values is None or len(values) == 0:
            values = [_ABNORMAL_DEFAULTS[c]] * k
        if c in _ABNORMAL_TEXT:
            codes, texts = pd.factorize(np.asarray(values, dtype=object).astype(str))
            rows[c] = _name_ids(db, job, list(texts))[codes]
        else:
            rows[c] = values
    return rows


def _last_per_rank(rows: np.ndarray) -> np.ndarray:
    """``rows`` (one iteration's summaries or compute times) keeping the last of each rank
    (a rank sent twice in one batch), by rank."""
    back = rows[::-1]
    return back[np.unique(back["rank"], return_index=True)[1]]


def _last_of_each(rows: np.ndarray) -> np.ndarray:
    """``rows`` keeping the last of those of one operator (rank, communicator, seq, peer, op:
    a pipeline send and the recv of one step can share the other four), in their order."""
    back = rows[::-1]
    keys = ("op", "peer", "seq", "group", "rank")
    order = np.lexsort(tuple(back[k] for k in keys))  # stable
    s = back[order]
    first = np.ones(len(s), dtype=bool)
    first[1:] = np.logical_or.reduce([s[k][1:] != s[k][:-1] for k in keys])
    return rows[np.sort(len(rows) - 1 - order[first])]


def _abnormal_frame(rows: np.ndarray, names: np.ndarray) -> pd.DataFrame:
    """``abnormal_records`` rows as the table :meth:`Store.agent_data` returns: by iteration,
    communicator (name), seq and rank; ``names``: the job's names by number."""
    by_text = np.empty(len(names), dtype=np.int64)
    by_text[np.argsort(names.astype(str), kind="stable")] = np.arange(len(names))
    group = by_text[rows["group"]] if len(names) else rows["group"]
    rows = rows[np.lexsort((rows["rank"], rows["seq"], group, rows["iteration"]))]
    out: dict[str, Any] = {}
    for c in _ABNORMAL_COLUMNS:
        if c in _ABNORMAL_TEXT:
            out[c] = pd.Series(names[rows[c]] if len(names) else np.array([], dtype=object),
                               dtype="str")
        else:
            out[c] = rows[c].astype(_ABNORMAL_ROW[c].newbyteorder("="))
    return pd.DataFrame(out, columns=list(_ABNORMAL_COLUMNS))


def _legacy_rows(db: sqlite3.Connection, table: str, select: str,
                 iterations: int = 1000) -> Iterator[tuple[str, pd.DataFrame]]:
    """The rows of a table of an older layout (keyed by job and iteration; ``select`` names it
    ``t``), job by job and ``iterations`` iterations at a time, so that converting a large
    database does not need it all in memory."""
    for (job,) in db.execute(f"SELECT DISTINCT job FROM {table}").fetchall():
        lo, hi = db.execute(f"SELECT min(iteration), max(iteration) FROM {table} WHERE job=?",
                            (job,)).fetchone()
        for start in range(int(lo), int(hi) + 1, iterations):
            part = pd.read_sql_query(f"{select} WHERE t.job=? AND t.iteration>=? AND "
                                     "t.iteration<?", db, params=(job, start, start + iterations))
            if len(part):
                yield job, part


def _insert_abnormal(db: sqlite3.Connection, job: str, iteration: int, source: str,
                     rows: pd.DataFrame) -> None:
    """Store abnormal operators of an older layout (a table of the columns agents send) as one
    ``abnormal_records`` block."""
    packed = _abnormal_rows(db, job, {c: rows[c].to_numpy() for c in _ABNORMAL_COLUMNS
                                      if c in rows.columns})
    db.execute("INSERT INTO abnormal_records VALUES (?,?,?,?,?)",
               (job, iteration, source, len(packed), packed.tobytes()))


class Store:
    """The service's SQLite database.

    Parameters
    ----------
    path:
        Database file; created with its tables when missing. ``":memory:"`` is accepted for
        tests of the store alone.

    Examples
    --------
    >>> s = Store(":memory:")
    >>> s.jobs()
    []
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # One connection shared by the request threads, serialized by a lock: SQLite allows a
        # single writer anyway, and reads are short.
        self._db = connect_sqlite(self.path, "a holmes serve database", "batches", "--db",
                                  check_same_thread=False, isolation_level=None)
        self._lock = threading.RLock()
        #: why the last write failed, until one succeeds (a lock held elsewhere aside)
        self.write_error: str | None = None
        self._inode = None if self.path == ":memory:" else os.stat(self.path).st_ino
        if not self._db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            # Only settable in a new file, before WAL mode and the first table: lets _reclaim
            # give the pages that pruning and deleting free back to the file system (an older
            # database only reuses them).
            self._db.execute("PRAGMA auto_vacuum=INCREMENTAL")
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: the WAL is fsynced at every commit, so "acknowledged" survives even a power cut.
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_DDL)
        for table, column, decl in _ADDED_COLUMNS:
            if column not in {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            self._db.execute(
                "INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
        elif int(row[0]) not in range(1, SCHEMA_VERSION + 1):
            self._db.close()
            raise DatabaseFileError(
                f"--db {self.path}: database schema version {row[0]}; expected "
                f"{SCHEMA_VERSION} or older (use a new --db file, or the holmes_ml that made it)"
            )
        self._upgrade()
        # a database of a holmes_ml before source_activity: each sender from its batches
        self._db.execute(
            "INSERT OR IGNORE INTO source_activity (job, source, first_at, last_at, batches, "
            "records, last_iteration) SELECT job, source, min(received_at), "
            "max(received_at), count(*), sum(records), max(last_iteration) FROM batches "
            "WHERE NOT EXISTS (SELECT 1 FROM source_activity) GROUP BY job, source")

    def _upgrade(self) -> None:
        """Convert the tables of an older holmes_ml, if any: ``iterations`` and ``abnormal``
        (one row per rank and iteration, resp. per operator; schema version 1) and
        ``abnormal_blocks`` (Arrow IPC; version 2) into ``iteration_blocks`` and
        ``abnormal_records``, each rank under the agent that sent it (the ``ranks`` facts;
        ``""`` for a rank no fact names), and ``raw_span`` (a raw batch's iterations) into
        ``batches.last_iteration``. One transaction: interrupted, nothing changed, and the next
        opening converts it again."""
        legacy = {"iterations", "abnormal", "abnormal_blocks", "raw_span"}
        tables = {t for (t,) in self._db.execute("SELECT name FROM sqlite_master")}
        if not tables & legacy and self._db.execute(
                "SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(
                SCHEMA_VERSION):
            return
        logger.info("%s: converting the database to schema version %d (once)", self.path,
                    SCHEMA_VERSION)
        with self._tx() as db:
            source = ("coalesce((SELECT f.value FROM facts f WHERE f.job=t.job AND "
                      "f.fact='ranks' AND f.key=CAST(t.rank AS TEXT)), '') AS source")
            if "iterations" in tables:
                for job, part in _legacy_rows(
                        db, "iterations", f"SELECT t.*, {source} FROM iterations t"):
                    for (i, src), rows in part.groupby(["iteration", "source"]):
                        packed = np.empty(len(rows), dtype=_SUMMARY_ROW)
                        for name in _SUMMARY_FIELDS:
                            packed[name] = rows[name].to_numpy()
                        packed = packed[np.argsort(packed["rank"], kind="stable")]
                        db.execute("INSERT INTO iteration_blocks VALUES (?,?,?,?,?)",
                                   (job, int(i), src, len(packed), packed.tobytes()))
                db.execute("DROP TABLE iterations")
            if "abnormal" in tables:
                for job, part in _legacy_rows(db, "abnormal", f"SELECT t.*, t.grp AS 'group', "
                                              f"{source} FROM abnormal t"):
                    for (i, src), rows in part.groupby(["iteration", "source"]):
                        _insert_abnormal(db, job, int(i), src, rows)
                db.execute("DROP TABLE abnormal")
            if "abnormal_blocks" in tables:
                for job, i, src, blob in db.execute(
                        "SELECT job, iteration, source, rows FROM abnormal_blocks").fetchall():
                    _insert_abnormal(db, job, i, src, pa.ipc.open_stream(
                        pa.py_buffer(blob)).read_all().to_pandas())
                db.execute("DROP TABLE abnormal_blocks")
            if "raw_span" in tables:
                # made between a567b45 and 11b3a19, a raw batch's record lacks its last iteration
                db.execute("UPDATE batches SET last_iteration=(SELECT s.last_iteration FROM "
                           "raw_span s WHERE s.job=batches.job AND s.source=batches.source AND "
                           "s.batch_id=batches.batch_id) WHERE last_iteration IS NULL")
                db.execute("DROP TABLE raw_span")
            db.execute("UPDATE meta SET value=? WHERE key='schema_version'",
                       (str(SCHEMA_VERSION),))
        logger.info("%s: upgraded the database to schema version %d", self.path, SCHEMA_VERSION)
        if self._db.execute("PRAGMA auto_vacuum").fetchone()[0] != 2 and self.path != ":memory:":
            # Made before holmes_ml gave freed pages back (_reclaim): once rewritten with
            # incremental vacuum on, the space the old tables held, and what pruning frees
            # from now on, goes back to the file system.
            before = Path(self.path).stat().st_size
            # One pass over the whole file (minutes for tens of GB): say so before it starts.
            logger.warning("%s: rewriting the database once (%.1f MB) so that pruned space "
                           "goes back to the file system; the service starts when it is done",
                           self.path, before / 2**20)
            self._db.execute("PRAGMA auto_vacuum=INCREMENTAL")
            self._db.execute("VACUUM")
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            logger.info("%s: rewritten to give freed space back: %.1f MB -> %.1f MB", self.path,
                        before / 2**20, Path(self.path).stat().st_size / 2**20)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._check_file()
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    self.write_error = str(exc)
                raise
            self.write_error = None

    def unusable(self) -> str | None:
        """Why the store cannot take writes now, None when it can: the file removed or
        replaced, a write lock it cannot take (a read-only file), or the last write failed
        (disk full, I/O error) and none succeeded since. Cheap: it writes nothing."""
        try:
            with self._lock:
                self._check_file()
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute("ROLLBACK")
        except sqlite3.Error as exc:
            return str(exc)
        if self.write_error is not None:
            return f"the last write failed ({self.write_error})"
        return None

    def _check_file(self) -> None:
        """Refuse to write into a database file removed (or replaced) under the service: the
        open connection would go on acknowledging batches that are gone at the next start."""
        if self._inode is None:
            return
        try:
            same = os.stat(self.path).st_ino == self._inode
        except FileNotFoundError:
            same = False
        if not same:
            raise sqlite3.OperationalError(
                f"the database file {self.path} was removed or replaced while the service ran; "
                "what is written now would be lost at the next start: restart holmes serve")

    # ------------------------------------------------------------------ batch bookkeeping
    def _check_batch(
        self,
        db: sqlite3.Connection,
        job: str,
        source: str,
        batch_id: str,
        seq: int | None,
        digest: str,
        mode: str,
    ) -> dict | None:
        """Return the stored ack for a duplicate (``records`` 0 for one whose record was
        pruned), raise for conflicts, None for a new batch."""
        row = db.execute(
            "SELECT digest, ack FROM batches WHERE job=? AND source=? AND batch_id=?",
            (job, source, batch_id),
        ).fetchone()
        if row is not None:
            if row[0] != digest:
                raise ConflictError(
                    f"batch_id {batch_id!r} of source {source!r} was already accepted with "
                    "different content; expected a new batch_id for new data",
                    field="batch_id",
                )
            ack = json.loads(row[1])
            ack["duplicate"] = True
            return ack
        jrow = db.execute("SELECT mode FROM jobs WHERE job=?", (job,)).fetchone()
        if jrow is not None and jrow[0] not in ("empty", mode):
            raise ConflictError(
                f"job {job!r} receives {jrow[0]} data; {mode} data for it is refused "
                "(use another job name)",
                field="job",
            )
        srow = None if seq is None else db.execute(
            "SELECT last_seq, pruned_seq FROM sources WHERE job=? AND source=?", (job, source)
        ).fetchone()
        if srow is not None and seq <= srow[1]:
            # A resend of a batch whose record was pruned with the iterations it held (prune).
            # What it stored is gone, and storing it again would only be pruned again.
            return {"job": job, "source": source, "batch_id": batch_id, "seq": seq,
                    "records": 0, "duplicate": True}
        # Gaps are allowed (an agent may drop a batch the service refused) but never a step
        # back: an older batch arriving after a newer one is out of order.
        if srow is not None and seq <= srow[0]:
            raise ConflictError(
                f"seq: got {seq} from source {source!r}, expected more than {srow[0]} "
                "(batches of a source are sent in increasing seq order)",
                field="seq",
            )
        return None

    def _record_batch(
        self,
        db: sqlite3.Connection,
        job: str,
        source: str,
        batch_id: str,
        seq: int | None,
        digest: str,
        records: int,
        mode: str,
        newest_ns: int | None,
        last_iteration: int | None,
    ) -> dict:
        now = time.time()
        ack = {
            "job": job, "source": source, "batch_id": batch_id, "seq": seq,
            "records": int(records), "duplicate": False,
        }
        db.execute(
            "INSERT INTO batches (job, source, batch_id, seq, digest, records, ack, received_at,"
            " last_iteration) VALUES (?,?,?,?,?,?,?,?,?)",
            (job, source, batch_id, seq, digest, int(records), json.dumps(ack), now,
             last_iteration),
        )
        if seq is not None:
            db.execute(
                "INSERT INTO sources (job, source, last_seq) VALUES (?,?,?) "
                "ON CONFLICT(job, source) "
                "DO UPDATE SET last_seq=excluded.last_seq",
                (job, source, seq),
            )
        # each sender's last delivery, kept past pruning: how an agent that stopped shows
        db.execute(
            "INSERT INTO source_activity (job, source, first_at, last_at, batches, records,"
            " last_iteration) VALUES (?,?,?,?,1,?,?) ON CONFLICT(job, source) DO UPDATE SET"
            " last_at=excluded.last_at, batches=batches+1,"
            " records=min(records + excluded.records, 9223372036854775807),"
            " last_iteration=CASE WHEN excluded.last_iteration IS NULL THEN last_iteration"
            " WHEN last_iteration IS NULL THEN excluded.last_iteration"
            " ELSE max(last_iteration, excluded.last_iteration) END",
            (job, source, now, now, int(records), last_iteration),
        )
        db.execute(
            "INSERT INTO jobs (job, created_at, last_ingest_at, records, batches, mode, newest_ns)"
            " VALUES (?,?,?,?,1,?,?) ON CONFLICT(job) DO UPDATE SET"
            " last_ingest_at=excluded.last_ingest_at,"
            # exact integers, held at the 64-bit maximum (SQLite would turn it into a float)
            " records=CASE WHEN records > 9223372036854775807 - excluded.records"
            " THEN 9223372036854775807 ELSE records + excluded.records END,"
            " batches=batches+1, mode=excluded.mode,"
            " newest_ns=max(coalesce(newest_ns, 0), coalesce(excluded.newest_ns, 0))",
            (job, now, now, int(records), mode, newest_ns),
        )
        return ack

    # ------------------------------------------------------------------ writes
    def ingest_agent(self, job: str, batch: dict[str, Any], digest: str) -> dict:
        """Store one agent batch (a dumped :class:`~holmes_ml.serve.schemas.AgentBatch`).

        Returns the acknowledgement, with the ranks and communicators the batch names that the
        job does not know (:meth:`_unknown`); raises :class:`ConflictError` for conflicts.
        """
        ranks: set[int] = set()
        for part in ("ranks", "iterations", "abnormal"):
            if batch.get(part):
                ranks.update(int(r) for r in batch[part]["rank"])
        groups = {str(g) for g in (batch.get("abnormal") or {}).get("group") or ()}
        with self._tx() as db:
            ack = self._store_agent(db, job, batch, digest, ranks)
            return {**ack, **self._unknown(db, job, ranks, groups)}

    def _store_agent(self, db: sqlite3.Connection, job: str, batch: dict[str, Any],
                     digest: str, ranks: set[int]) -> dict:
        """Store one agent batch (``ranks``: the ranks it carries) in transaction ``db``."""
        source, batch_id, seq = batch["source"], batch["batch_id"], batch["seq"]
        dup = self._check_batch(db, job, source, batch_id, seq, digest, "agent")
        if dup is not None:
            return dup
        # rows are keyed by rank and iteration: a second agent following the same logs
        # (a shared directory) would overwrite the first one's
        self._settle(db, job, source, batch_id, "ranks", {str(r): source for r in ranks})
        if batch.get("ranks"):  # an agent sending a rank again puts it on the same host
            hosts = {str(r): str(h) for r, h in zip(batch["ranks"]["rank"],
                                                    batch["ranks"]["host"], strict=True)}
            self._settle(db, job, source, batch_id, "host", hosts, field="ranks.host")
            self._held_to_topology(db, job, source, batch_id, hosts, "ranks.host")
        # agents send a communicator each as far as they saw it: the member lists add up
        # (_members), its kind must be the same
        self._settle(db, job, source, batch_id, "group_kind",
                     {str(g["name"]): str(g["kind"]) for g in batch.get("groups") or ()},
                     field="groups.kind")
        n = 0
        newest = None
        if batch.get("ranks"):
            r = batch["ranks"]
            k = len(r["rank"])
            coords = [r.get(c) or [-1] * k for c in COORDS]
            db.executemany(
                "INSERT OR REPLACE INTO ranks VALUES (?,?,?,?,?,?,?,?,?)",
                [(job, *row) for row in zip(r["rank"], r["host"], r["gpu"], *coords,
                                            strict=True)],
            )
        for g in batch.get("groups") or ():
            db.execute(
                "INSERT OR REPLACE INTO groups VALUES (?,?,?,?)",
                (job, g["name"], g["kind"], self._members(db, job, g)),
            )
        it = batch.get("iterations")
        replaced: dict[int, np.ndarray] = {}
        if it and it["iteration"]:
            added, before, replaced = self._store_summaries(db, job, source, it)
            self._store_compute(db, job, source, it)
            n += added - before
            newest = int(max(it["end_ns"]))
        ab = batch.get("abnormal")
        if (ab and ab["iteration"]) or replaced:
            self._store_abnormal(db, job, source, ab if ab and ab["iteration"] else None,
                                 replaced)
        last = max((max(part["iteration"]) for part in (it, ab) if part and part["iteration"]),
                   default=None)
        ack = self._record_batch(db, job, source, batch_id, seq, digest, n, "agent", newest,
                                 last)
        if batch.get("set_aside") is not None:
            db.execute("UPDATE source_activity SET set_aside=? WHERE job=? AND source=?",
                       (json.dumps(batch["set_aside"]), job, source))
        return ack

    @staticmethod
    def _unknown(db: sqlite3.Connection, job: str, ranks: set[int], groups: set[str]
                 ) -> dict[str, list]:
        """What an agent batch's ``ranks`` and (abnormal operators') ``groups`` lack in the
        job: ranks without a host, communicators without members. An agent sends each once;
        a job deleted under a running agent (or a refused first batch) lost them, and the ack
        tells the agent to send them again."""
        def missing(sql: str, keys: list[str]) -> list[str]:
            known = {r[0] for r in _rows_for_keys(db, sql, (job,), keys)}
            return [k for k in keys if k not in known]

        return {
            "unknown_ranks": sorted(int(r) for r in missing(
                "SELECT key FROM facts WHERE job=? AND fact='host' AND key IN ({})",
                [str(r) for r in ranks])),
            "unknown_groups": missing("SELECT name FROM groups WHERE job=? AND name IN ({})",
                                      sorted(groups)),
        }

    @staticmethod
    def _store_summaries(db: sqlite3.Connection, job: str, source: str, part: dict[str, list]
                         ) -> tuple[int, int, dict[int, np.ndarray]]:
        """Store the iteration summaries of one agent batch (its ``iterations`` part) in
        ``iteration_blocks``; returns the operators they count, the operators counted before
        for the same ranks and iterations, and those ranks by iteration.

        An agent ships a rank's last iteration again when more of it was logged after a flush:
        the new summary replaces the old one (and its abnormal operators: :meth:`_store_abnormal`),
        so that the job's record count grows only by the operators that are new.
        """
        new = np.empty(len(part["iteration"]), dtype=_SUMMARY_ROW)
        for name in _SUMMARY_FIELDS:
            new[name] = part[name]
        iterations = np.asarray(part["iteration"], dtype=np.int64)
        added = before = 0
        replaced: dict[int, np.ndarray] = {}
        for i in (int(x) for x in np.unique(iterations)):
            rows = _last_per_rank(new[iterations == i])
            added += int(rows["n_ops"].sum())
            found = db.execute("SELECT rows FROM iteration_blocks WHERE job=? AND iteration=? "
                               "AND source=?", (job, i, source)).fetchone()
            if found is not None:
                old = np.frombuffer(found[0], dtype=_SUMMARY_ROW)
                again = np.isin(old["rank"], rows["rank"])
                if again.any():
                    before += int(old["n_ops"][again].sum())
                    replaced[i] = old["rank"][again]
                rows = np.concatenate([old[~again], rows])
                rows = rows[np.argsort(rows["rank"], kind="stable")]
            db.execute("INSERT OR REPLACE INTO iteration_blocks VALUES (?,?,?,?,?)",
                       (job, i, source, len(rows), rows.tobytes()))
        return added, before, replaced

    @staticmethod
    def _store_compute(db: sqlite3.Connection, job: str, source: str, part: dict[str, list]
                       ) -> None:
        """Store the ranks' compute times of one agent batch's ``iterations`` part (its
        ``compute_us``, if any) in ``compute_blocks``: like the summary it came with, a rank's
        compute time sent again replaces the one stored, and a summary sent again without one
        drops it."""
        values = part.get("compute_us")
        if values is None and db.execute("SELECT 1 FROM compute_blocks WHERE job=? AND "
                                         "source=? LIMIT 1", (job, source)).fetchone() is None:
            return  # the common case: an agent whose logs carry no compute times
        iterations = np.asarray(part["iteration"], dtype=np.int64)
        new = np.empty(len(iterations), dtype=_COMPUTE_ROW)
        new["rank"] = part["rank"]
        new["compute_us"] = (np.nan if values is None
                             else [np.nan if v is None else v for v in values])
        for i in (int(x) for x in np.unique(iterations)):
            rows = _last_per_rank(new[iterations == i])
            found = db.execute("SELECT rows FROM compute_blocks WHERE job=? AND iteration=? AND "
                               "source=?", (job, i, source)).fetchone()
            if found is not None:
                old = np.frombuffer(found[0], dtype=_COMPUTE_ROW)
                rows = np.concatenate([old[~np.isin(old["rank"], rows["rank"])], rows])
                rows = rows[np.argsort(rows["rank"], kind="stable")]
            rows = rows[~np.isnan(rows["compute_us"])]
            if len(rows):
                db.execute("INSERT OR REPLACE INTO compute_blocks VALUES (?,?,?,?,?)",
                           (job, i, source, len(rows), rows.tobytes()))
            elif found is not None:
                db.execute("DELETE FROM compute_blocks WHERE job=? AND iteration=? AND source=?",
                           (job, i, source))

    @staticmethod
    def _store_abnormal(db: sqlite3.Connection, job: str, source: str,
                        part: dict[str, list] | None, replaced: dict[int, np.ndarray]) -> None:
        """Store the abnormal operators of one agent batch (its ``abnormal`` part, if any) in
        ``abnormal_records``: an operator sent again (same rank, communicator, ``seq`` and
        peer) replaces the one stored, and ``replaced`` ({iteration: ranks} whose summaries
        the batch replaced) drops those ranks' operators of the iteration sent before."""
        new = (np.empty(0, dtype=_ABNORMAL_ROW) if part is None
               else _abnormal_rows(db, job, part))
        for i in sorted({*replaced, *(int(x) for x in np.unique(new["iteration"]))}):
            rows = new[new["iteration"] == i]
            found = db.execute("SELECT rows FROM abnormal_records WHERE job=? AND iteration=? "
                               "AND source=?", (job, i, source)).fetchone()
            if found is not None:
                old = np.frombuffer(found[0], dtype=_ABNORMAL_ROW)
                rows = np.concatenate([old[~np.isin(old["rank"], replaced.get(i, ()))], rows])
            rows = _last_of_each(rows)
            if len(rows):
                db.execute("INSERT OR REPLACE INTO abnormal_records VALUES (?,?,?,?,?)",
                           (job, i, source, len(rows), rows.tobytes()))
            else:
                db.execute("DELETE FROM abnormal_records WHERE job=? AND iteration=? AND "
                           "source=?", (job, i, source))

    @staticmethod
    def _settle(db: sqlite3.Connection, job: str, source: str, batch_id: str, fact: str,
                values: dict[str, str], field: str | None = None) -> None:
        """Check ``values`` (key -> value) of one kind of :data:`_FACTS` against what earlier
        batches of ``job`` said, and keep the new ones; :class:`ConflictError` (nothing of the
        batch stored, naming ``field``, by default ``fact``) at the first that differs.

        The job's tables keep one value per rank or communicator: a batch saying otherwise
        would either overwrite rows of another agent or be read as if it agreed.
        """
        if not values:
            return
        keys = sorted(values)
        known = {k: (v, s, b) for k, v, s, b in _rows_for_keys(
            db, "SELECT key, value, source, batch_id FROM facts WHERE job=? AND fact=? AND key IN"
            " ({})", (job, fact), keys)}
        clash = [k for k in keys if k in known and known[k][0] != values[k]]
        if clash:
            k = clash[0]
            was, by, first = known[k]
            subject, expected = _FACTS[fact]
            more = f" (and {len(clash) - 1} more in this batch)" if len(clash) > 1 else ""
            raise ConflictError(
                f"{subject.format(key=k)} of job {job!r}: {was!r} since batch {first!r} of "
                f"source {by!r}; batch {batch_id!r} of source {source!r} says "
                f"{values[k]!r}{more}. Expected {expected}",
                field=field or fact,
            )
        db.executemany("INSERT INTO facts VALUES (?,?,?,?,?,?)",
                       [(job, fact, k, values[k], source, batch_id) for k in keys
                        if k not in known])

    @staticmethod
    def _held_to_topology(db: sqlite3.Connection, job: str, source: str, batch_id: str,
                          hosts: dict[str, str], field: str) -> None:
        """:class:`ConflictError` (nothing of the batch stored, naming ``field``) when the
        ranks' ``hosts`` (rank -> host) of a batch contradict the topology put for ``job``:
        stored, every verdict would fail on the two."""
        row = db.execute("SELECT topology FROM jobs WHERE job=?", (job,)).fetchone()
        if not hosts or row is None or row[0] is None:
            return
        placed = _placement(json.loads(row[0]))
        for key in sorted(hosts, key=int):
            if not hosts[key]:
                continue
            if key not in placed:
                where = f"is not placed by the job's topology ({len(placed)} ranks)"
            elif placed[key] != hosts[key]:
                where = f"is on host {placed[key]!r} by the job's topology"
            else:
                continue
            raise ConflictError(
                f"batch {batch_id!r} of source {source!r} puts rank {key} on host "
                f"{hosts[key]!r}; it {where}. Expected the ranks of the job the topology "
                "describes (PUT the right topology, or send to another job name)", field=field)

    @staticmethod
    def _members(db: sqlite3.Connection, job: str, group: dict[str, Any]) -> str:
        """The members of ``group`` to store: as sent, or, when agents list the communicator
        differently (each the ranks it saw, when the logs do not say), the union of the
        lists, as :func:`holmes_ml.pipeline.localize_summaries` merges them."""
        sent = " ".join(map(str, group["ranks"]))
        row = db.execute("SELECT ranks FROM groups WHERE job=? AND name=?",
                         (job, group["name"])).fetchone()
        if row is None or row[0] == sent:
            return sent
        return members_key(f"{row[0]} {sent}")

    def ingest_raw(
        self,
        job: str,
        source: str,
        batch_id: str,
        seq: int | None,
        table: pa.Table,
        digest: str,
    ) -> dict:
        """Store one batch of validated raw CommOps records (kept as an Arrow IPC blob)."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        payload = sink.getvalue().to_pybytes()
        newest = None
        if table.num_rows and "start_ns" in table.column_names:
            newest = int(pa.compute.max(table.column("start_ns")).as_py())
        its: list[int] = []
        if table.num_rows and "iteration" in table.column_names:
            its = [int(i) for i in pa.compute.unique(table.column("iteration")).to_pylist()]
        facts = _raw_facts(table)
        with self._tx() as db:
            dup = self._check_batch(db, job, source, batch_id, seq, digest, "raw")
            if dup is not None:
                return dup
            for fact, values in facts.items():
                self._settle(db, job, source, batch_id, fact, values)
            self._held_to_topology(db, job, source, batch_id, facts.get("host", {}), "host")
            db.execute(
                "INSERT INTO raw VALUES (?,?,?,?,?)",
                (job, source, batch_id, table.num_rows, sqlite3.Binary(payload)),
            )
            if its:
                db.executemany("INSERT OR IGNORE INTO raw_iterations VALUES (?,?)",
                               [(job, i) for i in its])
            return self._record_batch(db, job, source, batch_id, seq, digest, table.num_rows,
                                      "raw", newest, max(its, default=None))

    def delete_job(self, job: str) -> dict[str, int]:
        """Delete everything stored for ``job`` (its rows in every table); returns the rows
        deleted per table. Raises :class:`UnknownJobError` when there is no such job."""
        with self._tx() as db:
            if db.execute("SELECT 1 FROM jobs WHERE job=?", (job,)).fetchone() is None:
                raise UnknownJobError(f"unknown job {job!r}; list jobs with GET /v1/jobs",
                                      field="job")
            tables = [t for (t,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")
                if "job" in {r[1] for r in db.execute(f"PRAGMA table_info({t})")}]
            out = _delete_blocks(db, "job=?", (job,))
            out.update({t: db.execute(f"DELETE FROM {t} WHERE job=?", (job,)).rowcount
                        for t in tables if t not in _BLOCKS.values()})
        self._reclaim()
        return {t: n for t, n in out.items() if n}

    def set_topology(self, job: str, topology: dict) -> None:
        """Attach ``topology`` (``Topology.to_dict()``) to ``job``; :class:`ConflictError`
        (the stored one kept) when it contradicts what the job's batches said: a rank it does
        not place or places on another host, a communicator with other members. Every verdict
        would fail on it."""
        now = time.time()
        with self._tx() as db:
            self._check_topology(db, job, topology)
            db.execute(
                "INSERT INTO jobs (job, created_at, topology, topology_version) VALUES (?,?,?,1) "
                "ON CONFLICT(job) DO UPDATE SET topology=excluded.topology, "
                "topology_version=topology_version+1",
                (job, now, json.dumps(topology)),
            )

    @staticmethod
    def _check_topology(db: sqlite3.Connection, job: str, topology: dict) -> None:
        """Refuse (:class:`ConflictError`, 409) a ``topology`` for ``job`` that contradicts
        the ranks, hosts and communicators its batches stored: the localizer would refuse it
        at every verdict (:func:`holmes_ml.pipeline.localize_summaries` checks the same)."""
        if "rank" not in (topology.get("ranks") or {}):
            return  # no placement to hold it to (the service refuses such a topology: 422)
        placed = _placement(topology)
        facts: dict[str, dict[str, tuple[str, str, str]]] = {}
        for fact, key, value, source, batch_id in db.execute(
                "SELECT fact, key, value, source, batch_id FROM facts WHERE job=? AND fact IN "
                "('ranks', 'host', 'group_ranks')", (job,)):
            facts.setdefault(fact, {})[key] = (value, source, batch_id)
        expected = ("Expected the topology of the job that sent these batches (a job restarted "
                    "elsewhere goes under a new job name); the stored topology is unchanged")
        hosts = facts.get("host", {})
        for key in sorted(hosts, key=int):
            host, source, batch_id = hosts[key]
            if host and key in placed and placed[key] != host:
                clash = sum(1 for k, (h, _, _) in hosts.items()
                            if h and k in placed and placed[k] != h)
                raise ConflictError(
                    f"topology of job {job!r}: rank {key} is on host {placed[key]!r} in it, on "
                    f"host {host!r} since batch {batch_id!r} of source {source!r}"
                    + (f" (and {clash - 1} more rank(s) on other hosts)" if clash > 1 else "")
                    + f". {expected}", field="ranks.host")
        known = sorted(set(facts.get("ranks", {})) | set(hosts), key=int)
        missing = [k for k in known if k not in placed]
        if missing:
            raise ConflictError(
                f"topology of job {job!r}: it places {len(placed)} rank(s) and not rank(s) "
                f"{', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}, which batches "
                f"of the job sent. {expected}", field="ranks.rank")
        stored = {name: members for name, members in
                  db.execute("SELECT name, ranks FROM groups WHERE job=?", (job,))}
        stored.update({k: v for k, (v, _, _) in facts.get("group_ranks", {}).items()})
        for g in sorted(topology.get("groups") or (), key=lambda g: str(g.get("name"))):
            logged = member_ranks(stored.get(str(g.get("name")), ""))
            given = {int(r) for r in g.get("ranks") or ()}
            if logged and set(logged) != given:
                # (both lists cut at 8 read the same when they differ further on)
                only_topo = sorted(given - set(logged))
                only_job = sorted(set(logged) - given)
                diff = "; ".join(
                    [f"ranks {few(only_topo)} only in the topology"] * bool(only_topo)
                    + [f"ranks {few(only_job)} only in the job's batches"] * bool(only_job))
                raise ConflictError(
                    f"topology of job {job!r}: communicator {g['name']!r} has {len(given)} "
                    f"ranks in it, {len(set(logged))} by the job's batches ({diff}). "
                    f"{expected}", field="groups.ranks")

    def save_verdict(self, job: str, verdict: dict, data_batches: int, top: str | None,
                     topology_version: int = 0) -> int:
        """Append a verdict for ``job``, computed from its first ``data_batches`` batches and
        the ``topology_version``-th topology it was given (the job's counts as read before the
        computation started); returns its version (1, 2, ...)."""
        with self._tx() as db:
            row = db.execute(
                "SELECT coalesce(max(version), 0) FROM verdicts WHERE job=?", (job,)
            ).fetchone()
            version = int(row[0]) + 1
            db.execute(
                "INSERT INTO verdicts (job, version, computed_at, data_batches, top, body, "
                "topology_version) VALUES (?,?,?,?,?,?,?)",
                (job, version, time.time(), int(data_batches), top, json.dumps(verdict),
                 int(topology_version)),
            )
        return version

    # ------------------------------------------------------------------ reads
    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    _JOB_KEYS = ("job", "created_at", "last_ingest_at", "records", "batches", "mode",
                 "newest_ns", "topology_version")

    def jobs(self, job: str | None = None) -> list[dict]:
        """Every job's bookkeeping row (``job``'s alone when given), by name."""
        where, args = ("WHERE job=? ", (job,)) if job is not None else ("", ())
        rows = self._query(f"SELECT {', '.join(self._JOB_KEYS)} FROM jobs {where}ORDER BY job",
                           args)
        return [dict(zip(self._JOB_KEYS, r, strict=True)) for r in rows]

    _SOURCE_KEYS = ("source", "first_at", "last_at", "batches", "records", "last_iteration")

    def sources(self, job: str) -> list[dict]:
        """Who sent ``job`` its batches (an agent's ``--source``, a logger's host), each with
        its first and last delivery (epoch seconds), batches, records and newest iteration,
        what it reported it could not read of its logs (``rows_set_aside``, ``files_set_aside``,
        ``files_refused``: :class:`~holmes_ml.serve.schemas.SetAside`), plus
        ``behind_iterations`` (the job's newest iteration minus its own) and
        ``lagging``: it has not delivered for :data:`LAG_SECONDS` while others went on and
        its newest iteration is behind theirs (an agent that died, a node whose ranks fell
        silent). Kept past pruning; by source name."""
        rows = []
        for *values, aside in self._query(
                f"SELECT {', '.join(self._SOURCE_KEYS)}, set_aside FROM source_activity "
                "WHERE job=? ORDER BY source", (job,)):
            report = json.loads(aside) if aside else {}
            rows.append({**dict(zip(self._SOURCE_KEYS, values, strict=True)),
                         "rows_set_aside": int(report.get("rows", 0)),
                         "files_set_aside": report.get("files", []),
                         "files_refused": report.get("refused", [])})
        newest = max((r["last_iteration"] for r in rows if r["last_iteration"] is not None),
                     default=None)
        latest = max((r["last_at"] for r in rows), default=None)
        for r in rows:
            behind = (None if newest is None or r["last_iteration"] is None
                      else int(newest - r["last_iteration"]))
            r["behind_iterations"] = behind
            r["lagging"] = bool(behind and latest is not None
                                and latest - r["last_at"] >= LAG_SECONDS)
        return rows

    def job(self, job: str) -> dict:
        """One job's bookkeeping row; raises :class:`UnknownJobError` when absent."""
        found = self.jobs(job)
        if found:
            return found[0]
        raise UnknownJobError(f"unknown job {job!r}; list jobs with GET /v1/jobs", field="job")

    def topology(self, job: str) -> dict | None:
        rows = self._query("SELECT topology FROM jobs WHERE job=?", (job,))
        return json.loads(rows[0][0]) if rows and rows[0][0] else None

    def first_of_last(self, job: str, last: int | None) -> int | None:
        """The earliest of ``job``'s ``last`` most recent iterations (by number, among those
        it reported); ``None`` (everything) when ``last`` is ``None`` or 0 or the job has
        reported fewer iterations than that."""
        if not last:
            return None
        table = "raw_iterations" if self.job(job)["mode"] == "raw" else "iteration_blocks"
        # DISTINCT over the (job, iteration, ...) primary key: reads only the newest entries
        first, n = self._query(
            f"SELECT min(iteration), count(*) FROM (SELECT DISTINCT iteration FROM {table} "
            "WHERE job=? ORDER BY iteration DESC LIMIT ?)", (job, int(last)))[0]
        return int(first) if n >= last else None

    def prune(self, job: str, keep: int) -> dict[str, int]:
        """Delete what ``job`` holds of iterations before its ``keep`` most recent ones
        (:meth:`first_of_last`), so that a long job's database stops growing: iteration
        summaries, abnormal ops, the raw batches whose iterations all lie before them, the
        records of such batches (of sources that number their batches: a resend of one at or
        below the source's highest pruned ``seq`` is answered as a duplicate that stored
        nothing), and all but the :data:`VERDICTS_KEPT` latest verdicts. Returns the rows
        deleted per table (raw_batches: raw payloads)."""
        first = self.first_of_last(job, keep)
        if first is None:
            return {}
        with self._tx() as db:
            out = _delete_blocks(db, "job=? AND iteration<?", (job, first))
            out["raw_iterations"] = db.execute(
                "DELETE FROM raw_iterations WHERE job=? AND iteration<?", (job, first)).rowcount
            out["raw_batches"] = db.execute(
                "DELETE FROM raw WHERE job=? AND (source, batch_id) IN (SELECT source, batch_id "
                "FROM batches WHERE job=? AND last_iteration<?)", (job, job, first)).rowcount
            # the watermark first: it answers for the records deleted next
            gone = "job=? AND last_iteration<? AND seq IS NOT NULL"
            for source, seq in db.execute(f"SELECT source, max(seq) FROM batches WHERE {gone} "
                                          "GROUP BY source", (job, first)).fetchall():
                db.execute("UPDATE sources SET pruned_seq=max(pruned_seq, ?) WHERE job=? AND "
                           "source=?", (seq, job, source))
            out["batches"] = db.execute(f"DELETE FROM batches WHERE {gone}",
                                        (job, first)).rowcount
            out["verdicts"] = db.execute(
                "DELETE FROM verdicts WHERE job=? AND version<=(SELECT max(version) FROM "
                "verdicts WHERE job=?)-?", (job, job, VERDICTS_KEPT)).rowcount
        self._reclaim()
        return {table: n for table, n in out.items() if n}

    def _reclaim(self) -> None:
        """Give the pages deletions freed back to the file system, so the file shrinks (a
        no-op for a database made before holmes_ml set it up for that: it reuses them)."""
        with self._lock:
            # executescript steps it to the end (execute frees a single page)
            self._db.executescript("PRAGMA incremental_vacuum;")

    def agent_data(self, job: str, last: int | None = None, abnormal_last: int | None = None,
                   upto: Callable[[pd.DataFrame], int | None] | None = None) -> dict[str, Any]:
        """What agents sent for ``job``: iteration summaries, abnormal ops, groups, ranks;
        with ``last``, the iteration summaries and abnormal ops of its ``last`` most recent
        iterations only (:meth:`first_of_last`); with ``abnormal_last``, the abnormal ops of
        the ``abnormal_last`` most recent of those iterations that have any - counted back
        from the iteration ``upto`` names given the iteration summaries read (the last
        irregular one), when that lies before them, and then with every later one too (the
        localizer's window, :func:`holmes_ml.localize.rules.localize_records`)."""
        since = self._since(job, last)
        with self._lock:
            it = self._iterations(job, since)
            since_ab = self._abnormal_since(job, since, abnormal_last) if abnormal_last else since
        # (outside the lock: ingest need not wait for the irregularity monitor)
        until = upto(it) if upto is not None and since_ab > since else None
        with self._lock:
            if abnormal_last and until is not None and until < since_ab:
                since_ab = self._abnormal_since(job, since, abnormal_last, until)
            # (no later iteration than the summaries read: a batch may have come meanwhile)
            newest = int(it["iteration"].max()) if len(it) else _LAST_ITERATION
            blobs = self._db.execute("SELECT rows FROM abnormal_records WHERE job=? AND "
                                     "iteration>=? AND iteration<=?",
                                     (job, since_ab, newest)).fetchall()
            ab = _abnormal_frame(np.frombuffer(b"".join(b for (b,) in blobs),
                                               dtype=_ABNORMAL_ROW), self._names(job))
            groups = self._db.execute(
                "SELECT name, kind, ranks FROM groups WHERE job=? ORDER BY name", (job,)
            ).fetchall()
            ranks = pd.read_sql_query(
                "SELECT rank, host, gpu, dp, pp, tp, cp, ep FROM ranks WHERE job=? ORDER BY rank",
                self._db,
                params=(job,),
            )
        return {
            "iterations": it,
            "abnormal": ab,
            "groups": {n: (k, member_ranks(r)) for n, k, r in groups},
            "ranks": ranks,
        }

    def _abnormal_since(self, job: str, since: int, n: int, until: int | None = None) -> int:
        """The earliest of ``job``'s ``n`` most recent iterations from ``since`` on (up to
        ``until``) that have abnormal operators; ``since`` when none has."""
        (oldest,) = self._db.execute(
            "SELECT min(iteration) FROM (SELECT DISTINCT iteration FROM abnormal_records "
            "WHERE job=? AND iteration>=? AND iteration<=? ORDER BY iteration DESC LIMIT ?)",
            (job, since, _LAST_ITERATION if until is None else int(until), int(n))).fetchone()
        return since if oldest is None else int(oldest)

    def _names(self, job: str) -> np.ndarray:
        """``job``'s names (the strings of its abnormal operators) by number."""
        rows = self._db.execute("SELECT id, text FROM names WHERE job=?", (job,)).fetchall()
        names = np.empty(max((i for i, _ in rows), default=-1) + 1, dtype=object)
        for i, text in rows:
            names[i] = text
        return names

    def iteration_summaries(self, job: str, last: int | None = None) -> pd.DataFrame:
        """The ``iterations`` part of :meth:`agent_data` alone."""
        since = self._since(job, last)
        with self._lock:
            return self._iterations(job, since)

    def _iterations(self, job: str, since: int) -> pd.DataFrame:
        blocks = self._db.execute(
            "SELECT iteration, n, rows FROM iteration_blocks WHERE job=? AND iteration>=? "
            "ORDER BY iteration", (job, since)).fetchall()
        # by iteration, then by each block's first rank: agents that each hold a range of
        # ranks (a host's GPUs) then come in rank order, and nothing needs sorting
        blocks.sort(key=lambda b: (b[0], int.from_bytes(b[2][:8], "little", signed=True)))
        # every field is 8 bytes: the rows as an (n, fields) array of int64 gather and slice fast
        rows = np.frombuffer(b"".join(b[2] for b in blocks), dtype="<i8").reshape(
            -1, len(_SUMMARY_FIELDS))
        iteration = np.repeat(np.fromiter((b[0] for b in blocks), np.int64, len(blocks)),
                              np.fromiter((b[1] for b in blocks), np.int64, len(blocks)))
        step, up = np.diff(iteration), np.diff(rows[:, 0])
        if not np.all((step > 0) | ((step == 0) & (up > 0))):  # agents' ranks interleave
            order = np.lexsort((rows[:, 0], iteration))
            rows, iteration = rows[order], iteration[order]
        out = {"iteration": iteration}
        for k, name in enumerate(_SUMMARY_FIELDS):
            out[name] = rows[:, k].view(_SUMMARY_ROW[name])
        frame = pd.DataFrame(out, columns=list(_SUMMARY_COLUMNS))
        blocks = self._db.execute(
            "SELECT iteration, n, rows FROM compute_blocks WHERE job=? AND iteration>=?",
            (job, since)).fetchall()
        if not blocks:
            return frame
        # the agents' compute times, as the column compute_us (NaN for a rank sent without)
        compute = np.frombuffer(b"".join(b[2] for b in blocks), dtype=_COMPUTE_ROW)
        return frame.merge(pd.DataFrame({
            "iteration": np.repeat(np.fromiter((b[0] for b in blocks), np.int64, len(blocks)),
                                   np.fromiter((b[1] for b in blocks), np.int64, len(blocks))),
            "rank": compute["rank"], "compute_us": compute["compute_us"]}),
            on=["iteration", "rank"], how="left")

    def _since(self, job: str, last: int | None) -> int:
        """The first iteration of the window :meth:`first_of_last` gives
        (:data:`_EVERY_ITERATION` for every one)."""
        first = self.first_of_last(job, last)
        return _EVERY_ITERATION if first is None else first

    def raw_ops(self, job: str, last: int | None = None) -> pd.DataFrame:
        """The raw records of ``job`` in arrival order, as one canonical table; with ``last``,
        those of its ``last`` most recent iterations only (:meth:`first_of_last`): the batches
        that hold none of them are not read."""
        since = self._since(job, last)
        # a batch whose iterations are not known (its records have no iteration column) is
        # always read
        rows = self._query(
            "SELECT r.payload FROM raw r LEFT JOIN batches b ON b.job=r.job AND b.source=r.source "
            "AND b.batch_id=r.batch_id WHERE r.job=? AND (b.last_iteration IS NULL OR "
            "b.last_iteration>=?) ORDER BY r.rowid", (job, since)
        )
        tables = [pa.ipc.open_stream(pa.py_buffer(r[0])).read_all() for r in rows]
        if not tables:
            return pd.DataFrame()
        out = pa.concat_tables(tables, promote_options="default").to_pandas()
        if since != _EVERY_ITERATION:
            out = out[out["iteration"] >= since].reset_index(drop=True)
        return out

    def latest_verdict(self, job: str) -> dict | None:
        rows = self._query(
            "SELECT version, computed_at, data_batches, topology_version, body FROM verdicts "
            "WHERE job=? ORDER BY version DESC LIMIT 1", (job,),
        )
        if not rows:
            return None
        version, at, data_batches, topology_version, body = rows[0]
        return {"version": int(version), "computed_at": float(at),
                "data_batches": int(data_batches), "topology_version": int(topology_version),
                "verdict": json.loads(body)}

    def used_bytes(self) -> int:
        """Bytes of the database file in use: its pages less the free ones (which
        :meth:`prune` and :meth:`delete_job` give back to the file system, in a database made
        by this version; SQLite reuses them in an older one)."""
        (pages,), (free,), (size,) = (self._query(f"PRAGMA {p}")[0]
                                      for p in ("page_count", "freelist_count", "page_size"))
        return (pages - free) * size

    def counts(self) -> dict[str, int]:
        """Row counts per table (for tests and health checks)."""
        out = {}
        with self._lock:
            for table in ("batches", "iterations", "abnormal", "raw", "verdicts"):
                out[table] = (_block_rows(self._db, _BLOCKS[table], "1", ()) if table in _BLOCKS
                              else int(self._query(f"SELECT count(*) FROM {table}")[0][0]))
            out["raw_records"] = int(self._query("SELECT coalesce(sum(n), 0) FROM raw")[0][0])
        return out
