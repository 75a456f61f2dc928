"""`holmes train PATH...` re-trains a detector on labelled logs and saves a checked envelope."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from holmes_ml.cli import app
from holmes_ml.io import without_labels
from holmes_ml.models import load_model, read_header
from holmes_ml.simulator import FaultSpec, SimConfig, simulate


@pytest.mark.parametrize("estimator", ["rf", "lgbm-small"])
def test_train_on_labelled_logs_then_load(tmp_path, estimator):
    cfg = SimConfig(gpus=16, tp=2, pp=2, dp=4, iterations=14, seed=11,
                    faults=(FaultSpec.parse("gpu_slow:rank=3,severity=0.8,start=5"),))
    res = simulate(cfg)
    res.write(tmp_path / "sim")
    out = tmp_path / "m.holmes"
    result = CliRunner().invoke(app, ["train", str(tmp_path / "sim" / "ops.parquet"),
                                      "--estimator", estimator, "--out", str(out)])
    assert result.exit_code == 0, result.output
    header = read_header(out)
    assert header["metrics"]["train_rows"] > 0
    model = load_model(out)
    from holmes_ml.features import build_features

    scores = model.decision_function(build_features(res.ops))
    y = res.ops["abnormal"].to_numpy(bool)
    # trained on these very logs: abnormal ops must score above normal ones on average
    assert scores[y].mean() > scores[~y].mean() + 0.3


def test_train_refuses_unlabelled_logs(tmp_path):
    res = simulate(SimConfig(gpus=16, tp=2, pp=2, dp=4, iterations=6, seed=1))
    path = tmp_path / "ops.csv"
    without_labels(res.ops).to_csv(path, index=False)
    result = CliRunner().invoke(app, ["train", str(path), "--out", str(tmp_path / "m.holmes")])
    assert result.exit_code != 0
    assert "abnormal" in result.output


def test_train_unknown_estimator_lists_choices(tmp_path):
    result = CliRunner().invoke(app, ["train", "--estimator", "xgb", "--out",
                                      str(tmp_path / "m.holmes")])
    assert result.exit_code != 0
    assert "'xgb'" in result.output and "lgbm-small" in result.output


def test_train_reads_a_simulator_directory_and_refuses_one_class(tmp_path):
    cfg = SimConfig(gpus=16, tp=2, pp=2, dp=4, iterations=10, seed=12,
                    faults=(FaultSpec.parse("gpu_slow:rank=5,severity=0.8,start=4"),))
    simulate(cfg).write(tmp_path / "sim")
    out = tmp_path / "m.holmes"
    result = CliRunner().invoke(app, ["train", str(tmp_path / "sim"), "--estimator",
                                      "lgbm-small", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert load_model(out) is not None
    simulate(SimConfig(gpus=16, tp=2, pp=2, dp=4, iterations=6, seed=1)).write(tmp_path / "ok")
    result = CliRunner().invoke(app, ["train", str(tmp_path / "ok"), "--out",
                                      str(tmp_path / "h.holmes")])
    assert result.exit_code == 2
    assert "every op is labelled abnormal=False" in " ".join(result.output.split())
    assert not (tmp_path / "h.holmes").exists()
