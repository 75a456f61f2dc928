"""Candidate kind: a host stall (one long pause seen by several waiting partners) is a host."""

from __future__ import annotations

import pytest

from holmes_ml.io import without_labels
from holmes_ml.localize import DeviceKind, LocalizeConfig
from holmes_ml.pipeline import analyze
from holmes_ml.simulator import FaultSpec, SimConfig, simulate


def _sim(fault: str, seed: int):
    return simulate(SimConfig(gpus=64, model="llama2-7b", tp=2, pp=2, iterations=8, seed=seed,
                              faults=(FaultSpec.parse(fault),)))


@pytest.mark.parametrize("seed", [11, 12])
def test_persistent_host_stall_is_named_once_as_a_host(seed: int) -> None:
    res = _sim("host_stall:severity=0.5,start=2", seed)
    verdict = analyze(without_labels(res.ops), res.topology, model="rule")
    top = verdict.candidates[0]
    assert top.kind == DeviceKind.HOST
    assert top.device == res.faults[0].devices[0]
    devices = [c.device for c in verdict.candidates]
    assert len(devices) == len(set(devices))


def test_persistent_gpu_slow_stays_a_gpu() -> None:
    res = _sim("gpu_slow:severity=0.5,start=2", 11)
    verdict = analyze(without_labels(res.ops), res.topology, model="rule")
    top = verdict.candidates[0]
    assert top.kind == DeviceKind.GPU
    assert top.device == res.faults[0].devices[0]


@pytest.mark.parametrize(("seed", "rank"), [(3, 9), (5, 17)])
def test_slow_nic_is_told_apart_from_the_other_nics_of_its_ring(seed: int, rank: int) -> None:
    # Every NIC of the slow data-parallel ring sees the same slow all-reduces; the pipeline
    # send/recv crossing only the faulty NIC breaks the tie.
    res = simulate(SimConfig(gpus=64, model="llama2-7b", iterations=10, seed=seed,
                             faults=(FaultSpec.parse(f"nic_slow:rank={rank},severity=0.5"),)))
    verdict = analyze(res.ops, res.topology, model="rule")
    top = verdict.candidates[0]
    assert top.kind == DeviceKind.NIC
    assert top.device == res.faults[0].devices[0]
    others = [c for c in verdict.candidates if c.kind == DeviceKind.NIC and c.device != top.device]
    assert all(c.score < top.score for c in others)
    # that send/recv carries 1.6-1.8 % of the ring's excess: a floor on light flows above it
    # (min_flow_share, 0.1 % by default) would count it healthy and lose the NIC
    high = analyze(res.ops, res.topology, model="rule", config=LocalizeConfig(min_flow_share=0.02))
    assert high.candidates[0].device != top.device


@pytest.mark.parametrize(("fault", "seed"), [("gpu_slow", 1), ("host_stall", 1), ("gpu_slow", 2),
                                             ("host_stall", 3)])
def test_pure_data_parallel_straggler_is_a_gpu_tied_with_its_host(fault: str, seed: int) -> None:
    # One gradient all-reduce per step: a slow GPU and a host pause both make the rank one
    # late arrival per step, so the verdict names the rank's GPU and declares its host tied.
    res = simulate(SimConfig(gpus=16, model="llama2-7b", tp=1, pp=1, iterations=12, seed=seed,
                             faults=(FaultSpec.parse(f"{fault}:severity=0.5,start=3"),)))
    verdict = analyze(without_labels(res.ops), res.topology, model="rule")
    top = verdict.candidates[0]
    (rank,) = res.faults[0].ranks
    host = res.topology.ranks.set_index("rank").loc[rank, "host"]
    assert (top.kind, top.ranks) == (DeviceKind.GPU, (rank,))
    assert top.tied_with == (f"host:{host}",)


def test_pipeline_stages_meet_often_enough_to_tell_a_pause_from_a_slow_gpu() -> None:
    # With two pipeline stages each step holds ten operators per rank: the test decides again.
    def top(fault: str):
        res = simulate(SimConfig(gpus=32, model="llama2-7b", tp=1, pp=2, iterations=12, seed=2,
                                 faults=(FaultSpec.parse(f"{fault}:severity=0.5,start=3"),)))
        return analyze(without_labels(res.ops), res.topology, model="rule").candidates[0]

    gpu, host = top("gpu_slow"), top("host_stall")
    assert (gpu.kind, gpu.tied_with) == (DeviceKind.GPU, ())
    assert (host.kind, host.tied_with) == (DeviceKind.HOST, ())
