"""Benchmark results carry the commit, machine and library versions."""

from __future__ import annotations

import json

from holmes_ml.bench.record import BenchResult, git_commit, peak_rss_mb, write_result


def test_write_result_records_provenance(tmp_path):
    res = BenchResult("unit", {"seconds": 1.5}, config={"quick": True}, goals={"seconds": "<= 2"})
    path = write_result(res, tmp_path / "out")
    data = json.loads(path.read_text())
    assert path.name == "unit.json"
    assert data["figures"] == {"seconds": 1.5}
    assert data["config"] == {"quick": True}
    assert data["git_commit"] == git_commit()
    assert data["machine"]["cpu_count"] >= 1
    assert data["libraries"]["numpy"] != "absent"
    assert peak_rss_mb() > 1.0


def test_git_commit_outside_a_checkout(tmp_path):
    assert git_commit(tmp_path) == "unknown"
