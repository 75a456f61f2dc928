"""The job `holmes bench serve` times verdicts on is one whose late rank the service names."""

from __future__ import annotations

import numpy as np

from holmes_ml.bench.serve import _store_late_rank_job, _top_rank
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
