"""Known-answer localization on hand-built operator frames (no simulator)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from holmes_ml.localize import DeviceKind, LocalizeConfig, Verdict
from holmes_ml.localize.types import Candidate, WorkloadFinding
from holmes_ml.pipeline import analyze, summarize
from holmes_ml.topology import Group, Topology

HOSTS = 4
GPUS = 4  # per host; rank = host * GPUS + gpu


def _topology(spines: int = 2) -> Topology:
    n = HOSTS * GPUS
    ranks = pd.DataFrame({
        "rank": np.arange(n), "host": [f"h{r // GPUS}" for r in range(n)],
        "gpu": np.arange(n) % GPUS, "pod": 0,
    })
    for k in ("tp", "cp", "ep", "pp"):
        ranks[k] = -1
    ranks["dp"] = np.arange(n) // GPUS
    groups = {}
    for h in range(HOSTS):  # tp: the GPUs of one host
        members = tuple(range(h * GPUS, (h + 1) * GPUS))
        groups[f"tp-{h}"] = Group(f"tp-{h}", "tp", members)
    for g in range(GPUS):  # dp: one GPU per host, across the network
        members = tuple(h * GPUS + g for h in range(HOSTS))
        groups[f"dp-{g}"] = Group(f"dp-{g}", "dp", members)
    return Topology(ranks=ranks, groups=groups, spines=spines)


def _ops(topo: Topology, slow_rank: int = -1, factor: float = 1.0, slow_dp: str = "",
         comm_factor: float = 1.0, iterations: int = 8, seed: int = 0,
         rotate: bool = False) -> pd.DataFrame:
    """Each iteration: compute, tp all_reduce, compute, dp all_reduce (per GPU index).

    ``slow_rank`` computes ``factor`` x slower; ``slow_dp``'s transfer takes ``comm_factor`` x
    longer; ``rotate`` makes a different rank slow at every iteration (workload imbalance)."""
    rng = np.random.default_rng(seed)
    n = len(topo.ranks)
    rows = []
    clock = np.zeros(n)
    seqs: dict[str, int] = {}
    compute, xfer = 10_000.0, 500.0
    for it in range(iterations):
        late = (it * 5) % n if rotate else slow_rank
        for phase, groups in (("tp", [f"tp-{h}" for h in range(HOSTS)]),
                              ("dp", [f"dp-{g}" for g in range(GPUS)])):
            comp = compute * (1 + 0.01 * rng.standard_normal(n))
            if late >= 0:
                comp[late] *= factor
            arrive = clock + comp
            for g in groups:
                members = list(topo.groups[g].ranks)
                t_all = arrive[members].max()
                dur_x = xfer * (comm_factor if g == slow_dp else 1.0)
                seq = seqs.get(g, 0)
                seqs[g] = seq + 1
                for r in members:
                    dur = t_all - arrive[r] + dur_x
                    rows.append((it, r, "all_reduce", g, seq, 1 << 20, int(arrive[r] * 1e3),
                                 dur, " ".join(map(str, members)), -1, f"h{r // GPUS}", phase))
                    clock[r] = t_all + dur_x
    cols = ["iteration", "rank", "op", "group", "seq", "nbytes", "start_ns", "duration_us",
            "group_ranks", "peer", "host", "group_kind"]
    return pd.DataFrame(rows, columns=cols)


CFG = LocalizeConfig(min_wait_us=50.0)


def test_one_rank_slower_is_named() -> None:
    topo = _topology()
    verdict = analyze(_ops(topo, slow_rank=6, factor=1.5), topo, model="rule", config=CFG)
    assert verdict.candidates, verdict
    top = verdict.candidates[0]
    assert top.ranks == (6,)
    assert top.kind in (DeviceKind.GPU, DeviceKind.HOST)
    assert top.evidence and top.evidence[0].rule == "straggler"


@pytest.mark.parametrize("rank", [0, 9, 15])
def test_the_slow_rank_moves_with_the_fault(rank: int) -> None:
    topo = _topology()
    verdict = analyze(_ops(topo, slow_rank=rank, factor=2.0, seed=rank), topo, model="rule",
                      config=CFG)
    assert verdict.candidates[0].ranks == (rank,)


def test_healthy_job_blames_nobody() -> None:
    topo = _topology()
    verdict = analyze(_ops(topo), topo, model="rule", config=CFG)
    assert verdict.candidates == ()
    assert verdict.to_dict()["candidates"] == []


def test_slow_transfer_blames_the_ring_network_not_a_gpu() -> None:
    topo = _topology(spines=0)
    verdict = analyze(_ops(topo, slow_dp="dp-2", comm_factor=6.0), topo, model="rule", config=CFG)
    assert verdict.candidates
    top = verdict.candidates[0]
    assert top.kind == DeviceKind.NIC
    # Only the NICs of the slow communicator (GPU index 2 on every host) are in question.
    assert top.device.endswith("/2")
    assert all(c.kind != DeviceKind.GPU for c in verdict.candidates)


def test_rotating_late_rank_is_workload() -> None:
    topo = _topology()
    verdict = analyze(_ops(topo, factor=1.5, rotate=True, iterations=10), topo, model="rule",
                      config=CFG)
    assert verdict.candidates == ()
    wl = verdict.to_dict()["workload"]
    assert wl is not None and wl["kind"] == "rank-imbalance"


def test_sparse_summary_is_small_and_keeps_the_answer() -> None:
    topo = _topology()
    ops = _ops(topo, slow_rank=3, factor=1.5, iterations=12)
    s = summarize(ops, model="rule", config=CFG)
    assert 0 < len(s.abnormal) < len(ops)
    # The straggler's own copies are normal: it never appears in the shipped records.
    assert 3 not in set(s.abnormal["rank"])
    assert set(s.groups["group"]) == set(topo.groups)


def test_verdict_json_contract() -> None:
    c = Candidate(DeviceKind.GPU, "gpu:h0/1", (1,), ("h0",), 0.9, {"dp": 0})
    v = Verdict(True, (3, 4), (c,), (WorkloadFinding("stage-imbalance", (1, 2), 0.5, "x"),))
    d = v.to_dict()
    assert set(d) == {"irregular", "irregular_iterations", "candidates", "workload", "note",
                      "slowdown", "input"}
    assert d["irregular_iterations"] == [3, 4]
    # irregular; built by hand, no input counts or timing
    assert d["note"] is None and d["input"] is None and d["slowdown"] is None
    lone = Verdict(False, (), (c,), stats={"ops": 10.0, "ranks": 1.0, "iterations": 1.0,
                                          "analysed_iterations": 1.0})
    lone_d = lone.to_dict()
    assert lone_d["input"] == {"ops": 10, "ranks": 1, "iterations": 1}
    timed = Verdict(True, (3,), (c,), stats={"ops": 10.0, "ranks": 2.0, "iterations": 5.0,
                                            "usual_iteration_us": 2_512_345.6,
                                            "slowdown": 1.234567}).to_dict()
    assert timed["input"]["usual_iteration_s"] == 2.512346 and timed["slowdown"] == 1.2346
    assert "one rank" in lone_d["note"] and "last 1 iteration(s)" in lone_d["note"]
    cand = d["candidates"][0]
    assert {"kind", "ranks", "hosts", "score", "coords", "evidence"} <= set(cand)
    assert cand["kind"] == "gpu" and cand["ranks"] == [1]
    assert d["workload"]["kind"] == "stage-imbalance"


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="top_k"):
        LocalizeConfig(top_k=0)
    with pytest.raises(ValueError, match="follow_fraction"):
        LocalizeConfig(follow_fraction=2.0)
    with pytest.raises(ValueError, match="reference_shift"):
        LocalizeConfig(reference_shift=0.5)
    assert LocalizeConfig(reference_shift=0).reference_shift == 0  # 0 switches it off


def test_bench_baselines_on_a_known_straggler() -> None:
    from holmes_ml.bench.localize import hta_late_start, longest_comm, nvrx_relative, shortest_comm

    topo = _topology()
    ops = _ops(topo, slow_rank=10, factor=1.5)
    assert hta_late_start(ops)[0] == 10
    assert shortest_comm(ops)[0] == 10  # everybody else waits for it
    assert nvrx_relative(ops)[0] == 10
    assert longest_comm(ops)[0] != 10


def test_slowdown_is_over_the_usual_iteration_not_the_median_of_all() -> None:
    from holmes_ml.localize.rules import _slowdown

    times = pd.Series([10.0, 10.0, 12.0, 30.0, 40.0, 30.0], index=[0, 1, 2, 3, 4, 5])
    # half the iterations irregular: their median would be 21; the others' is 10
    assert _slowdown(times, (3, 4, 5)) == {"usual_iteration_us": 10.0, "slowdown": 4.0}
    assert _slowdown(times, ()) == {"usual_iteration_us": 21.0}  # none irregular: all
    assert _slowdown(times, (0, 1, 2, 3, 4, 5)) == {"usual_iteration_us": 21.0,
                                                   "slowdown": 40.0 / 21.0}
    assert _slowdown(times.iloc[:0], ()) == {}


def _pair_instance(last_duration_us: float | None) -> pd.DataFrame:
    """One data-parallel all_reduce of ranks 1 and 3 as abnormal records: rank 1 waited 430 ms
    for rank 3; rank 3's own copy (``None``: not abnormal, absent) lasted ``last_duration_us``."""
    rows = [(0, 1, "all_reduce", "dp-a", 0, 0, 500_000.0, 300_000.0)]
    if last_duration_us is not None:
        rows.append((0, 3, "all_reduce", "dp-a", 0, 430_000_000, last_duration_us, -100_000.0))
    return pd.DataFrame(rows, columns=["iteration", "rank", "op", "group", "seq", "start_ns",
                                       "duration_us", "excess_us"])


@pytest.mark.parametrize("last", [70_000.0, 20.0, None])
def test_a_late_arrivals_long_own_copy_is_also_a_slow_transfer(last) -> None:
    # behind a capped NIC a rank reaches its data-parallel all_reduce late (its other transfers
    # crawled) and then crawls through this one too: its copy is the transfer alone
    from holmes_ml.localize.rules import _collective_events

    members = pd.DataFrame({"group": ["dp-a", "dp-a"], "rank": [1, 3]})
    ev = _collective_events(_pair_instance(last), members, pd.Series({"dp-a": 2}), CFG,
                            pd.Series({"dp-a": "dp"}))
    strag = ev[ev["rule"] == "straggler"]
    assert list(strag["rank"]) == [3] and np.isclose(strag["weight"].iloc[0], 300_000.0)
    comm = ev[ev["rule"] == "communication"]
    if last is not None and last >= CFG.min_wait_us:
        assert list(comm["rank"]) == [-1] and np.isclose(comm["weight"].iloc[0], last)
        # the transfer began when rank 3 came, 430 ms after rank 1: placed there, not at 0
        assert list(comm["t"]) == [430_000_000] and list(strag["t"]) == [0]
    else:  # a short copy, or none flagged: the lateness alone
        assert comm.empty
