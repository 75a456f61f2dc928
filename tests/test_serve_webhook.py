"""Webhook on a new top device, background analysis, and verdicts surviving a restart."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

from fastapi.testclient import TestClient
from test_serve_support import ANALYZERS, TOKEN, auth, make_ops, raw_body

from holmes_ml.serve.app import ServeSettings, create_app


def test_webhook_fires_once_per_new_top_device_and_state_persists(tmp_path):
    got: list[dict] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server API
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    hook = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    settings = ServeSettings(db=tmp_path / "s.db", token=TOKEN, analyze_interval_s=0.1,
                             webhook=f"http://127.0.0.1:{hook.server_port}/hook")
    ops = make_ops(seed=5, slow_rank=2)
    with TestClient(create_app(settings, analyzers=ANALYZERS)) as c:
        assert c.post("/v1/jobs/w/raw", json=raw_body(ops, "a", seq=0),
                      headers=auth()).status_code == 200
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:  # the background thread analyzes
            time.sleep(0.05)
        more = make_ops(seed=6, slow_rank=2)
        assert c.post("/v1/jobs/w/raw", json=raw_body(more, "b", seq=1),
                      headers=auth()).status_code == 200
        v = c.post("/v1/jobs/w/analyze", headers=auth()).json()
        assert v["version"] == 2 and not v["stale"]
    hook.shutdown()
    assert len(got) == 1  # same top device after the second batch: no second notification
    assert got[0]["job"] == "w" and got[0]["candidate"]["ranks"] == [2]
    with TestClient(create_app(settings, analyzers=ANALYZERS)) as c:  # a restart keeps all
        v = c.get("/v1/jobs/w/verdict").json()
        assert v["version"] == 2 and v["candidates"][0]["ranks"] == [2]
        assert c.get("/v1/jobs/w").json()["records"] == len(ops) + len(more)
        assert 'holmes_job_top_candidate_score{device="gpu:r2",job="w",kind="gpu"} 1.0' in \
            c.get("/metrics").text


def test_a_webhook_refusing_or_unreachable_is_logged_and_counted(tmp_path, caplog):
    """A webhook answering non-2xx was dropped without a word, as was one not answering but
    for a log line: each is a warning naming the URL and why, counted in
    holmes_webhook_failures_total."""
    import logging
    import socket

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server API
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"receiver down")

        def log_message(self, *args):
            pass

    hook = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/hook"
    failing = f"http://127.0.0.1:{hook.server_port}/hook"
    for n, (url, reason, said) in enumerate([(failing, "status", "HTTP 500: receiver down"),
                                              (dead, "error", "ConnectError")]):
        settings = ServeSettings(db=tmp_path / f"s{n}.db", token=TOKEN, analyze_interval_s=0,
                                 webhook=url)
        with TestClient(create_app(settings, analyzers=ANALYZERS)) as c, \
                caplog.at_level(logging.WARNING, logger="holmes_ml.serve.app"):
            assert c.post("/v1/jobs/w/raw", json=raw_body(make_ops(seed=5), "a", seq=0),
                          headers=auth()).status_code == 200
            assert c.post("/v1/jobs/w/analyze", headers=auth()).status_code == 200
            metrics = c.get("/metrics").text
        assert f'holmes_webhook_failures_total{{reason="{reason}"}} 1.0' in metrics, metrics
        assert f"webhook {url}: notification of job w not delivered" in caplog.text
        assert said in caplog.text, caplog.text
        caplog.clear()
    hook.shutdown()
