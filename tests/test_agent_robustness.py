"""The agent against bad logs, bad options and a service that is down: it says what is wrong,
keeps shipping what it can and never loses what it accepted."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pandas as pd
import pytest
from test_serve_cli import HOLMES, holmes, one_line_error
from test_serve_support import TOKEN, fallback_summarize, free_port, make_ops, start_server

from holmes_ml.serve.agent import Agent, AgentConfig, Outbox


def agent_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    # The timeout turns "never exits" into a failure instead of a hung test run.
    return subprocess.run([sys.executable, "-c", HOLMES, "agent", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def _agent(srv, logs, job: str) -> Agent:
    cfg = AgentConfig(follow=logs, server=srv.url, job=job, token=TOKEN, source="n1",
                      backoff_s=0.05, timeout_s=5)
    return Agent(cfg, summarize=fallback_summarize)


def _write_good(logs, ops):
    logs.mkdir(exist_ok=True)
    for r, sub in ops.groupby("rank"):
        sub.to_json(logs / f"rank{r}.jsonl", orient="records", lines=True)


def _write_bad(logs, ops):
    first = ops.iloc[:1].to_json(orient="records", lines=True).strip()
    # (a line that is no JSON is skipped as torn; a record of an unknown op is refused)
    # (one bad row among good ones is set aside, the rest read; here half the rows are bad,
    # and the file is refused whole)
    gossip = (first.replace('"all_reduce"', '"gossip"').replace('"reduce_scatter"', '"gossip"')
              .replace('"all_gather"', '"gossip"'))
    (logs / "bad.jsonl").write_text(first + "\n" + gossip + "\n" + gossip + "\n")
    ops.to_parquet(logs / "whole.parquet")
    (logs / "trunc.parquet").write_bytes((logs / "whole.parquet").read_bytes()[:3000])
    (logs / "whole.parquet").unlink()


def test_once_gives_up_on_a_down_service_and_the_next_run_sends_the_outbox(tmp_path):
    ops = make_ops(seed=21, ranks=4, iterations=6)
    logs = tmp_path / "logs"
    _write_good(logs, ops)
    port = free_port()  # nothing listens there yet
    url = f"http://127.0.0.1:{port}"
    args = ["--follow", logs, "--server", url, "--job", "down", "--token", TOKEN, "--once",
            "--model", "rule"]
    proc = agent_cli(*args, "--retry-for", "2")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: service {url} unreachable for 2 s"), proc.stderr
    assert f"1 batch kept in the outbox {logs / '.holmes-agent.db'}" in last
    srv = start_server(tmp_path, port=port)
    try:
        again = agent_cli(*args)
        assert again.returncode == 0, (again.stdout, again.stderr)
        # what the first run accepted was kept and sent now, once
        assert httpx.get(url + "/v1/jobs/down").json()["records"] == len(ops)
    finally:
        srv.stop()


def test_follow_sets_bad_files_aside_and_keeps_shipping_the_others(tmp_path, caplog):
    ops = make_ops(seed=22, ranks=4, iterations=6)
    logs = tmp_path / "logs"
    good, other = ops[ops["rank"] < 3], ops[ops["rank"] == 3]
    _write_good(logs, good)
    _write_bad(logs, other)
    srv = start_server(tmp_path)
    agent = _agent(srv, logs, "bad")
    try:
        with caplog.at_level(logging.ERROR, logger="holmes_ml.serve.agent"):
            for _ in range(3):
                agent.step()
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        # named once each, not at every poll that finds them unchanged
        assert len(errors) == 2, errors
        assert any(str(logs / "bad.jsonl") in e and "column 'op', line 2: unknown op type "
                   "(got 'gossip'" in e for e in errors), errors
        assert any(str(logs / "trunc.parquet") in e and "without its footer" in e for e in errors)
        assert set(agent.bad_files) == {logs / "bad.jsonl", logs / "trunc.parquet"}
        # a half-written last line is not an error, only not read yet
        rank0 = logs / "rank0.jsonl"
        with rank0.open("a") as fh:
            fh.write('{"iteration": 6, "rank": 0, "op": "all_re')
        assert agent.read_new() == 0 and logs / "rank0.jsonl" not in agent.bad_files
        rank0.write_text(rank0.read_text().rsplit("\n", 1)[0] + "\n")  # the writer gave up
        # once fixed, the bad file is read (from its start: nothing of it was accepted)
        _write_good(logs, other)
        (logs / "bad.jsonl").write_text((logs / "rank3.jsonl").read_text())
        (logs / "rank3.jsonl").unlink()
        (logs / "trunc.parquet").unlink()
        agent.run(once=True)
        assert agent.bad_files == {}
        assert agent.outbox.n_pending() == 0
        assert httpx.get(srv.url + "/v1/jobs/bad").json()["records"] == len(ops)
    finally:
        agent.close()
        srv.stop()


def test_once_ships_the_good_files_and_exits_2_naming_the_bad_ones(tmp_path):
    ops = make_ops(seed=23, ranks=4, iterations=6)
    logs = tmp_path / "logs"
    good, other = ops[ops["rank"] < 3], ops[ops["rank"] == 3]
    _write_good(logs, good)
    _write_bad(logs, other)
    srv = start_server(tmp_path)
    try:
        proc = agent_cli("--follow", logs, "--server", srv.url, "--job", "mixed", "--token",
                         TOKEN, "--once", "--model", "rule")
        assert proc.returncode == 2, (proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert f"error: {logs / 'bad.jsonl'}: column 'op', line 2: unknown op type" in \
            proc.stderr
        assert f"error: {logs / 'trunc.parquet'}: a Parquet file without its footer" in proc.stderr
        assert httpx.get(srv.url + "/v1/jobs/mixed").json()["records"] == len(good)
    finally:
        srv.stop()


@pytest.mark.parametrize("content", ["garbage\n", "[1, 2]\n", '{"ranks": 3}\n', "\xff\xfe"])
def test_a_bad_topology_is_one_line_naming_the_file(tmp_path, content):
    logs = tmp_path / "logs"
    logs.mkdir()
    topo = tmp_path / "garbage.json"
    topo.write_bytes(content.encode("latin-1"))
    line = one_line_error(agent_cli("--follow", logs, "--server", "http://127.0.0.1:9",
                                    "--job", "j", "--once", "--topology", topo, timeout=60))
    assert str(topo) in line and "topology" in line


@pytest.mark.parametrize(("args", "expected"), [
    (["--poll", "-1"], "--poll -1: expected a finite number of seconds > 0"),
    (["--poll", "0"], "--poll 0: expected a finite number of seconds > 0"),
    (["--poll", "nan"], "--poll nan: expected"),
    (["--retry-for", "-1"], "--retry-for -1: expected a finite number of seconds >= 0"),
    (["--retry-for", "inf"], "--retry-for inf: expected"),
    (["--server", "svc:8787"], "--server 'svc:8787': expected a URL like http://HOST:8787"),
    # names the service would refuse with a 404 or 422 after the whole log was read
    (["--job", "train/run 1"], "--job 'train/run 1': expected a name of letters, digits"),
    (["--job", ""], "--job '': expected a name"),
    (["--source", "node 7"], "--source 'node 7': expected a name"),
    (["--since", "6x"], "--since '6x': expected a duration like 90s, 30m, 6h or 2d"),
    (["--since", "0"], "--since 0: expected a finite number of seconds > 0"),
])
def test_agent_rejects_impossible_numbers_naming_option_and_value(tmp_path, args, expected):
    logs = tmp_path / "logs"
    logs.mkdir()
    proc = agent_cli("--follow", logs, "--server", "http://127.0.0.1:9", "--job", "j", *args,
                     timeout=30)
    assert one_line_error(proc).startswith(f"error: {expected}")
    assert not (logs / ".holmes-agent.db").exists()  # refused before anything was created


def test_an_outbox_of_another_job_is_refused_naming_both_jobs(tmp_path):
    # Its watermarks say what job "first" was sent: reused for "second" it would ship nothing.
    ops = make_ops(seed=24, ranks=2, iterations=4)
    logs = tmp_path / "logs"
    _write_good(logs, ops)
    common = ["--follow", logs, "--server", "http://127.0.0.1:9", "--once", "--retry-for",
              "0.2", "--model", "rule"]
    assert agent_cli(*common, "--job", "first").returncode == 1  # queued, service down
    line = one_line_error(agent_cli(*common, "--job", "second"))
    assert f"--outbox {logs / '.holmes-agent.db'}" in line, line
    assert "'first'" in line and "'second'" in line, line
    other = tmp_path / "second.db"
    assert agent_cli(*common, "--job", "second", "--outbox", other).returncode == 1


def _outbox_rows(path) -> tuple[list, list, list]:
    """The batches (seq, state), watermarks and meta of the outbox ``path``, read directly."""
    db = sqlite3.connect(path)
    try:
        return (db.execute("SELECT seq, state FROM outbox ORDER BY seq").fetchall(),
                db.execute("SELECT * FROM watermark ORDER BY rank").fetchall(),
                db.execute("SELECT * FROM meta ORDER BY key").fetchall())
    finally:
        db.close()


def test_an_outbox_run_as_another_source_is_refused_and_every_row_arrives(tmp_path):
    """An outbox reused under another --source lost rows: the service refused them (409, the
    ranks are the first source's), the watermarks had passed them at queue time, and the run
    under the right --source went on after them. The other source is now refused at start,
    before anything is queued, and the right one ships every row."""
    ops = make_ops(seed=31, ranks=2, iterations=10)
    logs = tmp_path / "logs"
    box = logs / ".holmes-agent.db"
    srv = start_server(tmp_path)
    try:
        common = ["--follow", logs, "--server", srv.url, "--job", "jobA", "--token", TOKEN,
                  "--once", "--model", "rule"]
        _write_good(logs, ops[ops["iteration"] < 5])  # the agent stopped at iteration 4
        assert agent_cli(*common, "--source", "node007").returncode == 0
        _write_good(logs, ops)  # iterations 5-9 logged since
        before = _outbox_rows(box)
        line = one_line_error(agent_cli(*common, "--source", "node007b"))
        assert line.startswith(f"error: --outbox {box}: this outbox ships job 'jobA' as "
                               "source 'node007', not as source 'node007b'"), line
        assert "run the agent with --source 'node007'" in line, line
        assert _outbox_rows(box) == before  # nothing queued, no watermark moved
        again = agent_cli(*common, "--source", "node007")
        assert again.returncode == 0, again.stderr
        its = httpx.get(srv.url + "/v1/jobs/jobA/iterations").json()
        assert sorted(i["iteration"] for i in its) == list(range(10))
        assert httpx.get(srv.url + "/v1/jobs/jobA").json()["records"] == len(ops)
    finally:
        srv.stop()


def test_resend_rejected_ships_a_batch_an_earlier_version_queued_as_another_source(tmp_path):
    """An outbox of an earlier version (no source recorded) could hold a batch refused with 409
    because it went as another --source; --resend-rejected sent it as that source again, and
    was refused again: its rows, which the watermarks skip, never arrived. It now goes as the
    source the outbox shipped as (the one its acknowledged batches name)."""
    ops = make_ops(seed=32, ranks=2, iterations=10)
    logs = tmp_path / "logs"
    box = logs / ".holmes-agent.db"
    srv = start_server(tmp_path)
    try:
        _write_good(logs, ops[ops["iteration"] < 5])
        first = _agent(srv, logs, "jobA")  # (as source "n1")
        first.run(once=True)
        first.close()
        _write_good(logs, ops)
        # what an earlier version let happen: the same outbox run as another source
        db = sqlite3.connect(box)
        db.execute("UPDATE meta SET value='n1b' WHERE key='source'")
        db.commit()
        db.close()
        cfg = AgentConfig(follow=logs, server=srv.url, job="jobA", token=TOKEN, source="n1b",
                          backoff_s=0.05, timeout_s=5, once_retry_s=2)
        wrong = Agent(cfg, summarize=fallback_summarize)
        wrong.run(once=True)
        wrong.close()
        assert wrong.stats.batches_rejected == 1
        db = sqlite3.connect(box)
        db.execute("DELETE FROM meta WHERE key='source'")  # (earlier versions kept none)
        db.commit()
        db.close()
        common = ["--follow", logs, "--server", srv.url, "--job", "jobA", "--token", TOKEN,
                  "--once", "--model", "rule"]
        # the source of its acknowledged batches is the outbox's
        line = one_line_error(agent_cli(*common, "--source", "n1b"))
        assert "as source 'n1', not as source 'n1b'" in line, line
        proc = agent_cli(*common, "--source", "n1", "--resend-rejected")
        assert proc.returncode == 0, proc.stderr
        its = httpx.get(srv.url + "/v1/jobs/jobA/iterations").json()
        assert sorted(i["iteration"] for i in its) == list(range(10))
        assert httpx.get(srv.url + "/v1/jobs/jobA").json()["records"] == len(ops)
        assert [state for _, state in _outbox_rows(box)[0]] == ["acked"] * 2
    finally:
        srv.stop()


def test_an_earlier_versions_outbox_is_claimed_by_the_source_its_batches_were_acked_as(
        tmp_path):
    """An outbox of an earlier version records no source, and may hold batches queued as
    another one (a run with the wrong --source that could not reach the service): sent as
    they were, the service would refuse them (the ranks are the first source's) and their
    rows, past the watermarks, never arrive. The source of its acknowledged batches claims
    it, and those batches go as that source."""
    box = Outbox(tmp_path / "outbox.db")
    try:
        batch = {"iterations": {"iteration": [0], "rank": [0], "start_ns": [0],
                                "end_ns": [1], "comm_us": [1.0], "n_ops": [1]}}
        box.enqueue("n1", batch, {0: 0}, [], [0])
        box.mark(box.pending()[0][0], "acked")
        late = box.enqueue("n1b", {**batch, "iterations": {**batch["iterations"],
                                                           "iteration": [1]}}, {0: 1}, [], [])
        box.set_meta("job", "j")  # (as claim(j) left it; no source)
    finally:
        box.close()
    with pytest.raises(ValueError, match="as source 'n1', not as source 'n1b'"):
        other = Outbox(tmp_path / "outbox.db")
        try:
            other.claim("j", "n1b")
        finally:
            other.close()
    box = Outbox(tmp_path / "outbox.db")
    try:
        box.claim("j", "n1")
        [(seq, batch_id, body)] = box.pending()
        sent = json.loads(gzip.decompress(body))
        assert (seq, batch_id) == (late, f"n1-{late}")
        assert (sent["source"], sent["batch_id"], sent["iterations"]["iteration"]) == (
            "n1", f"n1-{late}", [1])
    finally:
        box.close()


def test_once_names_an_empty_follow_directory(tmp_path):
    logs = tmp_path / "logs"
    (logs / "sub").mkdir(parents=True)
    proc = agent_cli("--follow", logs, "--server", "http://127.0.0.1:9", "--job", "j",
                     "--once", "--retry-for", "0.2")
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    # (it says what it follows, having started, then why it found nothing to ship)
    assert len(lines) == 2 and lines[0].startswith(f"holmes agent: following {logs} "), lines
    assert lines[1].startswith(f"error: --follow {logs}: no CommOps log files"), lines


def test_agent_reads_subdirectories_and_ignores_tables_that_are_not_logs(tmp_path, caplog):
    ops = make_ops(seed=25, ranks=4, iterations=6)
    logs = tmp_path / "logs"
    for r, sub in ops.groupby("rank"):
        node = logs / f"node{r // 2}"
        node.mkdir(parents=True, exist_ok=True)
        sub.to_json(node / f"rank{r}.jsonl", orient="records", lines=True)
    # what `holmes detect` writes beside its scores, and a hidden directory's copy of a log
    (logs / "scores.iterations.csv").write_text("iteration,start_ns,end_ns,time_us\n0,1,2,3\n")
    (logs / ".old").mkdir()
    ops.to_json(logs / ".old" / "all.jsonl", orient="records", lines=True)
    # a whole log dumped as one JSON array cannot be followed line by line
    ops.to_json(logs / "dump.jsonl", orient="records")
    srv = start_server(tmp_path)
    agent = _agent(srv, logs, "tree")
    try:
        with caplog.at_level(logging.WARNING, logger="holmes_ml.serve.agent"):
            agent.run(once=True)
        assert agent.bad_files == {}
        assert agent.n_log_files == 4
        assert any("scores.iterations.csv is not a CommOps log" in r.getMessage()
                   for r in caplog.records)
        assert any("dump.jsonl holds one JSON array" in r.getMessage() for r in caplog.records)
        assert httpx.get(srv.url + "/v1/jobs/tree").json()["records"] == len(ops)
    finally:
        agent.close()
        srv.stop()


@pytest.mark.parametrize(("suffix", "line"), [(".jsonl", 4), (".csv", 5)])
def test_a_bad_value_is_named_by_its_file_line_and_the_file_once(tmp_path, suffix, line):
    ops = make_ops(seed=26, ranks=1, iterations=2).astype({"nbytes": object})
    ops.loc[3, "nbytes"] = "lots"  # the fourth record: line 4 of JSON lines, 5 of a CSV
    logs = tmp_path / "logs"
    logs.mkdir()
    path = logs / f"rank0{suffix}"
    if suffix == ".csv":
        ops.to_csv(path, index=False)
    else:
        ops.to_json(path, orient="records", lines=True)
    _lots_set_aside_at(path, line)


def _lots_set_aside_at(path: Path, line: int) -> None:
    """``holmes agent --once`` on ``path``'s directory sets its row of nbytes 'lots' aside,
    naming ``line``, and queues the others (the service is down)."""
    proc = agent_cli("--follow", path.parent, "--server", "http://127.0.0.1:9", "--job", "j",
                     "--once", "--retry-for", "0.2", "--model", "rule")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    error = [ln for ln in proc.stderr.splitlines() if ln.startswith(f"error: {path}")]
    assert error == [f"error: {path}: 1 row(s) set aside, the rest shipped: column 'nbytes', "
                     f"line {line}: not a number (got 'lots'; expected a finite int)"], \
        proc.stderr
    assert "1 batch kept in the outbox" in proc.stderr, proc.stderr


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".jsonl.gz", ".csv.gz"])
def test_a_bad_row_after_blank_lines_is_named_by_its_line_of_the_file(tmp_path, suffix):
    """Blank lines give no row: the bad row after them is named by its line of the file (as
    an editor or ``sed -n Np`` counts), in a followed log and in an archive read whole (which
    named it by its row)."""
    ops = make_ops(seed=27, ranks=1, iterations=2).astype({"nbytes": object})
    ops.loc[5, "nbytes"] = "lots"
    logs = tmp_path / "logs"
    logs.mkdir()
    csv = suffix.startswith(".csv")
    text = ops.to_csv(index=False) if csv else ops.to_json(orient="records", lines=True)
    lines = text.splitlines(keepends=True)
    head = 1 if csv else 0
    # a blank line after the second record, two (one of spaces) after the fourth
    lines[head + 2:head + 2] = ["\n"]
    lines[head + 5:head + 5] = ["\n", "  \n"]
    data = "".join(lines).encode()
    path = logs / f"rank0{suffix}"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    line = head + 6 + 3  # the sixth record, three blank lines before it
    assert data.splitlines()[line - 1].count(b"lots") == 1
    _lots_set_aside_at(path, line)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_bad_row_in_a_followed_log_is_set_aside_and_the_rows_after_it_ship(
        tmp_path, caplog, suffix):
    """One bad row (an unknown op; a torn CSV line run into the next, of more fields) kept the
    whole file unread from it on, however much its writer added after it."""
    ops = make_ops(seed=31, ranks=2, iterations=6)
    logs = tmp_path / "logs"
    logs.mkdir()
    path = logs / f"all{suffix}"

    def text(part) -> str:
        if suffix == ".csv":
            return part.to_csv(index=False, header=False)
        return part.to_json(orient="records", lines=True)

    head = ops[ops["iteration"] < 3]
    if suffix == ".csv":
        path.write_text(head.to_csv(index=False))
        bad = "3,1,all_red" + text(head.iloc[:1])  # a line torn, then a whole record after it
    else:
        path.write_text(text(head))
        bad = text(head.iloc[:1]).replace('"op":"' + str(head["op"].iloc[0]), '"op":"gossip')
    srv = start_server(tmp_path)
    agent = _agent(srv, logs, "aside")
    try:
        agent.step()
        bad_line = len(path.read_text().splitlines()) + 1
        with path.open("a") as fh:
            fh.write(bad + text(ops[ops["iteration"] >= 3]))
        with caplog.at_level(logging.WARNING, logger="holmes_ml.serve.agent"):
            agent.run(once=True)
        said = caplog.text
        assert f"line {bad_line}" in said, said
        assert agent.bad_files == {}
        # the torn CSV line gave no row, and counts as set aside too (the service hears of it)
        assert list(agent.rows_set_aside) == [path] and agent.n_set_aside[path] == 1
        why = agent.rows_set_aside[path][0]
        assert f"line {bad_line}: " in why and ("gossip" in why if suffix == ".jsonl"
                                                else "more fields" in why), why
        assert httpx.get(srv.url + "/v1/jobs/aside").json()["records"] == len(ops)
    finally:
        agent.close()
        srv.stop()


def test_rows_that_contradict_earlier_files_are_set_aside_naming_both(tmp_path, caplog):
    """Each file is validated alone as it grows; a rank that a later run appended under another
    host (or that another file puts elsewhere) would be shipped on the first host. The rows
    saying so are set aside, naming the file and line and the file that said otherwise;
    what was accepted stays, the other files keep being read."""
    ops = make_ops(seed=27, ranks=8, iterations=3)
    logs = tmp_path / "logs"
    logs.mkdir()
    for r, sub in ops.groupby("rank"):
        sub.to_csv(logs / f"rank{r}.csv", index=False)
    cfg = AgentConfig(follow=logs, server="http://127.0.0.1:9", job="j", source="n1")
    agent = Agent(cfg, summarize=fallback_summarize)
    try:
        assert agent.read_new() == len(ops)
        later = make_ops(seed=28, ranks=8, iterations=4)
        later = later[later["iteration"] == 3]
        moved = later[later["rank"] == 5].assign(host="h9")
        with (logs / "rank5.csv").open("a") as fh:
            moved.to_csv(fh, index=False, header=False)
        later[later["rank"] == 6].to_csv(logs / "rank6.csv", mode="a", index=False,
                                         header=False)
        with caplog.at_level(logging.ERROR, logger="holmes_ml.serve.agent"):
            assert agent.read_new() == len(later[later["rank"] == 6])
        assert set(agent.bad_files) == {logs / "rank5.csv"}
        why = agent.bad_files[logs / "rank5.csv"]
        assert why == (f"column 'host', line {len(ops[ops['rank'] == 5]) + 2}: the host of "
                       f"rank 5 is 'h1' in {logs / 'rank5.csv'} (got 'h9'; expected one value "
                       "per rank (a job restarted on other hosts: another --job, and a --follow "
                       "of its own logs))"), why
        assert sum(str(logs / "rank5.csv") in r.getMessage() for r in caplog.records) == 1
        assert len(agent._ops) == len(ops) + len(later[later["rank"] == 6])
    finally:
        agent.close()


def test_logs_of_a_second_job_are_set_aside(tmp_path):
    """Each file names one job; a file of another job in the followed directory would be
    shipped as this job's ranks: it is set aside, naming the file that named the first."""
    ops = make_ops(seed=29, ranks=4, iterations=3)
    logs = tmp_path / "logs"
    logs.mkdir()
    ops.assign(job="pretrain").to_csv(logs / "a.csv", index=False)
    cfg = AgentConfig(follow=logs, server="http://127.0.0.1:9", job="j", source="n1")
    agent = Agent(cfg, summarize=fallback_summarize)
    try:
        assert agent.read_new() == len(ops)
        ops.assign(job="eval", iteration=ops["iteration"] + 10).to_csv(logs / "b.csv",
                                                                       index=False)
        assert agent.read_new() == 0
        assert set(agent.bad_files) == {logs / "b.csv"}
        why = agent.bad_files[logs / "b.csv"]
        assert why.startswith(f"column 'job', line 2: logs of a second job: 'pretrain' in "
                              f"{logs / 'a.csv'} (got 'eval'"), why
    finally:
        agent.close()


def test_a_torn_line_rotation_truncation_and_a_fifo_do_not_stop_a_followed_log(tmp_path, caplog):
    # each used to freeze the file for the agent's life (or the agent itself, for a FIFO)
    ops = make_ops(seed=26, ranks=2, iterations=12)
    logs = tmp_path / "logs"
    logs.mkdir()
    r0, r1 = (ops[ops["rank"] == r] for r in (0, 1))
    early = r0["iteration"] < 4

    def lines(df):
        return df.to_json(orient="records", lines=True)

    os.mkfifo(logs / "rank9.jsonl")  # opening it to sniff would block
    (logs / "rank0.jsonl").write_text(lines(r0[early]))
    (logs / "rank1.jsonl").write_text(lines(r1))
    srv = start_server(tmp_path)
    agent = _agent(srv, logs, "rot")
    try:
        with caplog.at_level(logging.WARNING, logger="holmes_ml.serve.agent"):
            agent.read_new()
            assert "rank9.jsonl is no regular file" in caplog.text
            # a writer died mid-record; the restarted one appends whole lines after it
            with (logs / "rank0.jsonl").open("a") as fh:
                fh.write('{"iteration": 4, "rank": 0, "op": "all_re\n')
                fh.write(lines(r0[(r0["iteration"] >= 4) & (r0["iteration"] < 8)]))
            agent.read_new()
            torn = int(early.sum()) + 1
            assert f"rank0.jsonl: 1 line(s) that are no JSON object skipped (line {torn})" \
                in caplog.text
            assert agent.bad_files == {}
            # rotated: the file moved out of the logs' directory, a new one under the name
            (logs / "rank0.jsonl").rename(tmp_path / "rank0.jsonl.1")
            (logs / "rank0.jsonl").write_text(lines(r0[r0["iteration"] == 8]))
            agent.read_new()
            assert "rank0.jsonl was replaced (rotated?): reading it again from its start; " \
                "the file read until now is not beside it" in caplog.text
            # truncated in place (copytruncate), then written again
            (logs / "rank0.jsonl").write_text("")
            agent.read_new()
            (logs / "rank0.jsonl").write_text(lines(r0[r0["iteration"] >= 9]))
            agent.read_new()
            assert "rank0.jsonl was truncated" in caplog.text
        agent.run(once=True)
        assert agent.bad_files == {}
        its = httpx.get(srv.url + "/v1/jobs/rot/iterations").json()
        assert {i["iteration"] for i in its} == set(range(12))
        assert httpx.get(srv.url + "/v1/jobs/rot").json()["records"] == len(ops)
    finally:
        agent.close()
        srv.stop()


@pytest.mark.parametrize("suffix", ["jsonl", "csv"])
def test_a_log_written_anew_in_place_and_larger_is_read_from_its_start(tmp_path, caplog,
                                                                       suffix):
    """A restarted writer's file under the old name that kept the inode and outgrew what was
    read: neither rotation nor truncation shows, so the agent read on from the old offset,
    mid-record, and lost the new file's first rows."""
    ops = make_ops(seed=27, ranks=1, iterations=8)
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / f"rank0.{suffix}"

    def text(df):
        return df.to_json(orient="records", lines=True) if suffix == "jsonl" else \
            df.to_csv(index=False)

    early = ops[ops["iteration"] < 3]
    log.write_text(text(early))
    agent = Agent(AgentConfig(follow=logs, server="http://127.0.0.1:9", job="j"),
                  summarize=fallback_summarize)
    try:
        assert agent.read_new() == len(early)
        inode, size = log.stat().st_ino, log.stat().st_size
        again = ops.assign(start_ns=ops["start_ns"] + 10**12)  # another run's clock
        with log.open("r+") as fh:
            fh.truncate(0)
            fh.write(text(again))
        assert log.stat().st_ino == inode and log.stat().st_size > size
        with caplog.at_level(logging.WARNING, logger="holmes_ml.serve.agent"):
            assert agent.read_new() == len(ops)
        assert f"rank0.{suffix} was written anew (a restarted writer?): reading it again" \
            in caplog.text
        assert agent.bad_files == {} and not agent.rows_set_aside
        assert agent.read_new() == 0
    finally:
        agent.close()


def test_a_following_agent_ships_the_last_iteration_once_the_logs_are_idle(tmp_path):
    """A rank's last iteration is held back until it logs a later one: when training stops
    (or pauses) it never came, and a following agent never shipped it."""
    import time

    ops = make_ops(seed=22, ranks=2, iterations=4)
    logs = tmp_path / "logs"
    _write_good(logs, ops)
    srv = start_server(tmp_path)
    cfg = AgentConfig(follow=logs, server=srv.url, job="idle", token=TOKEN, source="n1",
                      backoff_s=0.05, timeout_s=5, poll_s=0.05, flush_after_s=0.5)
    agent = Agent(cfg, summarize=fallback_summarize)
    deadline = time.monotonic() + 20
    shipped: list[bool] = []

    def stop() -> bool:
        # (flushing at stop would ship it too: what counts is that it came before)
        r = httpx.get(srv.url + "/v1/jobs/idle")
        if r.status_code == 200 and r.json()["records"] == len(ops):
            shipped.append(True)
        return bool(shipped) or time.monotonic() > deadline

    try:
        agent.run(stop=stop)
        assert shipped, "the last iteration was not shipped while the logs were idle"
        assert agent.stats.batches_sent == 2  # the complete iterations, then the last one
        agent.close()
    finally:
        srv.stop()


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_sigterm_flushes_what_was_read_before_exiting(tmp_path, sig):
    """A following agent stopped by SIGTERM (systemd, kubernetes) or Ctrl-C exited without
    queueing the last iteration it had read, nor sending it."""
    import signal
    import time

    ops = make_ops(seed=23, ranks=2, iterations=4)
    logs = tmp_path / "logs"
    _write_good(logs, ops)
    srv = start_server(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLMES, "agent", "--follow", str(logs), "--server", srv.url,
         "--job", "term", "--token", TOKEN, "--model", "rule", "--poll", "0.1",
         "--flush-after", "1000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        complete = len(ops[ops["iteration"] < 3])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = httpx.get(srv.url + "/v1/jobs/term")
            if r.status_code == 200 and r.json()["records"] == complete:
                break
            time.sleep(0.1)
        assert r.json()["records"] == complete, r.text  # the last iteration held back
        proc.send_signal(getattr(signal, sig))
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, (out, err)
        assert "sent 2 batches" in out, (out, err)
        assert httpx.get(srv.url + "/v1/jobs/term").json()["records"] == len(ops)
    finally:
        if proc.poll() is None:
            proc.kill()
        srv.stop()


def test_a_csv_log_truncated_in_place_keeps_its_header(tmp_path, caplog):
    # logrotate's copytruncate empties the file; its writer goes on appending rows without a
    # header. The agent read the first row as a header, then ignored the file for good ("not a
    # CommOps log"). A writer that starts again with a header gives it anew.
    ops = make_ops(seed=27, ranks=2, iterations=12)
    logs = tmp_path / "logs"
    logs.mkdir()
    r0, r1 = (ops[ops["rank"] == r] for r in (0, 1))
    r1.to_csv(logs / "rank1.csv", index=False)
    log = logs / "rank16.csv"
    r0[r0["iteration"] < 6].to_csv(log, index=False)
    srv = start_server(tmp_path)
    agent = _agent(srv, logs, "copytrunc")
    try:
        with caplog.at_level(logging.WARNING, logger="holmes_ml.serve.agent"):
            agent.read_new()
            log.write_text("")  # `: > rank16.csv`
            r0[r0["iteration"].between(6, 8)].to_csv(log, mode="a", index=False, header=False)
            agent.read_new()
            assert "rank16.csv was truncated: reading it again from its start with the " \
                "columns of its header" in caplog.text
            # truncated again, and this writer starts the file with its header
            r0[r0["iteration"].between(9, 10)].to_csv(log, index=False)
            agent.read_new()
            r0[r0["iteration"] == 11].to_csv(log, mode="a", index=False, header=False)
        agent.run(once=True)
        assert "not a CommOps log" not in caplog.text
        assert agent.bad_files == {}
        its = httpx.get(srv.url + "/v1/jobs/copytrunc/iterations").json()
        assert {i["iteration"] for i in its} == set(range(12))
        assert httpx.get(srv.url + "/v1/jobs/copytrunc").json()["records"] == len(ops)
    finally:
        agent.close()
        srv.stop()


def test_the_agent_says_once_what_it_follows_and_when_delivery_begins(tmp_path):
    # It printed nothing until something went wrong: no way to tell a working agent from a
    # stuck one, or to see what it follows and where it sends.
    ops = make_ops(seed=28, ranks=2, iterations=6)
    logs = tmp_path / "logs"
    _write_good(logs, ops)
    srv = start_server(tmp_path)
    try:
        proc = agent_cli("--follow", logs, "--server", srv.url, "--job", "hello", "--token",
                         TOKEN, "--source", "n7", "--once", "--model", "rule")
    finally:
        srv.stop()
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if line.startswith("holmes agent: ")]
    assert len(said) == 2, proc.stderr
    assert said[0].startswith(f"holmes agent: following {logs} ")
    assert "job 'hello'" in said[0] and "source 'n7'" in said[0] and srv.url in said[0]
    # (said by every run: "the first batch of job 'hello'" read, after a restart, as if the
    # job were new)
    assert said[1].startswith(f"holmes agent: delivering to {srv.url}: this agent's first "
                              "batch since it started (job 'hello') was acknowledged")


def test_delivery_resuming_after_an_outage_is_said_once(tmp_path):
    ops = make_ops(seed=29, ranks=2, iterations=12)
    logs = tmp_path / "logs"
    port = free_port()
    said: list[str] = []
    logs.mkdir()
    cfg = AgentConfig(follow=logs, server=f"http://127.0.0.1:{port}", job="outage",
                      token=TOKEN, source="n1", backoff_s=0.05, backoff_max_s=0.05, timeout_s=5)
    agent = Agent(cfg, summarize=fallback_summarize, say=said.append)
    srv = start_server(tmp_path, port=port)
    try:
        _write_good(logs, ops[ops["iteration"] < 4])
        agent.step()
        _write_good(logs, ops[ops["iteration"] < 6])
        agent.step()  # a second batch delivered: nothing more to say
        assert agent.stats.batches_sent == 2
        assert len(said) == 1 and "this agent's first batch since it started (job " \
            "'outage')" in said[0], said
        srv.stop()
        _write_good(logs, ops[ops["iteration"] < 8])
        agent.step()
        agent.step()
        assert agent.stats.failures >= 1 and len(said) == 1, said
        srv = start_server(tmp_path, port=port)
        time.sleep(0.1)
        agent.step()
        _write_good(logs, ops)
        time.sleep(0.1)
        agent.step()
        assert agent.outbox.n_pending() == 0
        assert len(said) == 2, said
        assert said[1].startswith(f"delivering to {srv.url} again: the service answered "
                                  "after"), said
    finally:
        agent.close()
        srv.stop()


def test_logs_whose_job_column_names_another_job_than_job_are_warned_of_once(
        tmp_path, caplog):
    # Logs saying job "sim" were shipped as --job llm5 without a word.
    ops = make_ops(seed=30, ranks=2, iterations=6).assign(job="sim")
    logs = tmp_path / "logs"
    logs.mkdir()
    ops[ops["rank"] == 0].to_csv(logs / "rank0.csv", index=False)
    srv = start_server(tmp_path)
    agent = _agent(srv, logs, "llm5")
    try:
        with caplog.at_level(logging.WARNING, logger="holmes_ml.serve.agent"):
            agent.read_new()
            ops[ops["rank"] == 1].to_csv(logs / "rank1.csv", index=False)
            agent.run(once=True)
        said = [r.getMessage() for r in caplog.records if "job column" in r.getMessage()]
        assert len(said) == 1, said
        assert "'sim'" in said[0] and "--job 'llm5'" in said[0] and "rank0.csv" in said[0]
        assert httpx.get(srv.url + "/v1/jobs/llm5").json()["records"] == len(ops)
    finally:
        agent.close()
        srv.stop()
    caplog.clear()
    same = Agent(AgentConfig(follow=logs, server="http://127.0.0.1:9", job="sim",
                             outbox=tmp_path / "sim.db"), summarize=fallback_summarize)
    with caplog.at_level(logging.WARNING, logger="holmes_ml.serve.agent"):
        same.read_new()
    same.close()
    assert "job column" not in caplog.text


def test_a_second_agent_on_one_outbox_is_refused_until_the_first_is_gone(tmp_path):
    # Two agents following one directory (its default outbox) side by side shipped the same
    # ranks twice under one source, racing for the outbox's seqs, without a word.
    ops = make_ops(seed=31, ranks=2, iterations=6)
    logs = tmp_path / "logs"
    _write_good(logs, ops)
    outbox = logs / ".holmes-agent.db"
    first = Agent(AgentConfig(follow=logs, server="http://127.0.0.1:9", job="j"),
                  summarize=fallback_summarize)
    with pytest.raises(ValueError, match=f"--outbox {outbox}: in use by another holmes agent "
                       rf"\(pid {os.getpid()}\)"):
        Agent(AgentConfig(follow=logs, server="http://127.0.0.1:9", job="j"),
              summarize=fallback_summarize)
    first.close()  # released: the next one may take it
    Agent(AgentConfig(follow=logs, server="http://127.0.0.1:9", job="j"),
          summarize=fallback_summarize).close()

    srv = start_server(tmp_path)
    common = ["--follow", logs, "--server", srv.url, "--job", "j", "--token", TOKEN,
              "--model", "rule"]
    following = subprocess.Popen([sys.executable, "-c", HOLMES, "agent", *map(str, common)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        lock = logs / ".holmes-agent.db.lock"
        deadline = time.monotonic() + 60
        while not (lock.exists() and lock.read_text().strip() == str(following.pid)):
            assert following.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        line = one_line_error(agent_cli(*common, "--once"))
        assert line == (f"error: --outbox {outbox}: in use by another holmes agent (pid "
                        f"{following.pid}); expected one agent per outbox (two following one "
                        "directory would ship its ranks twice): stop that one first, or give "
                        "this one its own --outbox and --source"), line
        following.kill()  # SIGKILL: no clean-up, the lock file stays behind
        following.wait(timeout=30)
        assert lock.exists()
        again = agent_cli(*common, "--once")
        assert again.returncode == 0, again.stderr
        assert httpx.get(srv.url + "/v1/jobs/j").json()["records"] == len(ops)
    finally:
        if following.poll() is None:
            following.kill()
        srv.stop()


def test_a_live_writers_single_bad_line_is_set_aside_not_the_file(tmp_path):
    """A writer appending a line per poll: a chunk of one bad row refused the file until it
    grew (an ERROR, then 'readable again'); it is set aside like any other."""
    from pathlib import Path

    import pandas as pd

    from holmes_ml.serve.agent import _valid_rows

    base = {"iteration": 0, "rank": 0, "op": "all_reduce", "group": "g", "seq": 0,
            "nbytes": 1, "start_ns": 0, "duration_us": 1.0}
    out, aside, _ = _valid_rows(pd.DataFrame([dict(base, op="gossip")]), Path("f.csv"), 5)
    assert out.empty and len(aside) == 1 and aside[0].startswith("column 'op', line 5: "
                                                                 "unknown op type")
    # more than two rows, half of them bad: no log of this schema, refused whole
    rows = pd.DataFrame([dict(base, op="gossip"), dict(base, seq=1, op="x"), dict(base, seq=2)])
    with pytest.raises(Exception, match="f.csv, column 'op', line 5: unknown op type"):
        _valid_rows(rows, Path("f.csv"), 5)


def test_what_an_agent_could_not_read_is_visible_at_the_service(tmp_path):
    """Rows set aside and files refused were only in the node's own log: the service (its
    sources, /metrics and `holmes jobs`) now shows them, and a report clears once fixed."""
    ops = make_ops(seed=33, ranks=2, iterations=6)
    logs = tmp_path / "logs"
    logs.mkdir()
    first = ops[ops["rank"] == 0]
    text = first.to_json(orient="records", lines=True).splitlines()
    text.insert(3, text[3].replace('"op":"' + str(first["op"].iloc[3]), '"op":"gossip'))
    text.insert(6, '{"iteration":1,"ra')  # torn: counted too (it was only in the node's log)
    (logs / "rank0.jsonl").write_text("\n".join(text) + "\n")
    ops[ops["rank"] == 1].to_json(logs / "rank1.jsonl", orient="records", lines=True)
    ops.to_parquet(tmp_path / "whole.parquet")
    (logs / "trunc.parquet").write_bytes((tmp_path / "whole.parquet").read_bytes()[:3000])
    srv = start_server(tmp_path)
    agent = _agent(srv, logs, "unread")
    try:
        agent.run(once=True)
        (src,) = httpx.get(srv.url + "/v1/jobs/unread").json()["sources"]
        assert src["rows_set_aside"] == 2
        ((file, rows, why),) = (tuple(f.values()) for f in src["files_set_aside"])
        assert (file, rows) == ("rank0.jsonl", 2) and "line 4" in why and "gossip" in why, why
        assert [f["file"] for f in src["files_refused"]] == ["trunc.parquet"]
        metrics = httpx.get(srv.url + "/metrics").text
        assert 'holmes_source_rows_set_aside{job="unread",source="n1"} 2.0' in metrics
        assert 'holmes_source_files_refused{job="unread",source="n1"} 1.0' in metrics
        shown = holmes("jobs", "unread", "--server", srv.url)
        assert shown.returncode == 0, shown.stderr
        said = " ".join(shown.stdout.split())
        assert "unread: n1: trunc.parquet:" in said, said
        assert "set aside: n1: 2 row(s) of its logs unreadable" in said, said
        listed = subprocess.run([sys.executable, "-c", HOLMES, "jobs", "--server", srv.url],
                                capture_output=True, text=True, timeout=60,
                                env={**os.environ, "COLUMNS": "200"})
        assert "(1, 1 with unread logs)" in listed.stdout, listed.stdout
        # the truncated file removed: the next batch's report no longer names it
        (logs / "trunc.parquet").unlink()
        with (logs / "rank0.jsonl").open("a") as fh:
            fh.write(first.assign(iteration=first["iteration"] + 6)
                     .to_json(orient="records", lines=True))
        agent.run(once=True)
        (src,) = httpx.get(srv.url + "/v1/jobs/unread").json()["sources"]
        assert src["files_refused"] == [] and src["rows_set_aside"] == 2
        assert 'holmes_source_files_refused{job="unread",source="n1"} 0.0' in httpx.get(
            srv.url + "/metrics").text
    finally:
        agent.close()
        srv.stop()


def test_an_https_server_url_for_the_plain_http_service_says_to_use_http(tmp_path):
    """--server https://... against holmes serve (plain HTTP) was only 'unreachable
    (ConnectError: [SSL: WRONG_VERSION_NUMBER] ...)'."""
    ops = make_ops(seed=37, ranks=2, iterations=4)
    logs = tmp_path / "logs"
    _write_good(logs, ops)
    srv = start_server(tmp_path)
    try:
        https = srv.url.replace("http://", "https://")
        proc = agent_cli("--follow", logs, "--server", https, "--job", "tls", "--token", TOKEN,
                         "--once", "--retry-for", "1", "--model", "rule")
        assert proc.returncode == 1, (proc.stdout, proc.stderr)
        assert f"the service answers in plain HTTP, not TLS: expected --server {srv.url}" \
            in proc.stderr, proc.stderr
        listed = holmes("jobs", "--server", https)
        assert listed.returncode == 2 and (
            f"the service answers in plain HTTP, not TLS: expected --server {srv.url}"
            in listed.stderr), listed.stderr
    finally:
        srv.stop()


def test_an_agent_started_before_its_log_directory_waits_for_it(tmp_path):
    """An agent started at boot, before the job's loggers made the directory, exited 2
    ('does not exist'): it now waits for it, says so once, and ships it when it comes;
    with --once the missing directory is refused."""
    ops = make_ops(seed=41, ranks=2, iterations=6)
    logs = tmp_path / "later"
    srv = start_server(tmp_path)
    common = ["--follow", logs, "--server", srv.url, "--job", "w", "--token", TOKEN,
              "--model", "rule", "--poll", "0.2", "--flush-after", "0.5"]
    line = one_line_error(agent_cli(*common, "--once"))
    assert f"{logs}: no such directory" in line and "waits for it" in line, line
    following = subprocess.Popen([sys.executable, "-c", HOLMES, "agent", *map(str, common)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # the directory must come after the agent has started waiting for it: on a loaded machine
    # its start-up took longer than a fixed sleep, and it found the directory already there
    said: list[str] = []
    waiting = threading.Event()

    def listen() -> None:
        for said_line in following.stderr:
            said.append(said_line)
            if "to appear" in said_line:
                waiting.set()

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    try:
        waiting.wait(timeout=60)
        time.sleep(1)
        assert following.poll() is None  # still waiting, not gone
        _write_good(logs, ops)
        deadline = time.monotonic() + 90
        while httpx.get(srv.url + "/v1/jobs").json() == [] or httpx.get(
                srv.url + "/v1/jobs/w").json()["records"] < len(ops):
            assert following.poll() is None and time.monotonic() < deadline
            time.sleep(0.3)
        following.terminate()
        following.wait(timeout=60)
        listener.join(timeout=60)
        err = "".join(said)
        assert following.returncode == 0, err
        assert err.count(f"waiting for {logs} to appear") == 1, err
    finally:
        if following.poll() is None:
            following.kill()
        srv.stop()


def _counting_validate(monkeypatch) -> list[int]:
    """Count the rows of each schema check the agent makes (one per call)."""
    import holmes_ml.serve.agent as agent_module

    calls: list[int] = []
    real = agent_module.validate

    def counted(df, *args, **kwargs):
        calls.append(len(df))
        return real(df, *args, **kwargs)

    monkeypatch.setattr(agent_module, "validate", counted)
    return calls


def test_a_polls_new_rows_are_checked_together_and_kept_as_each_file_alone_gives_them(
        tmp_path, monkeypatch):
    """A host's files gain rows at every poll; their checks against the schema, a few ms of
    fixed cost each, are made in one call per schema rather than one per file, and what is
    kept is what each file checked alone gives."""
    from holmes_ml.collect.writer import COLUMNS, RowSink
    from holmes_ml.io.readers import read_arrow_stream
    from holmes_ml.io.schema import validate

    ops = make_ops(seed=41, ranks=8, iterations=5).assign(job="j")
    logs = tmp_path / "logs"
    sinks = {r: RowSink(logs / f"rank{r}.arrows", "arrow") for r in range(6)}
    calls = _counting_validate(monkeypatch)
    agent = Agent(AgentConfig(follow=logs, server="http://127.0.0.1:9", job="j", source="n1"),
                  summarize=fallback_summarize)
    try:
        for it in range(5):
            new = ops[ops["iteration"] == it]
            for r, sink in sinks.items():
                sink.write({c: new[new["rank"] == r][c].to_numpy() for c in COLUMNS})
            for r in (6, 7):  # two more ranks log CSV: a schema of their own
                new[new["rank"] == r].to_csv(logs / f"rank{r}.csv", mode="a", index=False,
                                             header=it == 0)
            calls.clear()
            assert agent.read_new() == len(new)
            # the six Arrow chunks in one check, the two CSV chunks in another
            assert sorted(calls) == sorted([6 * len(new) // 8, 2 * len(new) // 8]), calls
        for sink in sinks.values():
            sink.close()
        alone = [validate(read_arrow_stream(logs / f"rank{r}.arrows").to_pandas())
                 for r in range(6)]
        alone += [validate(pd.read_csv(logs / f"rank{r}.csv")) for r in (6, 7)]
        kept = agent._ops.drop(columns="_file")
        key = ["rank", "iteration", "seq"]
        expected = pd.concat(alone).astype({"group_ranks": str}).sort_values(key)
        pd.testing.assert_frame_equal(
            kept.astype({"group_ranks": str}).sort_values(key).reset_index(drop=True),
            expected[kept.columns].reset_index(drop=True))
        assert agent.bad_files == {} and agent.rows_set_aside == {}
    finally:
        agent.close()


def test_a_bad_row_among_files_checked_together_is_set_aside_in_its_file_alone(
        tmp_path, monkeypatch):
    """One file's bad row breaks the check of a poll's rows together: each file is then
    checked alone, the bad row set aside naming its file and line, every other row kept."""
    ops = make_ops(seed=42, ranks=4, iterations=3)
    logs = tmp_path / "logs"
    logs.mkdir()
    for r, sub in ops.groupby("rank"):
        sub.to_csv(logs / f"rank{r}.csv", index=False)
    bad = logs / "rank2.csv"
    lines = bad.read_text().splitlines()
    lines[3] = lines[3].replace("all_reduce", "gossip")  # line 4 of the file
    bad.write_text("\n".join(lines) + "\n")
    calls = _counting_validate(monkeypatch)
    agent = Agent(AgentConfig(follow=logs, server="http://127.0.0.1:9", job="j", source="n1"),
                  summarize=fallback_summarize)
    try:
        assert agent.read_new() == len(ops) - 1
        assert len(calls) == 1 + 4 + 1  # together; each alone; the bad file's again without it
        assert agent.bad_files == {}
        assert list(agent.rows_set_aside) == [bad] and len(agent.rows_set_aside[bad]) == 1
        assert agent.rows_set_aside[bad][0].startswith(
            "column 'op', line 4: unknown op type (got 'gossip'; expected one of "), \
            agent.rows_set_aside
    finally:
        agent.close()


def test_two_files_of_one_poll_that_disagree_set_the_second_aside_naming_the_first(tmp_path):
    """Files read in one poll that put one rank on two hosts: checked together they break the
    check, so each is checked alone and the second is set aside naming the first, as when
    they were read in two polls."""
    ops = make_ops(seed=43, ranks=4, iterations=2)
    logs = tmp_path / "logs"
    logs.mkdir()
    ops[ops["rank"] < 2].to_csv(logs / "a.csv", index=False)
    ops[ops["rank"] == 1].assign(host="elsewhere", seq=ops["seq"] + 50).to_csv(
        logs / "b.csv", index=False)
    agent = Agent(AgentConfig(follow=logs, server="http://127.0.0.1:9", job="j", source="n1"),
                  summarize=fallback_summarize)
    try:
        assert agent.read_new() == int((ops["rank"] < 2).sum())
        assert list(agent.bad_files) == [logs / "b.csv"]
        why = agent.bad_files[logs / "b.csv"]
        assert why.startswith(f"column 'host', line 2: the host of rank 1 is 'h0' in "
                              f"{logs / 'a.csv'} (got 'elsewhere'"), why
    finally:
        agent.close()


class _Writer:
    """A rank's log writer that keeps its file open: it goes on appending to the file it opened
    (renamed by a rotation) until told to open the name again."""

    def __init__(self, path, fmt):
        self.path, self.fmt = path, fmt
        self.reopen()

    def reopen(self):
        if self.fmt == "arrows":
            from holmes_ml.collect.writer import RowSink

            self.sink = RowSink(self.path, "arrow")
        else:
            self.fh = self.path.open("w")
            self.header = True

    def write(self, rows):
        if self.fmt == "arrows":
            from holmes_ml.collect.writer import COLUMNS

            self.sink.write({c: rows[c].to_numpy() for c in COLUMNS})
            return
        if self.fmt == "csv":
            rows.to_csv(self.fh, index=False, header=self.header)
            self.header = False
        else:
            self.fh.write(rows.to_json(orient="records", lines=True))
        self.fh.flush()

    def close(self):
        (self.sink if self.fmt == "arrows" else self.fh).close()


def _rank0_being_written(tmp_path, seed, fmt):
    """A 2-rank job of 12 iterations: rank 1's log written whole, rank 0's first 4 iterations
    by a writer that keeps its file open. Returns (ops, the logs' directory, rank 0's rows, its
    writer)."""
    ops = make_ops(seed=seed, ranks=2, iterations=12).assign(job="")
    logs = tmp_path / "logs"
    logs.mkdir()
    r0, r1 = (ops[ops["rank"] == r] for r in (0, 1))
    other = _Writer(logs / f"rank1.{fmt}", fmt)
    other.write(r1)
    other.close()
    writer = _Writer(logs / f"rank0.{fmt}", fmt)
    writer.write(r0[r0["iteration"] < 4])
    return ops, logs, r0, writer


@contextlib.contextmanager
def _rank0_followed(tmp_path, seed, fmt, job):
    """:func:`_rank0_being_written`'s job, a real service and an agent following its logs
    (closed on leaving): (ops, the logs' directory, rank 0's rows, its writer, service,
    agent)."""
    ops, logs, r0, writer = _rank0_being_written(tmp_path, seed, fmt)
    srv = start_server(tmp_path)
    agent = _agent(srv, logs, job)
    try:
        yield ops, logs, r0, writer, srv, agent
    finally:
        agent.close()
        srv.stop()


def _all_shipped_once(agent, srv, job, ops):
    """Every iteration of ``ops`` reached the service, each operator once, nothing set aside."""
    assert agent.bad_files == {}
    its = httpx.get(srv.url + f"/v1/jobs/{job}/iterations").json()
    assert {i["iteration"] for i in its} == set(ops["iteration"])
    assert httpx.get(srv.url + f"/v1/jobs/{job}").json()["records"] == len(ops)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "arrows"])
@pytest.mark.parametrize("rotated", ["rank0.{fmt}.1", "rank0-20261204.{fmt}"])
def test_a_log_rotated_by_renaming_loses_no_row_and_ships_none_twice(tmp_path, caplog, fmt,
                                                                     rotated):
    """logrotate renames the log (to a name the logs do not match, or with dateext and
    ``extension`` to one they do), and its writer appends to the renamed file until it opens
    the new one. The rows written after the last poll were lost; a rotated name the logs match
    was read again from its start and its rows shipped twice."""
    with _rank0_followed(tmp_path, 29, fmt, "rotated") as (
            ops, logs, r0, writer, srv, agent):
        steps, log = r0["iteration"], writer.path
        with caplog.at_level(logging.INFO, logger="holmes_ml.serve.agent"):
            agent.read_new()
            writer.write(r0[steps.between(4, 5)])  # after the poll
            log.rename(logs / rotated.format(fmt=fmt))
            writer.write(r0[steps == 6])  # to the renamed file: no new one yet
            agent.read_new()
            assert f"rank0.{fmt} was rotated to {rotated.format(fmt=fmt)}: read on there" \
                in caplog.text
            writer.write(r0[steps == 7])
            writer.close()
            writer.reopen()  # the writer opens the name anew
            writer.write(r0[steps >= 8])
            writer.close()
            agent.run(once=True)
            assert agent.read_new() == 0
        assert "are lost" not in caplog.text and "are not read" not in caplog.text
        _all_shipped_once(agent, srv, "rotated", ops)


def test_a_log_compressed_as_it_is_rotated_is_said_to_lose_its_last_rows(tmp_path, caplog):
    # logrotate's compress without delaycompress: the file read until now is gone at once;
    # its rows since the last poll cannot be read, and the warning says so and why
    with _rank0_followed(tmp_path, 30, "jsonl", "gz") as (
            ops, logs, r0, writer, srv, agent):
        steps, log = r0["iteration"], writer.path
        with caplog.at_level(logging.WARNING, logger="holmes_ml.serve.agent"):
            agent.read_new()
            writer.write(r0[steps.between(4, 5)])
            writer.close()
            rotated = log.rename(logs / "rank0.jsonl.1")  # create: a new file under the name
            r0[steps >= 6].to_json(log, orient="records", lines=True)
            (logs / "rank0.jsonl.1.gz").write_bytes(gzip.compress(rotated.read_bytes()))
            rotated.unlink()
            agent.run(once=True)
        assert f"{log} was replaced (rotated?): reading it again from its start; the file " \
            "read until now is not beside it (compressed at once, moved elsewhere or " \
            "removed?), so rows it gained since the last poll, if any, are lost unless a " \
            "compressed copy read whole (a name ending .jsonl.gz or .csv.gz) holds them" \
            in caplog.text
        assert agent.bad_files == {}
        lost = int(steps.between(4, 5).sum())
        assert httpx.get(srv.url + "/v1/jobs/gz").json()["records"] == len(ops) - lost


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
@pytest.mark.parametrize("copy", ["rank0.{fmt}.1", "rank0-20261204.{fmt}"])
def test_a_log_copied_then_truncated_in_place_loses_no_row_and_ships_none_twice(
        tmp_path, caplog, fmt, copy):
    """logrotate's copytruncate copies the log, then empties it; its writer appends on (a CSV
    without a header). The rows written after the last poll are in the copy only: they were
    lost, and a copy the logs match was read again from its start."""
    with _rank0_followed(tmp_path, 31, fmt, "copied") as (
            ops, logs, r0, writer, srv, agent):
        steps, log = r0["iteration"], writer.path
        with caplog.at_level(logging.INFO, logger="holmes_ml.serve.agent"):
            agent.read_new()
            writer.write(r0[steps.between(4, 5)])  # after the poll
            (logs / copy.format(fmt=fmt)).write_bytes(log.read_bytes())
            writer.fh.truncate(0)
            writer.fh.seek(0)
            writer.write(r0[steps.between(6, 8)])  # (a CSV's header was written before)
            agent.read_new()
            assert f"rank0.{fmt} was copied to {copy.format(fmt=fmt)} and truncated in place" \
                in caplog.text
            writer.write(r0[steps >= 9])
            writer.close()
            agent.run(once=True)
            assert agent.read_new() == 0
        _all_shipped_once(agent, srv, "copied", ops)


@pytest.mark.parametrize("delay", [True, False], ids=["delaycompress", "compress"])
def test_a_rotated_log_compressed_under_a_name_the_traces_match_ships_each_row_once(
        tmp_path, caplog, delay):
    """logrotate with dateext, ``extension .jsonl`` and compress: the rotated log ends up as
    rank0-20261204.jsonl.gz, which the agent reads whole as a trace. Its rows were read
    already as the log grew, and were shipped twice."""
    with _rank0_followed(tmp_path, 32, "jsonl", "archived") as (
            ops, logs, r0, writer, srv, agent):
        steps, log = r0["iteration"], writer.path
        with caplog.at_level(logging.INFO, logger="holmes_ml.serve.agent"):
            agent.read_new()
            writer.write(r0[steps.between(4, 5)])  # after the poll
            writer.close()
            rotated = log.rename(logs / "rank0-20261204.jsonl")
            r0[steps.between(6, 8)].to_json(log, orient="records", lines=True)
            if delay:  # the rotated log stays as it is for a cycle
                agent.read_new()
            gz = logs / "rank0-20261204.jsonl.gz"
            gz.write_bytes(gzip.compress(rotated.read_bytes()))
            rotated.unlink()
            with log.open("a") as fh:
                fh.write(r0[steps >= 9].to_json(orient="records", lines=True))
            agent.run(once=True)
        assert "were read already from the logs followed: archives of rotated logs? Each is " \
            "shipped once" in caplog.text
        _all_shipped_once(agent, srv, "archived", ops)


def _archives_read(monkeypatch) -> list[str]:
    """The names of the archives the agent reads from now on (each read whole with
    ``read_native``), in the order it reads them."""
    from holmes_ml.io import readers

    read: list[str] = []
    native = readers.read_native
    monkeypatch.setattr(readers, "read_native", lambda p: read.append(Path(p).name) or native(p))
    return read


def test_archives_of_rotated_logs_are_each_read_once_on_their_own(tmp_path, monkeypatch,
                                                                   caplog):
    """logrotate with dateext and compress, rotating every few iterations: each new archive
    (``rank0-0003.jsonl.gz``) is read once, on its own, not again with the others at every
    rotation (which cost a poll time and memory in proportion to every archive kept). An
    archive from before the agent started ships its rows; one cut short (still being
    compressed) is set aside until it changes; a bad row of one is set aside naming its line."""
    read = _archives_read(monkeypatch)
    ops = make_ops(seed=21, ranks=2, iterations=14).assign(job="")
    logs = tmp_path / "logs"
    logs.mkdir()
    steps = ops["iteration"]
    # an archive of iterations 0-1 from before the agent started, one row of an unknown op
    old = ops[steps < 2].copy()
    old.loc[old.index[3], "op"] = "gossip"
    for r, sub in old.groupby("rank"):
        sub.to_csv(logs / f"rank{r}-0000.csv.gz", index=False, compression="gzip")
    srv = start_server(tmp_path)
    agent = _agent(srv, logs, "rotating")
    try:
        with caplog.at_level(logging.INFO, logger="holmes_ml.serve.agent"):
            for k, first in enumerate(range(2, 14, 3), start=1):
                for r, sub in ops[steps.between(first, first + 2)].groupby("rank"):
                    sub.to_json(logs / f"rank{r}.jsonl", orient="records", lines=True)
                agent.read_new()
                agent.queue_ready()
                for r in (0, 1):  # rotated and compressed at once; the next begins empty
                    log = logs / f"rank{r}.jsonl"
                    gz = logs / f"rank{r}-{k:04d}.jsonl.gz"
                    data = gzip.compress(log.read_bytes())
                    log.unlink()
                    if k == 2 and r == 0:  # still being compressed at the poll
                        gz.write_bytes(data[:len(data) // 2])
                        agent.read_new()
                        assert "truncated gzip data" in agent.bad_files[gz]
                    gz.write_bytes(data)
            agent.run(once=True)
        assert sorted(read) == sorted(
            [f"rank{r}-{k:04d}.jsonl.gz" for r in (0, 1) for k in (1, 2, 3, 4)]
            + ["rank0-0000.csv.gz", "rank1-0000.csv.gz", "rank0-0002.jsonl.gz"])  # (cut short)
        # (the fourth record of a CSV: line 5 of the archive, once unpacked)
        assert agent.rows_set_aside == {logs / "rank0-0000.csv.gz": [
            "column 'op', line 5: unknown op type (got 'gossip'; expected one of all_reduce, "
            "all_gather, reduce_scatter, all_to_all, broadcast, reduce, barrier, send, "
            "recv)"]}, agent.rows_set_aside
        good = ops.drop(index=old.index[3])
        _all_shipped_once(agent, srv, "rotating", good)
    finally:
        agent.close()
        srv.stop()


def _age(path: Path, days: float) -> None:
    """Make ``path`` look last written ``days`` ago."""
    then = time.time() - days * 86400
    os.utime(path, (then, then))


def test_since_leaves_out_the_files_last_written_before_it(tmp_path, monkeypatch):
    """An agent started with --since beside a job that has run for days: the archives of its
    rotated logs written before then are not read (nor held), the live logs are, and the agent
    says what it left out. An archive written again is read, and its rows already shipped are
    not shipped twice."""
    read = _archives_read(monkeypatch)
    ops = make_ops(seed=23, ranks=2, iterations=12).assign(job="")
    logs = tmp_path / "logs"
    logs.mkdir()
    recent = ops[ops["iteration"] >= 6]
    for r, sub in ops.groupby("rank"):
        for k, days in ((1, 3), (2, 2)):  # archives of iterations 0-2, then 3-5
            first = 3 * (k - 1)
            gz = logs / f"rank{r}-{k:04d}.jsonl.gz"
            sub[sub["iteration"].between(first, first + 2)].to_json(
                gz, orient="records", lines=True, compression="gzip")
            _age(gz, days)
        sub[sub["iteration"] >= 6].to_json(logs / f"rank{r}.jsonl", orient="records",
                                           lines=True)
    srv = start_server(tmp_path)
    said: list[str] = []
    cfg = AgentConfig(follow=logs, server=srv.url, job="since", token=TOKEN, source="n1",
                      backoff_s=0.05, timeout_s=5, since_s=6 * 3600)
    agent = Agent(cfg, summarize=fallback_summarize, say=said.append)
    try:
        agent.run(once=True)
        assert read == []  # (the archives are read by read_native: none was)
        archives = sorted(logs.glob("*.gz"))
        assert sorted(agent.too_old) == archives
        assert agent.stats.ops_read == len(recent)
        _all_shipped_once(agent, srv, "since", recent)
        left_out = [line for line in said if line.startswith("--since 6h: 4 file(s) last "
                                                               "written before ")]
        assert len(left_out) == 1, said
        assert left_out[0].endswith(" UTC not read (rank0-0001.jsonl.gz, rank0-0002.jsonl.gz, "
                                    "rank1-0001.jsonl.gz and 1 more); each is read from its "
                                    "start if written again"), left_out
        agent.run(once=True)
        assert read == [] and sum(line.startswith("--since") for line in said) == 1  # (once)
        # written again (recompressed, say): read, its rows shipped already not again
        os.utime(archives[1])
        agent.run(once=True)
        assert read == ["rank0-0002.jsonl.gz"]
        assert sorted(agent.too_old) == [archives[0], archives[2], archives[3]]
        _all_shipped_once(agent, srv, "since", recent)
        archives[0].unlink()  # (one left out removed: no longer counted)
        agent.read_new()
        assert sorted(agent.too_old) == [archives[2], archives[3]]
    finally:
        agent.close()
        srv.stop()


def test_once_with_since_on_only_older_logs_says_so_and_is_no_error(tmp_path):
    logs = tmp_path / "logs"
    _write_good(logs, make_ops(seed=24, ranks=2, iterations=4))
    for log in logs.iterdir():
        _age(log, 2)
    proc = agent_cli("--follow", logs, "--server", "http://127.0.0.1:9", "--job", "j",
                     "--once", "--retry-for", "0.2", "--since", "1d")
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 2 and lines[1].startswith(
        "holmes agent: --since 1d: 2 file(s) last written before "), lines
    assert lines[1].endswith(" UTC not read (rank0.jsonl, rank1.jsonl); each is read from "
                             "its start if written again"), lines
    assert proc.stdout.startswith("read 0 ops (0 B), sent 0 batches"), proc.stdout


def test_one_walk_finds_the_files_each_pattern_matched_as_rglob_did(tmp_path):
    """A poll walks the directory once for every pattern (each pattern's rglob was a walk of its
    own): the same files in the same order, hidden ones and those under hidden or symlinked
    directories left out as before, and no directory whose name looks like a log."""
    from holmes_ml.serve.agent import PATTERNS, WHOLE_FILE_PATTERNS, _Tree

    root = tmp_path / "logs"
    for rel in ("rank0.jsonl", "rank1.csv", "a/rank2.arrows", "a/b/rank3.parquet",
                "a-1/rank4.jsonl", "a/rank5-0001.jsonl.gz", "rank6.csv.gz", "k/trace.json",
                "k/trace.json.gz", "fr/dump.pkl", "fr/dump.pickle", ".hidden.jsonl",
                ".cache/rank7.jsonl", "a/.x/rank8.csv", "notes.txt", "rank9.jsonl.1"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x\n")
    (root / "dir.jsonl").mkdir()  # (rglob gave it: reading it failed)
    (root / "linked").symlink_to(root / "a", target_is_directory=True)
    (root / "rank10.jsonl").symlink_to(root / "rank0.jsonl")
    tree = _Tree(root)

    def rglob(pattern: str) -> list[Path]:  # what the agent listed before
        return sorted(p for p in root.rglob(pattern)
                      if not any(part.startswith(".") for part in p.relative_to(root).parts))

    for pattern in (*PATTERNS, *WHOLE_FILE_PATTERNS):
        expected = [p for p in rglob(pattern) if not p.is_dir()]
        assert tree.found[pattern] == expected, pattern
    assert root / "dir.jsonl" in rglob("*.jsonl")
    assert tree.whole == sorted({p for pattern in WHOLE_FILE_PATTERNS for p in rglob(pattern)})
    assert [p.relative_to(root).as_posix() for p in tree.found["*.jsonl"]] == [
        "a-1/rank4.jsonl", "rank0.jsonl", "rank10.jsonl"]
    assert tree.stat(root / "rank10.jsonl").st_size == 2  # (a symlinked file: its target's)
    assert _Tree(tmp_path / "not-there").found["*.jsonl"] == []
    again = _Tree(root, tree)  # (the paths of the last walk reused)
    assert all(a is b for a, b in zip(again.found["*.csv"], tree.found["*.csv"], strict=True))


def test_many_archives_are_checked_a_group_at_a_time_and_kept_as_each_alone_gives_them(
        tmp_path, monkeypatch):
    """Archives of rotated logs from before the agent started, a few rows each: their checks
    against the schema (a fixed cost each, most of what a small archive cost) are made a
    group at a time, and what is kept is what each archive checked alone gives."""
    from holmes_ml.io.readers import read_native
    from holmes_ml.io.schema import validate
    from holmes_ml.serve import agent as agent_module

    monkeypatch.setattr(agent_module, "_ARCHIVES_AT_ONCE", 8)
    ops = make_ops(seed=43, ranks=2, iterations=10).assign(job="")
    logs = tmp_path / "logs"
    logs.mkdir()
    for (r, it), sub in ops.groupby(["rank", "iteration"]):  # an archive an iteration
        sub.to_json(logs / f"rank{r}-{it:04d}.jsonl.gz", orient="records", lines=True,
                    compression="gzip")
    calls = _counting_validate(monkeypatch)
    agent = Agent(AgentConfig(follow=logs, server="http://127.0.0.1:9", job="j", source="n1"),
                  summarize=fallback_summarize)
    try:
        assert agent.read_new() == len(ops)
        per_archive = len(ops) // 20
        assert calls == [8 * per_archive, 8 * per_archive, 4 * per_archive], calls  # (20)
        alone = pd.concat([validate(read_native(p)) for p in sorted(logs.glob("*.gz"))])
        kept = agent._ops.drop(columns="_file")
        key = ["rank", "iteration", "seq"]
        pd.testing.assert_frame_equal(
            kept.astype({"group_ranks": str}).sort_values(key).reset_index(drop=True),
            alone.astype({"group_ranks": str}).sort_values(key)[kept.columns]
            .reset_index(drop=True))
        assert agent.bad_files == {} and agent.rows_set_aside == {}
    finally:
        agent.close()
