"""The localization benchmark's grid covers every axis, sizes faults, and scores methods."""

from __future__ import annotations

import pandas as pd
import pytest

from holmes_ml.bench.localize import (
    AXES,
    DELTAS,
    HEALTHY_COMM_DRIFT,
    HEALTHY_DRIFT,
    HEALTHY_JITTER,
    HEALTHY_SWEEP,
    LAYOUTS,
    NOISY_AXES,
    NOISY_KINDS,
    NOISY_SWEEP,
    NOISY_TARGETS,
    SEVERITY,
    _accuracy,
    _healthy_table,
    _node_only_misses,
    _noisy_table,
    _sc,
    _sim_config,
    _simulate_scenario,
    _trials,
    _twin_key,
    healthy_sweep,
    noisy_sweep,
    scenarios,
)
from holmes_ml.simulator import FaultSpec


def test_grid_covers_scale_dims_delta_kind_pattern():
    quick, full = pd.DataFrame(scenarios(True)), pd.DataFrame(scenarios(False))
    assert quick["gpus"].max() <= 256 and len(quick) < len(full)
    assert {2048, 8192} <= set(full["gpus"])
    for grid in (quick, full):
        assert set(grid["dims"]) == set(LAYOUTS)
        six = grid[grid["dims"].str.startswith("6-D")]
        assert {"gpu_slow", "nic_slow", "host_stall"} <= set(six["kind"])
        sweep = grid[grid.get("sweep") == "delta"]
        assert sorted(set(sweep["delta"])) == sorted(DELTAS)
        assert (sweep["target"] > sweep["delta"]).all()
        assert {"persistent", "spike", "fluctuation"} <= set(grid["pattern"])
        assert (grid["kind"] == "healthy").any()
        assert set(SEVERITY) <= set(grid["kind"])  # every root-cause kind, switches included
    assert {"gpu_slow", "nic_slow", "host_stall", "link_slow", "switch_congested"} == set(SEVERITY)
    assert set(SEVERITY) <= set(full.loc[full["gpus"] == 8192, "kind"])
    # every job of the full grid is a valid simulator configuration
    for sc in scenarios(False):
        cfg = _sim_config(sc)
        assert cfg.layout.world == sc["gpus"]


@pytest.mark.parametrize(("target", "delta"), [(1.6, 1.1), (1.065, 1.05)])
def test_severity_rescaled_to_the_target_ratio(target, delta):
    from holmes_ml.features import iteration_table
    from holmes_ml.simulator import simulate

    sc = _sc(32, "3-D (tp,pp,dp)", "gpu_slow", "persistent", 3, iterations=6, target=target,
             delta=delta, layout={"tp": 2, "pp": 2})
    twin = iteration_table(simulate(_sim_config(sc)).ops)["duration_s"]
    _, severity, peak = _simulate_scenario(sc, twin)
    assert severity != 0.5
    assert peak >= delta  # the trial stays observable at its own delta
    assert peak == pytest.approx(target, abs=0.3 * (target - 1))


def test_accuracy_scores_methods_and_breaks_down_every_axis():
    lay = {"tp": 2, "pp": 2}

    def as_device(ops, topology):  # a plug-in naming a device id, not a rank
        worst = ops.groupby("rank")["duration_us"].sum().idxmin()
        return [topology.gpu_of(int(worst))]

    scs = [
        _sc(32, "3-D (tp,pp,dp)", "gpu_slow", "persistent", 5, iterations=6, layout=lay,
            fault="gpu_slow:rank=9,severity=1.0,start=2"),
        _sc(32, "3-D (tp,pp,dp)", "gpu_slow", "persistent", 5, iterations=6, layout=lay,
            fault="gpu_slow:rank=20,severity=1.0,start=2", delta=1.2, sweep="delta"),
        _sc(32, "3-D (tp,pp,dp)", "healthy", "", 5, iterations=6, layout=lay),
    ]
    summary, breakdown, trials = _accuracy(scs, {"device plug-in": as_device}, workers=1)
    by = {r["method"]: r for r in summary}
    assert by["holmes"]["trials"] == 2 and by["holmes"]["top1"] == 1.0
    assert by["holmes"]["top1_bound"] == by["holmes"]["top2_bound"] == 1.0  # no twin of a GPU
    assert by["holmes"]["healthy_trials"] == 1 and by["holmes"]["healthy_flagged"] == 0.0
    # the deployed path (each host summarized on its own) is scored on the same trials
    assert by["holmes, per node"]["trials"] == 2 and by["holmes, per node"]["top1"] == 1.0
    assert _node_only_misses(trials) == []
    assert by["device plug-in"]["top1"] == 1.0  # device ids are mapped to their ranks
    bd = pd.DataFrame(breakdown)
    assert set(AXES) <= set(bd["by"])
    # the delta axis reads the sweep trials only
    delta_rows = bd[(bd["by"] == "delta") & (bd["method"] == "holmes")]
    assert delta_rows["value"].tolist() == ["1.2"] and delta_rows["trials"].tolist() == [1]
    # device-level figures for the methods that name devices (a plug-in naming device ids
    # too), none for one that names ranks
    kind_rows = bd[bd["by"] == "kind"].set_index("method")
    assert kind_rows.loc["holmes", "device_top1"] == 1.0
    assert kind_rows.loc["holmes", "device_top1_ties"] == 1.0
    assert kind_rows.loc["device plug-in", "device_top1"] == 1.0
    assert pd.isna(kind_rows.loc["shortest comm", "device_top1"])
    assert by["holmes"]["device_top1"] == 1.0 and by["device plug-in"]["device_top1"] == 1.0
    # the methods table too: no 0 for a method that never names a device
    assert by["shortest comm"]["device_top1"] is None
    assert (trials.loc[trials["kind"] != "healthy", "peak_ratio"] > 1.2).all()


def test_healthy_sweep_spans_layouts_and_noise_and_reaches_the_simulator():
    jobs = healthy_sweep(False)
    sweep = pd.DataFrame(jobs)
    assert len(sweep) == HEALTHY_SWEEP[0] and (sweep["kind"] == "healthy").all()
    assert sweep["fault"].isna().all() and set(sweep["dims"]) == set(LAYOUTS)
    for key, values in (("jitter", HEALTHY_JITTER), ("drift", HEALTHY_DRIFT),
                        ("comm_drift", HEALTHY_COMM_DRIFT)):
        assert set(sweep[key]) == set(values)
    assert jobs == healthy_sweep(False)  # seeded: the same jobs every run
    assert len({_twin_key(sc) for sc in jobs}) == len(jobs)  # each its own fault-free job
    grid = scenarios(True)
    assert healthy_sweep(True) == grid[-HEALTHY_SWEEP[1] - NOISY_SWEEP[1]:-NOISY_SWEEP[1]]
    for sc in jobs[:10]:
        cfg = _sim_config(sc)
        assert (cfg.jitter, cfg.drift, cfg.comm_drift) == (
            sc["jitter"], sc["drift"], sc["comm_drift"])
        assert cfg.layout.world == sc["gpus"]


def test_another_draw_gives_fresh_healthy_jobs_of_the_same_kind():
    bench = healthy_sweep(False)
    fresh = healthy_sweep(False, draw=7001, first_seed=5000, n=40)
    assert len(fresh) == 40 and {sc["seed"] for sc in fresh} == set(range(5000, 5040))
    assert not {_twin_key(sc) for sc in fresh} & {_twin_key(sc) for sc in bench}
    assert set(pd.DataFrame(fresh)["dims"]) == set(LAYOUTS)


def test_noisy_sweep_spans_layouts_faults_and_noise():
    jobs = noisy_sweep(False)
    sweep = pd.DataFrame(jobs)
    assert len(sweep) == NOISY_SWEEP[0] and (sweep["sweep"] == "noisy").all()
    assert set(sweep["dims"]) == set(LAYOUTS) and set(sweep["kind"]) == set(NOISY_KINDS)
    assert set(sweep["pattern"]) == {"persistent", "spike", "fluctuation"}
    assert set(sweep["target"]) == set(NOISY_TARGETS) and set(sweep["jitter"]) == set(
        HEALTHY_JITTER)
    assert jobs == noisy_sweep(False)
    assert noisy_sweep(True) == scenarios(True)[-NOISY_SWEEP[1]:]
    for sc in jobs[:10]:
        spec = FaultSpec.parse(sc["fault"])
        assert spec.kind == sc["kind"] and 2 <= spec.start_iteration <= sc["iterations"] // 2
        assert _sim_config(sc, (spec,)).layout.world == sc["gpus"]


def test_noisy_sweep_draws_other_kinds_on_request():
    jobs = noisy_sweep(False, draw=8003, first_seed=8200, n=12, kinds=("switch_congested",))
    assert {sc["kind"] for sc in jobs} == {"switch_congested"}
    assert all(FaultSpec.parse(sc["fault"]).kind == "switch_congested" for sc in jobs)
    with pytest.raises(ValueError, match="'switch'; expected some of"):
        noisy_sweep(False, n=2, kinds=("switch",))


def test_noisy_trials_are_scored_apart_from_the_grid():
    lay = {"tp": 2, "pp": 2}
    scs = [
        _sc(32, "3-D (tp,pp,dp)", "gpu_slow", "persistent", 5, iterations=6, layout=lay,
            fault="gpu_slow:rank=9,severity=1.0,start=2"),
        _sc(32, "3-D (tp,pp,dp)", "gpu_slow", "spike", 6, iterations=6, layout=lay,
            fault="gpu_slow:rank=20,severity=1.0,start=2,pattern=spike", sweep="noisy",
            jitter=0.06, drift=0.1, comm_drift=0.0),
    ]
    summary, _, trials = _accuracy(scs, workers=1)
    holmes = {r["method"]: r for r in summary}["holmes"]
    assert holmes["trials"] == 1 and holmes["noisy_trials"] == 1
    assert holmes["noisy_top1"] == float(trials.loc[
        (trials["method"] == "holmes") & (trials["sweep"] == "noisy"), "top1"].iloc[0])
    table = pd.DataFrame(_noisy_table(trials))
    assert set(table["by"]) == {"all", *NOISY_AXES}
    assert (table.loc[table["by"] == "jitter", "value"] == "0.06").all()
    assert (table["trials"] == 1).all()


def test_trials_runs_a_subset_of_methods_with_the_model_given():
    lay = {"tp": 2, "pp": 2}
    job = [
        _sc(32, "3-D (tp,pp,dp)", "healthy", "", 5, iterations=6, layout=lay),
        _sc(32, "3-D (tp,pp,dp)", "gpu_slow", "persistent", 5, iterations=6, layout=lay,
            fault="gpu_slow:rank=9,severity=1.0,start=2"),
    ]
    rows, unobservable = _trials(job, None, only=("holmes", "shortest comm"), model="rule")
    assert not unobservable
    assert [(r["kind"], r["method"]) for r in rows] == [
        ("healthy", "holmes"), ("healthy", "shortest comm"),
        ("gpu_slow", "holmes"), ("gpu_slow", "shortest comm")]
    assert rows[0]["flagged"] is False and rows[2]["top1"]
    # the model reaches the holmes method: a model that is not one is refused there
    bad, _ = _trials(job[1:], None, only=("holmes",), model="no-such-model.holmes")
    assert bad[0]["top1"] is False and bad[0]["named"] == ""
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        _trials(job, None, only=("nope",))


def test_node_only_misses_lists_trials_the_deployed_path_loses():
    base = {"gpus": 64, "dims": "3-D (tp,pp,dp)", "delta": 1.1, "pattern": "persistent"}
    rows = []
    for seed, whole, nodes in ((1, True, True), (2, True, False), (3, False, False)):
        for method, hit in (("holmes", whole), ("holmes, per node", nodes), ("rule", False)):
            rows.append({**base, "kind": "gpu_slow", "seed": seed, "method": method,
                         "top1": hit})
    rows.append({**base, "kind": "healthy", "seed": 4, "method": "holmes", "flagged": False})
    trials = pd.DataFrame(rows)
    assert _node_only_misses(trials) == [{**base, "kind": "gpu_slow", "seed": 2,
                                          "sweep": "grid"}]
    assert _node_only_misses(trials[trials["method"] != "holmes, per node"]) == []


def test_healthy_table_counts_flagged_jobs_per_method_and_knob():
    rows = []
    for i, (jitter, flagged) in enumerate([(0.01, False), (0.01, False), (0.1, True),
                                           (0.1, False)]):
        for method in ("holmes", "3sigma+rule (no ML)", "longest comm"):
            rows.append({"kind": "healthy", "sweep": "healthy", "jitter": jitter, "drift": 0.0,
                         "comm_drift": 0.0, "dims": "3-D (tp,pp,dp)", "seed": i,
                         "method": method, "flagged": flagged or method == "longest comm"})
    rows.append({"kind": "healthy", "sweep": None, "method": "holmes", "flagged": False})
    rows.append({"kind": "gpu_slow", "method": "holmes", "top1": True})
    table = pd.DataFrame(_healthy_table(pd.DataFrame(rows)))
    assert set(table["method"]) == {"holmes", "3sigma+rule (no ML)"}  # those that can decline
    holmes = table[table["method"] == "holmes"].set_index(["jobs", "value"])
    assert holmes.loc[("all healthy jobs", ""), ["n", "flagged"]].tolist() == [5, 1]
    assert holmes.loc[("sweep, jitter", "0.1"), "share"] == 0.5
    assert holmes.loc[("sweep, jitter", "0.01"), ["n", "flagged"]].tolist() == [2, 0]
    lo, hi = (float(x) for x in holmes.loc[("sweep, jitter", "0.01"), "share_ci95"].strip(
        "[]").split(","))
    assert lo == 0.0 and 0.5 < hi < 1.0  # Wilson: 0 of 2 does not prove a low rate


def test_top1_split_credits_declared_ties_only():
    from holmes_ml.bench.localize import _top1_split
    from holmes_ml.localize.types import Candidate, DeviceKind

    def nic(dev: str, rank: int, score: float, tied: tuple[str, ...] = ()) -> Candidate:
        return Candidate(kind=DeviceKind.NIC, device=dev, ranks=(rank,), hosts=("h",),
                         score=score, tied_with=tied)

    a, b, c = "nic:node000/0", "nic:node001/0", "nic:node002/0"
    pair = [nic(a, 0, 0.5, (b,)), nic(b, 8, 0.5, (a,)), nic(c, 16, 0.1)]
    assert _top1_split(pair, {8}) == 0.5  # the truth is the other half of a declared tie
    assert _top1_split(pair, {0}) == 0.5  # ... and first place earns no more than that
    assert _top1_split(pair, {16}) == 0.0  # a lower candidate earns nothing
    strict = [nic(a, 0, 0.5), nic(b, 8, 0.5)]
    assert _top1_split(strict, {0}) == 1.0 and _top1_split(strict, {8}) == 0.0
    # a tie with devices the verdict did not list still divides the credit
    assert _top1_split([nic(a, 0, 0.5, (b, c))], {0}) == pytest.approx(1 / 3)
    assert _top1_split([3, 5], {3}) == 1.0 and _top1_split([], {3}) == 0.0
    # a GPU tied with its host: two readings of one rank, both naming it
    gpu = Candidate(kind=DeviceKind.GPU, device="gpu:node000/5", ranks=(5,), hosts=("node000",),
                    score=1.0, tied_with=("host:node000",))
    assert _top1_split([gpu], {5}) == 1.0 and _top1_split([gpu], {4}) == 0.0


def test_a_first_suspect_tied_with_the_faulty_device_counts_for_device_top1_ties_only():
    # A link that only one NIC's flows cross fails exactly like that NIC; the verdict lists the
    # NIC first (tied with the link), which the bench scores as a strict device miss but a hit
    # among the devices no log can tell apart. (The job of test_localize_network's tie test.)
    job = [_sc(128, "3-D (tp,pp,dp)", "link_slow", "persistent", 12, iterations=8,
               layout={"tp": 2, "pp": 2}, fault="link_slow:severity=2,start=2")]
    rows, _ = _trials(job, None, only=("holmes",), model="rule")
    (row,) = rows
    first = row["named"].split(",")[0]
    assert first.startswith("nic:") and row["truth"].startswith("link:")
    assert row["top1"]  # the NIC's rank sends over the link
    assert row["device_top1"] is False
    assert row["device_top1_ties"] is True


def test_a_ring_nic_sets_the_bounds_of_one_and_of_two_guesses_among_its_ring():
    # A slow NIC of a 2-D job's data-parallel ring slows every copy of the ring as each of the
    # seven other NICs its flows cross would: a perfect log-only method names it first in one
    # job of eight, among its first two in one of four. A slow GPU has no such twin.
    ring = _sc(32, "2-D (tp,dp)", "nic_slow", "persistent", 11, iterations=8,
               layout={"tp": 2, "pp": 1}, fault="nic_slow:severity=2,start=2")
    gpu = _sc(32, "2-D (tp,dp)", "gpu_slow", "persistent", 11, iterations=8,
              layout={"tp": 2, "pp": 1}, fault="gpu_slow:severity=2,start=2")
    rows, _ = _trials([ring, gpu], None, only=("holmes",), model="rule")
    by_kind = {r["kind"]: r for r in rows}
    assert by_kind["nic_slow"]["tied_ranks"] == 7
    assert by_kind["nic_slow"]["top1_bound"] == pytest.approx(1 / 8)
    assert by_kind["nic_slow"]["top2_bound"] == pytest.approx(1 / 4)
    assert by_kind["gpu_slow"]["top1_bound"] == by_kind["gpu_slow"]["top2_bound"] == 1.0


def test_plugins_are_scored_on_what_they_name_and_their_failures_are_counted(tmp_path):
    import numpy as np

    from holmes_ml.bench.localize import TRIALS_FILE, write_trials

    lay = {"tp": 2, "pp": 2}

    def spines(ops, topology):  # the same answer for every job: a switch above everyone
        return ["switch:spine-0", "switch:spine-1"]

    def shortest(ops, topology):  # numpy integers, as a pandas ranking gives them
        total = ops.groupby("rank")["duration_us"].sum()
        return total.index.to_numpy()[np.argsort(total.to_numpy())]

    def raises(ops, topology):
        raise RuntimeError("boom")

    def odd(ops, topology):
        return [1.5]

    told = []

    def tuned(ops, topology, *, delta):  # a method that needs the trial's delta asks for it
        told.append(delta)
        return shortest(ops, topology)

    scs = [
        _sc(32, "3-D (tp,pp,dp)", "gpu_slow", "persistent", 5, iterations=6, layout=lay,
            fault="gpu_slow:rank=9,severity=1.0,start=2"),
        _sc(32, "3-D (tp,pp,dp)", "healthy", "", 5, iterations=6, layout=lay),
    ]
    scs[0]["delta"] = 1.2
    plugins = {"spines": spines, "shortest": shortest, "raises": raises, "odd": odd,
               "tuned": tuned}
    summary, _, trials = _accuracy(scs, plugins, workers=1,
                                   only=("shortest comm", *plugins))
    by = {r["method"]: r for r in summary}
    assert by["spines"]["errors"] == 0  # device ids are suspects (scored by their ranks) ...
    assert by["spines"]["top1"] == 0.0  # ... but one above everyone names no GPU's fault
    # numpy ranks are ranks: the plug-in scores as the built-in ranking it copies
    assert by["shortest"]["top1"] == by["shortest comm"]["top1"] == 1.0
    assert by["raises"]["errors"] == 2 and by["odd"]["errors"] == 2  # faulty and healthy job
    assert by["shortest"]["errors"] == 0
    assert sorted(told) == sorted(sc["delta"] for sc in scs) and by["tuned"]["errors"] == 0
    failed = trials[trials["method"] == "odd"]["error"]
    assert failed.str.startswith("TypeError: localizer returned a suspect of type float (").all()
    assert trials.loc[trials["method"] == "raises", "error"].tolist() == [
        "RuntimeError: boom"] * 2
    # into a directory not made yet (the CLI's default bench-results/ in a fresh checkout):
    # the run's work is written, not lost to a missing directory at the end
    out = tmp_path / "not" / "yet"
    assert write_trials(trials, out) == TRIALS_FILE
    back = pd.read_csv(out / TRIALS_FILE)
    assert len(back) == len(trials) and {"method", "seed", "top1", "error"} <= set(back)
    # a row rebuilds its job: the layout (as JSON), the iterations and the target ratio
    import json

    row = back[back["method"] == "shortest"].iloc[0].to_dict()
    assert json.loads(row["layout"]) == lay and row["iterations"] == 6
    assert by["shortest"]["median_seconds"] >= 0


def test_run_reports_a_plugins_figures_and_writes_every_trial(tmp_path, monkeypatch):
    from holmes_ml.bench import localize as bl

    lay = {"tp": 2, "pp": 2}
    tiny = [_sc(32, "3-D (tp,pp,dp)", "gpu_slow", "persistent", 5, iterations=6, layout=lay,
                fault="gpu_slow:rank=9,severity=1.0,start=2"),
            _sc(32, "3-D (tp,pp,dp)", "healthy", "", 5, iterations=6, layout=lay)]
    monkeypatch.setattr(bl, "scenarios", lambda quick: tiny)
    monkeypatch.setattr(bl, "_speed", lambda quick: {})

    def broken(ops, topology):
        raise RuntimeError("no idea")

    res = bl.run(quick=True, localizers={"mine": bl.shortest_comm, "broken": broken},
                 out_dir=tmp_path)
    assert res.figures["mine_top1"] == 1.0 and res.figures["mine_errors"] == 0
    assert res.figures["broken_top1"] == 0.0 and res.figures["broken_errors"] == 2
    assert res.details["method_errors"] == {"broken": {"trials": 2,
                                                       "first": "RuntimeError: no idea"}}
    assert res.config["trial_rows"] == bl.TRIALS_FILE
    assert res.config["seeds"]["grid"] == bl.GRID_SEEDS[1]
    assert {"holmes", "mine", "broken"} <= set(res.config["methods"])
    back = pd.read_csv(tmp_path / bl.TRIALS_FILE)
    assert set(back["method"]) == set(res.config["methods"]) and len(back) == 2 * len(
        res.config["methods"])


def test_a_suspect_broader_than_the_faulty_device_names_no_fault():
    """Scoring by shared ranks alone would let a spine switch above everyone name any fault."""
    from holmes_ml.bench.plugins import fault_breadth, names_fault
    from holmes_ml.simulator import SimConfig, simulate

    topo = simulate(SimConfig(gpus=64, model="llama2-7b", iterations=2, seed=1)).topology
    leaf = "switch:leaf-p0-r1"
    link = "link:leaf-p0-r1~spine-0"
    cases = {  # fault device: (suspects that name it, suspects that do not)
        "gpu:node000/1": (["gpu:node000/1", 1], ["host:node000", "nic:node000/2", leaf]),
        "host:node000": (["host:node000", "gpu:node000/3", 2], ["switch:spine-0"]),
        "nic:node000/1": (["nic:node000/1", "gpu:node000/1"], [link, leaf, "host:node000"]),
        link: ([link, leaf, "nic:node000/1", 1], ["switch:spine-0", "host:node000"]),
        "switch:spine-0": (["switch:spine-0", leaf, 9], []),
    }
    for device, (hits, misses) in cases.items():
        truth = set(topo.ranks_on(device))
        widest = fault_breadth(truth, [device], topo)
        assert widest == len(truth), device
        for s in hits:
            assert names_fault(s, truth, topo, widest), (device, s)
        for s in misses:
            assert not names_fault(s, truth, topo, widest), (device, s)
    # a link fault's truth may be only the ranks whose flows cross it: the link still names it
    assert fault_breadth({1}, [link], topo) == len(topo.ranks_on(link)) > 1
    assert names_fault(link, {1}, topo, fault_breadth({1}, [link], topo))


def test_plugins_cannot_score_without_naming_a_device_and_cannot_touch_each_others_input():
    """What a benchmarker's review found: rank sets named no device yet hit network faults,
    a padded tie earned near top-2, a plug-in that changed the table changed the next one's
    answers, and a failing abstainer looked like a perfect healthy-job score."""
    lay = {"tp": 2, "pp": 2}
    scs = [
        _sc(32, "3-D (tp,pp,dp)", "gpu_slow", "persistent", 5, iterations=6, layout=lay,
            fault="gpu_slow:rank=9,severity=1.0,start=2"),
        _sc(32, "3-D (tp,pp,dp)", "healthy", "", 5, iterations=6, layout=lay),
    ]

    def spread(ops, topology):  # a quarter of the job, named as no device
        return [{"ranks": range(0, 32, 4)}, {"ranks": range(1, 32, 4)}]

    def claims(ops, topology):  # a device, with ranks that are not its own
        return [{"device": "gpu:node000/0", "ranks": range(32)}]

    from holmes_ml.bench.localize import shortest_comm

    def mutator(ops, topology):
        ops["duration_us"] = -ops["duration_us"]
        return shortest_comm(ops, topology)

    def after(ops, topology):
        return shortest_comm(ops, topology)

    def series(ops, topology):
        return ops.groupby("rank")["duration_us"].sum().sort_values()

    def far(ops, topology):
        return [10**6]

    class Failing:
        abstains = True

        def __call__(self, ops, topology):
            raise RuntimeError("no")

    def third(ops, topology):  # right first, but its third suspect is no rank of the job
        return [9, 1, 10**9]

    def bogus(ops, topology):  # a switch the fabric lacks read as a spine above everyone
        return ["switch:nonexistent", "link:foo~bar"]

    plugins = {"spread": spread, "claims": claims, "mutator": mutator, "after": after,
               "series": series, "far": far, "failing": Failing(), "third": third,
               "bogus": bogus}
    summary, _, trials = _accuracy(scs, plugins, workers=1, only=("shortest comm", *plugins))
    by = {r["method"]: r for r in summary}
    assert by["spread"]["errors"] == 2 and by["spread"]["top1"] == 0.0
    assert by["claims"]["top1"] == 0.0  # scored by its device: rank 0's GPU, not rank 9's
    assert by["after"]["top1"] == by["shortest comm"]["top1"] == 1.0  # its own copy
    assert by["series"]["errors"] == 2 and by["far"]["errors"] == 2
    assert by["failing"]["healthy_flagged"] == 1.0  # a failure is no healthy answer
    said = trials.set_index("method")["error"]
    assert "pandas Series" in said["series"].iloc[0] and "no device" in said["spread"].iloc[0]
    assert "stands for no rank of this job" in said["far"].iloc[0]
    assert by["third"]["errors"] == 2 and "1000000000" in said["third"].iloc[0]
    assert by["bogus"]["errors"] == 2 and by["bogus"]["top1"] == 0.0
    assert "'switch:nonexistent': expected switch:leaf-pPOD-rRAIL" in said["bogus"].iloc[0]
    named = trials[(trials["method"] == "after") & (trials["kind"] != "healthy")]["named"]
    assert named.iloc[0].split(",")[0] == "9"  # what each plug-in answered is in the trials
    with pytest.raises(ValueError, match="'holmes' is a built-in method's"):
        _accuracy(scs[:1], {"holmes": after}, workers=1)


def test_a_tie_padded_with_repeats_earns_one_share():
    from holmes_ml.bench.localize import _top1_split
    from holmes_ml.localize.types import Candidate, DeviceKind

    def nic(dev: str, rank: int, tied: tuple[str, ...] = ()) -> Candidate:
        return Candidate(kind=DeviceKind.NIC, device=dev, ranks=(rank,), hosts=("h",),
                         score=0.5, tied_with=tied)

    a, b = "nic:node000/0", "nic:node001/0"
    padded = [nic(a, 0, (b,) * 99 + (a,)), nic(b, 8)]
    assert _top1_split(padded, {8}) == 0.5


def test_the_plugin_loader_explains_a_path_a_failing_import_and_a_class_needing_arguments(
        tmp_path, monkeypatch):
    from holmes_ml.bench.plugins import load_localizer

    (tmp_path / "broken_mod.py").write_text("x = undefined_name\n")
    (tmp_path / "needy_mod.py").write_text(
        "class Loc:\n    def __init__(self, k):\n        self.k = k\n"
        "    def __call__(self, ops, topology):\n        return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="is a file path; expected an importable module"):
        load_localizer("./mymod.py:good")
    with pytest.raises(ValueError, match="importing broken_mod raised NameError"):
        load_localizer("broken_mod:x")
    with pytest.raises(ValueError, match=r"made with no arguments, and Loc\(\) raised TypeError"):
        load_localizer("needy_mod:Loc")


def test_a_link_fault_is_named_by_ranks_under_the_link_not_by_every_rank_crossing_it():
    """A slow link's simulator record lists every rank whose traffic crosses it (17 of 64
    here): scored by those, a GPU on another leaf whose ring crosses the link was a top-1 hit,
    as any baseline naming one of a quarter of the job's ranks was by chance."""
    from holmes_ml.bench.plugins import fault_ranks

    sc = _sc(64, "3-D (tp,pp,dp)", "link_slow", "persistent", 3,
             fault="link_slow:severity=2,start=2")
    from holmes_ml.simulator import simulate

    res = simulate(_sim_config(sc, (FaultSpec.parse(sc["fault"]),)))
    (fault,) = res.faults
    under = set(res.topology.ranks_on(fault.devices[0]))
    strict = fault_ranks(list(fault.ranks), list(fault.devices), res.topology)
    assert strict and strict <= under and strict <= set(fault.ranks) < set(range(64))
    far = next(r for r in fault.ranks if r not in under)
    near = min(strict)

    def other_leaf(ops, topology):
        return [topology.gpu_of(far)]

    def this_leaf(ops, topology):
        return [topology.nic_of(near)]

    rows, _ = _trials([sc], {"other leaf": other_leaf, "this leaf": this_leaf},
                      only=("other leaf", "this leaf"))
    got = {r["method"]: r for r in rows}
    assert not got["other leaf"]["top1"] and got["this leaf"]["top1"]
    # a GPU or host fault's ranks are its own
    assert fault_ranks([5], ["gpu:node000/5"], res.topology) == {5}


def test_try_localizer_scores_a_plugin_in_seconds_beside_holmes():
    """Checking a plug-in against the contract took the whole benchmark (minutes even with
    --quick): try_localizer scores it on one job per fault kind and a healthy one."""
    import pandas as pd

    from holmes_ml.bench.localize import try_localizer

    rows = try_localizer("holmes_ml.bench.plugins:example_longest_comm", gpus=32)
    assert set(rows["method"]) == {"holmes", "holmes_ml.bench.plugins:example_longest_comm"}
    assert set(rows["kind"]) <= {*SEVERITY, "healthy"} and "healthy" in set(rows["kind"])
    mine = rows[rows["method"] != "holmes"]
    assert mine["error"].isna().all()
    assert mine.loc[mine["kind"] == "healthy", "flagged"].eq(True).all()  # a ranking names one
    holmes = rows[(rows["method"] == "holmes") & (rows["kind"] == "gpu_slow")]
    assert holmes["top1"].eq(True).all()

    def series(ops, topology):  # the contract refuses a Series: counted, not raised
        return pd.Series([1, 2])

    wrong = try_localizer(series, gpus=32)
    assert wrong.loc[wrong["method"] == "series", "error"].str.contains("pandas Series").all()
