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


def test_the_commit_recorded_is_the_one_the_benchmark_started_on(tmp_path, caplog):
    """The commit was read when the result was written, up to an hour and a half after the
    start: a commit made meanwhile was recorded as the one measured."""
    res = BenchResult("unit", {"seconds": 1.5})
    with caplog.at_level("WARNING"):
        data = json.loads(write_result(res, tmp_path, commit="0" * 40).read_text())
    assert data["git_commit"] == "0" * 40 and data["git_commit_at_end"] == git_commit()
    assert "the checkout moved from 0000000000000000000000000000000000000000 to" in caplog.text
    assert f"commit `{'0' * 40}`" in (tmp_path / "unit.md").read_text()
    caplog.clear()
    same = json.loads(write_result(res, tmp_path, commit=git_commit()).read_text())
    assert "git_commit_at_end" not in same and not caplog.text


def test_git_commit_outside_a_checkout(tmp_path):
    assert git_commit(tmp_path) == "unknown"


def test_git_commit_is_the_package_checkouts_wherever_the_bench_starts(tmp_path, monkeypatch):
    from pathlib import Path

    import holmes_ml

    here = git_commit(Path(holmes_ml.__file__).parent)
    monkeypatch.chdir(tmp_path)  # not a git checkout
    assert git_commit() == here


def test_markdown_report_lists_figures_goals_and_tables(tmp_path):
    import numpy as np

    res = BenchResult(
        "unit",
        {"top1": np.float64(0.975)},
        goals={"top1": ">= 0.98"},
        tables={"by scale": [{"gpus": 64, "top1": 1.0}, {"gpus": 8192, "top1": 0.95, "n": 40}]},
    )
    write_result(res, tmp_path)
    text = (tmp_path / "unit.md").read_text()
    assert "| top1 | 0.975 | >= 0.98 |" in text
    assert "### by scale" in text
    # a column that only a later row has still gets a header and an empty cell before it
    assert "| gpus | top1 | n |" in text
    assert "| 64 | 1 |  |" in text
    assert json.loads((tmp_path / "unit.json").read_text())["figures"]["top1"] == 0.975


def test_the_rise_of_resident_memory_counts_what_the_call_touched():
    import numpy as np
    import pytest

    from holmes_ml.bench.record import rss_rise_mb

    def touch(mib: int) -> int:
        a = np.ones(mib * 2**20, dtype=np.uint8)  # written, so resident
        return int(a[::4096].sum())

    out, rise = rss_rise_mb(lambda: touch(200))
    if rise is None:
        pytest.skip("the peak of resident memory cannot be reset here (not Linux, or refused)")
    assert out == 200 * 2**20 // 4096
    assert 190 <= rise <= 400, rise
    # the peak was reset: a small call after a big one does not report the big one
    _, small = rss_rise_mb(lambda: touch(10))
    assert small is not None and small < 100, small
