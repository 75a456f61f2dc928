"""Known-answer localization on seeded simulator jobs, the CLI and the plots."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from holmes_ml.localize import DeviceKind, LocalizeConfig
from holmes_ml.pipeline import (
    analyze,
    analyze_paths,
    localize_summaries,
    summarize_per_host,
)
from holmes_ml.simulator import FaultSpec, SimConfig, simulate


def _sim(spec: str | None, gpus: int = 64, seed: int = 3, iterations: int = 10):
    faults = (FaultSpec.parse(spec),) if spec else ()
    return simulate(SimConfig(gpus=gpus, model="llama2-7b", iterations=iterations, seed=seed,
                              faults=faults))


@pytest.mark.parametrize(("gpus", "rank"), [(64, 5), (128, 77), (256, 200)])
def test_gpu_slow_is_found(gpus: int, rank: int) -> None:
    res = _sim(f"gpu_slow:rank={rank},severity=0.5,start=2", gpus=gpus, iterations=8)
    verdict = analyze(res.ops, res.topology, model="rule")
    top = verdict.candidates[0]
    assert top.kind == DeviceKind.GPU
    assert top.ranks == (rank,)
    assert top.device == res.faults[0].devices[0]


def test_host_stall_is_a_host() -> None:
    res = _sim("host_stall:rank=12,severity=0.5,pattern=spike,start=4")
    verdict = analyze(res.ops, res.topology, model="rule")
    top = verdict.candidates[0]
    assert top.kind == DeviceKind.HOST
    assert top.ranks == (12,)
    assert f"host:{top.hosts[0]}" == res.faults[0].devices[0]
    assert 4 in verdict.irregular_iterations


def test_nic_slow_blames_a_nic_of_the_slow_ring() -> None:
    res = _sim("nic_slow:rank=9,severity=0.5")
    verdict = analyze(res.ops, res.topology, model="rule")
    top = verdict.candidates[0]
    assert top.kind == DeviceKind.NIC
    # One slow NIC slows its whole ring equally: the blamed NIC must share the faulty rank's
    # data-parallel communicator (which one of them is not identifiable from that ring alone).
    dp = [g for g in res.topology.groups.values() if g.kind == "dp" and 9 in g.ranks][0]
    assert set(top.ranks) <= set(dp.ranks)


@pytest.mark.parametrize("seed", [0, 1])
def test_healthy_job_has_no_candidates(seed: int) -> None:
    res = _sim(None, seed=seed)
    verdict = analyze(res.ops, res.topology, model="rule")
    assert verdict.candidates == ()


def test_per_node_summaries_give_the_same_verdict() -> None:
    res = _sim("gpu_slow:rank=21,severity=0.5", iterations=8)
    ops = res.ops
    whole = analyze(ops, res.topology, model="rule")
    parts = summarize_per_host(ops, model="rule")
    assert len(parts) == ops["host"].nunique()
    assert [set(p.ranks["host"]) for p in parts] == [{h} for h in sorted(ops["host"].unique())]
    # Per-node scoring sees fewer peers, so only the top answer is compared.
    split = localize_summaries(parts, res.topology)
    assert whole.candidates[0].ranks == split.candidates[0].ranks == (21,)
    with pytest.raises(ValueError, match="no 'host' column"):
        summarize_per_host(ops.drop(columns="host"))
    shipped = sum(p.nbytes() for p in parts)
    raw = int(ops.memory_usage(deep=True).sum())
    assert shipped < raw  # the >= 97 % bar is measured by `holmes bench localize`


def test_cli_json_and_plots(tmp_path) -> None:
    from holmes_ml.cli import app

    res = _sim("gpu_slow:rank=5,severity=0.5", gpus=32, iterations=8)
    res.write(tmp_path / "job")
    out = CliRunner().invoke(app, ["localize", str(tmp_path / "job"), "--model", "rule",
                                   "--json", "--plot", str(tmp_path / "plots")])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert set(data) == {"irregular", "irregular_iterations", "candidates", "workload", "note",
                         "slowdown", "input"}
    usual = data["input"].pop("usual_iteration_s")
    first, last = data["input"].pop("analysed")  # the window: iterations with abnormal ops
    assert 0 <= first <= last <= 7  # (a fault from the start: no iteration is irregular)
    assert data["input"] == {"ops": len(res.ops), "ranks": 32, "iterations": 8}
    # the usual iteration: the median span (first start to last end) of those not irregular
    end = res.ops["start_ns"] + res.ops["duration_us"] * 1e3
    span = (end.groupby(res.ops["iteration"]).max()
            - res.ops.groupby("iteration")["start_ns"].min()) / 1e9
    flagged = span.index.isin(data["irregular_iterations"])
    assert usual == pytest.approx(span[~flagged].median(), rel=1e-5)
    assert data["slowdown"] == (pytest.approx(span[flagged].max() / usual, rel=1e-3)
                                if flagged.any() else None)
    assert data["candidates"][0]["ranks"] == [5]
    assert data["candidates"][0]["kind"] == "gpu"
    for name in ("iterations.png", "heatmap.png", "evidence.png", "graph.png"):
        assert (tmp_path / "plots" / name).stat().st_size > 1000
    # where they went, on stderr (stdout is the JSON verdict)
    assert f"plots: iterations.png, heatmap.png, evidence.png, graph.png in {tmp_path / 'plots'}" \
        in out.stderr
    assert analyze_paths([tmp_path / "job"], model="rule").candidates[0].ranks == (5,)


def test_cli_says_why_suspects_come_without_irregular_iterations(tmp_path) -> None:
    """A GPU slow from the first iteration makes no iteration stand out against the ones
    before it; the table still names it, and the text says where it comes from."""
    from holmes_ml.cli import app

    _sim("gpu_slow:rank=9,severity=0.8,start=0", gpus=64, iterations=10).write(tmp_path / "job")
    out = CliRunner().invoke(app, ["localize", str(tmp_path / "job")])
    assert out.exit_code == 0, out.output
    text = " ".join(out.stdout.split())  # rich wraps lines at the console's width
    assert "irregular iterations: none" in text
    assert "the findings come from the abnormal operators of the last 10 iteration(s)" in text
    data = json.loads(CliRunner().invoke(app, ["localize", str(tmp_path / "job"),
                                               "--json"]).stdout)
    assert not data["irregular"] and data["candidates"][0]["ranks"] == [9]
    # A script reading only the JSON gets the same caveat.
    assert "last 10 iteration(s)" in data["note"]


def test_cli_reads_the_topology_beside_a_log_file(tmp_path) -> None:
    """`holmes localize job/ops.parquet` uses job/topology.json as `holmes localize job/` does."""
    from holmes_ml.cli import app

    _sim("gpu_slow:rank=9,severity=0.8,start=3", gpus=64, iterations=8).write(tmp_path / "job")
    verdicts = [json.loads(CliRunner().invoke(app, ["localize", str(p), "--json"]).stdout)
                for p in (tmp_path / "job", tmp_path / "job" / "ops.parquet")]
    assert verdicts[0]["candidates"][0]["coords"] is not None
    assert verdicts[0] == verdicts[1]


def test_cli_refuses_a_topology_of_another_job_and_an_empty_log(tmp_path) -> None:
    from holmes_ml.cli import app

    _sim("gpu_slow:rank=9,severity=0.8,start=3", gpus=64, iterations=6).write(tmp_path / "big")
    _sim(None, gpus=16, iterations=6).write(tmp_path / "small")
    out = CliRunner().invoke(app, ["localize", str(tmp_path / "big"), "--topology",
                                   str(tmp_path / "small" / "topology.json")])
    assert out.exit_code == 2
    text = " ".join(out.output.split())
    assert "48 rank(s) the topology does not place (16, 17," in text and "places 16" in text
    # the same size, another layout: every rank placed, but the communicators differ
    layout = simulate(SimConfig(gpus=64, model="llama2-7b", iterations=4, seed=3, tp=4, pp=2))
    layout.write(tmp_path / "other")
    out = CliRunner().invoke(app, ["localize", str(tmp_path / "big"), "--topology",
                                   str(tmp_path / "other" / "topology.json")])
    assert out.exit_code == 2, out.output
    text = " ".join(out.output.split())
    assert "the topology disagrees with the logs: communicator" in text, text
    # the members that differ are named, not two lists that look alike when cut short
    assert re.search(r"has \d+ ranks in the logs \(.*\), \d+ in the topology \(.*\): ranks "
                     r"[\d ]+(\.\.\. )?only in the (logs|topology)", text), text
    (tmp_path / "empty.csv").write_text("iteration,rank,op,group,seq,nbytes,start_ns,"
                                        "duration_us\n")
    out = CliRunner().invoke(app, ["localize", str(tmp_path / "empty.csv")])
    assert out.exit_code == 2 and "no operator rows in" in out.output


def test_fabric_routes_like_the_topology() -> None:
    from holmes_ml.localize import Fabric

    topo = _sim(None, gpus=128, iterations=1).topology
    fab = Fabric(topo)
    pairs = [(0, 1), (0, 9), (3, 100), (64, 127), (17, 80)]
    for a, b in pairs:
        assert fab.path(a, b) == topo.path(a, b)
    ring = (0, 9, 17, 100)
    assert fab.devices(ring) == frozenset(topo.collective_devices(ring))
    ranks = np.array([0, 9, 100, 9, 127])
    assert fab.hosts(ranks).tolist() == [fab.host(int(r)) for r in ranks]
    assert fab.hosts(np.array([], dtype=np.int64)).tolist() == []
    with pytest.raises(KeyError, match="4096"):
        fab.hosts(np.array([3, 4096]))


def test_a_topology_placing_ranks_on_other_hosts_is_refused() -> None:
    from holmes_ml.io import SchemaError

    res = _sim(None, gpus=16, iterations=4)
    moved = res.topology.ranks.copy()
    moved["host"] = moved["host"].to_numpy()[::-1]  # same hosts, other ranks on them
    topo = type(res.topology)(ranks=moved, groups=res.topology.groups, spines=0)
    with pytest.raises(SchemaError, match=r"rank 0 ran on host 'node000' by the logs, "
                                          r"'node001' by the topology \(16 rank"):
        analyze(res.ops, topo, model="rule")


def test_two_runs_read_together_leave_a_note_in_the_json(tmp_path) -> None:
    from holmes_ml.cli import app

    for seed in (1, 2):  # the same job twice: every op identity comes back with other values
        _sim(None, gpus=16, iterations=4, seed=seed).write(tmp_path / "runs" / f"run{seed}")
    out = CliRunner().invoke(app, ["localize", str(tmp_path / "runs"), "--json"])
    assert out.exit_code == 0, out.output
    note = json.loads(out.stdout.strip().splitlines()[-1])["note"]
    assert note and "logs of two runs (or of a restarted job) seem mixed" in note, note
    one = CliRunner().invoke(app, ["localize", str(tmp_path / "runs" / "run1"), "--json"])
    assert "seem mixed" not in (json.loads(one.stdout)["note"] or "")


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("model", [None, "rule"])
def test_a_slowdown_over_most_of_the_window_is_measured_against_the_steps_before_it(
        seed: int, model: str | None) -> None:
    # One 8-GPU host, data parallel only: one communicator, so the waits of the slow GPU's
    # partners have no other group to be compared with, and the slowdown covers two thirds of
    # the logged steps - the median step is a slow one. The reference durations come from the
    # regular steps (before the fault), or the waits look like the job's normal.
    rank = int(np.random.default_rng(seed).integers(8))
    res = simulate(SimConfig(gpus=8, model="llama2-7b", tp=1, pp=1, dp=8, iterations=30,
                             seed=seed, faults=(FaultSpec.parse(
                                 f"gpu_slow:rank={rank},severity=0.5,start=10"),)))
    verdict = analyze(res.ops, res.topology, model=model)
    assert verdict.candidates, "no suspect"
    assert verdict.candidates[0].ranks == (rank,)


def test_a_drifting_job_is_not_measured_against_its_first_steps() -> None:
    # The noisy sweep's job 3196: transfers 20 % slower by the end, a slow NIC from step 3.
    # Against the regular (early) steps alone every late transfer looks slow and the spine
    # switches that all of them cross were blamed; the window's median keeps drift its norm.
    res = simulate(SimConfig(gpus=256, model="llama2-7b", tp=2, pp=2, iterations=10, seed=3196,
                             jitter=0.01, comm_drift=0.2, faults=(FaultSpec.parse(
                                 "nic_slow:severity=2.0,pattern=persistent,start=3"),)))
    verdict = analyze(res.ops, res.topology)
    assert verdict.candidates[0].device == res.faults[0].devices[0]
    # the job does exercise it: with early steps as every class's reference the drifted
    # transfers of other flows look slow, and once those light ones count too (every slow flow,
    # ``min_flow_share=0``) the NIC is lost; either guard alone keeps it
    early = LocalizeConfig(reference_shift=1.0)
    every = LocalizeConfig(min_flow_share=0.0)
    for config in (early, every):
        assert analyze(res.ops, res.topology, config=config).candidates[0].device \
            == res.faults[0].devices[0]
    both = analyze(res.ops, res.topology, config=replace(early, min_flow_share=0.0))
    assert both.candidates[0].device != res.faults[0].devices[0]


def test_ranks_whose_logs_are_missing_are_named_in_the_note(tmp_path, caplog) -> None:
    # the slowed rank's log lost (here: an empty file): its peers' verdict must say that
    # ranks the member lists name logged nothing, instead of a plain "no device blamed"
    from holmes_ml.io.schema import without_labels

    res = _sim("gpu_slow:rank=5,severity=0.5", gpus=16, iterations=8)
    logs = tmp_path / "logs"
    logs.mkdir()
    for r, sub in without_labels(res.ops).groupby("rank"):
        if r in (5, 9):
            (logs / f"rank{r}.csv").write_text("")
        else:
            sub.to_csv(logs / f"rank{r}.csv", index=False)
    with caplog.at_level("WARNING"):
        verdict = analyze_paths([logs], model="rule")
    assert verdict.silent_ranks == (5, 9)
    assert "2 rank(s) that the communicators' member lists or the topology name logged " \
           "nothing (5, 9)" in (verdict.note or "")
    assert "rank5.csv: an empty file, skipped" in caplog.text
    assert 5 not in {r for c in verdict.candidates for r in c.ranks}  # nothing to name it by
    # with the job's topology beside the logs: no warning that it is no log, and the note stays
    res.topology.to_json(logs / "topology.json")
    caplog.clear()
    with caplog.at_level("WARNING"):
        placed = analyze_paths([logs], model="rule")
    assert placed.silent_ranks == (5, 9) and "topology.json" not in caplog.text
    assert "logged nothing (5, 9)" in placed.to_dict()["note"]
    whole = analyze(res.ops, res.topology, model="rule")  # every rank's log: no such note
    assert whole.silent_ranks == () and "logged nothing" not in (whole.note or "")
    assert whole.candidates[0].ranks == (5,)


def test_a_corrupt_time_days_away_from_its_peers_is_warned_about(caplog) -> None:
    res = _sim("gpu_slow:rank=5,severity=0.5", gpus=16, iterations=8)
    ops = res.ops.copy()
    with caplog.at_level("WARNING"):
        analyze(ops, res.topology, model="rule")
    assert "days apart" not in caplog.text  # a straggler is no broken clock
    row = ops.index[(ops["iteration"] == 5) & (ops["rank"] == 3)][0]
    ops.loc[row, "start_ns"] = 5  # 1970, among operators of today
    caplog.clear()
    with caplog.at_level("WARNING"):
        analyze(ops, res.topology, model="rule")
    assert "iteration 5: rank 3's operators lie" in caplog.text
    assert "years before the other ranks'" in caplog.text


def test_logs_without_any_duration_are_warned_about(caplog) -> None:
    res = _sim("gpu_slow:rank=5,severity=0.5", gpus=16, iterations=8)
    with caplog.at_level("WARNING"):
        analyze(res.ops, res.topology, model="rule")
    assert "carry no timing" not in caplog.text
    with caplog.at_level("WARNING"):
        analyze(res.ops.assign(duration_us=0.0), res.topology, model="rule")
    assert "every operator's duration_us is 0" in caplog.text


def test_a_model_file_path_is_a_model_in_python_as_on_the_command_line(tmp_path) -> None:
    from importlib.resources import files

    from holmes_ml.models import ModelFileError, load_model

    res = simulate(SimConfig(gpus=32, model="llama2-7b", iterations=10, seed=3,
                             faults=(FaultSpec.parse("gpu_slow:rank=6,severity=0.8,start=3"),)))
    path = files("holmes_ml") / "data" / "default-model.holmes"
    by_path = analyze(res.ops, res.topology, model=str(path)).to_dict()
    loaded = analyze(res.ops, res.topology, model=load_model(path)).to_dict()
    assert by_path == loaded and by_path["candidates"][0]["ranks"] == [6]
    assert len(summarize_per_host(res.ops, model=path)) == res.ops["host"].nunique()
    with pytest.raises(ModelFileError, match="nope.holmes: no such model file"):
        analyze(res.ops, res.topology, model=tmp_path / "nope.holmes")


def test_logs_beside_a_simulate_outputs_ops_parquet_are_named_not_dropped(tmp_path, caplog):
    """A directory holding ops.parquet is read as a `holmes simulate` output, that file alone:
    another rank's log split off beside it went unread without a word."""
    import logging

    from holmes_ml.pipeline import resolve_paths

    res = _sim(None, gpus=16, iterations=3)
    d = tmp_path / "sim"
    res.write(d)
    ops = res.ops
    ops[ops["rank"] >= 8].to_parquet(d / "ops-part2.parquet")
    (d / "scores.parquet").write_bytes(b"")  # what `holmes detect` and --plot leave there
    (d / "iterations.png").write_bytes(b"")
    (d / "verdict.json").write_text("{}")  # what `holmes demo` leaves there
    with caplog.at_level(logging.WARNING, logger="holmes_ml.pipeline"):
        files, topo = resolve_paths([d])
    assert files == [d / "ops.parquet"] and topo is not None
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "1 other file(s) beside it not read: ops-part2.parquet" in said[0]
    assert f"{d / 'ops.parquet'} {d / 'ops-part2.parquet'}" in said[0]
    caplog.clear()
    (d / "ops-part2.parquet").unlink()
    with caplog.at_level(logging.WARNING, logger="holmes_ml.pipeline"):
        resolve_paths([d])
    assert caplog.records == []  # the simulator's own files and outputs are no logs


def test_a_verdict_of_too_few_iterations_says_the_monitor_saw_nothing() -> None:
    # a Flight Recorder or NCCL Inspector dump is one iteration: a clear straggler came back
    # as a healthy job without a caveat
    short = _sim(None, gpus=16, iterations=2)
    v = analyze(short.ops, short.topology)
    assert not v.irregular
    assert v.note is not None and "the logs (or the slice read) hold 2 iteration(s): the irregularity monitor " \
        "needs 3 regular ones" in v.note, v.note
    assert v.to_dict()["note"] == v.note
    long = _sim(None, gpus=16, iterations=8)
    note = analyze(long.ops, long.topology).note
    assert note is None or "irregularity monitor needs" not in note


def test_a_rank_that_logged_nothing_does_not_move_its_host_neighbours_onto_its_gpu() -> None:
    """Logs with a host column but no topology: the GPUs of a host were numbered among the
    ranks that logged, so with rank 3's log missing the slowed rank 5 was named gpu:node000/4
    (a healthy GPU to pull). A launcher places rank = node * 8 + local rank: rank 5 is GPU 5."""
    from holmes_ml.io.schema import without_labels

    res = _sim("gpu_slow:rank=5,severity=0.5", gpus=16, iterations=8)
    ops = without_labels(res.ops)
    assert ops["host"].str.len().gt(0).all()
    whole = analyze(ops, None, model="rule").candidates[0]
    gappy = analyze(ops[~ops["rank"].isin([3, 9])], None, model="rule").candidates[0]
    assert whole.ranks == gappy.ranks == (5,)
    assert whole.device == gappy.device == res.faults[0].devices[0], (whole, gappy)


def test_a_rank_missing_from_some_iterations_is_not_named_the_late_arrival() -> None:
    """A rank whose log lacks a few iterations has no copy in their collectives; read as the
    normal copy (the late arrival), it was named a straggler with evidence it never gave
    ("rank 7 arrived last"), beside the slowed rank 5."""
    from holmes_ml.io.schema import without_labels

    res = simulate(SimConfig(gpus=16, model="llama2-7b", tp=2, pp=2, dp=4, iterations=20,
                             seed=0, hosts_per_pod=1, faults=(FaultSpec.parse(
                                 "gpu_slow:rank=5,severity=0.5,start=10"),)))
    ops = without_labels(res.ops)
    gap = ops[~((ops["rank"] == 7) & ops["iteration"].between(12, 14))]
    verdict = analyze(gap, res.topology)
    named = [r for c in verdict.candidates for r in c.ranks]
    assert named[0] == 5 and 7 not in named, verdict.candidates
    assert not any("rank 7 arrived last" in e.detail for c in verdict.candidates
                   for e in c.evidence)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_log_cut_short_in_mid_episode_does_not_make_its_rank_a_suspect(seed) -> None:
    """Rank 3's log stops part-way through iteration 20 of an episode that began at 15 (a
    file cut short, an agent behind). Its partners' waits after the cut were read as its late
    arrival: it came second ("rank 3 arrived last"), although in the irregular steps its log
    holds it waited like the others. Its copies there are unknown, not late."""
    from holmes_ml.io.schema import without_labels

    rng = np.random.default_rng(seed)
    res = simulate(SimConfig(gpus=16, iterations=30, seed=seed, faults=(
        FaultSpec.parse("gpu_slow:rank=9,severity=0.5,start=15"),)))
    ops = without_labels(res.ops)
    mine = ops[(ops["rank"] == 3) & (ops["iteration"] == 20)]
    cut_ns = np.quantile(mine["start_ns"], rng.uniform(0.2, 0.8))
    verdict = analyze(ops[~((ops["rank"] == 3) & (ops["start_ns"] > cut_ns))], res.topology)
    assert [c.ranks for c in verdict.candidates] == [(9,)], verdict.candidates
    assert verdict.lacking_ranks == (3,)


def test_an_archive_of_a_simulate_directory_reads_like_the_directory(tmp_path, caplog) -> None:
    """A tar of a `holmes simulate` output: its topology.json was left out (another device
    named, no coordinates) and its config.json and faults.json were warned of as unknown logs."""
    import logging
    import tarfile

    res = _sim("gpu_slow:rank=5,severity=0.5,start=3", gpus=16, iterations=8)
    d = tmp_path / "sim"
    res.write(d)
    archive = tmp_path / "sim.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(d, arcname=".")
    with caplog.at_level(logging.WARNING):
        packed = analyze_paths([archive], model="rule")
    assert "not a log" not in caplog.text, caplog.text
    plain = analyze_paths([d], model="rule")
    assert packed.to_dict()["candidates"] == plain.to_dict()["candidates"]
    assert packed.candidates[0].coords, packed.candidates[0]
    # a topology.json in the archive that is no JSON is refused naming the member
    (d / "topology.json").write_text("{not json")
    with tarfile.open(tmp_path / "bad.tar", "w") as tf:
        tf.add(d, arcname="run")
    with pytest.raises(Exception, match=r"bad\.tar:run/topology\.json: not valid JSON"):
        analyze_paths([tmp_path / "bad.tar"], model="rule")


@pytest.mark.parametrize(("change", "said"), [
    (lambda o: o.assign(rank=o["rank"] + 0.5), "column 'rank', row 0: not an integer (got 0.5"),
    (lambda o: o.assign(duration_us=np.where(o.index == 5, -1.0, o["duration_us"])),
     "column 'duration_us', row 5: negative duration (got -1.0"),
    (lambda o: o.assign(iteration=np.where(o.index == 5, np.nan, o["iteration"])),
     "column 'iteration', row 5: missing value"),
    (lambda o: o.assign(op=np.where(o.index == 5, "allreduce", o["op"].astype(str))),
     "column 'op', row 5: unknown op type (got 'allreduce'"),
])
def test_a_table_given_in_python_is_checked_as_a_file_would_be(change, said) -> None:
    """analyze() took a table built by hand as it came: a fractional rank was truncated (and
    named a GPU no host has), a negative duration or a NaN iteration gave a verdict."""
    from holmes_ml.io.schema import SchemaError

    res = _sim("gpu_slow:rank=3,severity=1,start=4", gpus=16, iterations=8)
    for model in ("rule", None):
        with pytest.raises(SchemaError, match=re.escape(said)):
            analyze(change(res.ops), res.topology, model=model)
    with pytest.raises(SchemaError, match="no operator rows"):
        analyze(res.ops.iloc[:0], model="rule")
    with pytest.raises(TypeError, match="topology: got str; expected a holmes_ml Topology"):
        analyze(res.ops, "topology.json", model="rule")  # type: ignore[arg-type]


def test_a_host_whose_logs_stop_before_the_fault_is_named_not_a_gpu_of_it() -> None:
    """Node003's agent died at iteration 6; rank 26 there slowed from 12. Its host-mate 27 was
    named first (on p2p evidence it never gave), the slow GPU second, without a caveat. The
    peers' waits point at the ranks with no log of those iterations, so the host is named, and
    the note says whose logs stop."""
    from holmes_ml.io.schema import without_labels

    res = simulate(SimConfig(gpus=32, model="llama2-7b", iterations=40, seed=3, faults=(
        FaultSpec.parse("gpu_slow:rank=26,severity=0.8,start=12"),)))
    ops = without_labels(res.ops)
    cut = ops[~((ops["rank"] >= 24) & (ops["iteration"] > 6))]
    verdict = analyze(cut, res.topology)
    top = verdict.candidates[0]
    assert top.hosts == ("node003",) and top.device in ("host:node003", "gpu:node003/2"), top
    assert not any(c.device == "gpu:node003/3" for c in verdict.candidates), verdict.candidates
    assert verdict.lacking_ranks == tuple(range(24, 32))
    assert "8 rank(s) lack some of the analysed iterations (24-31)" in (verdict.note or "")
    assert verdict.to_dict()["input"]["lacking_ranks"] == list(range(24, 32))
    # what it is named on is its peers' waits, not a late arrival it logged
    said = [e.detail for e in top.evidence]
    assert said and all(re.fullmatch(r"rank \d+ logged none of iteration \d+ \(its log lacks "
                                     r"it\); the other copies waited .+, read as its late "
                                     r"arrival", d) for d in said), said
    whole = analyze(ops, res.topology)
    assert whole.candidates[0].device == "gpu:node003/2" and whole.lacking_ranks == ()


def test_a_host_none_of_whose_ranks_logged_is_named_in_the_note() -> None:
    """Node001's agent never started: the note listed ranks 8-15 as having logged nothing,
    and nothing said they are one whole host (whose agent is the thing to check)."""
    res = _sim("gpu_slow:rank=3,severity=0.5,start=3", gpus=16, iterations=8)
    ops = res.ops[res.ops["rank"] < 8]
    verdict = analyze(ops, res.topology, model="rule")
    assert verdict.silent_hosts == ("node001",)
    assert "; every rank of host(s) node001: is its agent running?)" in (verdict.note or ""), \
        verdict.note
    read = verdict.to_dict()["input"]
    assert read["silent_ranks"] == list(range(8, 16)) and "lacking_ranks" not in read
    assert "silent_ranks" not in analyze(res.ops, res.topology, model="rule").to_dict()["input"]


def test_two_runs_concatenated_in_python_are_named_as_mixed(caplog, tmp_path) -> None:
    """read_paths warned of two runs read together, but analyze() of a pd.concat of two
    runs' tables said nothing and came back healthy; one run's table stays unremarked."""
    import pandas as pd

    from holmes_ml.pipeline import read_paths

    a = _sim("gpu_slow:rank=5,severity=0.5", gpus=32, seed=0, iterations=12)
    b = _sim("gpu_slow:rank=9,severity=0.5", gpus=32, seed=1, iterations=12)
    mixed = pd.concat([a.ops, b.ops], ignore_index=True)
    with caplog.at_level("WARNING", logger="holmes_ml"):
        verdict = analyze(mixed, a.topology, model="rule")
    assert f"{len(mixed):,} operator rows share rank, group, seq, op and iteration" \
        in verdict.note
    assert "two runs read together" in caplog.text
    assert "reused_key_rows" not in mixed.attrs  # the caller's table is left as it was
    caplog.clear()
    # tables as read carry the reader's count, which a concat of two of them keeps
    a.write(tmp_path / "a")
    b.write(tmp_path / "b")
    read = pd.concat([read_paths([tmp_path / "a" / "ops.parquet"]),
                      read_paths([tmp_path / "b" / "ops.parquet"])], ignore_index=True)
    assert "share rank, group, seq" in analyze(read, a.topology, model="rule").note
    caplog.clear()
    alone = analyze(a.ops, a.topology, model="rule")
    assert alone.candidates[0].ranks == (5,)
    assert "share rank, group, seq" not in (alone.note or "")
    assert "two runs read together" not in caplog.text
