"""`holmes detect` end to end on a small simulated log."""

from __future__ import annotations

import pandas as pd
from typer.testing import CliRunner

from holmes_ml.cli import app


def test_detect_writes_scores_and_irregular_iterations(tmp_path):
    from holmes_ml.simulator import FaultSpec, SimConfig, simulate

    res = simulate(SimConfig(gpus=64, iterations=14, seed=4,
                             faults=(FaultSpec.parse("gpu_slow:rank=3,severity=0.9,start=6"),)))
    log = tmp_path / "ops.parquet"
    res.ops.drop(columns=["abnormal", "fault_id"]).to_parquet(log, index=False)
    out = tmp_path / "scores.parquet"
    r = CliRunner().invoke(app, ["detect", str(log), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "irregular iterations:" in r.output
    table = pd.read_parquet(out)
    assert len(table) == len(res.ops) and table["score"].between(0, 1).all()
    merged = table.merge(res.ops[["iteration", "rank", "group", "seq", "op", "abnormal"]],
                         on=["iteration", "rank", "group", "seq", "op"])
    assert merged.loc[merged["abnormal"], "score"].mean() > merged.loc[
        ~merged["abnormal"], "score"].mean() + 0.3


def test_detect_refuses_foreign_model(tmp_path):
    bad = tmp_path / "m.holmes"
    bad.write_bytes(b"not a model")
    log = tmp_path / "ops.csv"
    log.write_text("x\n1\n")
    r = CliRunner().invoke(app, ["detect", str(log), "--model", str(bad)])
    assert r.exit_code != 0
    assert "not a holmes_ml model envelope" in " ".join(r.output.split()).replace("│ ", "")
