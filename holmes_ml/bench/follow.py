"""``holmes bench follow``: what one poll of a node agent costs as its ranks' logs grow.

A node agent reads, at every poll, what its ranks' log files gained. This bench grows the logs
of one host (8 ranks, one file each) an iteration at a time and, after each, times (CPU) the
agent's read of what was added (:meth:`holmes_ml.serve.agent.Agent.read_new`: read, parse,
validate), then lets it summarize and queue the complete iterations (not timed; no service:
the batches stay in its outbox), as a following agent does. It does this for each log format
an agent follows as it grows: Arrow IPC streams (the logger's default), JSON lines and CSV.

A poll whose cost stays flat while the files grow reads only what they gained;
``*_read_growth`` (the median read of the last tenth of the polls over that of the first
tenth) says so. Beside them, ``arrow_reread_*`` times reading each Arrow file whole at every
poll, which is what the agent did before it followed streams a batch at a time.

Then JSON-lines logs are grown again and rotated 14 times (every 10 polls by default) as
logrotate does with ``dateext``, ``extension .jsonl`` and ``compress``: each rank's log renamed and
compressed at once to ``rank0-0001.jsonl.gz``, a new one begun. ``rotated_rotation_*`` times the
polls that find new archives (each read once, on its own, its rows read already as the log grew
dropped), ``rotated_read_*`` the others; a rotation poll whose cost grows with the archives kept
would be reading them all again. ``read_points_5760_archives_ms_*`` is the CPU a batch spends
keeping the read points of 5,760 archives read already (hourly rotations of 8 ranks' logs for 30
days): the first batch writes them all, the next only those that changed (none);
``idle_poll_5760_archives_ms`` the CPU of a poll that finds nothing new beside them, and
``first_read_960_archives_s`` that of a new agent reading 960 such small archives.

Then, once every format was followed (``peak_rss_mb_following``), each agent stops and a new
one on its outbox catches up (``*_restart_*``: CPU time and rows of its reads until the logs
hold nothing new for it): first reading each log on from the point the outbox kept (and, of
the rotated logs' archives, only those holding rows of the context the next batches need),
then, the points deleted, from each log's start, as agents did before they kept points (a chunk
at a time, as an agent catching up reads; every archive whole, its rows dropped as queued
already and not counted); the peak resident memory is taken after each kind of restart, in
every format.
Neither may queue anything: every complete iteration was queued before. Last, the rotated logs'
archives are made to look two days old and a new agent with its own outbox is started on them
with ``--since 1h`` (``rotated_since_*``: CPU seconds until it queued what it read, its rows, the
files it left out): it reads the live logs only, where one without ``--since`` reads every archive
as well (``rotated_restart_from_start_*`` reads them all too).

The rows are synthetic but shaped like a tensor-parallel group's: three collective types over
one 8-rank communicator, seeded sizes, starts and durations.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from holmes_ml.bench.record import BenchResult, peak_rss_mb
from holmes_ml.collect.writer import COLUMNS, FORMATS, RowSink

RANKS = 8
_OPS = ("all_reduce", "all_gather", "reduce_scatter")
_SUFFIX = {**FORMATS, "csv": ".csv"}


def _iteration(it: int, rows: int, rng: np.random.Generator) -> dict[int, pd.DataFrame]:
    """One iteration's rows of every rank: the same collectives on each, started and ended
    within microseconds of each other."""
    k = np.arange(rows)
    op = np.asarray(_OPS, dtype=object)[rng.integers(0, len(_OPS), rows)]
    nbytes = rng.choice([1 << 16, 1 << 20, 1 << 24], rows)
    start = 10**18 + it * 10**9 + k * 50_000
    out = {}
    for r in range(RANKS):
        out[r] = pd.DataFrame({
            "iteration": it, "rank": r, "op": op, "group": "tp-0", "seq": it * rows + k,
            "nbytes": nbytes, "start_ns": start + rng.integers(0, 2_000, rows),
            "duration_us": rng.gamma(4.0, 10.0, rows),
            "group_ranks": " ".join(map(str, range(RANKS))), "group_kind": "tp", "peer": -1,
            "host": "node0000", "job": "bench"})
    return out


def _append(path: Path, fmt: str, df: pd.DataFrame, sinks: dict) -> None:
    if fmt == "csv":
        df.to_csv(path, mode="a", header=not path.exists(), index=False)
        return
    if path not in sinks:
        sinks[path] = RowSink(path, fmt)
    sinks[path].write({c: df[c].to_numpy() for c in COLUMNS})


def _follow(fmt: str, steps: int, rows: int, root: Path, reread: bool = False,
            every: int = 0, name: str | None = None) -> dict[str, Any]:
    """Grow a host's logs in ``fmt`` for ``steps`` iterations; CPU seconds of each poll. With
    ``every``, rotate them every ``every`` polls as logrotate does with ``dateext``,
    ``extension .jsonl`` and ``compress`` (renamed to ``rank0-0001.jsonl``, compressed to
    ``rank0-0001.jsonl.gz`` at once, a new ``rank0.jsonl`` begun): the polls that found new
    archives are timed apart (``rotated_s``)."""
    import gzip

    from holmes_ml.io.readers import read_arrow_stream
    from holmes_ml.serve.agent import Agent, AgentConfig

    logs = root / (name or fmt) / "logs"
    logs.mkdir(parents=True)
    cfg = AgentConfig(follow=logs, server="http://127.0.0.1:9", job="bench", source="node0000",
                      outbox=root / (name or fmt) / "outbox.db")
    agent = Agent(cfg, model="rule")
    sinks: dict = {}
    rng = np.random.default_rng(0)
    read_s: list[float] = []
    rotated_s: list[float] = []
    reread_s: list[float] = []
    read_rows: list[int] = []
    sizes: list[int] = []
    archives = 0
    # (each rotation is warned of, rank by rank: the rows a log compressed at once gained
    # since the last poll are lost unless its archive holds them, as here)
    quiet = logging.getLogger("holmes_ml.serve.agent")
    level = quiet.level
    if every:
        quiet.setLevel(logging.ERROR)
    try:
        for it in tqdm(range(steps), desc=f"follow {name or fmt}", unit="poll", leave=False):
            paths = [logs / f"rank{r}{_SUFFIX[fmt]}" for r in range(RANKS)]
            rotated = every > 0 and it > 0 and it % every == 0
            if rotated:
                archives += 1
                for sink in sinks.values():
                    sink.close()
                sinks.clear()
                for path in paths:
                    moved = path.rename(logs / f"{path.stem}-{archives:04d}{path.suffix}")
                    with gzip.open(f"{moved}.gz", "wb", compresslevel=6) as fh:
                        fh.write(moved.read_bytes())
                    moved.unlink()
            for r, df in _iteration(it, rows, rng).items():
                _append(paths[r], fmt, df, sinks)
            t0 = time.process_time()
            n = agent.read_new()
            (rotated_s if rotated else read_s).append(time.process_time() - t0)
            read_rows.append(n)
            agent.queue_ready()
            if reread:
                t0 = time.process_time()
                for p in paths:
                    read_arrow_stream(p).to_pandas()
                reread_s.append(time.process_time() - t0)
            sizes.append(sum(p.stat().st_size for p in paths))
        queued = agent.outbox.watermarks()
    finally:
        quiet.setLevel(level)
        for sink in sinks.values():
            sink.close()
        agent.close()
    return {"read_s": read_s, "rotated_s": rotated_s, "reread_s": reread_s, "rows": read_rows,
            "bytes": sizes, "archives": archives, "watermarks": queued, "config": cfg}


def _many_points(root: Path, archives: int) -> dict[str, float]:
    """CPU milliseconds an agent spends per batch keeping the read points of ``archives``
    archives read already (a long run's hourly rotations: 8 ranks x 30 days is 5,760): the
    first batch, which writes them all, and the next, where none changed. The archives' states
    are made up (reading thousands of files is not what is timed); the points are what
    :meth:`~holmes_ml.serve.agent.Agent.queue_ready` keeps and queues with each batch."""
    from holmes_ml.serve.agent import _ARCHIVE, Agent, AgentConfig, _FileState

    logs = root / "points"
    logs.mkdir(parents=True)
    agent = Agent(AgentConfig(follow=logs, server="http://127.0.0.1:9", job="bench"),
                  model="rule")
    try:
        for i in range(archives):
            state = _FileState(kind=_ARCHIVE, stamp=(1 << 20, i), top=i,
                               ranks=frozenset({i % RANKS}))
            state.points = (state.point(),)
            agent._files[logs / f"rank{i % RANKS}-{i:05d}.jsonl.gz"] = state
        marks = {r: archives + agent.config.history for r in range(RANKS)}
        out = {}
        for which in ("first", "next"):
            t0 = time.process_time()
            agent.outbox.enqueue("node0000", {}, marks, [], [], None, agent._keep_points(marks))
            out[which] = (time.process_time() - t0) * 1e3
        if len(agent.outbox.read_points()) != archives:
            raise RuntimeError("bench follow: the outbox does not hold every archive's point")
    finally:
        agent.close()
    return out


def _archives(root: Path, archives: int) -> Path:
    """A directory of ``archives`` archives of rotated logs (a few rows each: hourly rotations
    of 8 ranks' logs, ``rank0-00001.jsonl.gz``) beside 8 live logs."""
    import gzip

    logs = root / f"archives-{archives}"
    logs.mkdir(parents=True)
    rows = _iteration(0, 4, np.random.default_rng(0))
    texts = {r: df.to_json(orient="records", lines=True).encode() for r, df in rows.items()}
    for i in range(archives):
        path = logs / f"rank{i % RANKS}-{i // RANKS:05d}.jsonl.gz"
        path.write_bytes(gzip.compress(texts[i % RANKS], mtime=0))
    for r, text in texts.items():
        (logs / f"rank{r}.jsonl").write_bytes(text)
    return logs


def _idle_polls(root: Path, archives: int, polls: int = 7) -> float:
    """Median CPU milliseconds of a poll that finds nothing new, with ``archives`` archives of
    rotated logs read already beside 8 live logs (hourly rotations of 8 ranks for 30 days is
    5,760): what an agent costs its host between iterations. The archives are real files (a
    few rows each); their states are made up as those of archives read (reading them all is
    not what is timed), and a first poll looks at each file's format once."""
    from holmes_ml.serve.agent import _ARCHIVE, Agent, AgentConfig, _FileState

    logs = _archives(root, archives)
    agent = Agent(AgentConfig(follow=logs, server="http://127.0.0.1:9", job="bench",
                              outbox=root / f"idle-{archives}.db"), model="rule")
    try:
        for path in logs.glob("*.gz"):
            st = path.stat()
            agent._files[path] = _FileState(kind=_ARCHIVE, stamp=(st.st_size, st.st_mtime_ns))
        agent.read_new()  # (each archive's format looked at, the live logs read)
        seconds = []
        for _ in range(polls):
            t0 = time.process_time()
            if agent.read_new():
                raise RuntimeError("bench follow: an idle poll read rows")
            seconds.append(time.process_time() - t0)
    finally:
        agent.close()
    return float(np.median(seconds)) * 1e3


def _first_read(root: Path, archives: int) -> float:
    """CPU seconds of a new agent (no outbox) reading ``archives`` archives of rotated logs
    and 8 live logs until it has read them all (:meth:`~holmes_ml.serve.agent.Agent.read_all`;
    what it read is not summarized)."""
    from holmes_ml.serve.agent import Agent, AgentConfig

    logs = _archives(root, archives)
    t0 = time.process_time()
    agent = Agent(AgentConfig(follow=logs, server="http://127.0.0.1:9", job="bench",
                              outbox=root / f"first-{archives}.db"), model="rule")
    try:
        agent.read_all()
        seconds = time.process_time() - t0
    finally:
        agent.close()
    return seconds


def _restart(cfg, keep_points: bool) -> dict[str, float]:
    """A new agent on ``cfg``'s outbox reads until the logs hold nothing new for it: CPU
    seconds and rows (with the outbox's read points, or with them deleted)."""
    import sqlite3

    from holmes_ml.serve.agent import Agent

    if not keep_points:
        with sqlite3.connect(cfg.outbox) as db:
            db.execute("DELETE FROM read_point")
    t0 = time.process_time()
    agent = Agent(cfg, model="rule")
    try:
        rows = agent.read_all()  # (a huge log is caught up over a few polls)
        if agent.queue_ready() is not None or agent.stats.batches_queued:
            raise RuntimeError("bench follow: a restarted agent queued a batch again")
        seconds = time.process_time() - t0
        resumed = agent.resumed
    finally:
        agent.close()
    return {"seconds": seconds, "rows": rows, "logs_resumed": resumed}


def _since(cfg, root: Path) -> dict[str, float]:
    """A new agent (its own outbox) started with ``--since 1h`` on the rotated logs, their
    archives made to look two days old: CPU seconds until it queued what it read, its rows,
    and the files it left out."""
    import os
    from dataclasses import replace

    from holmes_ml.serve.agent import Agent

    then = time.time() - 2 * 86400
    for archive in Path(cfg.follow).glob("*.gz"):
        os.utime(archive, (then, then))
    t0 = time.process_time()
    agent = Agent(replace(cfg, outbox=root / "since.db", since_s=3600.0), model="rule",
                  say=lambda line: None)
    try:
        rows = agent.read_all()
        agent.queue_ready(flush=True)
        seconds = time.process_time() - t0
        left_out = len(agent.too_old)
    finally:
        agent.close()
    return {"s": round(seconds, 3), "rows": rows, "files_left_out": left_out}


def _tenths(seconds: list[float], least: int = 3) -> tuple[float, float]:
    """Median of the first and of the last tenth of ``seconds`` (at least ``least`` polls
    each)."""
    k = max(least, len(seconds) // 10)
    return float(np.median(seconds[:k])), float(np.median(seconds[-k:]))


def run(quick: bool = False, polls: int | None = None, rows: int | None = None
        ) -> BenchResult:
    """Grow one host's logs and time each poll of its agent, per format: ``polls`` iterations
    of ``rows`` operators a rank (by default 150 of 2,048; ``quick``: 30 of 512)."""
    steps = polls or (30 if quick else 150)
    rows = rows or (512 if quick else 2048)
    figures: dict[str, float] = {}
    details: dict[str, dict] = {}
    table = []
    restarts: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="holmes-bench-follow-") as tmp:
        for fmt in ("arrow", "jsonl", "csv"):
            got = _follow(fmt, steps, rows, Path(tmp), reread=fmt == "arrow")
            if sum(got["rows"]) != steps * rows * RANKS:
                raise RuntimeError(f"bench follow: the {fmt} agent read {sum(got['rows']):,} "
                                   f"rows of {steps * rows * RANKS:,}")
            first, last = _tenths(got["read_s"])
            per_row = sum(got["read_s"]) / sum(got["rows"]) * 1e6
            figures.update({f"{fmt}_read_ms_first": round(first * 1e3, 2),
                            f"{fmt}_read_ms_last": round(last * 1e3, 2),
                            f"{fmt}_read_growth": round(last / first, 2),
                            f"{fmt}_read_us_per_row": round(per_row, 3),
                            f"{fmt}_mb": round(got["bytes"][-1] / 2**20, 1)})
            table.append({"format": fmt, "first tenth ms": round(first * 1e3, 2),
                          "last tenth ms": round(last * 1e3, 2),
                          "growth": round(last / first, 2), "µs per row": round(per_row, 3),
                          "MB at the end": round(got["bytes"][-1] / 2**20, 1)})
            if got["reread_s"]:
                first, last = _tenths(got["reread_s"])
                figures.update({"arrow_reread_ms_first": round(first * 1e3, 2),
                                "arrow_reread_ms_last": round(last * 1e3, 2),
                                "arrow_reread_growth": round(last / first, 2)})
                table.append({"format": "arrow, read whole at every poll",
                              "first tenth ms": round(first * 1e3, 2),
                              "last tenth ms": round(last * 1e3, 2),
                              "growth": round(last / first, 2), "µs per row": None,
                              "MB at the end": round(got["bytes"][-1] / 2**20, 1)})
            details[fmt] = got
        every = max(2, steps // 15)
        got = details["rotated"] = _follow("jsonl", steps, rows, Path(tmp), every=every,
                                           name="rotated")
        if got["watermarks"] != {r: steps - 2 for r in range(RANKS)}:
            raise RuntimeError(f"bench follow: the agent of the rotated logs queued up to "
                               f"{got['watermarks']}, expected iteration {steps - 2} of "
                               f"every rank")
        for what, seconds in (("read", got["read_s"]), ("rotation", got["rotated_s"])):
            first, last = _tenths(seconds, 2)
            figures.update({f"rotated_{what}_ms_first": round(first * 1e3, 2),
                            f"rotated_{what}_ms_last": round(last * 1e3, 2),
                            f"rotated_{what}_growth": round(last / first, 2)})
            table.append({"format": "jsonl, rotated and compressed every "
                                    f"{every} polls: " + ("other polls" if what == "read" else
                                                          "polls finding new archives"),
                          "first tenth ms": round(first * 1e3, 2),
                          "last tenth ms": round(last * 1e3, 2),
                          "growth": round(last / first, 2), "µs per row": None,
                          "MB at the end": None})
        figures["rotated_archives"] = got["archives"] * RANKS
        points = _many_points(Path(tmp), 5760)
        figures.update({"read_points_5760_archives_ms_first": round(points["first"], 2),
                        "read_points_5760_archives_ms_next": round(points["next"], 2),
                        "idle_poll_5760_archives_ms": round(_idle_polls(Path(tmp), 5760), 2),
                        "first_read_960_archives_s": round(_first_read(Path(tmp), 960), 3)})
        # (after every format was followed: the peak of following is told apart)
        figures["peak_rss_mb_following"] = round(peak_rss_mb(), 1)
        for how, key, peak in (("from its point", "restart", "from_points"),
                               ("from the start", "restart_from_start", "from_start")):
            for fmt, got in details.items():
                r = got.setdefault("restart", {})[how] = _restart(
                    got["config"], keep_points=how == "from its point")
                figures.update({f"{fmt}_{key}_s": round(r["seconds"], 3),
                                f"{fmt}_{key}_rows": r["rows"]})
                restarts.append({"format": fmt, "read on": how,
                                 "logs read on from a point": r["logs_resumed"],
                                 "rows read": r["rows"], "CPU s": round(r["seconds"], 3)})
            figures[f"peak_rss_mb_after_restarts_{peak}"] = round(peak_rss_mb(), 1)
        r = details["rotated"]["since"] = _since(details["rotated"]["config"], Path(tmp))
        figures.update({f"rotated_since_{k}": v for k, v in r.items()})
        for got in details.values():
            del got["config"]
    figures["peak_rss_mb"] = round(peak_rss_mb(), 1)
    return BenchResult(
        name="follow", figures=figures,
        config={"ranks": RANKS, "polls": steps, "rows_per_rank_per_poll": rows, "quick": quick,
                "summarize": "rule (not timed)", "rotated_every_polls": every,
                "method": "CPU time of Agent.read_new after each iteration is appended to "
                          "every rank's file; medians of the first and last tenth of polls"},
        goals={"arrow_read_growth": "<= 1.5", "rotated_rotation_growth": "<= 1.5"},
        details=details,
        tables={"one agent poll as the logs grow": table,
                "a restarted agent catching up": restarts},
    )
