"""Two agent processes feed a simulated 256-GPU job with a slow GPU; the service names it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pandas as pd
import pytest
from test_serve_support import TOKEN, auth, start_server

from holmes_ml.io import without_labels
from holmes_ml.simulator import FaultSpec, SimConfig, simulate

AGENT = "from holmes_ml.cli import main; main()"


def _two_nodes(ops, tmp_path) -> list:
    """``ops`` split by host into two node directories (the first half of the hosts, the
    rest), each holding its ranks' log as ``ops.parquet``."""
    hosts = sorted(ops["host"].astype(str).unique())
    nodes = []
    for i, part in enumerate((hosts[: len(hosts) // 2], hosts[len(hosts) // 2:])):
        d = tmp_path / f"node{i}"
        d.mkdir()
        ops[ops["host"].astype(str).isin(part)].to_parquet(d / "ops.parquet")
        nodes.append(d)
    return nodes


def _agent(follow, url: str, job: str, *extra: str) -> list[str]:
    """The command line of ``holmes agent --once`` following ``follow`` into job ``job``."""
    return [sys.executable, "-c", AGENT, "agent", "--follow", str(follow), "--server", url,
            "--job", job, "--token", TOKEN, "--once", *extra]


def test_two_agents_localize_injected_gpu(tmp_path):
    sim = simulate(SimConfig(gpus=256, iterations=16, seed=3,
                             faults=(FaultSpec.parse("gpu_slow:rank=37,severity=0.5,start=6"),)))
    injected = sim.faults[0].to_dict()["devices"][0]
    ops = without_labels(sim.ops)
    nodes = _two_nodes(ops, tmp_path)
    (tmp_path / "topology.json").write_text(json.dumps(sim.topology.to_dict()))
    srv = start_server(tmp_path, pipeline=True)
    try:
        procs = [
            subprocess.Popen(
                _agent(d, srv.url, "sim256", "--source", f"node{i}", "--model", "rule")
                + (["--topology", str(tmp_path / "topology.json")] if i == 0 else []),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )
            for i, d in enumerate(nodes)
        ]
        outs = [p.communicate(timeout=120)[0].decode() for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        job = httpx.get(srv.url + "/v1/jobs/sim256").json()
        assert job["records"] == len(ops)
        v = httpx.post(srv.url + "/v1/jobs/sim256/analyze", headers=auth(), timeout=60).json()
        assert v["error"] is None and v["state"] == "analysed" and v["irregular"] is True
        assert v["candidates"][0]["device"] == injected, v["candidates"][:2]
        assert v["candidates"][0]["ranks"] == [37]
        sent = sum(int(o.split("sent ")[1].split("(")[1].split(" B")[0]) for o in outs)
        raw = sum((d / "ops.parquet").stat().st_size for d in nodes)
        assert sent < 0.1 * raw, (sent, raw)
    finally:
        srv.stop()


def test_raw_records_with_compute_times_name_a_heavier_stage(tmp_path):
    # The canonical schema's compute time per step reaches the service with raw records
    # (a logger posting to /raw) and the verdict names the heavier stage, no device.
    sim = simulate(SimConfig(gpus=64, model="llama2-7b", tp=2, pp=4, iterations=12, seed=2,
                             stage_weights=(1.0, 1.35, 1.0, 1.0), log_compute=True))
    ops = without_labels(sim.ops)
    cols = ["iteration", "rank", "op", "group", "seq", "nbytes", "start_ns", "duration_us",
            "group_ranks", "peer", "host", "group_kind", "step_compute_us"]
    srv = start_server(tmp_path, pipeline=True)
    try:
        c = httpx.Client(base_url=srv.url, headers=auth(), timeout=60)
        r = c.put("/v1/jobs/wl/topology", json=sim.topology.to_dict())
        assert r.status_code == 200, r.text
        for i, part in enumerate((ops.iloc[: len(ops) // 2], ops.iloc[len(ops) // 2:])):
            body = {"source": "logger", "batch_id": f"b{i}", "seq": i,
                    "columns": {k: part[k].astype(str if k in ("op", "group", "group_ranks",
                                                               "host", "group_kind")
                                                  else part[k].dtype).tolist() for k in cols}}
            r = c.post("/v1/jobs/wl/raw", json=body)
            assert r.status_code == 200, r.text
        bad = dict(body, batch_id="bad", seq=2)
        bad["columns"] = dict(body["columns"], step_compute_us=[-1.0] * len(part))
        r = c.post("/v1/jobs/wl/raw", json=bad)
        assert r.status_code == 422 and "step_compute_us" in r.text, r.text
        v = c.post("/v1/jobs/wl/analyze").json()
        assert v["error"] is None and v["candidates"] == [], v
        assert v["workload"]["kind"] == "stage-imbalance" and v["workload"]["coords"] == {"pp": 1}
    finally:
        srv.stop()


@pytest.mark.parametrize("logged", [True, False])
def test_agents_ship_compute_times_and_the_verdict_names_the_heavier_stage(tmp_path, logged):
    # As deployed: each host's agent summarizes its own ranks' logs; the compute time per step
    # travels in the iteration summaries and the centre names the stage, no device. Logs
    # without compute times (and a service told no placement) name it too: from each rank's
    # time outside communication, its stage read off the send/recv pairs.
    sim = simulate(SimConfig(gpus=64, model="llama2-7b", tp=2, pp=4, iterations=12, seed=4,
                             stage_weights=(1.0, 1.0, 1.0, 1.35), log_compute=logged))
    nodes = _two_nodes(without_labels(sim.ops), tmp_path)
    srv = start_server(tmp_path, pipeline=True)
    try:
        for i, d in enumerate(nodes):
            done = subprocess.run(
                _agent(d, srv.url, "wl", "--source", f"node{i}", "--model", "rule"),
                capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stdout + done.stderr
        c = httpx.Client(base_url=srv.url, headers=auth(), timeout=60)
        if logged:
            assert c.put("/v1/jobs/wl/topology", json=sim.topology.to_dict()).status_code == 200
        v = c.post("/v1/jobs/wl/analyze").json()
        assert v["error"] is None and v["candidates"] == [], v
        assert v["workload"] and v["workload"]["kind"] == "stage-imbalance", json.dumps(v)
        assert v["workload"]["coords"] == {"pp": 3}, v
        assert v["workload"]["basis"] == ("compute" if logged else "gaps"), v["workload"]
    finally:
        srv.stop()


WHATIF = Path("/work/shared/realdata/bytedance-whatif")


@pytest.mark.skipif(not WHATIF.exists(), reason="real traces not available")
@pytest.mark.parametrize(("name", "expected"), [("ST", "stage-imbalance"), ("AR", "gpu"),
                                               ("SE", "rank-imbalance")])
def test_an_agent_ships_a_real_whatif_trace_and_the_verdict_matches_holmes_localize(
        tmp_path, name, expected):
    # A ByteDance what-if Parquet trace in the followed directory is read whole (not as one
    # rank's log), its compute times travel with the summaries: ST's heavier last stage is
    # named with no device, AR's slowed worker (dp 0, pp 0) comes first, SE's rotating late
    # rank is a workload (with its heavier stage beside it).
    logs = tmp_path / "logs"
    logs.mkdir()
    for part in ("trace", "meta"):
        src = next(WHATIF.glob(f"{part}-{name}.*"))
        (logs / src.name).write_bytes(src.read_bytes())
    srv = start_server(tmp_path, pipeline=True)
    try:
        done = subprocess.run(_agent(logs, srv.url, name), capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        v = httpx.post(f"{srv.url}/v1/jobs/{name}/analyze", headers=auth(), timeout=120).json()
        assert v["error"] is None, v
        if expected == "gpu":
            assert v["candidates"][0]["kind"] == "gpu", v["candidates"][:2]
            assert {"dp": 0, "pp": 0}.items() <= v["candidates"][0]["coords"].items()
        else:
            assert v["candidates"] == [] and v["workload"]["kind"] == expected, v
            stage = v["workload"] if name == "ST" else v["workload"]["others"][0]
            assert stage["kind"] == "stage-imbalance" and stage["basis"] == "compute", v
            assert stage["coords"] == {"pp": 3 if name == "ST" else 1}
    finally:
        srv.stop()


@pytest.mark.parametrize(("fmt", "suffix"), [("arrow", "arrows"), ("jsonl", "jsonl"),
                                           ("csv", "csv")])
def test_simulated_rank_logs_ship_through_one_agent_per_host(tmp_path, fmt, suffix):
    """Trying the deployed path meant splitting ops.parquet by host by hand: `holmes simulate
    --rank-logs` writes each rank's log (no labels) under logs/HOST/, and one agent per host
    ships it into a real service, which names the injected GPU."""
    from test_serve_cli import holmes

    sim_dir = tmp_path / "sim"
    made = holmes("simulate", "--gpus", "32", "--iterations", "14", "--seed", "5", "--fault",
                  "gpu_slow:rank=13,severity=0.5,start=6", "--out", sim_dir, "--rank-logs", fmt,
                  "--no-progress", timeout=120)
    assert made.returncode == 0, made.stderr
    hosts = sorted((sim_dir / "logs").iterdir())
    assert [h.name for h in hosts] == ["node000", "node001", "node002", "node003"]
    assert sorted(f.name for f in hosts[1].iterdir()) == [
        f"rank-{r:05d}.{suffix}" for r in range(8, 16)]
    if fmt == "arrow":  # as the logger flushes: a record batch per iteration
        import pyarrow as pa

        with pa.ipc.open_stream(hosts[1] / "rank-00013.arrows") as stream:
            batches = list(stream)
        assert [b.column("iteration").unique().to_pylist() for b in batches] == [
            [i] for i in range(14)]
    srv = start_server(tmp_path, pipeline=True)
    try:
        for host in hosts:
            done = subprocess.run(_agent(host, srv.url, "ranklogs", "--source", host.name),
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
        job = httpx.get(srv.url + "/v1/jobs/ranklogs").json()
        assert job["records"] == len(pd.read_parquet(sim_dir / "ops.parquet"))
        v = httpx.post(srv.url + "/v1/jobs/ranklogs/analyze", headers=auth(), timeout=60).json()
        assert v["candidates"][0]["device"] == "gpu:node001/5", v["candidates"][:2]
    finally:
        srv.stop()
