"""`holmes check`: what a set of logs holds and what localization can use, without a model."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from test_cli_errors import _one_error_line
from typer.testing import CliRunner

from holmes_ml.cli import app
from holmes_ml.simulator import SimConfig, simulate_to

REALDATA = Path("/work/shared/realdata/bytedance-whatif/trace-AR.parquet")


def _check(*args: str) -> dict:
    out = CliRunner().invoke(app, ["check", *args, "--json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def test_a_simulated_job_is_counted_and_every_check_passes(tmp_path):
    simulate_to(SimConfig(gpus=32, tp=2, pp=2, dp=8, iterations=6, seed=4), tmp_path / "sim")
    ops = pd.read_parquet(tmp_path / "sim" / "ops.parquet")
    report = _check(str(tmp_path / "sim"))
    assert report["ops"] == len(ops)
    assert (report["ranks"], report["rank_list"]) == (32, list(range(32)))
    assert (report["iterations"], report["iteration_list"]) == (6, list(range(6)))
    assert (report["hosts"], report["hosts_from"]) == (4, "topology")
    assert report["communicators"] == ops["group"].nunique()
    assert report["communicators_by_kind"] == ops.groupby("group")["group_kind"].first() \
        .astype(str).value_counts().to_dict()
    assert report["op_types"] == ops["op"].astype(str).value_counts().to_dict()
    assert [c["ok"] for c in report["checks"]] == [True] * 10, report["checks"]
    # the logs carry no coordinates; the topology beside them places each rank on tp, pp, dp
    assert report["coordinates"] == ["dp", "pp", "tp"]
    # the readable form says the same
    text = CliRunner().invoke(app, ["check", str(tmp_path / "sim")]).stdout
    assert f"read {len(ops):,} ops of 32 rank(s) (0-31) over 6 iteration(s) (0-5;" in text
    # pipeline stages but no logged compute times: the gaps between operators stand in
    assert report["compute_times"] is False
    assert "not logged; read as each rank's time outside communication" in " ".join(text.split())


def test_what_a_thin_log_lacks_is_said(tmp_path):
    # one rank, no member lists, no host, a send without its peer, two iterations
    rows = [{"iteration": it, "rank": 3, "op": op, "group": g, "seq": it, "nbytes": 64,
             "start_ns": 10**18 + it * 10**9 + k, "duration_us": 10.0}
            for it in range(2) for k, (op, g) in enumerate([("all_reduce", "dp-0"),
                                                            ("send", "pp-0-1")])]
    pd.DataFrame(rows).to_csv(tmp_path / "rank3.csv", index=False)
    report = _check(str(tmp_path / "rank3.csv"))
    assert (report["ranks"], report["hosts"], report["hosts_from"]) == (1, 1, "assumed")
    assert report["send_recv_without_peer"] == 2
    assert report["communicators_with_members"] == 0
    failed = [c["what"] for c in report["checks"] if not c["ok"]]
    assert [w.split(":")[0] for w in failed] == [
        "one rank logged", "2 of 2 communicators list no members",
        "no host column and no topology.json", "no topology.json with switches",
        "2 iterations", "2 of 2 send/recv rows name no peer"], failed


def test_checks_say_nothing_about_what_the_log_has_none_of(tmp_path):
    """No send/recv: no line about their peers (an "ok" there would be vacuous); one rank
    missing is "1 rank", not "1 ranks"."""
    rows = [{"iteration": it, "rank": r, "op": "all_reduce", "group": "dp-0", "seq": it,
             "nbytes": 64, "start_ns": 10**18 + it * 10**9 + r, "duration_us": 10.0,
             "group_ranks": "0 1 2"} for it in range(2) for r in range(2)]
    pd.DataFrame(rows).to_csv(tmp_path / "ops.csv", index=False)
    report = _check(str(tmp_path / "ops.csv"))
    said = [c["what"] for c in report["checks"]]
    assert not [w for w in said if "send/recv" in w], said
    assert any(w.startswith("1 rank named by member lists logged nothing (2)") for w in said)
    # (lists are integers, as in localize --json; the lines above say them as runs)
    assert (report["listed_not_logged"], report["listed_not_logged_list"]) == (1, [2])
    assert report["compute_times"] is False


@pytest.mark.skipif(not REALDATA.exists(), reason="real traces not available")
def test_the_real_trace_says_which_workers_were_not_recorded():
    """trace-AR records 16 of its 64 workers (its README): the other 48 are named."""
    report = _check(str(REALDATA), "--format", "bytedance")
    assert (report["ranks"], report["listed_not_logged"]) == (16, 48)
    assert report["coordinates"] == ["dp", "pp", "tp"]
    assert report["compute_times"] is True
    lacking = [c["what"] for c in report["checks"] if not c["ok"]]
    assert lacking[0].startswith("48 ranks named by member lists logged nothing (1-3 5-7 9-11")


def test_logs_that_contradict_each_other_are_one_error_line(tmp_path):
    rows = pd.DataFrame({"iteration": [0, 0], "rank": [0, 1], "op": ["all_reduce", "barrier"],
                         "group": ["dp-0", "dp-0"], "seq": [0, 0], "nbytes": [8, 8],
                         "start_ns": [1, 2], "duration_us": [1.0, 1.0]})
    rows.to_csv(tmp_path / "ops.csv", index=False)
    line = _one_error_line(CliRunner().invoke(app, ["check", str(tmp_path / "ops.csv")]))
    assert "copies of collective 'dp-0' seq 0 (iteration 0) name two ops" in line, line


def test_a_topology_of_another_job_is_refused_as_localize_refuses_it(tmp_path):
    simulate_to(SimConfig(gpus=16, tp=2, pp=2, dp=4, iterations=3, seed=4), tmp_path / "a")
    simulate_to(SimConfig(gpus=16, tp=4, pp=2, dp=2, iterations=3, seed=4), tmp_path / "b")
    args = [str(tmp_path / "a" / "ops.parquet"), "--topology", str(tmp_path / "b" / "topology.json")]
    lines = [_one_error_line(CliRunner().invoke(app, [cmd, *args])) for cmd in ("check", "localize")]
    assert lines[0] == lines[1] and "the topology disagrees with the logs" in lines[0], lines


def test_ranks_missing_from_some_iterations_are_named_with_the_iterations(tmp_path):
    """A rank whose log lacks iterations the others logged passed every check ("every rank
    the member lists name logged"), though its copies there are unknown."""
    rows = [{"iteration": it, "rank": r, "op": "all_reduce", "group": "dp-0", "seq": it,
             "nbytes": 64, "start_ns": 10**18 + it * 10**9 + r, "duration_us": 10.0,
             "group_ranks": "0 1 2"} for it in range(8) for r in range(3)
            if not (r == 2 and it in (3, 4, 5)) and not (r == 0 and it == 7)]
    pd.DataFrame(rows).to_csv(tmp_path / "ops.csv", index=False)
    report = _check(str(tmp_path / "ops.csv"))
    assert report["ranks_lacking_iterations"] == 2
    assert report["ranks_lacking_iterations_list"] == {"0": [7], "2": [3, 4, 5]}
    failed = [c["what"] for c in report["checks"] if not c["ok"]]
    assert any(w.startswith("2 ranks lack iterations the others logged (0: 7; 2: 3-5)")
               for w in failed), failed
    whole = [{**r, "rank": r["rank"]} for r in rows if r["rank"] == 1]
    pd.DataFrame(whole).to_csv(tmp_path / "one.csv", index=False)
    said = [c["what"] for c in _check(str(tmp_path / "one.csv"))["checks"] if c["ok"]]
    assert "every rank logged every iteration" in said, said


def test_an_operator_lasting_days_is_named_by_check_and_warned_of_by_detect(tmp_path, caplog):
    """An op of 11.6 days among steps of a second (a corrupt duration) passed every check and
    detect said nothing; only localize warned, and only when ranks' clocks disagreed."""
    rows = [{"iteration": it, "rank": r, "op": "all_reduce", "group": "dp-0", "seq": it,
             "nbytes": 64, "start_ns": 10**18 + it * 10**9 + r, "duration_us": 10.0,
             "group_ranks": "0 1"} for it in range(6) for r in range(2)]
    rows[7]["duration_us"] = 1e12  # rank 1, iteration 3
    pd.DataFrame(rows).to_csv(tmp_path / "ops.csv", index=False)
    report = _check(str(tmp_path / "ops.csv"))
    failed = [c["what"] for c in report["checks"] if not c["ok"]]
    assert any(w.startswith("1 operator(s) logged as lasting longer than an hour (the longest "
                            "11.6 days: rank 1, iteration 3, all_reduce in dp-0)")
               for w in failed), failed
    with caplog.at_level("WARNING"):
        result = CliRunner().invoke(app, ["detect", str(tmp_path / "ops.csv"), "--out",
                                          str(tmp_path / "scores.parquet"), "--model", "rule"])
    assert result.exit_code == 0, result.output
    assert "longer than an hour (the longest 11.6 days" in caplog.text, caplog.text


@pytest.mark.parametrize(("column", "factor"), [("duration_us", 1e3), ("start_ns", 1e-3)],
                         ids=["durations in ns", "starts in us"])
def test_times_in_other_units_than_the_schemas_are_named(tmp_path, caplog, column, factor):
    """Durations logged in ns, or starts in us, were read without a word: `holmes check`
    said every check was ok (an iteration of 473 s) and localize blamed a host, not the slow
    GPU."""
    simulate_to(SimConfig(gpus=16, iterations=6, seed=4), tmp_path / "sim")
    ops = pd.read_parquet(tmp_path / "sim" / "ops.parquet")
    ops[column] = (ops[column] * factor).astype(ops[column].dtype)
    ops.to_csv(tmp_path / "ops.csv", index=False)
    report = _check(str(tmp_path / "ops.csv"))
    failed = [c["what"] for c in report["checks"] if not c["ok"]]
    assert any("operators add up to" in w and "duration_us in nanoseconds, or start_ns in "
               "microseconds or milliseconds?" in w for w in failed), failed
    with caplog.at_level("WARNING"):
        result = CliRunner().invoke(app, ["detect", str(tmp_path / "ops.csv"), "--out",
                                          str(tmp_path / "scores.parquet"), "--model", "rule"])
    assert result.exit_code == 0, result.output
    assert "operators add up to" in caplog.text


def test_a_gloo_profiler_trace_of_one_step_is_said_to_name_no_device():
    """On a gloo CPU trace `holmes check` said every communicator lists its members (the
    reader had filled the world in) beside a row saying they are unknown, and for one
    iteration only that findings 'come from abnormal operators alone', of which it has none."""
    trace = Path("/work/shared/realdata/kineto-hta/cpu_only__rank-34.Jul_15_10_52_41.1074"
                 ".pt.trace.json.gz")
    if not trace.exists():
        pytest.skip("the real trace is not at hand")
    checks = {c["what"]: c["ok"] for c in _check(str(trace))["checks"]}
    assert not any(w.startswith("every communicator lists its members") for w in checks)
    assert any(w.startswith("the gloo communicators' members are not known") and not ok
               for w, ok in checks.items()), checks
    assert any("expect no device named" in w for w in checks), checks
