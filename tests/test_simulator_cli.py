"""`holmes simulate` and `holmes bench simulator` (small sizes)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from holmes_ml.cli import app
from holmes_ml.simulator import load_result


def test_simulate_cli_writes_labelled_logs_and_ground_truth(tmp_path) -> None:
    out = tmp_path / "sim"
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--gpus",
            "32",
            "--model",
            "llama2-7b",
            "--tp",
            "4",
            "--iterations",
            "4",
            "--fault",
            "gpu_slow:rank=5,severity=1,start=2",
            "--fault",
            "nic_slow:rank=9,pattern=spike",
            "--seed",
            "1",
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "gpu_slow" in result.output and "nic_slow" in result.output
    # the spike is at iteration 0, the straggler from iteration 2
    assert "iterations with abnormal ops (ground truth): 0" in result.output
    faults = json.loads((out / "faults.json").read_text())
    assert [f["kind"] for f in faults] == ["gpu_slow", "nic_slow"]
    assert faults[0]["devices"] == ["gpu:node000/5"] and faults[0]["active_iterations"] == [2, 3]
    res = load_result(out)
    assert res.topology.parallel["tp"] == 4
    abn = res.ops[res.ops["abnormal"]]
    assert set(abn["fault_id"]) <= {0, 1} and len(abn)
    assert set(abn.loc[abn["fault_id"] == 0, "iteration"]) <= {2, 3}
    assert isinstance(pd.read_parquet(out / "ops.parquet"), pd.DataFrame)


def test_simulate_cli_hsdp_layout(tmp_path) -> None:
    out = tmp_path / "sim"
    result = CliRunner().invoke(
        app, ["simulate", "--gpus", "32", "--model", "llama2-7b", "--tp", "2", "--pp", "2",
              "--dp-replicate", "2", "--iterations", "3", "--out", str(out), "--no-progress"],
    )
    assert result.exit_code == 0, result.output
    assert "2 replicas x 4 shards" in result.output
    kinds = set(load_result(out).ops["group_kind"].astype(str))
    assert {"dp", "dp_replicate"} <= kinds


def test_simulate_cli_fabric_hardware_batch_and_job_options(tmp_path) -> None:
    """The SimConfig knobs a benchmark varies are options, checked by their option names."""
    def run(out, *extra):
        return CliRunner().invoke(app, ["simulate", "--gpus", "64", "--model", "llama2-7b",
                                        "--iterations", "2", "--seed", "3", "--out", str(out),
                                        "--no-progress", *extra])

    base = run(tmp_path / "base")
    assert base.exit_code == 0, base.output
    r = run(tmp_path / "set", "--hardware", "h100", "--hosts-per-pod", "4", "--spines", "3",
            "--micro-batch-size", "2", "--job", "exp7")
    assert r.exit_code == 0, r.output
    cfg = json.loads((tmp_path / "set" / "config.json").read_text())
    assert (cfg["hardware"], cfg["hosts_per_pod"], cfg["spines"], cfg["micro_batch_size"],
            cfg["job"]) == ("h100", 4, 3, 2, "exp7")
    topo = json.loads((tmp_path / "set" / "topology.json").read_text())
    assert topo["spines"] == 3 and max(topo["ranks"]["pod"]) + 1 == 2  # 8 hosts, 4 per pod
    ops, ops0 = load_result(tmp_path / "set").ops, load_result(tmp_path / "base").ops
    assert set(ops["job"].astype(str)) == {"exp7"}
    for op in ("send", "all_reduce"):  # activations (pipeline, tensor parallel): 2 sequences
        now, before = (int(o.loc[o["op"] == op, "nbytes"].max()) for o in (ops, ops0))
        assert abs(now - 2 * before) <= 2, op
    for flag, value in (("--hardware", "b200"), ("--spines", "0"), ("--hosts-per-pod", "0"),
                        ("--micro-batch-size", "0"), ("--job", " ")):
        r = run(tmp_path / "bad", flag, value)
        assert r.exit_code == 2 and f"{flag}: got" in r.output, (flag, r.output)
        assert "None" not in r.output


def test_simulate_cli_rejects_bad_fault_naming_the_key(tmp_path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--gpus",
            "16",
            "--fault",
            "gpu_slow:sevrity=2",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code != 0
    assert "sevrity" in result.output


def test_bench_simulator_quick_records_figures(monkeypatch) -> None:
    from holmes_ml.bench import simulator as bench

    monkeypatch.setattr(bench, "_sizes", lambda quick: (64, 3))
    res = bench.run(quick=True)
    assert res.name == "simulator"
    assert res.figures["rows"] > 0 and res.figures["seconds"] > 0
    assert res.figures["peak_rss_mb"] > 0
    assert res.config["gpus"] == 64


def test_a_calibration_log_is_checked_as_localize_checks_it(tmp_path) -> None:
    """--calibrate-from reads its log as every other command does: an unknown op or a line
    cut short is one error naming the file and line, not a calibration fitted on it."""
    rows = pd.DataFrame({"iteration": [0, 0, 1], "rank": [0, 1, 0], "op": ["all_reduce"] * 3,
                         "group": ["dp-0"] * 3, "seq": [0, 0, 1], "nbytes": [8] * 3,
                         "start_ns": [1, 2, 3], "duration_us": [1.0, 1.0, 2.0]})
    bad = rows.assign(op=["all_reduce", "allreduce_v2", "all_reduce"])
    bad.to_csv(tmp_path / "badop.csv", index=False)
    cut = tmp_path / "cut.csv"  # a row cut inside the file (a last line unfinished is left out)
    rows.to_csv(cut, index=False)
    text = cut.read_text().splitlines()
    cut.write_text("\n".join(text[:3] + [text[3][:-12]] + text[1:2]) + "\n")
    (tmp_path / "notes").write_text("hello world\n")  # no --format to name: not suggested
    for path, needle in ((tmp_path / "badop.csv", "line 3: unknown op type (got 'allreduce_v2'"),
                         (cut, "line 4: has 4 of the header's 8 fields"),
                         (tmp_path / "notes", "cannot tell the format of this file (expected a "
                          "log of a format holmes reads, told by its content or name")):
        result = CliRunner().invoke(app, ["simulate", "--gpus", "16", "--iterations", "3",
                                          "--calibrate-from", str(path), "--out",
                                          str(tmp_path / "sim"), "--no-progress"])
        assert result.exit_code == 2 and str(path) in result.output, result.output
        assert needle in " ".join(result.output.split()), result.output


def test_config_json_simulates_the_same_job_again(tmp_path) -> None:
    """config.json holds the inputs, a drawn fault still drawn: SimConfig.from_dict of it
    draws the same device and active iterations and writes the same operators."""
    from holmes_ml.simulator import SimConfig, simulate

    out = tmp_path / "a"
    result = CliRunner().invoke(app, ["simulate", "--gpus", "64", "--iterations", "12",
                                      "--seed", "5", "--fault",
                                      "nic_slow:pattern=fluctuation,start=3", "--fault",
                                      "gpu_slow:device=gpu:node002/3,start=4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "config.json").read_text())
    assert saved["faults"][0]["devices"] == [] and saved["faults"][0]["device"] is None
    assert saved["derived"]["chunks_per_microbatch"] >= 1
    first = load_result(out)
    again = simulate(SimConfig.from_dict(saved))
    assert [f.to_dict() for f in again.faults] == [f.to_dict() for f in first.faults]
    assert again.faults[0].active_iterations == first.faults[0].active_iterations
    pd.testing.assert_frame_equal(again.ops.reset_index(drop=True),
                                  first.ops.reset_index(drop=True), check_dtype=False)
    with pytest.raises(ValueError, match="unknown key 'gpu'"):
        SimConfig.from_dict({**saved, "gpu": 8})


def test_an_out_that_would_write_over_the_calibration_log_is_refused(tmp_path) -> None:
    """--calibrate-from DIR --out DIR wrote the new run over the log it was fitted from (the
    labelled log lost, config.json naming a calibration source that no longer exists)."""
    first = CliRunner().invoke(app, ["simulate", "--gpus", "16", "--iterations", "4", "--out",
                                     str(tmp_path / "run"), "--no-progress"])
    assert first.exit_code == 0, first.output
    before = (tmp_path / "run" / "ops.parquet").read_bytes()
    for given in (tmp_path / "run", tmp_path / "run" / "ops.parquet"):
        result = CliRunner().invoke(app, ["simulate", "--gpus", "16", "--iterations", "3",
                                          "--calibrate-from", str(given), "--out",
                                          str(tmp_path / "run"), "--no-progress"],
                                    env={"COLUMNS": "1000"})
        said = " ".join(result.output.split())
        assert result.exit_code == 2, said
        assert (f"would write over {tmp_path / 'run' / 'ops.parquet'}, which --calibrate-from "
                f"{given} reads") in said, said
    assert (tmp_path / "run" / "ops.parquet").read_bytes() == before
    # another directory is fine
    other = CliRunner().invoke(app, ["simulate", "--gpus", "16", "--iterations", "3",
                                     "--calibrate-from", str(tmp_path / "run"), "--out",
                                     str(tmp_path / "other"), "--no-progress"])
    assert other.exit_code == 0, other.output


def test_simulate_help_says_what_a_spike_ends_at_and_what_calibrates(tmp_path) -> None:
    """--help said a fault's end defaults to "the last iteration", while a spike lasts one or
    two iterations from its start; and --calibrate-from said "Canonical CommOps log" while
    Kineto traces and the other formats are read (their group kinds matching no job's)."""
    result = CliRunner().invoke(app, ["simulate", "--help"], env={"COLUMNS": "200"})
    said = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 0, said
    assert ("end (default: the last iteration; for pattern=spike start or start+1, drawn from "
            "--seed)") in said, said
    assert "in any format holmes reads" in said and "Kineto/PyTorch profiler JSON" in said, said
    assert "a Kineto trace names process groups, which match none" in said, said


def test_simulate_gpus_0_and_1_give_the_same_bound(tmp_path) -> None:
    """--gpus 0 said "expected an integer >= 1", and --gpus 1 then "expected at least 2"."""
    for gpus in ("0", "1"):
        result = CliRunner().invoke(app, ["simulate", "--gpus", gpus, "--out",
                                          str(tmp_path / "s")], env={"COLUMNS": "1000"})
        said = " ".join(result.output.split())
        assert result.exit_code == 2, said
        assert (f"--gpus: got {gpus}; expected an integer of at least 2 (a rank alone runs no "
                "collective") in said, said


def test_a_pinned_idle_nic_is_refused_like_a_drawn_one(tmp_path) -> None:
    """`--fault nic_slow:rank=3` on one host wrote a job labelled faulty (faults.json listing
    the fault active) with no abnormal op and exit 0; `--fault nic_slow` was refused."""
    for fault in ("nic_slow", "nic_slow:rank=3"):
        result = CliRunner().invoke(app, ["simulate", "--gpus", "8", "--model", "llama2-7b",
                                          "--iterations", "6", "--fault", fault, "--out",
                                          str(tmp_path / "x"), "--no-progress"],
                                    env={"COLUMNS": "1000"})
        said = " ".join(result.output.split())
        assert result.exit_code == 2, said
        assert "would slow nothing (the job would carry a fault its logs cannot show)" in said
    assert "crosses nic:node000/3" in said
    assert not (tmp_path / "x" / "faults.json").exists()
