"""`holmes jobs` against a real service on loopback: the job list, a verdict shown as
`holmes localize` shows one, deleting a job, and one-line errors."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx
import pyarrow as pa
import pytest
from test_serve_cli import HOLMES, holmes, on_a_terminal, one_line_error
from test_serve_support import TOKEN, auth, free_port, make_ops, raw_body, start_server

from holmes_ml.io import without_labels
from holmes_ml.simulator import FaultSpec, SimConfig, simulate


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    sim = simulate(SimConfig(gpus=16, iterations=16, seed=3, faults=(
        FaultSpec.parse("gpu_slow:rank=5,severity=0.5,start=6"),)))
    ops = without_labels(sim.ops)
    table = pa.Table.from_pandas(ops, preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    srv = start_server(tmp_path_factory.mktemp("jobs"), pipeline=True)
    r = httpx.post(srv.url + "/v1/jobs/job7/raw.arrow", content=sink.getvalue().to_pybytes(),
                   params={"source": "logger", "batch_id": "b0"}, headers=auth())
    assert r.status_code == 200, r.text
    yield srv, ops
    srv.stop()


def test_a_verdict_reads_as_holmes_localize_prints_one(service):
    srv, ops = service
    shown = holmes("jobs", "job7", "--analyze", "--token", TOKEN, "--server", srv.url)
    assert shown.returncode == 0, shown.stderr
    answer = json.loads(holmes("jobs", "job7", "--json", "--server", srv.url).stdout)
    assert answer == httpx.get(srv.url + "/v1/jobs/job7/verdict").json()
    # what the verdict was computed from and its caveat travel with it, as from localize
    usual = answer["input"].pop("usual_iteration_s")
    first, last = answer["input"].pop("analysed")
    assert 0 <= first <= last <= 15
    assert answer["input"] == {"ops": len(ops), "ranks": 16, "iterations": 16} and usual > 0
    out = shown.stdout
    assert out.startswith(f"job job7: verdict {answer['version']}, computed "), out
    assert (f"read {len(ops):,} ops of 16 rank(s) over 16 iteration(s) (usually {usual:.4g} s "
            "each)") in out
    # and for alerting, the service's gauges (slowdown 1 when nothing is irregular)
    metrics = httpx.get(srv.url + "/metrics").text
    assert f'holmes_job_usual_iteration_seconds{{job="job7"}} {float(usual)}' in metrics
    assert f'holmes_job_slowdown{{job="job7"}} {float(answer["slowdown"] or 1.0)}' in metrics
    assert answer["candidates"][0]["ranks"] == [5], answer  # the slowed GPU
    assert "gpu:node000/5" in out and "rank 5 arrived last" in out
    listed = holmes("jobs", "--server", srv.url)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if "job7" in line)
    assert "raw" in row and f"{len(ops):,}" in row and "gpu:node000/5" in row
    # who delivers the job's data: one logger, not lagging, also for alerting
    assert "sources: 1 (logger); all delivering" in out
    (src,) = httpx.get(srv.url + "/v1/jobs/job7").json()["sources"]
    assert (src["source"], src["batches"], src["records"], src["last_iteration"],
            src["behind_iterations"], src["lagging"]) == ("logger", 1, len(ops), 15, 0, False)
    assert 'holmes_source_iterations_behind{job="job7",source="logger"} 0.0' in metrics
    assert 'holmes_source_seconds_since_batch{job="job7",source="logger"}' in metrics


def test_a_lagging_source_is_named_with_what_the_verdict_misses():
    import io

    from rich.console import Console

    from holmes_ml.cli.jobs import _print_sources

    out = io.StringIO()
    _print_sources([
        {"source": "node0", "last_at": 0.0, "last_iteration": 120, "behind_iterations": 360,
         "lagging": True},
        {"source": "node1", "last_at": 1.0, "last_iteration": 480, "behind_iterations": 0,
         "lagging": False}], Console(file=out, width=200))
    text = out.getvalue()
    assert "sources: 2 (node0, node1); 1 lagging" in text
    assert "lagging: node0 last delivered" in text and "up to iteration 120 (360 behind" in text
    assert "node1 last delivered" not in text


def test_a_deleted_job_is_gone_and_bad_requests_are_one_line(service, tmp_path):
    srv, _ = service
    assert httpx.post(srv.url + "/v1/jobs/old/raw", json=raw_body(make_ops(seed=4), "b0", 0),
                      headers=auth()).status_code == 200
    line = one_line_error(holmes("jobs", "old", "--delete", "--server", srv.url))
    assert "needs its token" in line and "--token" in line
    line = one_line_error(holmes("jobs", "old", "--delete", "--token", "wrong", "--server",
                                 srv.url))
    assert "refused the token given" in line
    line = one_line_error(holmes("jobs", "train/run 1", "--server", srv.url))
    assert line.startswith("error: JOB 'train/run 1': expected a name of letters"), line
    gone = holmes("jobs", "old", "--delete", "--token", TOKEN, "--server", srv.url)
    assert gone.returncode == 0 and gone.stdout.startswith("deleted job old ("), gone.stdout
    line = one_line_error(holmes("jobs", "old", "--server", srv.url))
    assert "HTTP 404" in line and "unknown job 'old'" in line
    assert line.endswith(f"list them with holmes jobs --server {srv.url}"), line
    assert "old" not in [j["job"] for j in httpx.get(srv.url + "/v1/jobs").json()]
    nobody = f"http://127.0.0.1:{free_port()}"
    down = holmes("jobs", "--server", nobody)
    # 1, as holmes agent exits when it cannot deliver: a script tells "try again" from
    # "fix the command" (2, which every other line here is)
    assert down.returncode == 1 and nobody in down.stderr and (
        "expected a running holmes serve" in down.stderr), down.stderr
    line = one_line_error(holmes("jobs", "--server", srv.url.removeprefix("http://")))
    assert "expected an http:// or https:// URL" in line
    line = one_line_error(holmes("jobs", "--delete", "--server", srv.url))
    assert line == "error: --delete: expected a JOB argument (which job?)"


def test_host_names_holding_markup_are_printed_as_they_are(tmp_path):
    """The service takes any printable host name, and `holmes jobs` printed the names as rich
    markup: 'n[/b]000' stopped the whole listing with a MarkupError traceback, and
    'rack[a]-n000' was shown as 'rack-n000', another device's name."""
    sim = simulate(SimConfig(gpus=16, iterations=16, seed=3, faults=(
        FaultSpec.parse("gpu_slow:rank=5,severity=0.5,start=6"),)))
    ops = without_labels(sim.ops)
    srv = start_server(tmp_path, pipeline=True)
    try:
        for job, host in (("closing", "n[/b]{:03d}"), ("tagged", "rack[a]-n{:03d}")):
            named = ops.assign(host=[host.format(int(h[-3:])) for h in ops["host"]])
            table = pa.Table.from_pandas(named, preserve_index=False)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            r = httpx.post(srv.url + f"/v1/jobs/{job}/raw.arrow",
                           content=sink.getvalue().to_pybytes(),
                           params={"source": "logger", "batch_id": "b0"}, headers=auth())
            assert r.status_code == 200, r.text
            shown = holmes("jobs", job, "--analyze", "--token", TOKEN, "--server", srv.url)
            assert shown.returncode == 0, shown.stderr
            device = "gpu:" + host.format(0) + "/5"
            assert device in shown.stdout, shown.stdout
        listed = holmes("jobs", "--server", srv.url)
        assert listed.returncode == 0, listed.stderr
        # the table folds long cells: read the suspect column's cells joined
        cells = "".join(line.split("│")[6].strip() for line in listed.stdout.splitlines()
                        if line.count("│") >= 8)
        assert "gpu:n[/b]000/5" in cells and "gpu:rack[a]-n000/5" in cells, listed.stdout
    finally:
        srv.stop()


def test_a_job_without_a_verdict_is_shown_as_none_yet_and_exits_1(tmp_path, monkeypatch):
    """`holmes jobs JOB` of a job not localized yet exited 0 (and --json printed `irregular:
    false`), the list showed "-" for its suspect, as for a healthy job. Now: a line saying it
    has no verdict yet and why, exit 1 ("try again"), and --json prints the service's answer
    (`state`, `irregular` null) with that line on stderr."""
    from test_serve import jobs_in_every_verdict_state, start_quiet_server

    monkeypatch.setenv("COLUMNS", "250")  # one line per table row, not folded at 80
    srv = start_quiet_server(tmp_path)
    try:
        jobs_in_every_verdict_state(httpx.Client(base_url=srv.url, headers=auth(), timeout=30))
        for job, state, said in [
                ("bare", "no_data", "no data has come for it yet (only its topology)"),
                ("pending", "pending", "its data has not been localized yet (the service "
                 "localizes a job after its data arrives, unless started with "
                 "--analyze-every 0; --analyze asks for it now)"),
                ("failed", "failed", "localization failed: RuntimeError: a localizer bug")]:
            shown = holmes("jobs", job, "--server", srv.url)
            assert shown.returncode == 1, (shown.returncode, shown.stdout, shown.stderr)
            out = " ".join(shown.stdout.split())
            assert out.startswith(f"job {job}: no verdict yet: {said}"), out
            assert "irregular" not in out and "no device blamed" not in out, out
            assert "sources: 1 (logger)" in out or job == "bare", out
            answer = holmes("jobs", job, "--json", "--server", srv.url)
            assert answer.returncode == 1, (answer.stdout, answer.stderr)
            body = json.loads(answer.stdout)
            assert (body["state"], body["version"], body["irregular"]) == (state, 0, None), body
            assert answer.stderr.startswith(f"job {job}: no verdict yet: {said}"), answer.stderr
        # localized: exit 0, the verdict as before, healthy or not
        for job, said in [("healthy", "no device blamed"), ("sick", "gpu:rank5")]:
            shown = holmes("jobs", job, "--server", srv.url)
            assert shown.returncode == 0, (shown.stdout, shown.stderr)
            assert shown.stdout.startswith(f"job {job}: verdict 1, computed "), shown.stdout
            assert said in shown.stdout and "no verdict" not in shown.stdout, shown.stdout
            answer = holmes("jobs", job, "--json", "--server", srv.url)
            assert answer.returncode == 0 and not answer.stderr, answer.stderr
            assert json.loads(answer.stdout)["state"] == "analysed"
        # the list: "-" is a verdict blaming no device, a job without one says so
        listed = holmes("jobs", "--server", srv.url)
        assert listed.returncode == 0, listed.stderr
        suspect = {line.split("│")[1].strip(): line.split("│")[6].strip()
                   for line in listed.stdout.splitlines() if line.count("│") >= 8}
        assert suspect == {"bare": "no verdict: no data yet", "failed":
                           "no verdict: localization failed", "healthy": "-",
                           "pending": "no verdict yet", "sick": "gpu:rank5"}, listed.stdout
        # asked to localize now: the pending job gets its verdict (exit 0), the failing one
        # still has none (1, with the reason)
        done = holmes("jobs", "pending", "--analyze", "--token", TOKEN, "--server", srv.url)
        assert done.returncode == 0 and "job pending: verdict 1" in done.stdout, done.stdout
        again = holmes("jobs", "failed", "--analyze", "--token", TOKEN, "--server", srv.url)
        assert again.returncode == 1 and "a localizer bug" in again.stdout, again.stdout
        # a verdict whose newer data failed to localize is shown (exit 0) with the reason
        newer = make_ops(seed=3).assign(nbytes=13, iteration=lambda d: d["iteration"] + 100)
        assert httpx.post(srv.url + "/v1/jobs/healthy/raw", headers=auth(),
                          json=raw_body(newer, "b1", seq=1)).status_code == 200
        kept = holmes("jobs", "healthy", "--analyze", "--token", TOKEN, "--server", srv.url)
        assert kept.returncode == 0, (kept.stdout, kept.stderr)
        out = " ".join(kept.stdout.split())
        assert out.startswith("job healthy: verdict 1, computed "), out
        assert ("newer data has arrived since error: localization failed: RuntimeError: a "
                "localizer bug (the verdict shown is of older data)") in out, out
    finally:
        srv.stop()


def test_a_verdict_from_a_service_without_state_is_read_from_its_version():
    """A service of an earlier version answers no `state`: version 0 is no verdict yet."""
    from holmes_ml.cli.jobs import verdict_state

    assert verdict_state({"version": 0, "irregular": False}) == "pending"
    assert verdict_state({"version": 0, "error": "localization failed: X"}) == "failed"
    assert verdict_state({"version": 3, "irregular": False}) == "analysed"
    assert verdict_state({"state": "no_data", "version": 0}) == "no_data"


def _watching(*args: str) -> subprocess.Popen:
    """``holmes jobs ARGS --watch 0.5`` running, its output piped (no terminal: each view
    printed again when the answer changes)."""
    return subprocess.Popen([sys.executable, "-c", HOLMES, "jobs", *args, "--watch", "0.5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stopped(proc: subprocess.Popen) -> tuple[str, str]:
    """SIGTERM ``proc``: it exits 0; its output."""
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, (out, err)
    return out, err


def _post_job(srv, job: str, ops) -> None:
    r = httpx.post(srv.url + f"/v1/jobs/{job}/raw", json=raw_body(ops, f"{job}-b0"),
                   headers=auth())
    assert r.status_code == 200, r.text


def test_watch_prints_the_job_list_again_when_it_changes_until_stopped(tmp_path):
    srv = start_server(tmp_path)
    try:
        _post_job(srv, "first", make_ops(seed=1, ranks=4, iterations=4))
        proc = _watching("--json", "--server", srv.url)
        answers = [json.loads(proc.stdout.readline())]
        assert [j["job"] for j in answers[0]] == ["first"]
        time.sleep(1.6)  # three calls more
        _post_job(srv, "second", make_ops(seed=2, ranks=4, iterations=4))
        while len(answers[-1]) < 2:
            answers.append(json.loads(proc.stdout.readline()))
        assert sorted(j["job"] for j in answers[-1]) == ["first", "second"]
        out, err = _stopped(proc)
        assert out == "" and err == "", (out, err)
        # each answer printed once: a line only when it changed (the job's verdict computed,
        # the second job), not at each of the calls between
        assert len(answers) <= 4, answers
        assert all(answers[k] != answers[k + 1] for k in range(len(answers) - 1)), answers
    finally:
        srv.stop()


def test_watch_says_once_that_the_service_stopped_answering_and_when_it_is_back(tmp_path):
    port = free_port()
    srv = start_server(tmp_path, port=port)  # (a job stored, then the service stopped)
    _post_job(srv, "back", make_ops(seed=3, ranks=4, iterations=4))
    srv.stop()
    proc = _watching("--server", f"http://127.0.0.1:{port}")
    try:
        line = proc.stdout.readline()
        assert f"GET http://127.0.0.1:{port}/v1/jobs: no answer" in line, line
        time.sleep(1.1)  # (two calls more fail, unsaid)
        srv = start_server(tmp_path, port=port)  # the same database
    except BaseException:
        proc.kill()
        raise
    try:
        deadline = time.monotonic() + 20
        shown = ""
        while "back" not in shown and time.monotonic() < deadline:
            shown += proc.stdout.readline()
        out, err = _stopped(proc)
        said = shown + out
        # the outage said once, however many calls failed; then the list, once
        assert said.count("no answer") == 0 and said.count("answering again") == 1, said
        assert said.count(f"jobs at http://127.0.0.1:{port}") == 1 and "back" in said, said
        assert err == "", err
    finally:
        srv.stop()


def test_watch_refuses_what_a_watch_cannot_do_and_a_wrong_job_at_once(service):
    srv, _ = service
    line = one_line_error(holmes("jobs", "job7", "--watch", "1", "--delete", "--server",
                                 srv.url))
    assert line.startswith("error: --watch and --delete: expected one of them"), line
    assert one_line_error(holmes("jobs", "nope", "--watch", "1", "--server", srv.url)
                          ).startswith(f"error: GET {srv.url}/v1/jobs/nope/verdict: HTTP 404")


def test_watch_on_a_terminal_redraws_one_view_in_place(service):
    """On a terminal (a pseudo-terminal here) the view is redrawn where it stands, each time
    with the time it was asked at, rather than printed below the last."""
    srv, _ = service
    status, text = on_a_terminal("jobs", "job7", "--watch", "0.5", "--server", srv.url,
                                 until=lambda said: said.count("(Ctrl-C to stop)") >= 3,
                                 timeout=20)
    assert status == 0
    views = text.count("(Ctrl-C to stop)")
    # each redraw after the first moves the cursor up over the view before drawing it again
    redraws = text.count("\r\x1b[2K\x1b[1A")
    assert views >= 3 and redraws >= 2, text
    # and shows it once: one header and one verdict a redraw (not the earlier views again)
    assert views <= redraws + 2 and text.count("job job7: ") == views, (views, redraws, text)
