"""``holmes bench features`` and its synthetic job generator."""

from __future__ import annotations

import numpy as np

from holmes_ml.bench import features as bench
from holmes_ml.io.schema import validate


def test_synthetic_ops_is_canonical_and_labels_the_straggler_window():
    ops = bench.synthetic_ops(tp=2, pp=2, dp=2, iterations=10, seed=1, slow_rank=3,
                              slow_factor=2.0, slow_iterations=(4, 6))
    validate(ops, "synthetic")
    assert ops["rank"].nunique() == 8
    abnormal_iters = set(ops.loc[ops["abnormal"], "iteration"])
    assert abnormal_iters == {4, 5}
    assert (ops.loc[ops["abnormal"], "fault_id"] == 0).all()
    # every collective instance has all its group members
    sizes = ops.groupby(["iteration", "group", "seq"])["rank"].nunique()
    members = ops.groupby(["iteration", "group", "seq"])["group_ranks"].first().str.split().map(len)
    assert (sizes == members).all()


def test_run_quick_reports_throughput_and_memory():
    result = bench.run(quick=True)
    assert result.name == "features"
    figures = result.figures
    assert figures["n_ops"] > 100_000
    for key in ("ops_per_s", "ops_per_cpu_s", "ops_per_s_first_call", "features_peak_mb"):
        assert np.isfinite(figures[key]) and figures[key] > 0, key
    assert result.config["n_features"] > 20
    assert 0.0 <= figures["system_cpu_share"] <= 1.0
    if "ops_per_s_with_inference" in figures:  # a default model is shipped
        for key in ("ops_per_cpu_s_with_inference", "inference_ops_per_cpu_s"):
            assert np.isfinite(figures[key]) and figures[key] > 0, key
        # features + inference cannot be faster than inference alone
        assert figures["ops_per_cpu_s_with_inference"] <= figures["inference_ops_per_cpu_s"]
        assert 0.0 <= figures["system_cpu_share_with_inference"] <= 1.0
    (phases,) = result.tables.values()  # one call split by step, then the rest
    assert [row["function"] for row in phases[:-1]] == [name for _, name in bench.PHASES]
    assert sum(row["cpu_s"] for row in phases) <= result.details["phases_cpu_s"] + 1e-3


def test_phase_times_time_every_step_and_put_the_functions_back():
    from holmes_ml.features import FeatureConfig, build

    ops = bench.synthetic_ops(tp=2, pp=2, dp=2, iterations=12, seed=2, slow_rank=1,
                              slow_factor=2.0, slow_iterations=(6, 9))
    before = {name: getattr(build, name) for _, name in bench.PHASES}
    total, rows = bench._phase_times(ops, FeatureConfig())
    # every step is still one build_features calls (a renamed step would time nothing)
    for row in rows[:-1]:
        assert row["cpu_s"] > 0, row
    assert sum(row["cpu_s"] for row in rows) <= total + 1e-3
    assert all(0.0 <= row["share"] <= 1.0 for row in rows)
    assert all(getattr(build, name) is func for name, func in before.items())


def test_cli_refuses_a_model_file_that_is_not_an_envelope(tmp_path):
    from typer.testing import CliRunner

    from holmes_ml.cli import app

    bad = tmp_path / "not-a-model.holmes"
    bad.write_bytes(b"garbage")
    result = CliRunner().invoke(app, ["bench", "features", "--quick", "--model", str(bad),
                                      "--out", str(tmp_path / "out")],
                                env={"COLUMNS": "400"})
    assert result.exit_code != 0
    assert "not-a-model.holmes" in result.output, result.output
    assert not (tmp_path / "out").exists()


def test_cli_refuses_an_option_the_named_benchmark_would_ignore(tmp_path):
    # bench simulator --localizer ran and exited 0, as if the localizer had been benchmarked
    from typer.testing import CliRunner

    from holmes_ml.cli import app

    for args, said in [(["simulator", "--localizer", "holmes_ml.bench.plugins:example_longest_comm"],
                        "--localizer does not apply to bench simulator; it applies to localize"),
                       (["features", "--keep-cores-awake"],
                        "--keep-cores-awake does not apply to bench features"),
                       (["features", "--log-format", "arrow"],
                        "--log-format does not apply to bench features; it applies to logger")]:
        result = CliRunner().invoke(app, ["bench", *args, "--quick", "--out",
                                          str(tmp_path / "out")], env={"COLUMNS": "400"})
        assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output
        assert not (tmp_path / "out").exists()
