"""A pipeline stage that computes more than the others, read from each rank's compute time per
step (``step_compute_us``, or else the time outside communication between its operators), is a
workload finding; a slow GPU, a slow host or a stage of one replica is not, and the suspects
never change."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from holmes_ml.io import without_labels
from holmes_ml.pipeline import analyze
from holmes_ml.simulator import FaultSpec, SimConfig, simulate

BASE_US = 200_000.0


def _job(seed: int, gpus: int = 32, faults: tuple[str, ...] = ()):
    res = simulate(SimConfig(gpus=gpus, model="llama2-7b", tp=2, pp=4, iterations=10, seed=seed,
                             faults=tuple(FaultSpec.parse(f) for f in faults)))
    return without_labels(res.ops), res.topology


def _with_compute(ops: pd.DataFrame, topology, seed: int, stage: int | None = None,
                  factor: float = 1.0, rank: int | None = None) -> pd.DataFrame:
    """``ops`` with a ``step_compute_us`` column: 3 % log-normal jitter per (iteration, rank)
    around one base time, ``factor`` times that on pipeline ``stage`` (or on ``rank`` alone)."""
    its = np.sort(ops["iteration"].unique())
    place = topology.ranks.set_index("rank")
    ranks = place.index.to_numpy()
    rng = np.random.default_rng(seed)
    table = pd.DataFrame({
        "iteration": np.repeat(its, len(ranks)),
        "rank": np.tile(ranks, len(its)),
        "step_compute_us": BASE_US * rng.lognormal(0.0, 0.03, len(its) * len(ranks)),
    })
    heavy = np.zeros(len(table), dtype=bool)
    if stage is not None:
        heavy |= table["rank"].map(place["pp"]).to_numpy() == stage
    if rank is not None:
        heavy |= table["rank"].to_numpy() == rank
    table.loc[heavy, "step_compute_us"] *= factor
    return ops.merge(table, on=["iteration", "rank"], how="left")


def _stage_findings(verdict):
    return [w for w in verdict.workload_findings if w.kind == "stage-imbalance"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_heavier_stage_is_named_as_workload(seed: int) -> None:
    ops, topo = _job(seed)
    verdict = analyze(_with_compute(ops, topo, seed, stage=2, factor=1.3), topo, model="rule")
    (found,) = _stage_findings(verdict)
    stage_ranks = topo.ranks.loc[topo.ranks["pp"] == 2, "rank"]
    assert found.coords == {"pp": 2}
    assert found.basis == "compute"
    assert set(found.ranks) == set(stage_ranks.astype(int))
    assert verdict.candidates == ()
    body = verdict.to_dict()
    assert body["workload"]["basis"] == "compute"
    # read from compute times, not from abnormal operators: the no-irregular-step note, which
    # says where operator findings come from, does not apply
    assert body["note"] is None


@pytest.mark.parametrize("seed", [0, 1])
def test_one_slow_gpu_or_a_small_excess_is_not_a_heavy_stage(seed: int) -> None:
    ops, topo = _job(seed)
    one_gpu = analyze(_with_compute(ops, topo, seed, rank=13, factor=2.0), topo, model="rule")
    small = analyze(_with_compute(ops, topo, seed, stage=1, factor=1.04), topo, model="rule")
    assert _stage_findings(one_gpu) == [] and _stage_findings(small) == []


def test_a_single_replica_cannot_tell_a_stage_from_its_gpus() -> None:
    ops, topo = _job(0, gpus=8)  # tp2 pp4: dp 1
    assert topo.ranks["dp"].nunique() == 1
    verdict = analyze(_with_compute(ops, topo, 0, stage=3, factor=1.5), topo, model="rule")
    assert _stage_findings(verdict) == []


@pytest.mark.parametrize("seed", [3, 4])
def test_the_suspects_stay_as_they_were(seed: int) -> None:
    ops, topo = _job(seed, faults=("gpu_slow:severity=0.6,start=4",))
    without = analyze(ops, topo, model="rule")
    heavy = analyze(_with_compute(ops, topo, seed, stage=0, factor=1.3), topo, model="rule")
    assert without.candidates and heavy.candidates == without.candidates
    assert [w.coords for w in _stage_findings(heavy)] == [{"pp": 0}]


def test_plots_draw_compute_times_only_when_logged(tmp_path) -> None:
    from holmes_ml.pipeline import localize_summaries, summarize
    from holmes_ml.report import write_plots

    ops, topo = _job(0)
    for name, table in (("with", _with_compute(ops, topo, 0, stage=2, factor=1.3)),
                        ("without", ops)):
        summary = summarize(table, "rule")
        verdict = localize_summaries([summary], topo)
        written = {p.name for p in write_plots(verdict, summary.iterations, tmp_path / name)}
        assert ("compute.png" in written) == (name == "with")
    assert (tmp_path / "with" / "compute.png").stat().st_size > 1000


def test_a_stage_read_off_the_gaps_gets_its_compute_map(tmp_path) -> None:
    from holmes_ml.pipeline import localize_summaries, summarize
    from holmes_ml.report import write_plots

    res = _workload_job(6, stage_weights=(1.0, 1.0, 1.4, 1.0))
    summary = summarize(without_labels(res.ops), "rule")
    verdict = localize_summaries([summary], res.topology)
    assert [w.basis for w in verdict.workload_findings] == ["gaps"]
    written = {p.name for p in write_plots(verdict, summary.iterations, tmp_path)}
    assert "compute.png" in written and (tmp_path / "compute.png").stat().st_size > 1000


# ----------------------------------------------------------------- the simulator's workloads


def _workload_job(seed: int, **kw):
    res = simulate(SimConfig(gpus=64, model="llama2-7b", tp=2, pp=4, iterations=12, seed=seed,
                             **kw))
    return res


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_simulated_heavy_stage_blames_no_device_and_its_compute_names_the_stage(seed) -> None:
    res = _workload_job(seed, stage_weights=(1.0, 1.0, 1.3, 1.0), log_compute=True)
    assert not res.ops["abnormal"].any()  # a workload, not a fault: no labels
    per_stage = res.ops.groupby(res.ops["rank"].map(res.topology.ranks.set_index("rank")["pp"]))[
        "step_compute_us"].median()
    assert per_stage[2] / per_stage.drop(2).median() == pytest.approx(1.3, rel=0.05)
    ops = without_labels(res.ops)
    verdict = analyze(ops, res.topology)
    assert verdict.candidates == ()
    assert [(w.kind, w.coords) for w in verdict.workload_findings] == [
        ("stage-imbalance", {"pp": 2})]
    # without compute times no device either, and the stage is read off the gaps between
    # each rank's operators (its time outside communication)
    gaps = analyze(ops.drop(columns="step_compute_us"), res.topology)
    assert gaps.candidates == ()
    assert [(w.kind, w.coords, w.basis) for w in gaps.workload_findings] == [
        ("stage-imbalance", {"pp": 2}, "gaps")]
    (found,) = gaps.workload_findings
    assert "1.3" in found.detail and "outside communication" in found.detail


def test_compute_read_off_the_gaps_is_the_simulated_compute() -> None:
    from holmes_ml.localize.rules import step_compute
    from holmes_ml.pipeline import summarize

    res = _workload_job(7, stage_weights=(1.0, 1.4, 1.0, 1.0), log_compute=True)
    logged = summarize(without_labels(res.ops), "rule").iterations
    read = step_compute(logged.drop(columns="compute_us"))
    assert read is not None and read[1] == "gaps"
    both = read[0].merge(logged, on=["iteration", "rank"], suffixes=("_gaps", ""))
    # every step but each rank's last (no next step to end it)
    assert len(both) == len(logged) - logged["rank"].nunique()
    np.testing.assert_allclose(both["compute_us_gaps"], both["compute_us"], rtol=0.01)
    # a missing step leaves the one before it unmeasured rather than twice as long
    holed = logged[logged["iteration"] != 5].drop(columns="compute_us")
    assert 4 not in set(step_compute(holed)[0]["iteration"])


@pytest.mark.parametrize("seed", [0, 1])
def test_a_slow_host_holding_two_stages_is_not_a_heavy_stage(seed) -> None:
    # 16 GPUs tp2 pp4 dp2: node000 holds stages 0 and 1 - whole - and stalls at every step;
    # its ranks' gaps grow, stage by stage, like a heavier stage's would
    res = simulate(SimConfig(gpus=16, model="llama2-7b", tp=2, pp=4, iterations=12, seed=seed,
                             faults=(FaultSpec.parse(
                                 "host_stall:pattern=persistent,device=host:node000,"
                                 "severity=2"),)))
    verdict = analyze(without_labels(res.ops), res.topology)
    assert _stage_findings(verdict) == []


@pytest.mark.parametrize("seed", [0, 1])
def test_simulated_sequence_imbalance_blames_no_device(seed) -> None:
    res = _workload_job(seed, seq_imbalance=0.5, log_compute=True)
    assert not res.ops["abnormal"].any()
    dp = res.ops["rank"].map(res.topology.ranks.set_index("rank")["dp"])
    heaviest = res.ops.assign(dp=dp).groupby(["iteration", "dp"])["step_compute_us"].median(
        ).groupby(level="iteration").idxmax()
    assert len({d for _, d in heaviest}) > 3  # the slowest replica changes from step to step
    for ops in (without_labels(res.ops), without_labels(res.ops).drop(columns="step_compute_us")):
        verdict = analyze(ops, res.topology)
        assert verdict.candidates == () and not [
            w for w in verdict.workload_findings if w.kind == "stage-imbalance"]


def test_workloads_leave_the_rest_of_the_job_as_it_was() -> None:
    plain = _workload_job(5).ops
    logged = _workload_job(5, log_compute=True).ops
    pd.testing.assert_frame_equal(plain, logged.drop(columns="step_compute_us"))
    with pytest.raises(ValueError, match="one per pipeline stage"):
        SimConfig(gpus=64, model="llama2-7b", tp=2, pp=4, stage_weights=(1.0, 1.2))
    with pytest.raises(ValueError, match="stage_weights"):
        SimConfig(gpus=64, model="llama2-7b", tp=2, pp=4, stage_weights=(1, 1, 1, 0))
    with pytest.raises(ValueError, match="seq_imbalance"):
        SimConfig(gpus=64, model="llama2-7b", seq_imbalance=2.0)


# --------------------------------------------------------- stages read off the communicators


def _topology(groups: dict[str, tuple[str, tuple[int, ...]]], world: int):
    from holmes_ml.topology import Group, Topology

    ranks = pd.DataFrame({"rank": range(world), "host": ["h0"] * world, "gpu": range(world),
                          "pod": 0, "pp": -1, "dp": -1})
    return Topology(ranks=ranks, groups={n: Group(n, k, m) for n, (k, m) in groups.items()},
                    spines=0)


def test_stages_and_replicas_come_from_send_recv_pairs_and_dp_groups() -> None:
    from holmes_ml.localize.rules import _pipeline_places

    # two pipelines of three stages, 0-2-4 and 1-3-5 (pairs in both directions), dp pairs
    pairs = {f"pp-{a}-{b}": ("pp", (a, b)) for a, b in
             [(0, 2), (2, 0), (2, 4), (4, 2), (1, 3), (3, 1), (3, 5), (5, 3)]}
    dp = {f"dp-{i}": ("dp", (2 * i, 2 * i + 1)) for i in range(3)}
    place = _pipeline_places(_topology({**pairs, **dp}, 6))
    assert place["pp"].tolist() == [0, 0, 1, 1, 2, 2]
    assert place["dp"].tolist() == [0, 1, 0, 1, 0, 1]
    # without dp groups each pipeline is a replica of its own
    assert _pipeline_places(_topology(pairs, 6))["dp"].tolist() == [0, 1, 0, 1, 0, 1]
    # a ring of pairs, pipelines of different lengths, or no pairs: no stages
    ring = {**pairs, "pp-4-0": ("pp", (4, 0))}
    assert _pipeline_places(_topology(ring, 6)) is None
    uneven = {k: v for k, v in pairs.items() if 5 not in v[1]}
    assert _pipeline_places(_topology(uneven, 6)) is None
    assert _pipeline_places(_topology(dp, 6)) is None


def test_a_heavy_stage_is_named_from_a_log_without_placement() -> None:
    res = _workload_job(3, stage_weights=(1.3, 1.0, 1.0, 1.0))
    verdict = analyze(without_labels(res.ops))  # no topology: coordinates unknown
    assert verdict.candidates == ()
    (found,) = _stage_findings(verdict)
    assert (found.coords, found.basis) == ({"pp": 0}, "gaps")
    stage = res.topology.ranks.loc[res.topology.ranks["pp"] == 0, "rank"]
    assert set(found.ranks) == set(stage.astype(int))


@pytest.mark.parametrize("seed", range(5))
def test_the_floor_is_never_above_any_stage_s_others_median(seed) -> None:
    from holmes_ml.localize.rules import _others_median_floor

    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 400))
    c = pd.DataFrame({"iteration": rng.integers(0, 6, n), "pp": rng.integers(0, 5, n),
                      "compute_us": rng.lognormal(10, 1, n)})
    floor = _others_median_floor(c)
    for stage in c["pp"].unique():
        others = c[c["pp"] != stage].groupby("iteration")["compute_us"].median()
        assert (floor.reindex(others.index) <= others).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_stage_that_fills_one_host_names_the_host_as_the_alternative(seed) -> None:
    # 32 GPUs tp2 pp4 dp4: node000 holds stage 0 and nothing else, and pauses at every step.
    # Its ranks are the last to arrive like a heavier stage's: the finding says the host would
    # look the same.
    res = simulate(SimConfig(gpus=32, model="llama2-7b", tp=2, pp=4, iterations=12, seed=seed,
                             faults=(FaultSpec.parse(
                                 "host_stall:pattern=persistent,device=host:node000"),)))
    verdict = analyze(without_labels(res.ops), res.topology)
    (found,) = _stage_findings(verdict)
    assert found.coords == {"pp": 0} and "unless it is its host node000" in found.detail
    # a heavier stage spread over two hosts carries no such caveat
    heavy = analyze(without_labels(_workload_job(seed, stage_weights=(1.3, 1, 1, 1)).ops))
    assert all("unless" not in w.detail for w in heavy.workload_findings)
