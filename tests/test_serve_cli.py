"""`holmes serve` and `holmes agent` as a user runs them: bad options and files give one line."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

HOLMES = "from holmes_ml.cli import main; main()"


def holmes(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    # A subprocess with a timeout: a regression that starts serving (or retries forever)
    # instead of refusing fails the test instead of hanging it.
    return subprocess.run([sys.executable, "-c", HOLMES, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def on_a_terminal(*args: str, until=None, timeout: float = 120) -> tuple[int, str]:
    """``holmes ARGS`` with stdout and stderr on a pseudo-terminal (40 rows of 100 columns);
    with ``until``, stopped by SIGTERM once what it wrote (as text) satisfies it, or at the
    timeout. Its exit status and all it wrote there."""
    import fcntl
    import os
    import pty
    import select
    import signal
    import struct
    import termios
    import time

    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-c", HOLMES, *map(str, args)],
                            stdin=subprocess.DEVNULL, stdout=child, stderr=child,
                            env={**os.environ, "COLUMNS": "100", "TERM": "xterm"})
    os.close(child)
    seen = b""
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if until is not None and until(seen.decode(errors="replace")):
                break
            if select.select([main], [], [], 0.5)[0]:
                try:
                    data = os.read(main, 65536)
                except OSError:  # the child's end closed: it exited
                    break
                if not data:
                    break
                seen += data
            elif proc.poll() is not None:
                break
        if until is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main)
    return status, seen.decode(errors="replace")


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


@pytest.mark.parametrize("content", [b"rank,iteration\n0,1\n", b"SQLite format 3\x00garbage"])
def test_serve_refuses_a_db_file_that_is_not_its_database(tmp_path, content):
    db = tmp_path / "some.csv"
    db.write_bytes(content)
    line = one_line_error(holmes("serve", "--db", db, "--port", "1"))
    assert str(db) in line and "--db" in line and "holmes serve database" in line
    assert db.read_bytes() == content  # left as it was


def test_serve_refuses_another_programs_sqlite_database(tmp_path):
    import sqlite3

    db = tmp_path / "other.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE accounts (id INTEGER)")
    line = one_line_error(holmes("serve", "--db", db, "--port", "1"))
    assert "accounts" in line and "holmes serve database" in line
    with sqlite3.connect(db) as c:  # no tables of ours were added to it
        names = {r[0] for r in c.execute("SELECT name FROM sqlite_master")}
    assert names == {"accounts"}


def test_agent_refuses_an_outbox_that_is_not_one(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    bad = tmp_path / "outbox.db"
    bad.write_text("not sqlite\n")
    line = one_line_error(holmes("agent", "--follow", logs, "--server", "http://127.0.0.1:9",
                                 "--job", "j", "--outbox", bad, "--once"))
    assert str(bad) in line and "--outbox" in line and "agent outbox" in line


@pytest.mark.parametrize(("args", "expected"), [
    (["--max-body-mb", "-1"], "--max-body-mb -1: expected a finite size in MiB of at least 0.001"),
    (["--max-body-mb", "inf"], "--max-body-mb inf: expected"),
    (["--analyze-every", "-1"], "--analyze-every -1: expected seconds >= 0"),
    (["--analyze-every", "nan"], "--analyze-every nan: expected seconds >= 0"),
    (["--port", "0"], "--port 0: expected 1..65535"),
    (["--port", "70000"], "--port 70000: expected 1..65535"),
    (["--host", "0.0.0.0"], "--host '0.0.0.0' is not a loopback address; a --token"),
    (["--webhook", "notaurl"], "--webhook 'notaurl': expected an http:// or https:// URL"),
    (["--webhook", "ftp://h/x"], "--webhook 'ftp://h/x': expected an http:// or https:// URL"),
    # too few for the irregularity monitor: a job that slowed down was never flagged
    (["--analyze-last", "10"], "--analyze-last 10: expected 0 (every iteration) or at least 70 "
     "iterations: the irregularity monitor judges each iteration against the 20 regular ones "
     "before it, and the localizer looks at up to the 50 most recent; with fewer, a slowdown "
     "lasting those is judged against fewer regular iterations, or none and so never flagged"),
    (["--analyze-last", "69"], "--analyze-last 69: expected 0 (every iteration) or at least 70"),
    (["--analyze-last", "-1"], "--analyze-last -1: expected 0 (every iteration) or at least 70"),
])
def test_serve_rejects_impossible_numbers_naming_option_and_value(tmp_path, args, expected):
    from test_serve_support import free_port

    # a free port first (a later --port wins): a regression that starts serving binds nothing
    # anybody else uses, and the timeout fails the test
    proc = holmes("serve", "--db", tmp_path / "s.db", "--port", str(free_port()), *args,
                  timeout=20)
    assert one_line_error(proc).startswith(f"error: {expected}")
    assert not (tmp_path / "s.db").exists()  # refused before anything was created


def _serve_announced(*args: object) -> tuple[subprocess.Popen, str]:
    """``holmes serve ARGS`` started, and the first line it printed (empty after 30 s)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLMES, "serve", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # read in a thread: a service that never announces itself fails the test, not hangs it
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(30)
    return proc, got[0] if got else ""


def _slowed_job(iterations: int, slow: int) -> dict:
    """An agent batch of two ranks' ``iterations`` back to back, about 1 ms each, the last
    ``slow`` of them 1.3 ms."""
    its, start, end, t = [], [], [], 0
    for i in range(iterations):
        dur = (1_300_000 if i >= iterations - slow else 1_000_000) + 5_000 * (i % 3)
        its += [i, i]
        start += [t, t + 1_000]
        end += [t + dur, t + dur]
        t += dur + 10_000
    return {"source": "n1", "batch_id": "b0", "seq": 0,
            "ranks": {"rank": [0, 1], "host": ["h0", "h0"], "gpu": [0, 1]},
            "groups": [{"name": "dp-0", "kind": "dp", "ranks": [0, 1]}],
            "iterations": {"iteration": its, "rank": [0, 1] * iterations, "start_ns": start,
                           "end_ns": end, "comm_us": [0.5] * len(its), "n_ops": [3] * len(its)}}


def test_the_smallest_analyze_last_accepted_still_flags_a_job_that_slowed_down(tmp_path):
    """``--analyze-last 10`` was accepted and every verdict then read 10 iterations: the
    irregularity monitor had no regular iterations to judge them against, and a job whose
    latest iterations all slowed down showed no irregular iteration and a slowdown of 1.0.
    At the smallest value accepted (70), a slowdown lasting the localizer's whole window (50
    iterations) is flagged, by the verdict, /metrics and /iterations alike."""
    import httpx
    from test_serve_support import free_port

    from holmes_ml.serve.engine import min_analyze_last

    # the number --analyze-last's help, its refusal and the README give (50 + 20)
    assert min_analyze_last() == 70
    assert "At least 70: the localizer looks at up to the 50 most recent" in " ".join(
        holmes("serve", "--help").stdout.replace("│", " ").split())
    port = free_port()
    proc, line = _serve_announced("--db", tmp_path / "s.db", "--port", port,
                                  "--analyze-last", 70, "--analyze-every", 0)
    try:
        assert line.startswith("holmes serve: listening on "), (line, proc.poll())
        c = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        assert c.post("/v1/jobs/slowed/batches", json=_slowed_job(200, 50)).status_code == 200
        v = c.post("/v1/jobs/slowed/analyze").json()
        assert v["irregular_iterations"] == list(range(150, 200)), v
        assert 1.25 < v["slowdown"] < 1.4, v
        metrics = c.get("/metrics").text
        assert 'holmes_job_irregular_iterations{job="slowed"} 50.0' in metrics
        (slowdown,) = [float(ln.split()[-1]) for ln in metrics.splitlines()
                       if ln.startswith('holmes_job_slowdown{job="slowed"}')]
        assert slowdown > 1.25
        its = c.get("/v1/jobs/slowed/iterations", params={"last": 10}).json()
        assert [r["irregular"] for r in its] == [True] * 10, its
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


def test_serve_announces_its_url_once_listening(tmp_path):
    import httpx
    from test_serve_support import free_port

    port = free_port()
    db = tmp_path / "s.db"
    proc, line = _serve_announced("--db", db, "--port", port)
    try:
        url = f"http://127.0.0.1:{port}"
        assert line.startswith(f"holmes serve: listening on {url} "), (line, proc.stderr)
        assert str(db) in line and "/v1/jobs/JOB/batches" in line
        assert "; no --token: writes need none;" in line, line
        # announced only once bound: the very next request is answered
        assert httpx.get(url + "/healthz", timeout=5).json()["status"] == "ok"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    # SIGTERM (systemctl stop) shuts it down saying so, and where its data stays
    assert f"holmes serve: stopped; what it accepted is kept in {db}" in err, err



def test_serve_and_agent_help_explain_every_option_with_an_example():
    for cmd, example in (("serve", "holmes serve --db"), ("agent", "holmes agent --follow")):
        out = holmes(cmd, "--help").stdout
        assert f"Example: {example}" in out, out
        blocks = out.split("╭─ Options")[1]
        # every option row has a help text next to its type (a bare "<int>  [default..." row
        # is an option nobody explained)
        for row in blocks.splitlines():
            cells = row.strip("│ ").split()
            if cells and cells[0].lstrip("*").strip() == "" and len(cells) > 1:
                cells = cells[1:]
            if cells and cells[0].startswith("--"):
                assert len(cells) > 2 and not cells[2].startswith("["), (cmd, row)


def test_serve_takes_the_rule_baseline_like_the_agent(tmp_path):
    from test_serve_support import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", HOLMES, "serve", "--db", str(tmp_path / "s.db"),
                             "--port", str(port), "--model", "rule"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(30)
        assert got and got[0].startswith("holmes serve: listening on "), (got, proc.poll())
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    # (the line it stops with names the --db, whose directory is named after this test)
    err = "\n".join(x for x in err.splitlines() if not x.startswith("holmes serve: stopped"))
    assert "rule" not in err, err


def test_serve_on_a_port_in_use_is_one_line_and_leaves_no_database(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        db = tmp_path / "s.db"
        line = one_line_error(holmes("serve", "--db", db, "--port", port, timeout=30))
    assert line.startswith(f"error: --host/--port 127.0.0.1:{port}: cannot listen there ("), line
    assert "expected a free port" in line
    assert not db.exists()


def test_serve_with_a_bad_model_leaves_no_database(tmp_path):
    db = tmp_path / "s.db"
    line = one_line_error(holmes("serve", "--db", db, "--port", "1",
                                 "--model", tmp_path / "missing.holmes"))
    assert "missing.holmes" in line
    assert not db.exists()


def test_serve_on_all_interfaces_announces_an_address_agents_can_use(tmp_path):
    import socket

    import httpx
    from test_serve_support import free_port

    port = free_port()
    proc, line = _serve_announced("--db", tmp_path / "s.db", "--port", port, "--host", "0.0.0.0",
                                  "--token", "t")
    try:
        url = f"http://{socket.gethostname()}:{port}"
        assert line.startswith(f"holmes serve: listening on {url} (all interfaces, also "
                               f"http://127.0.0.1:{port} from this machine; "), line
        assert "0.0.0.0" not in line and f"{url}/v1/jobs/JOB/batches" in line
        assert "; writes need the --token;" in line, line
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).is_success
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


@pytest.mark.parametrize("cmd", ["serve", "agent"])
@pytest.mark.parametrize("how", ["option", "env"])
def test_an_empty_token_is_refused_not_taken_for_none(tmp_path, cmd, how):
    """``--token ''`` (or ``HOLMES_SERVE_TOKEN=`` from a variable not set where it was
    expanded) ran the service without authentication, silently."""
    import os

    args = (["--db", tmp_path / "s.db", "--port", "1"] if cmd == "serve"
            else ["--follow", tmp_path, "--job", "j", "--once"])
    env = {**os.environ, "HOLMES_SERVE_TOKEN": ""} if how == "env" else None
    if how == "option":
        args += ["--token", ""]
    proc = subprocess.run([sys.executable, "-c", HOLMES, cmd, *map(str, args)],
                          capture_output=True, text=True, timeout=60, env=env)
    line = one_line_error(proc)
    assert line.startswith("error: --token '' (or HOLMES_SERVE_TOKEN): expected a non-empty "
                           "token"), line
    assert not (tmp_path / "s.db").exists()


def test_a_second_service_on_the_same_database_is_refused_naming_the_first(tmp_path):
    """Two `holmes serve` on one --db both listened, and both computed (and would announce)
    every verdict of a batch either got."""
    from test_serve_support import free_port, start_server

    srv = start_server(tmp_path)
    try:
        proc = holmes("serve", "--db", srv.db, "--port", str(free_port()), timeout=60)
        line = one_line_error(proc)
        assert line.startswith(f"error: --db {srv.db}: in use by another holmes serve (pid "
                               f"{srv.proc.pid}); expected one service per database"), line
    finally:
        srv.stop()
    # once the first has stopped, the database is free again
    again = start_server(tmp_path)
    again.stop()
