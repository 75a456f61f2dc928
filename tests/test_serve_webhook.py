"""Webhook on a new top device, background analysis, and verdicts surviving a restart."""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import prometheus_client as prom
import pytest
from fastapi.testclient import TestClient
from test_serve_support import ANALYZERS, TOKEN, auth, free_port, make_ops, raw_body

from holmes_ml.serve.app import ServeSettings, create_app, redact_url
from holmes_ml.serve.engine import Analyzers


class _Receiver:
    """A webhook receiver on loopback: records each POST's JSON body, and answers it with
    ``answer(n, handler)`` (``n``: how many came before), 204 by default."""

    def __init__(self, answer: Callable[[int, BaseHTTPRequestHandler], None] | None = None):
        self.got: list[dict] = []
        receiver = self

        class Hook(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                n = len(receiver.got)
                receiver.got.append(body)
                if answer is None:
                    self.send_response(204)
                    self.end_headers()
                else:
                    answer(n, self)

            def log_message(self, *args):
                pass

        # threads of its own: a receiver held on one request still takes the next
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _status(code: int, text: bytes = b"") -> Callable[[BaseHTTPRequestHandler], None]:
    def send(h: BaseHTTPRequestHandler) -> None:
        try:
            h.send_response(code)
            h.send_header("Content-Length", str(len(text)))
            h.end_headers()
            h.wfile.write(text)
        except OSError:
            pass  # the service hung up (stopped, or past its deadline)
    return send


def _metric(c: TestClient, line: str) -> float | None:
    """The value of the /metrics sample ``line`` (name and labels), None when absent."""
    m = re.search(rf"^{re.escape(line)} (\S+)$", c.get("/metrics").text, re.M)
    return float(m.group(1)) if m else None


def _count(counter: prom.Counter, **labels: str) -> float:
    """A counter's total (of ``labels``) once the service, and its /metrics, are gone."""
    return sum(s.value for m in counter.collect() for s in m.samples
               if s.name.endswith("_total") and s.labels == labels)


def _until(condition: Callable[[], object], seconds: float = 20.0) -> bool:
    """Whether ``condition`` came true within ``seconds`` (generous: the machine is shared)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _settings(tmp_path, url: str, name: str = "s.db", every: float = 0.0) -> ServeSettings:
    return ServeSettings(db=tmp_path / name, token=TOKEN, analyze_interval_s=every,
                         webhook=url)


def test_webhook_fires_once_per_new_top_device_and_state_persists(tmp_path):
    hook = _Receiver()
    got = hook.got
    settings = _settings(tmp_path, hook.url, every=0.1)
    ops = make_ops(seed=5, slow_rank=2)
    with TestClient(create_app(settings, analyzers=ANALYZERS)) as c:
        assert c.post("/v1/jobs/w/raw", json=raw_body(ops, "a", seq=0),
                      headers=auth()).status_code == 200
        assert _until(lambda: got, 10)  # the background thread analyzes
        more = make_ops(seed=6, slow_rank=2)
        assert c.post("/v1/jobs/w/raw", json=raw_body(more, "b", seq=1),
                      headers=auth()).status_code == 200
        v = c.post("/v1/jobs/w/analyze", headers=auth()).json()
        assert v["version"] == 2 and not v["stale"]
        assert _until(lambda: c.app.state.service.sender.pending == 0)
    hook.close()
    assert len(got) == 1  # same top device after the second batch: no second notification
    assert got[0]["job"] == "w" and got[0]["candidate"]["ranks"] == [2]
    with TestClient(create_app(settings, analyzers=ANALYZERS)) as c:  # a restart keeps all
        v = c.get("/v1/jobs/w/verdict").json()
        assert v["version"] == 2 and v["candidates"][0]["ranks"] == [2]
        assert c.get("/v1/jobs/w").json()["records"] == len(ops) + len(more)
        assert 'holmes_job_top_candidate_score{device="gpu:r2",job="w",kind="gpu"} 1.0' in \
            c.get("/metrics").text


@pytest.mark.parametrize(("answer", "reason", "said", "posts"), [
    (_status(500, b"receiver down"), "status", "HTTP 500: receiver down", 3),
    (_status(404, b"no such hook"), "status", "HTTP 404: no such hook", 1),
    (None, "error", "ConnectError", 0),
])
def test_a_webhook_refusing_or_unreachable_is_retried_then_logged_and_counted_once(
        tmp_path, caplog, answer, reason, said, posts):
    """A webhook answering non-2xx was dropped without a word, as was one not answering but
    for a log line; then each was a warning and a count, but never tried again: a receiver
    restarting lost the notification. Now a 5xx or no connection is tried 3 times (a 404 once:
    the same POST would be refused again), and the notification given up is one warning
    naming the (redacted) URL and why, counted once in holmes_webhook_failures_total."""
    hook = _Receiver(lambda n, h: answer(h)) if answer else None
    if hook is None:
        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{s.getsockname()[1]}/hook"
    else:
        url = hook.url
    app = create_app(_settings(tmp_path, url), analyzers=ANALYZERS)
    sender = app.state.service.sender
    sender.backoff_s = 0.05
    with TestClient(app) as c, caplog.at_level(logging.WARNING, logger="holmes_ml.serve.app"):
        assert c.post("/v1/jobs/w/raw", json=raw_body(make_ops(seed=5), "a", seq=0),
                      headers=auth()).status_code == 200
        assert c.post("/v1/jobs/w/analyze", headers=auth()).status_code == 200
        assert _until(lambda: _metric(c, f'holmes_webhook_failures_total{{reason="{reason}"}}'))
        assert _metric(c, f'holmes_webhook_failures_total{{reason="{reason}"}}') == 1.0
        assert _metric(c, "holmes_webhook_sent_total") == 0.0
    if hook is not None:
        hook.close()
        assert len(hook.got) == posts
    shown = f"webhook {redact_url(url)}: new_top_candidate notification of job w (verdict 1) " \
            "not delivered after"
    assert shown in caplog.text, caplog.text
    assert said in caplog.text, caplog.text


def test_a_receiver_failing_twice_gets_the_notification_on_the_third_attempt(tmp_path):
    """A notification answered 500 (a receiver restarting) was never sent again. It is now
    retried with back-off, delivered on the third attempt, and counted in
    holmes_webhook_sent_total; the payload carries sent_at, verdict_version and slowdown
    besides the keys receivers already read."""
    hook = _Receiver(lambda n, h: _status(500 if n < 2 else 200)(h))
    app = create_app(_settings(tmp_path, hook.url), analyzers=ANALYZERS)
    app.state.service.sender.backoff_s = 0.05
    before = time.time()
    with TestClient(app) as c:
        assert c.post("/v1/jobs/w/raw", json=raw_body(make_ops(seed=5, slow_rank=2), "a",
                                                      seq=0), headers=auth()).status_code == 200
        assert c.post("/v1/jobs/w/analyze", headers=auth()).status_code == 200
        assert _until(lambda: _metric(c, "holmes_webhook_sent_total") == 1.0)
        assert _metric(c, 'holmes_webhook_failures_total{reason="status"}') is None
    hook.close()
    assert len(hook.got) == 3
    last = hook.got[-1]
    assert {"event", "job", "candidate", "irregular_iterations", "sent_at", "verdict_version",
            "slowdown"} <= set(last), last
    assert last["event"] == "new_top_candidate" and last["job"] == "w"
    assert last["candidate"]["ranks"] == [2] and last["irregular_iterations"] == [1]
    assert last["verdict_version"] == 1 and before <= last["sent_at"] <= time.time()
    assert hook.got[0]["sent_at"] <= last["sent_at"]  # stamped at each attempt


def test_a_slow_receiver_holds_no_verdict_health_check_or_deletion(tmp_path):
    """The notification was POSTed by the analysis thread, holding the job's lock: a
    receiver slow to answer delayed every other job's verdict, made DELETE of the job wait,
    and (with clients waiting on the lock) left /healthz and ingestion unanswered. Now a
    receiver that does not answer at all leaves them be: another job's verdict comes, and
    /healthz, DELETE and /metrics answer, while that delivery is still under way; stopping the
    service ends it."""
    release = threading.Event()
    arrived = threading.Event()

    def hold(n: int, h: BaseHTTPRequestHandler) -> None:
        arrived.set()
        release.wait(60)
        _status(204)(h)

    hook = _Receiver(hold)
    app = create_app(_settings(tmp_path, hook.url, every=0.1), analyzers=ANALYZERS)
    service = app.state.service
    service.sender.deadline_s = 120.0  # still under way whatever the machine's load
    try:
        with TestClient(app) as c:
            assert c.post("/v1/jobs/a/raw", json=raw_body(make_ops(seed=5), "a", seq=0),
                          headers=auth()).status_code == 200
            assert arrived.wait(20)
            assert c.post("/v1/jobs/b/raw", json=raw_body(make_ops(seed=6), "a", seq=0),
                          headers=auth()).status_code == 200
            assert _until(lambda: c.get("/v1/jobs/b/verdict").json()["version"] == 1)
            assert c.get("/healthz").status_code == 200
            assert c.delete("/v1/jobs/a", headers=auth()).status_code == 200
            assert _until(lambda: service.sender.pending == 2)  # a's under way, b's queued
            assert _metric(c, "holmes_webhook_pending") == 2.0
            assert not release.is_set() and len(hook.got) == 1
        # the lifespan ended the POST under way and dropped b's, saying so
        assert not service.sender._thread.is_alive()
        assert _count(service.webhook_dropped, reason="stopped") == 2
        assert _count(service.webhook_sent) == 0 and _count(service.webhook_failures) == 0
    finally:
        release.set()
        hook.close()


def test_a_receiver_trickling_its_answer_is_given_up_at_the_deadline(tmp_path):
    """httpx's timeout is per read: a receiver sending its answer a byte at a time was
    waited on for as long as it kept trickling (with the job's lock held). A POST now has a
    deadline for the whole of it: the notification is given up (reason timeout) while the
    receiver is still trickling."""
    stop, finished = threading.Event(), threading.Event()

    def trickle(n: int, h: BaseHTTPRequestHandler) -> None:
        try:
            h.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            end = time.monotonic() + 60
            while not stop.is_set() and time.monotonic() < end:
                h.wfile.write(b"a")
                h.wfile.flush()
                time.sleep(0.1)
        except OSError:
            pass  # the service hung up: what it should do
        finally:
            finished.set()

    hook = _Receiver(trickle)
    app = create_app(_settings(tmp_path, hook.url), analyzers=ANALYZERS)
    sender = app.state.service.sender
    sender.deadline_s, sender.attempts = 1.0, 1
    try:
        with TestClient(app) as c:
            assert c.post("/v1/jobs/w/raw", json=raw_body(make_ops(seed=5), "a", seq=0),
                          headers=auth()).status_code == 200
            assert c.post("/v1/jobs/w/analyze", headers=auth()).status_code == 200
            assert _until(lambda: _metric(c, 'holmes_webhook_failures_total{reason="timeout"}')
                          == 1.0, 30)
            assert not stop.is_set() and len(hook.got) == 1
            # the service hung up: the receiver's next byte fails (it did not run out)
            assert finished.wait(20) and len(hook.got) == 1
    finally:
        stop.set()
        hook.close()


def _nic(device: str, tied: list[str], score: float = 0.5) -> dict:
    return {"kind": "nic", "device": device, "ranks": [0, 1], "hosts": ["h0"], "score": score,
            "tied_with": tied}


def test_a_swap_within_a_tie_pages_not_and_recovery_sends_resolved(tmp_path):
    """Two devices the verdict declares tied (tied_with each other, same score) come in
    either order: a swap paged again as a new top candidate. And a job whose suspect went
    away sent nothing. Now the suspect is the device with its tie, and a verdict naming none
    after one that named one sends {"event": "resolved"} once."""
    a, b = "nic:h0/mlx5_0", "nic:h1/mlx5_0"
    script = iter([
        {"candidates": [_nic(a, [b]), _nic(b, [a])], "slowdown": 1.4},  # 1: paged
        {"candidates": [_nic(b, [a]), _nic(a, [b])], "slowdown": 1.5},  # 2: the same tie
        {"candidates": []},                                              # 3: resolved
        {"candidates": []},                                              # 4: still nothing
        {"candidates": [_nic(a, [], 0.9)], "slowdown": 1.2},             # 5: paged again
    ])
    analyzers = Analyzers(ANALYZERS.localize_summaries,
                          lambda ops, topology=None, model=None: next(script),
                          lambda **kw: SimpleNamespace(**kw))
    hook = _Receiver()
    app = create_app(_settings(tmp_path, hook.url), analyzers=analyzers)
    with TestClient(app) as c:
        for seq in range(5):
            assert c.post("/v1/jobs/w/raw", json=raw_body(make_ops(seed=seq), f"b{seq}",
                                                          seq=seq),
                          headers=auth()).status_code == 200
            assert c.post("/v1/jobs/w/analyze", headers=auth()).json()["version"] == seq + 1
        assert _until(lambda: app.state.service.sender.pending == 0)
        assert _metric(c, "holmes_webhook_sent_total") == 3.0
    hook.close()
    assert [(g["event"], g["verdict_version"]) for g in hook.got] == [
        ("new_top_candidate", 1), ("resolved", 3), ("new_top_candidate", 5)]
    assert hook.got[0]["candidate"]["device"] == a and hook.got[0]["slowdown"] == 1.4
    assert set(hook.got[1]) == {"event", "job", "sent_at", "verdict_version"}
    assert hook.got[1]["job"] == "w"


def test_the_webhook_url_is_redacted_in_logs(tmp_path, caplog):
    """The warnings named the webhook URL in full, and with it the secret it often holds
    (a token as its user or password, in its path or query). They now show scheme, host and
    port only."""
    hook = _Receiver(lambda n, h: _status(403, b"bad token")(h))
    port = hook.server.server_port
    url = f"http://bot:pa55w0rd@127.0.0.1:{port}/services/T0K3N?key=k3y"
    with TestClient(create_app(_settings(tmp_path, url), analyzers=ANALYZERS)) as c, \
            caplog.at_level(logging.INFO, logger="holmes_ml.serve.app"):
        assert c.post("/v1/jobs/w/raw", json=raw_body(make_ops(seed=5), "a", seq=0),
                      headers=auth()).status_code == 200
        assert c.post("/v1/jobs/w/analyze", headers=auth()).status_code == 200
        assert _until(lambda: _metric(c, 'holmes_webhook_failures_total{reason="status"}'))
    hook.close()
    assert f"webhook http://127.0.0.1:{port}/…: new_top_candidate notification" in caplog.text
    assert "HTTP 403: bad token" in caplog.text
    for secret in ("bot", "pa55w0rd", "T0K3N", "k3y", "/services"):
        assert secret not in caplog.text, caplog.text
    assert redact_url("https://[::1]:8443") == "https://[::1]:8443"
    assert redact_url("https://hooks.example.com/") == "https://hooks.example.com"


def test_serve_reads_the_webhook_from_its_environment_variable(tmp_path):
    """--webhook had no environment variable (unlike --token), so the URL, secret and all,
    showed in `ps`; HOLMES_SERVE_WEBHOOK now gives it."""
    import os

    env = {**os.environ, "HOLMES_SERVE_WEBHOOK": "notaurl"}
    proc = subprocess.run([sys.executable, "-c", "from holmes_ml.cli import main; main()",
                           "serve", "--db", str(tmp_path / "s.db"), "--port", str(free_port())],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "--webhook 'notaurl': expected an http:// or https:// URL" in proc.stderr
    assert not (tmp_path / "s.db").exists()


def test_a_full_queue_drops_its_oldest_notification_and_counts_it(caplog):
    """Notifications now wait in a queue while the receiver is slow; a receiver that never
    keeps up must not make it grow without end: past its bound the oldest is dropped, with
    a warning, counted in holmes_webhook_dropped_total{reason="queue_full"}; the others
    are delivered in order."""
    from holmes_ml.serve.app import WebhookSender

    release, arrived = threading.Event(), threading.Event()

    def hold_first(n: int, h: BaseHTTPRequestHandler) -> None:
        if n == 0:
            arrived.set()
            release.wait(60)
        _status(204)(h)

    hook = _Receiver(hold_first)
    registry = prom.CollectorRegistry()
    sent = prom.Counter("sent", "", registry=registry)
    failures = prom.Counter("failures", "", ["reason"], registry=registry)
    dropped = prom.Counter("dropped", "", ["reason"], registry=registry)
    sender = WebhookSender(hook.url, sent, failures, dropped, max_queue=2)
    try:
        with caplog.at_level(logging.WARNING, logger="holmes_ml.serve.app"):
            sender.send({"event": "resolved", "job": "j0", "verdict_version": 1})
            assert arrived.wait(20)  # the first is under way, out of the queue
            for n in (1, 2, 3):
                sender.send({"event": "resolved", "job": f"j{n}", "verdict_version": 1})
            assert _count(dropped, reason="queue_full") == 1 and sender.pending == 3
            release.set()
            assert _until(lambda: sender.pending == 0)
        assert [g["job"] for g in hook.got] == ["j0", "j2", "j3"] and _count(sent) == 3
        assert "dropped the oldest (resolved notification of job j1" in caplog.text
    finally:
        release.set()
        sender.stop()
        hook.close()
