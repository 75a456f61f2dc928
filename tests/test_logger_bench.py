"""``holmes bench logger --quick --keep-cores-awake``: figures present, condition recorded, and
the spinning helper process gone afterwards (it must never outlive the benchmark)."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("torch")


@pytest.mark.torch
def test_logger_bench_keeps_cores_awake_and_cleans_up(monkeypatch: pytest.MonkeyPatch) -> None:
    import holmes_ml.bench.logger as bench

    started = []
    real = bench._spinner

    def spy():
        proc = real()
        started.append(proc)
        return proc

    monkeypatch.setattr(bench, "_spinner", spy)
    result = bench.run(quick=True, keep_cores_awake=True)
    assert len(started) == 1
    assert started[0].poll() is not None  # killed and reaped
    assert result.config["keep_cores_awake"] is True
    f = result.figures
    assert math.isfinite(f["overhead_us_per_op"]) and f["unlogged_us_per_op"] > 0
    assert f["flush_us_per_op"] >= 0 and f["gc_us_per_op"] >= 0
    assert result.config["rows_logged"] > 0 and result.config["fmt"] == "arrow"  # the default
    assert f["sink_write_us_per_row"] > 0 and f["sink_bytes_per_row"] > 0


@pytest.mark.torch
def test_logger_bench_measures_the_format_asked_for(tmp_path) -> None:
    from typer.testing import CliRunner

    from holmes_ml.cli import app

    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["bench", "logger", "--quick", "--log-format", "arrow",
                                      "--out", str(out)], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    got = json.loads((out / "logger.json").read_text())
    assert got["config"]["fmt"] == "arrow" and got["config"]["rows_logged"] > 0
    assert got["figures"]["flush_us_per_op"] > 0
    bad = CliRunner().invoke(app, ["bench", "logger", "--quick", "--log-format", "csv",
                                   "--out", str(out)], env={"COLUMNS": "400"})
    assert bad.exit_code == 2
    assert "'csv' is not a log format; expected one of parquet, arrow, jsonl" in \
        " ".join(bad.output.split()), bad.output
