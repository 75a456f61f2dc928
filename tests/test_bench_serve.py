"""The job `holmes bench serve` times verdicts on is one whose late rank the service names, and
a verdict reads no more of it than the localizer looks at."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from holmes_ml.bench.serve import _store_late_rank_job, _top_rank
from holmes_ml.localize import LocalizeConfig
from holmes_ml.serve.engine import compute_verdict, pipeline_analyzers
from holmes_ml.serve.store import Store


def test_the_bench_job_has_one_late_rank_and_the_service_names_it(tmp_path):
    store = Store(tmp_path / "s.db")
    _store_late_rank_job(store, 64, 0, 30, np.random.default_rng(1), step=7)
    assert store.job("job")["batches"] == 5
    verdict = compute_verdict(store, "job", pipeline_analyzers(), last=200)
    assert _top_rank(verdict) == 5.0, verdict["candidates"][:2]
    assert "rank 5 arrived last" in verdict["candidates"][0]["evidence"][0]["detail"]
    store.close()


def test_a_verdict_reads_only_the_abnormal_operators_the_localizer_looks_at(tmp_path):
    store = Store(tmp_path / "s.db")
    rng = np.random.default_rng(2)
    _store_late_rank_job(store, 32, 0, 40, rng, step=10)  # rank 5 late, then rank 9
    _store_late_rank_job(store, 32, 40, 80, rng, step=10, late=9)
    real = pipeline_analyzers()
    assert real.abnormal_window == LocalizeConfig().window == 50
    data = store.agent_data("job", 200, real.abnormal_window)
    assert data["iterations"]["iteration"].min() == 0
    assert data["abnormal"]["iteration"].min() == 30  # the 50 most recent with any
    fast = compute_verdict(store, "job", real, last=200)
    every = compute_verdict(store, "job", replace(real, abnormal_window=None), last=200)
    assert fast == every
    assert [c["ranks"] for c in fast["candidates"][:2]] == [[9], [5]], fast["candidates"]
    store.close()


def _episode_batch(its: np.ndarray, ranks: int, episode: range, late: int,
                   rng: np.random.Generator) -> dict:
    """Agent batch of a data-parallel job (one all_reduce a step, 0.8 s of compute): rank
    ``late`` joins 0.2 s late in the steps of ``episode``; in the others one random rank's
    copy is a little long (what a detector flags now and then in a healthy step)."""
    it, rk = np.repeat(its, ranks), np.tile(np.arange(ranks), len(its))
    slow = np.isin(it, list(episode))
    waited = slow & (rk != late)
    batch: dict = {
        "source": "agent", "batch_id": f"b{its[0]}", "seq": int(its[0]),
        "iterations": {"iteration": it.tolist(), "rank": rk.tolist(),
                       "start_ns": (it * 10**9).tolist(),
                       "end_ns": (it * 10**9 + 8 * 10**8 + slow * 2 * 10**8).tolist(),
                       "comm_us": np.where(waited, 2e5 + 900.0, 900.0).tolist(),
                       "n_ops": [1] * len(it)}}
    ab_it = np.concatenate([it[waited], [i for i in its if i not in episode]])
    ab_rank = np.concatenate([rk[waited], rng.integers(0, ranks, len(ab_it) - waited.sum())])
    excess = np.where(np.isin(ab_it, list(episode)), 2e5, 300.0)
    n = len(ab_it)
    batch["abnormal"] = {"iteration": ab_it.tolist(), "rank": ab_rank.tolist(),
                         "op": ["all_reduce"] * n, "group": ["dp-0"] * n,
                         "seq": ab_it.tolist(), "nbytes": [1 << 20] * n,
                         "start_ns": (ab_it * 10**9 + 8 * 10**8).tolist(),
                         "duration_us": (excess + 900.0).tolist(), "score": [0.99] * n,
                         "excess_us": excess.tolist()}
    if its[0] == 0:
        batch["ranks"] = {"rank": list(range(ranks)),
                          "host": [f"h{r // 8}" for r in range(ranks)],
                          "gpu": [r % 8 for r in range(ranks)]}
        batch["groups"] = [{"name": "dp-0", "kind": "dp", "ranks": list(range(ranks))}]
    return batch


def test_a_verdict_reaches_back_to_an_episode_older_than_the_abnormal_window(tmp_path):
    # 120 steps, rank 5 late in 20-30 only; the 50 most recent steps with abnormal operators
    # are all healthy: the verdict analyses the episode it reports, as holmes localize does
    store = Store(tmp_path / "s.db")
    rng = np.random.default_rng(3)
    for at in range(0, 120, 10):
        store.ingest_agent("job", _episode_batch(np.arange(at, at + 10), 16, range(20, 31), 5,
                                                 rng), f"d{at}")
    real = pipeline_analyzers()
    fast = compute_verdict(store, "job", real, last=200)
    assert fast["irregular_iterations"] == list(range(20, 31))
    assert fast["candidates"][0]["ranks"] == [5]
    assert all(e["rule"] == "straggler" and 20 <= e["iteration"] <= 30
               for e in fast["candidates"][0]["evidence"])
    assert "the iterations after 30" in fast["note"]
    every = compute_verdict(store, "job", replace(real, abnormal_window=None), last=200)
    assert fast == every
    store.close()
