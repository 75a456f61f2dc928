"""Candidate kind: a host stall (one long pause seen by several waiting partners) is a host."""

from __future__ import annotations

import pytest

from holmes_ml.io import without_labels
from holmes_ml.localize import DeviceKind
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
