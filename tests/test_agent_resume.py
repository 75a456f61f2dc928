"""A restarted agent reads each log on from a point its outbox kept, not from the log's start,
and builds the batches an agent that never stopped builds; a log rotated while no agent ran is
read on in its rotated file, so its last rows are not lost."""

from __future__ import annotations

import gzip
import json
import logging
import sqlite3
import time

import pytest
from test_agent_robustness import _all_shipped_once, _rank0_being_written, _Writer
from test_serve_support import TOKEN, fallback_summarize, make_ops, start_server

from holmes_ml.serve.agent import Agent, AgentConfig, Outbox

#: Context iterations the agents of these tests give the detector (the default is 10).
HISTORY = 3


def _agent_at(logs, outbox, history: int = HISTORY) -> Agent:
    # never sends: the batches are read from the outbox
    cfg = AgentConfig(follow=logs, server="http://127.0.0.1:9", job="resume", source="n1",
                      outbox=outbox, history=history)
    return Agent(cfg, summarize=fallback_summarize)


def _batches(outbox) -> list[dict]:
    with sqlite3.connect(outbox) as db:
        bodies = [json.loads(gzip.decompress(b)) for (b,) in
                  db.execute("SELECT body FROM outbox ORDER BY seq")]
    return [{k: v for k, v in b.items() if k not in ("seq", "batch_id")} for b in bodies]


def _step(agent: Agent) -> None:
    agent.read_new()
    agent.queue_ready()


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "arrows"])
def test_a_restarted_agent_reads_on_from_its_kept_point_and_builds_the_same_batches(
        tmp_path, fmt):
    ops = make_ops(seed=41, ranks=2, iterations=24).assign(job="")
    runs = {}
    for name in ("never stopped", "restarted"):
        logs = tmp_path / name / "logs"
        logs.mkdir(parents=True)
        writers = [_Writer(logs / f"rank{r}.{fmt}", fmt) for r in (0, 1)]
        outbox = tmp_path / name / "outbox.db"
        agent = _agent_at(logs, outbox)
        for i in range(24):  # a live job: one iteration a poll
            for r, w in enumerate(writers):
                w.write(ops[(ops["rank"] == r) & (ops["iteration"] == i)])
            if i == 14 and name == "restarted":
                agent.close()
                agent = _agent_at(logs, outbox)
                # each log's point: after iteration 9, the last one before which every row
                # was queued (the watermark is 12 after iteration 13's poll) and older than
                # the context the next batch needs (HISTORY iterations before the watermark)
                assert agent.resumed == 2
                assert "2 log(s) read on from where its last run stopped" in \
                    agent.starting_message  # (its first line on stderr)
                _step(agent)
                assert agent.stats.ops_read == ((ops["iteration"] > 9)
                                                & (ops["iteration"] <= 14)).sum()
                continue
            _step(agent)
        for w in writers:
            w.close()
        agent.read_new()
        agent.queue_ready(flush=True)
        agent.close()
        runs[name] = _batches(outbox)
    assert runs["restarted"] == runs["never stopped"]
    assert {i for b in runs["restarted"] for i in b["iterations"]["iteration"]} == set(range(24))


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "arrows"])
def test_a_log_rotated_while_no_agent_ran_loses_no_row_and_ships_none_twice(tmp_path, caplog,
                                                                             fmt):
    """The agent stops; its rank's log gains rows, is renamed (to a name the logs do not
    match) and gains more there before its writer opens the name again. Read from the new
    file alone, the rows written to the old one after the agent stopped were lost."""
    ops, logs, r0, writer = _rank0_being_written(tmp_path, 43, fmt)  # iterations 0-3 written
    steps, log = r0["iteration"], writer.path
    srv = start_server(tmp_path)
    cfg = AgentConfig(follow=logs, server=srv.url, job="downtime", token=TOKEN, source="n1",
                      backoff_s=0.05, timeout_s=5, history=1)
    agent = Agent(cfg, summarize=fallback_summarize)
    try:
        for i in range(4, 7):  # one iteration a poll
            agent.read_new()
            agent.queue_ready()
            writer.write(r0[steps == i])
        agent.run(once=True)
        agent.close()
        writer.write(r0[steps == 7])  # no agent runs from here
        log.rename(logs / f"rank0.{fmt}.1")
        writer.write(r0[steps == 8])
        writer.close()
        writer.reopen()
        writer.write(r0[steps >= 9])
        writer.close()
        agent = Agent(cfg, summarize=fallback_summarize)  # (the same outbox)
        assert agent.resumed >= 1
        with caplog.at_level(logging.INFO, logger="holmes_ml.serve.agent"):
            agent.run(once=True)
        assert f"rank0.{fmt} was rotated to rank0.{fmt}.1: read on there" in caplog.text
        assert "are lost" not in caplog.text and "are not read" not in caplog.text
        _all_shipped_once(agent, srv, "downtime", ops)
    finally:
        agent.close()
        srv.stop()


def test_points_kept_for_less_context_than_the_agent_now_gives_are_not_used(tmp_path):
    ops = make_ops(seed=44, ranks=1, iterations=12).assign(job="")
    logs = tmp_path / "logs"
    logs.mkdir()
    writer = _Writer(logs / "rank0.jsonl", "jsonl")
    agent = _agent_at(logs, tmp_path / "o.db", history=2)
    for i in range(12):
        writer.write(ops[ops["iteration"] == i])
        _step(agent)
    agent.close()
    writer.close()
    # the point was chosen for 2 iterations of context: read from the start for 4
    agent = _agent_at(logs, tmp_path / "o.db", history=4)
    assert agent.resumed == 0
    agent.read_new()
    assert agent.stats.ops_read == len(ops)
    agent.close()
    agent = _agent_at(logs, tmp_path / "o.db", history=2)
    assert agent.resumed == 1
    agent.close()


def test_an_outbox_of_an_earlier_version_has_no_points_and_its_logs_are_read_from_the_start(
        tmp_path):
    ops = make_ops(seed=45, ranks=1, iterations=6).assign(job="")
    logs = tmp_path / "logs"
    logs.mkdir()
    ops.to_json(logs / "rank0.jsonl", orient="records", lines=True)
    Outbox(tmp_path / "o.db").close()
    with sqlite3.connect(tmp_path / "o.db") as db:  # an earlier version's: no read points
        db.execute("DROP TABLE read_point")
        db.execute("INSERT INTO watermark VALUES (0, 3)")
    agent = _agent_at(logs, tmp_path / "o.db")
    assert agent.resumed == 0
    agent.read_new()
    assert agent.stats.ops_read == len(ops)
    agent.queue_ready(flush=True)
    # (what the watermark says was queued is not queued again)
    assert {i for b in _batches(tmp_path / "o.db") for i in b["iterations"]["iteration"]} == {4, 5}
    agent.close()


def test_a_log_whose_iteration_never_ends_holds_a_bounded_number_of_points(tmp_path,
                                                                           monkeypatch):
    import holmes_ml.serve.agent as agent_module

    monkeypatch.setattr(agent_module, "_MAX_POINTS", 4)
    ops = make_ops(seed=46, ranks=1, iterations=1, ops_per_iter=40).assign(job="")
    logs = tmp_path / "logs"
    logs.mkdir()
    writer = _Writer(logs / "rank0.jsonl", "jsonl")
    agent = _agent_at(logs, tmp_path / "o.db")
    try:
        for k in range(20):  # one iteration that never completes: no point qualifies
            writer.write(ops.iloc[2 * k: 2 * k + 2])
            _step(agent)
        points = agent._files[logs / "rank0.jsonl"].points
        assert 2 <= len(points) <= 4
        first = len(ops.iloc[:2].to_json(orient="records", lines=True))
        assert points[0].offset == first  # the earliest, the first to qualify, is kept
    finally:
        writer.close()
        agent.close()


def _small_chunks(monkeypatch, chunk: int = 4096, least: int = 1024) -> None:
    """Chunks of a few kB, so that logs of a few dozen rows take several."""
    import holmes_ml.serve.agent as agent_module

    monkeypatch.setattr(agent_module, "_MAX_CHUNK", chunk)
    monkeypatch.setattr(agent_module, "_MIN_CHUNK", least)
    monkeypatch.setattr(agent_module, "_ARROW_DENSITY", 2)  # (these streams: few rows)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "arrows"])
def test_once_ships_every_log_to_its_end_however_many_chunks_it_takes(tmp_path, monkeypatch,
                                                                       fmt):
    """``--once`` read one chunk of each log and shipped that, exiting 0 ("everything was
    sent"): of logs longer than a chunk (64 MiB), the rest waited for another run."""
    _small_chunks(monkeypatch)
    ops = make_ops(seed=47, ranks=2, iterations=12).assign(job="")
    logs = tmp_path / "logs"
    logs.mkdir()
    for r in (0, 1):
        writer = _Writer(logs / f"rank{r}.{fmt}", fmt)
        for i in range(12):  # (an Arrow stream of one batch per iteration)
            writer.write(ops[(ops["rank"] == r) & (ops["iteration"] == i)])
        writer.close()
    assert (logs / f"rank0.{fmt}").stat().st_size > 2 * 4096 // 2  # more than a poll reads
    srv = start_server(tmp_path)
    cfg = AgentConfig(follow=logs, server=srv.url, job="long", token=TOKEN, source="n1",
                      backoff_s=0.05, timeout_s=5)
    agent = Agent(cfg, summarize=fallback_summarize)
    try:
        agent.run(once=True)
        _all_shipped_once(agent, srv, "long", ops)
    finally:
        agent.close()
        srv.stop()


def test_a_poll_reads_a_share_of_the_chunk_from_each_log_and_says_it_is_behind(
        tmp_path, monkeypatch):
    """An agent catching up on its node's logs holds about one chunk's rows at a time, not
    one chunk per log."""
    _small_chunks(monkeypatch, chunk=8192)
    ops = make_ops(seed=48, ranks=4, iterations=12).assign(job="")
    logs = tmp_path / "logs"
    logs.mkdir()
    for r, sub in ops.groupby("rank"):
        sub.to_json(logs / f"rank{r}.jsonl", orient="records", lines=True)
    agent = _agent_at(logs, tmp_path / "o.db")
    try:
        polls = 0
        while agent.read_new():
            polls += 1
            assert agent.stats.raw_bytes <= polls * 8192  # a quarter of the chunk each
            agent.queue_ready()
        assert polls > 1 and not agent.behind
        assert agent.stats.ops_read == len(ops)
    finally:
        agent.close()


def test_a_following_agent_catches_up_without_pausing_between_chunks(tmp_path, monkeypatch):
    _small_chunks(monkeypatch)
    ops = make_ops(seed=49, ranks=2, iterations=12).assign(job="")
    logs = tmp_path / "logs"
    logs.mkdir()
    for r, sub in ops.groupby("rank"):
        sub.to_json(logs / f"rank{r}.jsonl", orient="records", lines=True)
    cfg = AgentConfig(follow=logs, server="http://127.0.0.1:9", job="resume", source="n1",
                      outbox=tmp_path / "o.db", poll_s=60, backoff_s=60)
    agent = Agent(cfg, summarize=fallback_summarize)
    deadline = time.monotonic() + 20
    try:
        # a pause of poll_s (60 s) between chunks would stop it at the deadline, rows unread
        agent.run(stop=lambda: agent.stats.ops_read == len(ops) or time.monotonic() > deadline)
        assert agent.stats.ops_read == len(ops)
    finally:
        agent.close()


def test_a_restarted_agent_does_not_read_again_the_archives_whose_rows_were_all_queued(
        tmp_path, monkeypatch):
    """Logs rotated and compressed at once every 4 iterations (``rank0-0001.jsonl.gz``): a
    restarted agent reads again only the archives holding rows of the context the next batches
    need, not every archive kept (which cost it a read of each, and the memory of all of
    them at once), and builds the batches an agent that never stopped builds."""
    from pathlib import Path

    from holmes_ml.io import readers

    read: list[str] = []
    native = readers.read_native
    monkeypatch.setattr(readers, "read_native", lambda p: read.append(Path(p).name) or native(p))
    ops = make_ops(seed=47, ranks=2, iterations=20).assign(job="")
    runs = {}
    for name in ("never stopped", "restarted"):
        logs = tmp_path / name / "logs"
        logs.mkdir(parents=True)
        outbox = tmp_path / name / "outbox.db"
        agent = _agent_at(logs, outbox)
        for i in range(20):  # a live job: one iteration a poll
            if i and i % 4 == 0:
                for r in (0, 1):
                    log = logs / f"rank{r}.jsonl"
                    (logs / f"rank{r}-{i // 4:04d}.jsonl.gz").write_bytes(
                        gzip.compress(log.read_bytes()))
                    log.unlink()
            for r in (0, 1):
                with (logs / f"rank{r}.jsonl").open("a") as fh:
                    fh.write(ops[(ops["rank"] == r) & (ops["iteration"] == i)].to_json(
                        orient="records", lines=True))
            if i == 14 and name == "restarted":
                agent.close()
                read.clear()
                agent = _agent_at(logs, outbox)
                _step(agent)
                # the watermark is 12 after iteration 13's poll, and the next batch needs the
                # HISTORY iterations before it: archives 1 and 2 (iterations 0-3 and 4-7) are
                # not read again, archive 3 (8-11) is
                assert sorted(read) == ["rank0-0003.jsonl.gz", "rank1-0003.jsonl.gz"]
                continue
            _step(agent)
        kept = {rel for rel, _ in agent.outbox.read_points()}
        assert {f"rank{r}-{k:04d}.jsonl.gz" for r in (0, 1) for k in (1, 2, 3)} <= kept
        for r in (0, 1):  # removed (logrotate's rotate count): its point is no longer kept
            (logs / f"rank{r}-0001.jsonl.gz").unlink()
        agent.read_new()
        agent.queue_ready(flush=True)
        kept = {rel for rel, _ in agent.outbox.read_points()}
        assert not any("-0001" in rel for rel in kept) and "rank0-0002.jsonl.gz" in kept
        agent.close()
        runs[name] = _batches(outbox)
    assert runs["restarted"] == runs["never stopped"]
    assert {i for b in runs["restarted"] for i in b["iterations"]["iteration"]} == set(range(20))


def test_the_outbox_writes_only_the_read_points_that_changed_and_keeps_them_all(tmp_path):
    """``enqueue`` replaces the read points as a whole (what is not given is dropped), writing
    only those that changed (thousands of archives' points are rewritten at no batch); a
    batch that fails to queue changes none, and the next one writes what it must."""
    outbox = Outbox(tmp_path / "outbox.db")
    try:
        outbox.enqueue("n1", {"b": 1}, {0: 1}, [], [], None, {"a": "1", "b": "2", "c": "3"})
        outbox.enqueue("n1", {"b": 2}, {0: 2}, [], [], None, {"a": "1", "b": "9", "d": "4"})
        assert outbox.read_points() == [("a", "1"), ("b", "9"), ("d", "4")]
        with pytest.raises(TypeError):  # (not JSON: the transaction is rolled back)
            outbox.enqueue("n1", {"b": object()}, {0: 3}, [], [], None, {"a": "5"})
        assert outbox.read_points() == [("a", "1"), ("b", "9"), ("d", "4")]
        outbox.enqueue("n1", {"b": 3}, {0: 3}, [], [], None, {"a": "1", "d": "4"})
        assert outbox.read_points() == [("a", "1"), ("d", "4")]
        outbox.enqueue("n1", {"b": 4}, {0: 4}, [], [], None)  # none given: kept as they are
        assert outbox.read_points() == [("a", "1"), ("d", "4")]
    finally:
        outbox.close()
    reopened = Outbox(tmp_path / "outbox.db")
    try:
        assert reopened.read_points() == [("a", "1"), ("d", "4")]
        reopened.enqueue("n1", {"b": 5}, {0: 5}, [], [], None, {"d": "4", "e": "6"})
        assert reopened.read_points() == [("d", "4"), ("e", "6")]
    finally:
        reopened.close()
