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


def _faulty_log(tmp_path):
    from holmes_ml.simulator import FaultSpec, SimConfig, simulate

    res = simulate(SimConfig(gpus=64, iterations=14, seed=7,
                             faults=(FaultSpec.parse("gpu_slow:rank=5,severity=0.9,start=8"),)))
    log = tmp_path / "ops.parquet"
    res.ops.drop(columns=["abnormal", "fault_id", "affected"]).to_parquet(log, index=False)
    return log


def test_detect_json_reports_episodes_and_writes_the_iteration_table(tmp_path):
    import json

    log = _faulty_log(tmp_path)
    out = tmp_path / "run" / "scores.parquet"
    r = CliRunner().invoke(app, ["detect", str(log), "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    its = pd.read_csv(tmp_path / "run" / "scores.iterations.csv", index_col="iteration")
    # the printed verdict and the written table say the same, and the fault's onset is in it
    assert report["irregular_iterations"] == its.index[its["irregular"]].tolist()
    assert 8 in report["irregular_iterations"]
    first = report["episodes"][0]
    assert first["first"] == min(report["irregular_iterations"])
    assert first["pattern"] in {"spike", "fluctuation", "persistent"}
    assert first["peak_ratio"] == round(its.loc[first["first"]:first["last"], "ratio"].max(), 4)
    scored = pd.read_parquet(out)
    assert report["abnormal_ops"] == int(scored["predicted"].sum()) > 0
    assert report["labels"] is None  # an unlabelled log is not scored against anything
    assert report["top_ranks"][0]["abnormal_ops"] == int(
        scored.loc[scored["predicted"]].groupby("rank").size().max())
    # --help lists the table's columns, every one of them
    shown = " ".join(CliRunner().invoke(app, ["detect", "--help"],
                                        terminal_width=400).output.split())
    assert all(c in shown for c in ["iteration", *its.columns]), (list(its.columns), shown)


def test_detect_threshold_and_delta_options(tmp_path):
    import json

    log = _faulty_log(tmp_path)
    out = tmp_path / "s.parquet"
    r = CliRunner().invoke(app, ["detect", str(log), "--out", str(out), "--json",
                                 "--threshold", "1", "--delta", "100"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    scored = pd.read_parquet(out)
    assert report["threshold"] == 1.0
    assert report["abnormal_ops"] == int((scored["score"] >= 1.0).sum())
    assert report["irregular_iterations"] == [] and report["episodes"] == []


def test_labelled_logs_are_scored_against_their_labels(tmp_path):
    """A researcher compares detectors on labelled held-out jobs with `holmes detect` alone."""
    import json

    import numpy as np
    from sklearn.metrics import f1_score, precision_score, recall_score

    from holmes_ml.simulator import FaultSpec, SimConfig, simulate

    ops = simulate(SimConfig(gpus=32, iterations=12, seed=9, faults=(
        FaultSpec.parse("gpu_slow:rank=6,severity=0.8,start=5"),))).ops
    ops = ops.drop(columns=["fault_id", "affected"]).astype({"abnormal": object})
    ops.loc[ops["iteration"] == 0, "abnormal"] = None  # a part of the run carries no labels
    log, out = tmp_path / "ops.parquet", tmp_path / "out" / "scores.parquet"
    ops.to_parquet(log, index=False)
    r = CliRunner().invoke(app, ["detect", str(log), "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    said = json.loads(r.output)
    lab = said["labels"]
    assert said["model"] == "bundled"
    scored = pd.read_parquet(out)
    known = scored["abnormal"].notna()
    truth = scored.loc[known, "abnormal"].astype(bool)
    pred = scored.loc[known, "predicted"]
    assert lab["unlabelled_ops"] == int((ops["iteration"] == 0).sum()) > 0
    assert lab["labelled_ops"] == int(known.sum()) and lab["abnormal"] == int(truth.sum()) > 0
    for name, metric in (("precision", precision_score), ("recall", recall_score),
                         ("f1", f1_score)):
        assert lab[name] == round(float(metric(truth, pred)), 4), name
    assert lab["missed"] == int((truth & ~pred).sum())
    assert lab["false_alarms"] == int((~truth & pred).sum())
    assert lab["f1"] > 0.8  # the bundled model on a plain straggler
    # a healthy labelled job left alone has no precision, recall or F1 to report (not 0)
    healthy = simulate(SimConfig(gpus=32, iterations=8, seed=9)).ops
    healthy.to_parquet(tmp_path / "healthy.parquet", index=False)
    r = CliRunner().invoke(app, ["detect", str(tmp_path / "healthy.parquet"), "--out",
                                 str(tmp_path / "h.parquet"), "--json", "--threshold", "1"])
    calm = json.loads(r.output)["labels"]
    assert calm["abnormal"] == calm["false_alarms"] == calm["missed"] == 0
    assert calm["precision"] is calm["recall"] is calm["f1"] is None
    r = CliRunner().invoke(app, ["detect", str(log), "--out", str(tmp_path / "s2.parquet")],
                           terminal_width=300)
    assert f"F1 {lab['f1']:.3f}" in r.output and "left out" in r.output
    # a label that is not one is refused by name before anything is written
    ops["abnormal"] = np.where(ops["abnormal"] == True, "yes", "no")  # noqa: E712
    ops.to_parquet(log, index=False)
    again = tmp_path / "again.parquet"
    r = CliRunner().invoke(app, ["detect", str(log), "--out", str(again)])
    assert r.exit_code == 2 and not again.exists()
    assert "'abnormal'" in r.stderr and "'no'" in r.stderr and str(log) in r.stderr


def test_bad_input_is_one_line_on_stderr_not_a_traceback(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"iteration": 0}\nnot json\n')
    for args in (["detect", str(bad)], ["localize", str(bad)],
                 ["detect", str(tmp_path / "missing.parquet")]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert isinstance(r.exception, SystemExit) and "Traceback" not in r.output
        line = r.stderr.strip()
        assert line.startswith("error: ") and "\n" not in line
        assert ("bad.jsonl" in line and "line 2" in line) or "missing.parquet" in line


def test_bad_topology_is_reported_with_its_file(tmp_path):
    from holmes_ml.simulator import SimConfig, simulate

    log = tmp_path / "ops.parquet"
    simulate(SimConfig(gpus=64, iterations=6, seed=1)).ops.to_parquet(log, index=False)
    topo = tmp_path / "topo.json"
    topo.write_text('{"ranks": [{"rank": 0}]}')
    r = CliRunner().invoke(app, ["localize", str(log), "--topology", str(topo)])
    assert r.exit_code == 2, r.output
    assert "topo.json" in r.stderr and "ranks.host" in r.stderr


def test_detect_takes_the_rule_baseline_like_localize_and_the_agent(tmp_path):
    import json

    import numpy as np

    from holmes_ml.pipeline import read_paths, rule_scores

    log = _faulty_log(tmp_path)
    out = tmp_path / "s.parquet"
    r = CliRunner().invoke(app, ["detect", str(log), "--model", "rule", "--out", str(out),
                                 "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    scored = pd.read_parquet(out)
    assert report["threshold"] == 0.5  # the rule's own bar
    np.testing.assert_allclose(scored["score"], rule_scores(read_paths([log])))
    assert report["abnormal_ops"] == int((scored["score"] >= 0.5).sum()) > 0
    r = CliRunner().invoke(app, ["localize", str(log), "--model", "rule", "--json"])
    assert r.exit_code == 0, r.output


def test_an_output_that_would_replace_an_input_is_refused(tmp_path):
    """`--out sim/ops.parquet` with `sim/` as input used to overwrite the logs with the
    scores table; now nothing is written and the error names both."""
    from holmes_ml.simulator import SimConfig, simulate

    sim = tmp_path / "sim"
    sim.mkdir()
    log = sim / "ops.parquet"
    simulate(SimConfig(gpus=16, iterations=4, seed=2)).ops.to_parquet(log, index=False)
    before = log.read_bytes()
    for given in (sim, log):
        r = CliRunner().invoke(app, ["detect", str(given), "--out", str(log)])
        assert r.exit_code == 2, r.output
        assert f"--out {log}: would replace a file read from the input {given}" in r.stderr
    r = CliRunner().invoke(app, ["train", str(sim), "--out", str(log)])
    assert r.exit_code == 2 and "would replace a file read from the input" in r.stderr
    assert log.read_bytes() == before
    assert sorted(p.name for p in sim.iterdir()) == ["ops.parquet"]


def test_an_unwritable_out_is_refused_before_the_logs_are_read(tmp_path):
    """`--out /proc/x.parquet` passed the check (root may write into /proc by its mode) and
    failed once every op was scored, in Arrow's words: `[Errno 2] Failed to open local file
    '/proc/x.parquet'`. Now it is refused first, naming the option."""
    import os

    if not os.path.isdir("/proc/self"):
        import pytest

        pytest.skip("no /proc")
    log = _faulty_log(tmp_path)
    for args, said in ((["--out", "/proc/x.parquet"], "--out /proc/x.parquet"),
                       (["--out", str(tmp_path / "s.parquet"), "--iterations-out",
                         "/proc/x.csv"], "--iterations-out /proc/x.csv")):
        r = CliRunner().invoke(app, ["detect", str(log), *args])
        assert r.exit_code == 2 and r.stdout == "", r.output
        line = r.stderr.strip()
        assert line.startswith(f"error: {said}: directory /proc is not writable"), line
        assert line.endswith("; expected a path in a writable directory") and "\n" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ops.parquet"]


def test_a_bad_label_names_its_operator(tmp_path):
    """A label that is no boolean was named by its value only; in a log of a million rows the
    operator it belongs to is what lets one find it."""
    from holmes_ml.simulator import SimConfig, simulate

    ops = simulate(SimConfig(gpus=16, iterations=6, seed=9)).ops
    ops = ops.drop(columns=["fault_id", "affected"]).astype({"abnormal": object})
    ops.loc[300, "abnormal"] = "maybe"
    log = tmp_path / "ops.csv"
    ops.to_csv(log, index=False)
    r = CliRunner().invoke(app, ["detect", str(log), "--out", str(tmp_path / "s.parquet")])
    op = ops.loc[300]
    assert r.exit_code == 2 and (
        f"labels are not a boolean, the first of rank {op['rank']}, iteration "
        f"{op['iteration']}, {op['op']} seq {op['seq']} in {op['group']!r} (got 'maybe'"
        in " ".join(r.output.split())), r.output
