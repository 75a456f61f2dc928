"""Helpers shared by the serving tests: a real uvicorn subprocess and small synthetic jobs.

Until :mod:`holmes_ml.pipeline` exists, the service under test runs with a simple stand-in
localizer (the rank with the most abnormal operator time) and agents with a stand-in
summarizer; both are defined here only.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pandas as pd

from holmes_ml.serve.engine import Analyzers

TOKEN = "s3cret-token"

LAUNCHER = r'''
import sys
from types import SimpleNamespace
import pandas as pd
from holmes_ml.serve.app import ServeSettings, serve
from holmes_ml.serve.engine import Analyzers

def _verdict(frame, weight):
    if frame.empty:
        return {"irregular": False, "irregular_iterations": [], "candidates": []}
    w = frame.groupby("rank")[weight].sum().sort_values(ascending=False, kind="stable")
    total = float(w.sum()) or 1.0
    return {"irregular": True,
            "irregular_iterations": sorted(int(i) for i in frame["iteration"].unique()),
            "candidates": [{"kind": "gpu", "device": f"gpu:rank{int(r)}", "ranks": [int(r)],
                            "hosts": [], "score": float(v) / total, "coords": None,
                            "evidence": []} for r, v in w.head(5).items()]}

def localize_summaries(summaries, topology=None):
    ab = pd.concat([s.abnormal for s in summaries])
    return _verdict(ab, "duration_us")

def analyze(ops, topology=None, model=None):
    med = ops.groupby("op")["duration_us"].transform("median")
    return _verdict(ops[ops["duration_us"] > 3 * med], "duration_us")

use_pipeline = sys.argv[4] == "pipeline"
analyzers = None if use_pipeline else Analyzers(localize_summaries, analyze,
                                                lambda **kw: SimpleNamespace(**kw))
serve(ServeSettings(db=sys.argv[1], port=int(sys.argv[2]), token=sys.argv[3] or None,
                    max_body_bytes=4 * 2**20, analyze_interval_s=0.5), analyzers=analyzers)
'''


def _stand_in_analyze(ops, topology=None, model=None):
    slow = ops.groupby("rank")["duration_us"].sum().idxmax()
    return {"irregular": True, "irregular_iterations": [1],
            "candidates": [{"kind": "gpu", "device": f"gpu:r{slow}", "ranks": [int(slow)],
                            "hosts": [], "score": 1.0}]}


#: Stand-in localizer for services run in-process: the rank with the most operator time.
ANALYZERS = Analyzers(
    lambda s, topology=None: _stand_in_analyze(pd.concat([x.abnormal for x in s])),
    _stand_in_analyze, lambda **kw: SimpleNamespace(**kw))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    db: Path
    port: int

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill9()


def start_server(tmp: Path, db: Path | None = None, port: int | None = None,
                 token: str = TOKEN, pipeline: bool = False) -> Server:
    script = tmp / "launch_serve.py"
    script.write_text(LAUNCHER)
    db = db or tmp / "serve.db"
    port = port or free_port()
    log = open(tmp / f"serve-{port}.log", "ab")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(
        [sys.executable, str(script), str(db), str(port), token,
         "pipeline" if pipeline else "fallback"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((tmp / f"serve-{port}.log").read_text())
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return Server(proc, url, db, port)
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("service did not start")


def auth(token: str = TOKEN) -> dict:
    return {"Authorization": f"Bearer {token}"}


def make_ops(seed: int = 0, ranks: int = 8, iterations: int = 12, slow_rank: int = 5,
             ops_per_iter: int = 6) -> pd.DataFrame:
    """A tiny data-parallel job in which ``slow_rank``'s operators take 5x longer."""
    rng = np.random.default_rng(seed)
    it, rk, sq = np.meshgrid(np.arange(iterations), np.arange(ranks), np.arange(ops_per_iter),
                             indexing="ij")
    it, rk, sq = it.ravel(), rk.ravel(), sq.ravel()
    dur = rng.normal(100.0, 3.0, it.size).clip(50)
    dur[rk == slow_rank] *= 5
    start = it * 10_000_000 + sq * 1_000_000 + rng.integers(0, 1000, it.size)
    return pd.DataFrame({
        "iteration": it, "rank": rk, "op": "all_reduce", "group": "dp-0", "seq": it * 100 + sq,
        "nbytes": 1 << 20, "start_ns": start, "duration_us": dur,
        "group_ranks": " ".join(map(str, range(ranks))), "peer": -1,
        "host": [f"h{r // 4}" for r in rk], "group_kind": "dp",
    })


def raw_body(ops: pd.DataFrame, batch_id: str, seq: int | None = None,
             source: str = "logger") -> dict:
    cols = ["iteration", "rank", "op", "group", "seq", "nbytes", "start_ns", "duration_us"]
    return {"source": source, "batch_id": batch_id, "seq": seq,
            "columns": {c: ops[c].tolist() for c in cols}}


def window_batch(seq: int, iterations: range, slow_rank: int | None) -> dict:
    """Two ranks' summaries of ``iterations``; ``slow_rank`` has one abnormal op in each."""
    its = [i for i in iterations for _ in (0, 1)]
    body = {"source": "n1", "batch_id": f"w-{seq}", "seq": seq,
            "iterations": {"iteration": its, "rank": [0, 1] * len(iterations),
                           "start_ns": [i * 1000 for i in its],
                           "end_ns": [i * 1000 + 900 for i in its],
                           "comm_us": [0.5] * len(its), "n_ops": [3] * len(its)}}
    if seq == 0:
        body["ranks"] = {"rank": [0, 1], "host": ["h0", "h0"], "gpu": [0, 1]}
        body["groups"] = [{"name": "dp-0", "kind": "dp", "ranks": [0, 1]}]
    if slow_rank is not None:
        n = len(iterations)
        body["abnormal"] = {"iteration": list(iterations), "rank": [slow_rank] * n,
                            "op": ["all_reduce"] * n, "group": ["dp-0"] * n, "seq": [0] * n,
                            "nbytes": [8] * n, "start_ns": [i * 1000 for i in iterations],
                            "duration_us": [0.9] * n, "score": [0.97] * n}
    return body


def fallback_summarize(ops: pd.DataFrame) -> SimpleNamespace:
    """Stand-in for pipeline.summarize: operators 3x above their op's median are abnormal."""
    g = ops.assign(end_ns=ops["start_ns"] + (ops["duration_us"] * 1e3).astype(np.int64))
    iters = g.groupby(["iteration", "rank"], as_index=False).agg(
        start_ns=("start_ns", "min"), end_ns=("end_ns", "max"), comm_us=("duration_us", "sum"),
        n_ops=("seq", "size"))
    med = ops.groupby("op")["duration_us"].transform("median")
    ab = ops[ops["duration_us"] > 3 * med].assign(score=1.0)
    groups = ops.groupby("group", as_index=False).agg(group_kind=("group_kind", "first"),
                                                      group_ranks=("group_ranks", "first"))
    return SimpleNamespace(iterations=iters, abnormal=ab, groups=groups)
