"""``holmes bench serve``: ingest rate, request latency and agent traffic of the service.

Starts a real ``holmes serve`` (uvicorn subprocess on a free loopback port, temporary SQLite
database), then measures

* sustained raw-record ingest: columnar batches of canonical records posted back to back by
  ``clients`` concurrent clients (ops/s over the whole run, every batch committed with fsync);
* p50/p99 latency of those ingest requests and of ``GET /v1/jobs/{job}/verdict``;
* agent traffic: a simulated faulty job is summarized per node with
  :func:`holmes_ml.pipeline.summarize` and the gzip-compressed agent batches are compared with the
  raw per-node logs (Parquet and JSON lines);
* verdict cost against a job's age: one job's agent summaries (512 ranks, one slow) stored
  iteration after iteration, and the verdict computed as the service does, over its most recent
  ``ServeSettings.analyze_last`` iterations and over all of them; with the database's size
  at each age, and after pruning it to that window (``holmes serve --keep-iterations``);
* verdict cost against a job's size: the same kind of job with 512 … 8,192 ranks in one
  communicator (as under FSDP across the whole job, or a job's default process group), its
  window of iterations stored; seconds per verdict and how far the process's resident memory
  rose during it (Arrow's buffers included, which tracemalloc does not see).
  Both tables carry the first rank of the verdict's first suspect: 5, the late one.
"""

from __future__ import annotations

import gzip
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from holmes_ml.bench.record import BenchResult, rss_rise_mb
from holmes_ml.io.schema import without_labels

#: Bearer token of the service :func:`_start` launches.
TOKEN = "bench"
_LAUNCH = (
    "import sys; from holmes_ml.serve.app import ServeSettings, serve; "
    f"serve(ServeSettings(db=sys.argv[1], port=int(sys.argv[2]), token={TOKEN!r}, "
    "max_body_bytes=256 * 2**20, analyze_interval_s=0))"
)
_COLS = ("iteration", "rank", "op", "group", "seq", "nbytes", "start_ns", "duration_us")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(db: Path) -> tuple[subprocess.Popen, str]:
    import httpx

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", _LAUNCH, str(db), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("holmes serve did not start within 30 s")


def _batches(n_batches: int, rows: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for b in range(n_batches):
        cols = {
            "iteration": (np.arange(rows) // 4096 + b).tolist(),
            "rank": rng.integers(0, 256, rows).tolist(),
            "op": ["all_reduce"] * rows,
            "group": ["dp-0"] * rows,
            "seq": np.arange(rows).tolist(),
            "nbytes": [1 << 20] * rows,
            "start_ns": (b * 10**9 + np.arange(rows) * 1000).tolist(),
            "duration_us": rng.normal(100, 5, rows).round(3).tolist(),
        }
        body = {"source": f"bench{b % 4}", "batch_id": f"b{b}", "columns": cols}
        out.append(json.dumps(body, separators=(",", ":")).encode())
    return out


def _arrow_bodies(bodies: list[bytes]) -> list[bytes]:
    import pyarrow as pa

    out = []
    for body in bodies:
        table = pa.table(json.loads(body)["columns"])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        out.append(sink.getvalue().to_pybytes())
    return out


def _ingest(url: str, bodies: list[bytes], clients: int,
            arrow: bool = False) -> tuple[float, list[float]]:
    import httpx

    lat: list[float] = []
    lock = threading.Lock()
    queue = list(enumerate(bodies))

    def worker() -> None:
        with httpx.Client(base_url=url, timeout=120,
                          headers={"Authorization": f"Bearer {TOKEN}",
                                   "Content-Type": "application/json"}) as c:
            while True:
                with lock:
                    if not queue:
                        return
                    i, body = queue.pop()
                t0 = time.perf_counter()
                if arrow:
                    r = c.post("/v1/jobs/bench-arrow/raw.arrow", content=body,
                               params={"source": "arrow", "batch_id": f"a{i}"},
                               headers={"Content-Type": "application/vnd.apache.arrow.stream"})
                else:
                    r = c.post("/v1/jobs/bench/raw", content=body)
                r.raise_for_status()
                with lock:
                    lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, lat


def _agent_traffic(quick: bool) -> tuple[dict[str, float], str]:
    from holmes_ml import pipeline
    from holmes_ml.simulator import FaultSpec, SimConfig, simulate

    sim = simulate(SimConfig(gpus=64 if quick else 256, iterations=12 if quick else 30, seed=0,
                             faults=(FaultSpec.parse("gpu_slow:rank=5,severity=0.5,start=4"),)))
    ops = without_labels(sim.ops)
    raw_parquet = raw_jsonl = sent = 0
    model = "default"
    with tempfile.TemporaryDirectory() as tmp:
        for host, part in ops.groupby(ops["host"].astype(str), sort=True):
            p = Path(tmp) / f"{host}.parquet"
            part.to_parquet(p)
            raw_parquet += p.stat().st_size
            raw_jsonl += len(part.to_json(orient="records", lines=True).encode())
            try:
                s = pipeline.summarize(part)
            except Exception:  # noqa: BLE001 - no default model file yet: rule baseline
                s = pipeline.summarize(part, model="rule")
                model = "rule"
            batch = {
                "iterations": {c: s.iterations[c].tolist() for c in s.iterations.columns},
                "abnormal": {c: s.abnormal[c].astype(str if s.abnormal[c].dtype == object
                                                     else s.abnormal[c].dtype).tolist()
                             for c in s.abnormal.columns},
                "groups": s.groups.to_dict("list"),
            }
            sent += len(gzip.compress(json.dumps(batch, default=float).encode()))
    return {
        "agent_bytes": float(sent),
        "raw_parquet_bytes": float(raw_parquet),
        "raw_jsonl_bytes": float(raw_jsonl),
        "agent_reduction_vs_jsonl_pct": 100.0 * (1 - sent / raw_jsonl),
        "agent_reduction_vs_parquet_pct": 100.0 * (1 - sent / raw_parquet),
    }, model


def _late_rank_batch(first: int, its: np.ndarray, ranks: int, rng: np.random.Generator,
                     late: int = 5) -> dict:
    """An agent batch of ``its`` of a data-parallel job of ``ranks`` ranks in one communicator
    (as under FSDP across the whole job): every rank computes for 0.8 s, then joins the
    all_reduce; rank ``late`` joins 0.2 s late, so the others' copies are abnormal (they
    waited) and its own is not."""
    it, rk = np.repeat(its, ranks), np.tile(np.arange(ranks), len(its))
    waited = np.repeat(its, ranks - 1)
    n = len(waited)
    batch: dict = {
        "source": "agent", "batch_id": f"b{first}", "seq": first,
        "iterations": {"iteration": it.tolist(), "rank": rk.tolist(),
                       "start_ns": (it * 10**9 + rng.integers(0, 10**4, len(it))).tolist(),
                       "end_ns": (it * 10**9 + 12 * 10**8
                                  + rng.integers(0, 10**4, len(it))).tolist(),
                       "comm_us": np.where(rk == late, 900.0, 2e5 + 900.0).tolist(),
                       "n_ops": [8] * len(it)},
        "abnormal": {"iteration": waited.tolist(),
                     "rank": np.tile(np.delete(np.arange(ranks), late), len(its)).tolist(),
                     "op": ["all_reduce"] * n, "group": ["dp-0"] * n, "seq": waited.tolist(),
                     "nbytes": [1 << 20] * n, "start_ns": (waited * 10**9 + 8 * 10**8).tolist(),
                     "duration_us": [2e5 + 900.0] * n, "score": [0.99] * n,
                     "excess_us": [2e5] * n}}
    if first == 0:
        batch["ranks"] = {"rank": list(range(ranks)), "host": [f"h{r // 8}" for r in range(ranks)],
                          "gpu": [r % 8 for r in range(ranks)]}
        batch["groups"] = [{"name": "dp-0", "kind": "dp", "ranks": list(range(ranks))}]
    return batch


def _store_late_rank_job(store: Any, ranks: int, first: int, last: int, rng: np.random.Generator,
                         step: int = 100, late: int = 5) -> None:
    """Iterations ``first`` to ``last`` (excluded) of the :func:`_late_rank_batch` job."""
    for at in range(first, last, step):
        its = np.arange(at, min(at + step, last))
        store.ingest_agent("job", _late_rank_batch(at, its, ranks, rng, late), f"d{at}")


def _top_rank(verdict: dict) -> float:
    """The first rank of the verdict's first suspect (-1: none), to show that it is rank 5."""
    return float(verdict["candidates"][0]["ranks"][0]) if verdict["candidates"] else -1.0


def _verdict_vs_age(quick: bool) -> tuple[list[dict[str, float]], float]:
    """Seconds per verdict of an agent job as it ages, and the megabytes it keeps stored with
    ``--keep-iterations`` at the verdict window (see the module docstring)."""
    from holmes_ml.serve.app import ServeSettings
    from holmes_ml.serve.engine import compute_verdict, pipeline_analyzers
    from holmes_ml.serve.store import Store

    ranks = 128 if quick else 512
    ages = (100, 1000) if quick else (100, 1000, 4000)
    window = ServeSettings(db=Path("unused")).analyze_last
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "age.db")
        stored = 0
        for age in ages:
            _store_late_rank_job(store, ranks, stored, age, rng)
            stored = age
            if age == ages[0]:  # imports and the first pandas calls are not the verdict's
                compute_verdict(store, "job", pipeline_analyzers(), last=window)
            row: dict[str, float] = {"iterations_stored": float(age)}
            for name, last in (("seconds_window", window), ("seconds_all", None)):
                t0 = time.perf_counter()
                verdict = compute_verdict(store, "job", pipeline_analyzers(), last=last)
                row[name] = time.perf_counter() - t0
            row["top_suspect_rank"] = _top_rank(verdict)
            row["database_mb"] = store.used_bytes() / 1e6
            rows.append(row)
        store.prune("job", window)
        kept = store.used_bytes() / 1e6
        store.close()
    return rows, kept


def _verdict_vs_size(quick: bool) -> list[dict[str, float]]:
    """Seconds and traced peak memory of a verdict over the window of a job whose one
    communicator spans every rank, at growing job sizes."""
    from holmes_ml.serve.app import ServeSettings
    from holmes_ml.serve.engine import compute_verdict, pipeline_analyzers
    from holmes_ml.serve.store import Store

    window = ServeSettings(db=Path("unused")).analyze_last
    rows: list[dict[str, float]] = []
    for ranks in (512, 2048) if quick else (512, 2048, 8192):
        with tempfile.TemporaryDirectory() as tmp:
            store = Store(Path(tmp) / "size.db")
            _store_late_rank_job(store, ranks, 0, window, np.random.default_rng(0),
                                 step=max(1, 50_000 // ranks))
            if not rows:  # imports and the first pandas calls are not the verdict's
                compute_verdict(store, "job", pipeline_analyzers(), last=10)
            t0 = time.perf_counter()
            verdict, rise = rss_rise_mb(
                partial(compute_verdict, store, "job", pipeline_analyzers(), last=window))
            seconds = time.perf_counter() - t0
            store.close()
        rows.append({"ranks": float(ranks), "abnormal_rows_stored": float(window * (ranks - 1)),
                     "seconds": seconds, "rss_rise_mb": float("nan") if rise is None else rise,
                     "top_suspect_rank": _top_rank(verdict)})
    return rows


def run(quick: bool = False) -> BenchResult:
    """Measure the service on loopback (see module docstring)."""
    import httpx

    rows = 20_000
    n_batches = 20 if quick else 100
    clients = 2
    bodies = _batches(n_batches, rows, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = _start(Path(tmp) / "bench.db")
        try:
            seconds, lat = _ingest(url, bodies, clients)
            arrow_bodies = _arrow_bodies(bodies)
            a_seconds, a_lat = _ingest(url, arrow_bodies, clients, arrow=True)
            q = []
            with httpx.Client(base_url=url, timeout=60) as c:
                for _ in range(50):
                    t0 = time.perf_counter()
                    c.get("/v1/jobs/bench").raise_for_status()
                    q.append(time.perf_counter() - t0)
        finally:
            proc.terminate()
            proc.wait(10)
    figures = {
        "ingest_ops_per_s": rows * n_batches / seconds,
        "ingest_mb_per_s": sum(map(len, bodies)) / seconds / 2**20,
        "ingest_p50_ms": float(np.percentile(lat, 50) * 1e3),
        "ingest_p99_ms": float(np.percentile(lat, 99) * 1e3),
        "ingest_arrow_ops_per_s": rows * n_batches / a_seconds,
        "ingest_arrow_p99_ms": float(np.percentile(a_lat, 99) * 1e3),
        "query_p99_ms": float(np.percentile(q, 99) * 1e3),
    }
    traffic, model = _agent_traffic(quick)
    figures.update(traffic)
    age, kept_mb = _verdict_vs_age(quick)
    size = _verdict_vs_size(quick)
    figures[f"verdict_seconds_{int(size[-1]['ranks'])}_ranks_one_communicator"] = \
        size[-1]["seconds"]
    figures[f"verdict_rss_rise_mb_{int(size[-1]['ranks'])}_ranks_one_communicator"] = \
        size[-1]["rss_rise_mb"]
    oldest = int(age[-1]["iterations_stored"])
    figures[f"database_mb_{oldest}_iterations"] = age[-1]["database_mb"]
    figures["database_mb_kept_to_the_verdict_window"] = kept_mb
    figures[f"verdict_seconds_{oldest}_iterations"] = age[-1]["seconds_window"]
    figures[f"verdict_seconds_{oldest}_iterations_all_read"] = age[-1]["seconds_all"]
    figures["verdict_seconds_100_iterations"] = age[0]["seconds_window"]
    return BenchResult(
        name="serve",
        figures=figures,
        config={"quick": quick, "rows_per_batch": rows, "batches": n_batches,
                "clients": clients, "agent_model": model, "transport": "HTTP/1.1 JSON columnar, loopback",
                "durability": "SQLite WAL synchronous=FULL, commit per batch"},
        goals={"ingest_ops_per_s": ">= 200000", "ingest_arrow_ops_per_s": ">= 200000", "agent_reduction_vs_jsonl_pct": ">= 97"},
        tables={"latency": [{"request": "POST raw batch (20k ops)",
                             "p50_ms": figures["ingest_p50_ms"],
                             "p99_ms": figures["ingest_p99_ms"]},
                            {"request": "GET job", "p99_ms": figures["query_p99_ms"]}],
                "verdict against the job's age (agent job, one slow rank)": age,
                "verdict against the job's size (one communicator of every rank)": size},
    )


__all__ = ["run"]
