"""holmes bench agents: real agents replay a job into a real service, scored like the localize bench."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from holmes_ml.bench.agents import LIVE, LiveAgents, _by_trial_misses, _traffic, cases
from holmes_ml.bench.localize import _sc, _trials
from holmes_ml.bench.serve import _start

LAYOUT = {"tp": 2, "pp": 2}


def _job() -> list[dict]:
    return [
        _sc(32, "3-D (tp,pp,dp)", "healthy", "", 5, iterations=6, layout=LAYOUT),
        _sc(32, "3-D (tp,pp,dp)", "gpu_slow", "persistent", 5, iterations=6, layout=LAYOUT,
            fault="gpu_slow:rank=9,severity=1.0,start=2"),
    ]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-agents")
    proc, url = _start(root / "serve.db")
    yield url, root
    proc.terminate()
    proc.wait(timeout=30)


def test_live_agents_replay_a_job_and_the_service_names_the_slow_gpu(service):
    url, root = service
    rows, unobservable = _trials(_job(), {LIVE: LiveAgents(url=url, root=str(root))},
                                 only=("holmes", LIVE))
    assert not unobservable
    by = {(r["kind"], r["method"]): r for r in rows}
    assert by[("gpu_slow", LIVE)]["top1"] and by[("gpu_slow", "holmes")]["top1"]
    # the live path may abstain: a healthy job is flagged only if the service names someone
    assert by[("healthy", LIVE)]["flagged"] is False
    stats = [json.loads(p.read_text()) for p in sorted(root.glob("t*.json"))]
    assert len(stats) == 2
    for s in stats:
        # one step per host and replayed iteration; far fewer bytes posted than read
        assert s["hosts"] == 4 and len(s["step_seconds"]) == 4 * 6
        assert 0 < s["sent_bytes"] < 0.1 * s["raw_bytes"]
        assert not (root / s["job"]).exists()  # logs and outboxes are cleaned up
    figures, table = _traffic(root)
    assert figures["replays"] == 2 and figures["agent_steps"] == 48
    assert [r["gpus"] for r in table] == [32]


def test_a_service_that_refuses_the_batches_is_an_error_not_a_miss(service, tmp_path):
    from holmes_ml.io import without_labels
    from holmes_ml.simulator import FaultSpec, SimConfig, simulate

    url, _ = service
    res = simulate(SimConfig(gpus=16, iterations=4, seed=1,
                             faults=(FaultSpec.parse("gpu_slow:rank=3,severity=1.0,start=1"),)))
    live = LiveAgents(url=url, root=str(tmp_path), token="not-the-token")
    with pytest.raises(Exception, match="401|403|not delivered"):
        live(without_labels(res.ops), res.topology)


def test_misses_list_trials_holmes_gets_and_the_live_agents_lose():
    base = {"gpus": 64, "dims": "3-D", "kind": "gpu_slow", "pattern": "persistent"}
    rows = []
    for seed, holmes, live in [(1, True, True), (2, True, False), (3, False, False)]:
        rows += [{**base, "seed": seed, "method": "holmes", "top1": holmes},
                 {**base, "seed": seed, "method": LIVE, "top1": live}]
    rows.append({**base, "kind": "healthy", "seed": 4, "method": LIVE, "flagged": False})
    assert _by_trial_misses(pd.DataFrame(rows)) == [{**base, "seed": 2}]


def test_cases_cover_every_layout_and_kind_and_the_big_tp8_job():
    full, quick = pd.DataFrame(cases(False)), pd.DataFrame(cases(True))
    assert set(quick["kind"]) == {"gpu_slow", "healthy"} and quick["gpus"].max() == 64
    grid = full[full["gpus"] <= 256]
    assert grid["dims"].nunique() == 5
    assert {"gpu_slow", "nic_slow", "link_slow", "host_stall", "healthy"} <= set(grid["kind"])
    assert (full["gpus"] == 2048).sum() >= 4
    assert (full.get("sweep") == "healthy").sum() > 0


def test_a_failed_replay_voids_the_run(monkeypatch):
    # the bench's trial loop scores a plug-in that raises as "named nothing", which on a healthy
    # job would look right: run() must refuse to report such a run
    from holmes_ml.bench import agents

    def broken(self, ops, topology):
        raise RuntimeError("service down")

    monkeypatch.setattr(agents.LiveAgents, "__call__", broken)
    with pytest.raises(RuntimeError, match="4 of 4 replays failed"):
        agents.run(quick=True, workers=1)


def test_a_noisy_healthy_job_replayed_live_names_no_one(service):
    # The healthy sweep's job 29 (256 GPUs, 6-D, 10 % jitter, 20 % compute and transfer drift):
    # in its 15th step ranks on five hosts each held their partners back by 0.97-1.02 x the
    # GPU/host floor, as the agents' trailing windows measure it, and the service named the two
    # that cleared it. They were late together (LocalizeConfig.step_peer_share).
    from holmes_ml.bench.localize import healthy_sweep

    url, root = service
    job = [sc for sc in healthy_sweep(False) if sc["seed"] == 2029]
    assert job and job[0]["gpus"] == 256 and job[0]["jitter"] == 0.1
    rows, _ = _trials(job, {LIVE: LiveAgents(url=url, root=str(root))}, only=(LIVE,))
    assert [r["flagged"] for r in rows] == [False]
