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
