"""Physics and contract tests of holmes_ml.simulator (small jobs, seeded, fast)."""

from __future__ import annotations

import hashlib
import json
import logging
import re

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from holmes_ml.io.schema import validate
from holmes_ml.simulator import (
    ABNORMAL_ABS_US,
    ABNORMAL_REL,
    FaultSpec,
    SimConfig,
    fit_calibration,
    load_result,
    simulate,
    simulate_to,
)
from holmes_ml.simulator.engine import Engine

SMALL = {"gpus": 32, "model": "llama2-7b", "tp": 4, "pp": 2, "iterations": 4, "seed": 3}


def _iteration_us(ops: pd.DataFrame) -> np.ndarray:
    end = ops["start_ns"] + ops["duration_us"] * 1000.0
    frame = pd.DataFrame({"s": ops["start_ns"], "e": end, "i": ops["iteration"]}).groupby("i")
    return ((frame["e"].max() - frame["s"].min()) / 1000.0).to_numpy()


def _instance_min(ops: pd.DataFrame) -> pd.Series:
    """Per op instance (iteration, group, seq, op family) the shortest duration = pure transfer:
    the last participant to arrive waits for nobody."""
    fam = ops["op"].astype(str).replace({"recv": "p2p", "send": "p2p"})
    keys = [ops["iteration"], ops["group"].astype(str), ops["seq"], fam]
    return ops["duration_us"].groupby(keys).min()


def test_straggler_own_collectives_shorten_while_tp_peers_lengthen() -> None:
    healthy = simulate(SimConfig(**SMALL)).ops
    fault = FaultSpec.parse("gpu_slow:rank=5,severity=1.0")
    ops = simulate(SimConfig(**SMALL, faults=(fault,))).ops
    tp = (ops["group_kind"] == "tp").to_numpy()
    own = tp & (ops["rank"] == 5).to_numpy()
    peers = tp & ops["rank"].isin([4, 6, 7]).to_numpy()  # rank 5's TP group is 4..7
    assert ops.loc[own, "duration_us"].mean() < 0.9 * healthy.loc[own, "duration_us"].mean()
    assert ops.loc[peers, "duration_us"].mean() > 3 * healthy.loc[peers, "duration_us"].mean()
    # Labels: the peers' waits are abnormal (blamed on fault 0); the straggler's own copy is not.
    assert ops.loc[peers, "abnormal"].mean() > 0.9
    assert not ops.loc[own, "abnormal"].any()
    assert set(ops.loc[ops["abnormal"], "fault_id"]) == {0}
    others = tp & ~ops["rank"].between(4, 7).to_numpy() & (ops["iteration"] == 0).to_numpy()
    # The TP groups of the other data-parallel replicas are not slowed at their start.
    assert ops.loc[others, "abnormal"].mean() < 0.2


@pytest.mark.parametrize(
    ("fault", "hosts_per_pod"),
    [
        ("nic_slow:rank=9,severity=1", 32),
        ("switch_congested:rank=9,severity=1", 2),
        ("link_slow:rank=9,severity=1", None),  # default: 8 hosts -> 4 pods of 2
    ],
)
def test_bandwidth_fault_lengthens_exactly_the_collectives_crossing_its_device(
    fault: str, hosts_per_pod: int | None
) -> None:
    cfg = {**SMALL, "gpus": 64, "tp": 2, "hosts_per_pod": hosts_per_pod}
    healthy = simulate(SimConfig(**cfg))
    res = simulate(SimConfig(**cfg, faults=(FaultSpec.parse(fault),)))
    device = res.faults[0].devices[0]
    assert device.split(":")[0] == {"nic": "nic", "swi": "switch", "lin": "link"}[fault[:3]]
    ratio = _instance_min(res.ops) / _instance_min(healthy.ops)
    topo = res.topology
    groups = ratio.index.get_level_values(1)
    crossing = {
        name for name in set(groups) if device in topo.collective_devices(topo.groups[name].ranks)
    }
    hit = groups.isin(list(crossing))
    assert hit.any() and (~hit).any()
    # Transfers over the faulty device take ~ (1 + severity) longer (minus latency terms) ...
    assert ratio[hit].min() > 1.5
    # ... and every other collective's own transfer is untouched (same seed, same draws).
    np.testing.assert_allclose(ratio[~hit].to_numpy(), 1.0, rtol=1e-9)
    assert res.faults[0].active_iterations == tuple(range(cfg["iterations"]))


def test_iteration_time_grows_by_the_expected_amount() -> None:
    # Without pipelining the straggler's extra compute lands fully on the critical path:
    # delta = severity * microbatches * (t_fwd + t_bwd).
    cfg = {**SMALL, "pp": 1, "jitter": 0.0}
    engine = Engine(SimConfig(**cfg))
    per_iter = engine.lay.microbatches * (engine.t_fwd_us + engine.t_bwd_us)
    base = _iteration_us(simulate(SimConfig(**cfg)).ops)
    deltas = []
    for sev in (0.5, 1.0):
        ops = simulate(
            SimConfig(**cfg, faults=(FaultSpec(kind="gpu_slow", ranks=(5,), severity=sev),))
        ).ops
        delta = _iteration_us(ops) - base
        np.testing.assert_allclose(delta[1:], sev * per_iter, rtol=0.02)
        deltas.append(delta.mean())
    # With a pipeline some of the extra time hides in the bubble, but it still grows with severity.
    pp_times = [
        _iteration_us(
            simulate(
                SimConfig(
                    **SMALL,
                    faults=(FaultSpec(kind="gpu_slow", ranks=(5,), severity=s),) if s else (),
                )
            ).ops
        ).mean()
        for s in (0, 0.5, 1.0, 2.0)
    ]
    assert np.all(np.diff(pp_times) > 0)


def test_host_stall_pauses_one_rank_and_its_peers_wait() -> None:
    fault = FaultSpec.parse("host_stall:rank=6,severity=0.3,pattern=spike,start=2,end=2")
    res = simulate(SimConfig(**SMALL, faults=(fault,)))
    ops = res.ops
    pause = 0.3 * Engine(SimConfig(**SMALL)).est_iter_us
    assert res.faults[0].active_iterations == (2,)
    assert res.faults[0].devices == ("host:node000",)
    waits = ops[(ops["iteration"] == 2) & ops["rank"].isin([4, 5, 7]) & (ops["group_kind"] == "tp")]
    assert waits["duration_us"].max() > 0.9 * pause
    assert not ops.loc[ops["iteration"] < 2, "abnormal"].any()
    assert ops.loc[ops["iteration"] == 2, "abnormal"].any()


def test_healthy_run_has_no_abnormal_labels_and_drift_is_benign() -> None:
    ops = simulate(SimConfig(**{**SMALL, "iterations": 6}, drift=0.2)).ops
    assert not ops["abnormal"].any()
    assert (ops["fault_id"] == -1).all()
    times = _iteration_us(ops)
    assert 1.1 < times[-1] / times[1] < 1.25
    validate(ops, "simulated")  # canonical schema, group sizes consistent


def test_comm_drift_stretches_transfers_and_stays_benign() -> None:
    base = simulate(SimConfig(**{**SMALL, "iterations": 6})).ops
    drifted = simulate(SimConfig(**{**SMALL, "iterations": 6}, comm_drift=0.5)).ops
    assert not drifted["abnormal"].any()
    key = ["iteration", "rank", "group", "seq"]
    m = base.merge(drifted, on=key, suffixes=("", "_d"))
    sends = m[m["op"] == "send"]  # a send's duration is its transfer alone
    ratio = (sends["duration_us_d"] / sends["duration_us"]).groupby(sends["iteration"]).median()
    assert abs(ratio.loc[0] - 1.0) < 1e-9  # same draws: the first iteration is untouched
    assert abs(ratio.loc[5] - 1.5) < 1e-6  # the last one 50 % longer
    with pytest.raises(ValueError, match="comm_drift"):
        SimConfig(**SMALL, comm_drift=1.5)


def test_abnormal_label_threshold_matches_counterfactual() -> None:
    healthy = simulate(SimConfig(**SMALL)).ops
    res = simulate(SimConfig(**SMALL, faults=(FaultSpec.parse("gpu_slow:rank=20,severity=0.4"),)))
    expect = res.ops["duration_us"] > healthy["duration_us"] * (1 + ABNORMAL_REL) + ABNORMAL_ABS_US
    assert expect.any()
    np.testing.assert_array_equal(res.ops["abnormal"].to_numpy(), expect.to_numpy())


def test_multiple_faults_get_their_own_fault_id() -> None:
    faults = (
        FaultSpec.parse("gpu_slow:rank=5,severity=1,start=1"),
        FaultSpec.parse("gpu_slow:rank=18,severity=1.5,pattern=spike,start=2"),
    )
    ops = simulate(SimConfig(**SMALL, faults=faults)).ops
    abn = ops[ops["abnormal"] & (ops["group_kind"] == "tp")]
    first = abn[abn["rank"].between(4, 7)]
    second = abn[abn["rank"].between(16, 19)]
    assert len(first) and len(second)
    assert set(first["fault_id"]) == {0}
    assert set(second["fault_id"]) == {1}
    assert set(second["iteration"]) <= {2, 3}


def test_same_seed_same_file_and_round_trip(tmp_path) -> None:
    cfg = SimConfig(**SMALL, faults=(FaultSpec.parse("nic_slow:severity=1,pattern=fluctuation"),))
    a, b = simulate(cfg), simulate(cfg)
    a.write(tmp_path / "a")
    b.write(tmp_path / "b")
    digest = [hashlib.sha256((tmp_path / d / "ops.parquet").read_bytes()).hexdigest() for d in "ab"]
    assert digest[0] == digest[1]
    assert (tmp_path / "a" / "faults.json").read_text() == (
        tmp_path / "b" / "faults.json"
    ).read_text()
    other = simulate(SimConfig(**{**SMALL, "seed": 4}, faults=cfg.faults))
    assert not np.array_equal(other.ops["duration_us"], a.ops["duration_us"])

    back = load_result(tmp_path / "a")
    pd.testing.assert_frame_equal(back.ops, a.ops)
    assert back.faults == a.faults
    assert back.topology.to_dict() == a.topology.to_dict()
    # Streaming writes the same rows.
    simulate_to(cfg, tmp_path / "c")
    pd.testing.assert_frame_equal(load_result(tmp_path / "c").ops, a.ops)
    # One Parquet row group per iteration, so readers can stream large jobs.
    assert pq.ParquetFile(tmp_path / "c" / "ops.parquet").num_row_groups == cfg.iterations
    with pytest.raises(ValueError, match="ops.parquet"):
        load_result(tmp_path / "missing")


def test_faultspec_parse_errors_name_the_bad_key() -> None:
    with pytest.raises(ValueError, match="'rnak'"):
        FaultSpec.parse("gpu_slow:rnak=5")
    with pytest.raises(ValueError, match="'severity'"):
        FaultSpec.parse("gpu_slow:severity=abc")
    with pytest.raises(ValueError, match="unknown kind 'gpu_slo'"):
        FaultSpec.parse("gpu_slo:rank=1")
    with pytest.raises(ValueError, match="pattern"):
        FaultSpec.parse("nic_slow:pattern=sometimes")
    with pytest.raises(ValueError, match="ranks"):
        SimConfig(**SMALL, faults=(FaultSpec.parse("gpu_slow:rank=99"),))
    spec = FaultSpec.parse("nic_slow:ranks=3+4,pattern=spike,severity=2,start=1,end=2")
    assert (spec.ranks, spec.pattern, spec.end_iteration) == ((3, 4), "spike", 2)
    # an infinite or absurd severity overflowed the simulated clock (logs localize refused)
    for severity in ("inf", "1e12"):
        with pytest.raises(ValueError, match="severity: got .*expected a number > 0 and at "
                                             "most 1000"):
            FaultSpec.parse(f"gpu_slow:rank=3,severity={severity}")
    assert FaultSpec.parse("gpu_slow:rank=3,severity=1000").severity == 1000
    # keys that silently lost: one given twice, a probability no pattern but fluctuation reads
    with pytest.raises(ValueError, match="'ranks' given twice \\(after 'rank=3'\\)"):
        FaultSpec.parse("gpu_slow:rank=3,ranks=4")
    with pytest.raises(ValueError, match="probability applies to pattern=fluctuation only; "
                                         "got pattern=spike"):
        FaultSpec.parse("gpu_slow:probability=0.2,pattern=spike")
    assert FaultSpec.parse("gpu_slow:probability=0.2,pattern=fluctuation").probability == 0.2


def test_a_gpu_fault_given_a_rank_and_another_device_is_refused() -> None:
    # the rank was slowed while faults.json also named the device, which nothing slowed
    with pytest.raises(ValueError, match=r"faults\[0\]: ranks 3 \(gpu:\S+\) and device "
                                         r"'gpu:node001/2' \(gpu:node001/2\) name different"):
        simulate(SimConfig(**SMALL, faults=(
            FaultSpec.parse("gpu_slow:rank=3,device=gpu:node001/2"),)))
    # the same device twice is fine, and so is a host named with one of its ranks
    for spec in ("gpu_slow:rank=10,device=gpu:node001/2", "host_stall:rank=3,device=host:node000"):
        res = simulate(SimConfig(**SMALL, faults=(FaultSpec.parse(spec),)))
        assert res.faults[0].devices == (spec.split("device=")[1],)


def test_a_job_out_of_the_simulators_bounds_is_refused_naming_them() -> None:
    """gpus=1 crashed deep in the engine; then gpus=0 said "expected an integer >= 1" and
    gpus=1 "expected at least 2": both now give the one bound."""
    for gpus in (0, 1):
        with pytest.raises(ValueError, match=f"gpus: got {gpus}; expected an integer of at "
                                             "least 2 \\(a rank alone"):
            SimConfig(gpus=gpus, iterations=3)
    with pytest.raises(ValueError, match="iterations: got 1000000000000; expected at most"):
        SimConfig(gpus=8, iterations=10**12)
    with pytest.raises(ValueError, match="gpus: got 65536; expected at most 32,768"):
        SimConfig(gpus=65_536, iterations=1)
    assert SimConfig(gpus=2, iterations=3).gpus == 2


def test_six_dimensional_layout_runs_with_consistent_groups() -> None:
    cfg = SimConfig(
        gpus=64,
        model="mixtral-8x7b",
        tp=2,
        pp=2,
        ep=2,
        cp=2,
        iterations=2,
        faults=(FaultSpec.parse("gpu_slow:rank=9,severity=1"),),
    )
    res = simulate(cfg)
    ops = validate(res.ops, "6d")
    assert res.topology.parallel == {"tp": 2, "cp": 2, "ep": 2, "dp": 4, "pp": 2}
    assert set(ops["group_kind"]) == {"tp", "cp", "ep", "dp", "pp"}
    assert {"all_to_all", "all_gather", "reduce_scatter", "all_reduce", "send", "recv"} <= set(
        ops["op"]
    )
    coll = ops[ops["peer"] == -1]
    size = coll.groupby(["iteration", "group", "seq"]).size()
    listed = coll.groupby(["iteration", "group", "seq"])["group_ranks"].first().str.count(" ") + 1
    pd.testing.assert_series_equal(size, listed, check_names=False)
    p2p = ops[ops["peer"] >= 0]
    per_op = p2p.groupby(["group", "op"]).size().unstack()
    assert (per_op["send"] == per_op["recv"]).all()  # every send has its matching recv
    # recv waits for its send: it never completes before the matching send started + transfer
    s = p2p[p2p["op"] == "send"].set_index(["group", "seq"])
    r = p2p[p2p["op"] == "recv"].set_index(["group", "seq"]).loc[s.index]
    t0 = int(ops["start_ns"].min())
    r_end = (r["start_ns"] - t0) / 1000 + r["duration_us"]
    s_end = (s["start_ns"] - t0) / 1000 + s["duration_us"]
    assert (r_end.to_numpy() >= s_end.to_numpy() - 0.01).all()
    assert (r_end.to_numpy() > s_end.to_numpy() + 1.0).any()  # receivers arriving late finish later
    per_rank = ops.groupby(["iteration", "rank"]).size()
    assert per_rank.between(50, 400).all()


def test_calibration_drives_transfer_and_iteration_times(tmp_path) -> None:
    base = simulate(SimConfig(**SMALL)).ops
    # A "real" cluster: wire 3x slower, iterations ~2x longer.
    real = base.copy()
    real["duration_us"] *= 3.0
    real["start_ns"] = (real["start_ns"] - int(real["start_ns"].min())) * 2
    real.to_parquet(tmp_path / "real.parquet")
    cal = fit_calibration(real)
    target = cal.get("all_reduce", "tp")
    assert target is not None and target.sigma > 0
    # Fitted on per-instance transfer (shortest duration), not on waits.
    assert target.median_us == pytest.approx(
        3 * _instance_min(base[base["group_kind"] == "tp"]).median(), rel=0.05
    )
    ops = simulate(SimConfig(**SMALL, calibrate_from=tmp_path / "real.parquet")).ops
    got = _instance_min(ops[ops["group_kind"] == "tp"]).median()
    assert got == pytest.approx(target.median_us, rel=0.1)
    assert cal.iteration_us is not None
    assert np.median(_iteration_us(ops)[1:]) == pytest.approx(cal.iteration_us, rel=0.1)
    # Plain CSV without instance keys still fits (raw durations).
    real[["op", "group_kind", "duration_us"]].to_csv(tmp_path / "real.csv", index=False)
    assert fit_calibration(pd.read_csv(tmp_path / "real.csv")).get("send", "pp") is not None
    with pytest.raises(ValueError, match="does not exist"):
        simulate(SimConfig(**SMALL, calibrate_from=tmp_path / "nope.csv"))


def test_fault_patterns_resolve_to_the_documented_active_iterations() -> None:
    base = {**SMALL, "iterations": 40}
    faults = (
        FaultSpec.parse("gpu_slow:rank=1,pattern=spike,start=7"),
        FaultSpec.parse("gpu_slow:rank=2,pattern=fluctuation,probability=0.5,start=10,end=29"),
        FaultSpec.parse("nic_slow:rank=9,start=30"),
    )
    spike, fluct, pers = (f.spec for f in Engine(SimConfig(**base, faults=faults)).faults)
    assert spike.active_iterations in ((7,), (7, 8))
    assert set(fluct.active_iterations) <= set(range(10, 30))
    assert 4 <= len(fluct.active_iterations) <= 16
    assert pers.active_iterations == tuple(range(30, 40))
    assert pers.devices == ("nic:node001/1",) and pers.hosts == ("node001",)


def test_a_pinned_nic_fault_that_no_traffic_crosses_is_refused() -> None:
    """A NIC pinned by rank= or device= that no traffic crosses was injected with a warning:
    the job was written as faulty (faults.json listing the fault active) with not one abnormal
    op, while the same fault drawn was refused. Both are refused now, the pinned one naming
    its NIC and ranks whose NIC does carry traffic."""
    # one 8-GPU host: every collective stays inside it, so no NIC carries anything
    for spec in ("nic_slow:rank=3,severity=2", "nic_slow:device=nic:node000/3"):
        with pytest.raises(ValueError, match=r"faults\[0\] nic_slow: no traffic of this job "
                                             r"crosses nic:node000/3 .*no NIC of this job "
                                             "carries any"):
            simulate(SimConfig(gpus=8, iterations=4, seed=1, faults=(FaultSpec.parse(spec),)))
    # without a pipeline, a data-parallel ring leaves each host through two of its ranks'
    # NICs: the middle members' NICs carry nothing, the ring's ends do
    cfg = {"gpus": 64, "model": "llama2-7b", "tp": 2, "pp": 1, "iterations": 3}
    with pytest.raises(ValueError, match=r"crosses nic:node000/2 .*expected a rank whose NIC "
                                         r"carries traffic, e\.g\. 0, 6, 8"):
        simulate(SimConfig(**cfg, faults=(FaultSpec.parse("nic_slow:rank=2"),)))
    res = simulate(SimConfig(**cfg, faults=(FaultSpec.parse("nic_slow:rank=6,severity=2"),)))
    assert res.ops["abnormal"].any()


@pytest.mark.parametrize("seed", [3001, 3003, 3005])
def test_an_unpinned_link_fault_finds_a_link_that_traffic_crosses(seed) -> None:
    # the drawn rank talked between hosts below one leaf only: 4 of 7 seeds were refused with
    # "the job fits in 4 pod(s)", a job that spans pods
    res = simulate(SimConfig(gpus=64, model="llama2-7b", tp=2, pp=1, iterations=10, seed=seed,
                             faults=(FaultSpec.parse("link_slow:severity=2,start=5"),)))
    (fault,) = res.faults
    assert fault.links and fault.links[0].startswith("link:leaf-")
    assert res.ops["abnormal"].any()
    with pytest.raises(ValueError, match="no traffic of any rank crosses a leaf-spine link"):
        simulate(SimConfig(gpus=8, iterations=4, seed=seed,
                           faults=(FaultSpec.parse("link_slow:severity=2"),)))


@pytest.mark.parametrize("seed", [2, 4, 6, 10, 11])
def test_an_unpinned_nic_fault_finds_a_nic_that_traffic_crosses(seed) -> None:
    # a data-parallel ring of 4 ranks per host leaves each host through 2 of their NICs: a
    # drawn middle member's NIC carries nothing, and these seeds were refused as if no
    # traffic left any host (two jobs of the bench's noisy sweep were skipped so)
    res = simulate(SimConfig(gpus=64, model="llama2-7b", tp=2, pp=1, iterations=4, seed=seed,
                             faults=(FaultSpec.parse("nic_slow:severity=2,start=1"),)))
    (fault,) = res.faults
    assert len(fault.devices) == 1 and fault.devices[0].startswith("nic:")
    assert res.ops["affected"].any()


@pytest.mark.parametrize(("make", "said"), [
    (lambda: SimConfig(gpus=16, seed=-1), "SimConfig.seed: got -1; expected an integer >= 0"),
    (lambda: SimConfig(gpus=16, seed="a"), "SimConfig.seed: got 'a'"),
    (lambda: SimConfig(gpus=16, iterations=True), "SimConfig.iterations: got True"),
    (lambda: FaultSpec("gpu_slow", ranks="12"),
     "FaultSpec.ranks: got the str '12'; expected a tuple"),
    (lambda: FaultSpec("gpu_slow", ranks=(1.7,)), "FaultSpec.ranks: got (1.7,)"),
    (lambda: FaultSpec("gpu_slow", start_iteration=2.5), "FaultSpec.start_iteration: got 2.5"),
    (lambda: FaultSpec("gpu_slow", severity="0.5"), "FaultSpec.severity: got '0.5'"),
    (lambda: FaultSpec("gpu_slow", device=5), "FaultSpec.device: got 5"),
])
def test_a_config_of_the_wrong_type_is_refused_where_it_is_written(make, said):
    """A seed of -1 or 'a' failed later inside numpy, ranks='12' became ranks 1 and 2, a
    fractional start failed as a slice index: each is refused naming the field."""
    with pytest.raises(ValueError, match=re.escape(said)):
        make()


def test_numpy_integers_are_integers_to_a_config():
    import numpy as np

    cfg = SimConfig(gpus=np.int64(16), iterations=np.int32(4), seed=np.uint8(3))
    assert (cfg.gpus, cfg.iterations, cfg.seed) == (16, 4, 3)
    assert type(cfg.gpus) is int


@pytest.mark.parametrize(("make", "said"), [
    (lambda: FaultSpec("gpu_slow", ranks=5),
     "FaultSpec.ranks: got the int 5; expected a tuple of ranks, e.g. (5,)"),
    (lambda: FaultSpec("gpu_slow", ranks=None), "FaultSpec.ranks: got None; expected a tuple"),
    (lambda: SimConfig(gpus=16, faults=FaultSpec("gpu_slow", ranks=(3,))),
     "SimConfig.faults: got one FaultSpec (gpu_slow); expected a tuple of them"),
    (lambda: SimConfig(gpus=16, faults="gpu_slow:rank=3"),
     "SimConfig.faults: got the str 'gpu_slow:rank=3'; expected a tuple of FaultSpec"),
    (lambda: SimConfig(gpus=64, model="llama2-7b", pp=4, stage_weights="1,1,1,1.4"),
     "SimConfig.stage_weights: got the str '1,1,1,1.4'; expected a tuple of numbers, one per "
     "pipeline stage, e.g. (1, 1, 1, 1.4)"),
    (lambda: SimConfig(gpus=64, model="llama2-7b", pp=4, stage_weights=1.4),
     "SimConfig.stage_weights: got the float 1.4; expected a tuple of numbers"),
])
def test_a_scalar_or_string_for_a_tuple_field_is_refused_naming_the_field(make, said):
    """ranks=5 failed as "TypeError: 'int' object is not iterable", faults=FaultSpec(...) as
    "'FaultSpec' object is not iterable", and stage_weights="1,1,1,1.4" as
    "stage_weights[0]: got '1'", blaming a character: none named the field and its value."""
    with pytest.raises(ValueError, match=re.escape(said)):
        make()


def test_tuple_fields_take_any_sequence_of_their_items():
    spec = FaultSpec("gpu_slow", ranks=np.array([3, 4]))
    assert spec.ranks == (3, 4) and type(spec.ranks[0]) is int
    cfg = SimConfig(gpus=64, model="llama2-7b", pp=4, stage_weights=[1, 1, 1, 1.4],
                    faults=[spec])
    assert cfg.faults == (spec,) and cfg.stage_weights == (1, 1, 1, 1.4)


def test_a_fault_on_several_ranks_round_trips_through_its_dict(tmp_path) -> None:
    """FaultSpec.from_dict took the first of a resolved fault's devices as its device: a
    gpu_slow on ranks 3+4 read back from faults.json was pinned to ranks 3+4 *and* to
    gpu:node000/3, and simulating it again was refused as naming different devices."""
    spec = FaultSpec.parse("gpu_slow:ranks=3+4,severity=1,start=1")
    assert FaultSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    first = simulate(SimConfig(**SMALL, faults=(spec,)))
    (resolved,) = first.faults
    assert resolved.devices == ("gpu:node000/3", "gpu:node000/4") and resolved.device is None
    first.write(tmp_path / "a")
    (back,) = load_result(tmp_path / "a").faults
    assert back == resolved
    again = simulate(SimConfig(**SMALL, faults=(back,)))
    assert again.faults == first.faults
    pd.testing.assert_frame_equal(again.ops, first.ops)
    # a faults.json of before the "device" key still reads a single device as the device
    one = simulate(SimConfig(**SMALL, faults=(FaultSpec.parse("gpu_slow:rank=9"),))).faults[0]
    old = {k: v for k, v in one.to_dict().items() if k != "device"}
    assert FaultSpec.from_dict(old) == one and one.device == "gpu:node001/1"


def test_fault_id_blames_the_fault_that_reaches_the_op() -> None:
    """With a slow GPU (severity 0.8) and a slow NIC (severity 2) in one job, fault_id named
    the "most severe" fault comparing severities of different kinds: 839 ops that only the
    GPU's delay reaches (abnormal with the GPU fault alone, not with the NIC's) were blamed
    on the NIC, many in groups containing neither rank."""
    faults = (FaultSpec.parse("gpu_slow:rank=5,severity=0.8,start=2"),
              FaultSpec.parse("nic_slow:rank=50,severity=2,start=2"))
    cfg = {"gpus": 64, "model": "llama2-7b", "tp": 2, "pp": 4, "iterations": 6, "seed": 7}
    both = simulate(SimConfig(**cfg, faults=faults)).ops
    keys = ["iteration", "rank", "op", "group", "seq"]
    alone = [simulate(SimConfig(**cfg, faults=(f,))).ops.set_index(keys)["abnormal"]
             for f in faults]
    ops = both.set_index(keys)
    gpu_only = (ops["abnormal"] & alone[0] & ~alone[1]).to_numpy()
    nic_only = (ops["abnormal"] & alone[1] & ~alone[0]).to_numpy()
    assert gpu_only.sum() > 100 and nic_only.sum() > 10
    assert (ops["fault_id"].to_numpy()[gpu_only] == 0).all()
    assert (ops["fault_id"].to_numpy()[nic_only] == 1).all()
    # the rest of the job is what it always was: only the labels' fault ids are chosen anew
    assert set(both.loc[both["abnormal"], "fault_id"]) == {0, 1}
    assert (both.loc[~both["abnormal"], "fault_id"] == -1).all()


def test_a_calibration_that_matches_none_of_the_jobs_transfers_says_so(tmp_path, caplog):
    """A Kineto trace's group kinds are process-group names ('0'), none of a simulated job's
    tp/dp/pp: calibrating from one set no transfer time, silently (only compute was
    rescaled, with a warning that spoke as if communication had been calibrated)."""
    base = simulate(SimConfig(**SMALL)).ops
    foreign = base.assign(group_kind="0")
    foreign.to_parquet(tmp_path / "trace.parquet")
    with caplog.at_level(logging.WARNING, logger="holmes_ml.simulator.engine"):
        simulate(SimConfig(**SMALL, calibrate_from=tmp_path / "trace.parquet"))
    said = " ".join(caplog.text.split())
    assert ("none of the (op, group_kind) pairs fitted from " + str(tmp_path / "trace.parquet")
            + " (all_gather/0, all_reduce/0, reduce_scatter/0, send/0) is one this job runs "
            "(all_reduce/tp, send/pp, reduce_scatter/dp, all_gather/dp) (its group kinds '0' "
            "are no parallel dimension") in said, said
    assert "communication stays at the built-in alpha-beta model" in said
    # with no iteration times to rescale compute by either, it would calibrate nothing at all
    cal = fit_calibration(foreign[["op", "group_kind", "duration_us"]])
    assert cal.iteration_us is None and cal.table
    with pytest.raises(ValueError, match=r"calibrate_from: none of the \(op, group_kind\) "
                                         r"pairs .* so it would calibrate nothing"):
        Engine(SimConfig(**SMALL), calibration=cal)
    # a log of the job's own kinds says nothing of the kind
    caplog.clear()
    base.to_parquet(tmp_path / "own.parquet")
    with caplog.at_level(logging.WARNING, logger="holmes_ml.simulator.engine"):
        simulate(SimConfig(**SMALL, calibrate_from=tmp_path / "own.parquet"))
    assert "none of the" not in caplog.text
