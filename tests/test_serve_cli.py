"""`holmes serve` and `holmes agent` as a user runs them: bad options and files give one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

HOLMES = "from holmes_ml.cli import main; main()"


def holmes(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    # A subprocess with a timeout: a regression that starts serving (or retries forever)
    # instead of refusing fails the test instead of hanging it.
    return subprocess.run([sys.executable, "-c", HOLMES, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


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
