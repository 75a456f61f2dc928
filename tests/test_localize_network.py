"""Network candidates on simulated jobs: NIC vs link vs the other devices of a slow ring.

128 GPUs (tp2 x pp2 x dp32, 4 hosts per pod, so data-parallel rings cross spines). Seeds are
outside the ``holmes bench localize`` grid.
"""

from __future__ import annotations

import pytest

from holmes_ml.localize import DeviceKind
from holmes_ml.localize.fabric import Fabric
from holmes_ml.pipeline import analyze
from holmes_ml.simulator import FaultSpec, SimConfig, simulate


def _alike(res, device: str) -> set[str]:
    """Network devices crossed by exactly the same flows of the job as ``device``."""
    flows_of = Fabric(res.topology).flows_by_device(res.ops["group_ranks"].astype(str).unique())
    return {d for d, flows in flows_of.items() if flows == flows_of[device]}


def _verdict(fault: str, seed: int):
    res = simulate(SimConfig(gpus=128, model="llama2-7b", tp=2, pp=2, iterations=8, seed=seed,
                             faults=(FaultSpec.parse(fault),)))
    ops = res.ops.drop(columns=["abnormal", "fault_id"])
    return res, analyze(ops, res.topology, model="rule")


@pytest.mark.parametrize("seed", [5, 22])
def test_nic_spike_names_that_nic_and_its_rank(seed: int) -> None:
    # One or two slow steps: the ring all-reduces and the NIC's own pipeline send/recv are slow
    # there. The NIC crossed by both outranks the links crossed by the ring alone.
    res, verdict = _verdict("nic_slow:severity=2,pattern=spike,start=2", seed)
    fault = res.faults[0]
    assert verdict.candidates, verdict
    top = verdict.candidates[0]
    assert top.kind == DeviceKind.NIC
    assert top.device == fault.devices[0]
    assert top.ranks == fault.ranks
    assert all(c.score <= 0.6 * top.score for c in verdict.candidates[1:])


def test_link_beats_its_leaf_spine_and_the_nics_of_the_ring() -> None:
    res, verdict = _verdict("link_slow:severity=2,start=2", 22)
    top = verdict.candidates[0]
    assert top.kind == DeviceKind.LINK
    assert top.device == res.faults[0].devices[0]
    leaf = "switch:" + top.device.split(":", 1)[1].split("~", 1)[0]
    others = {c.device: c.score for c in verdict.candidates[1:]}
    assert others.get(leaf, 0.0) < top.score
    assert all(s < top.score for d, s in others.items() if d.startswith("nic:"))


@pytest.mark.parametrize(("seed", "leaf"), [(5, "switch:leaf-p1-r0"), (22, "switch:leaf-p2-r7")])
def test_congested_leaf_switch_beats_the_nics_and_links_below_it(seed: int, leaf: str) -> None:
    # Every flow through the leaf slows: the rings of several hosts of the pod on that rail.
    # Each NIC and link below it carries only part of those flows (and healthy ones of its own).
    res, verdict = _verdict(f"switch_congested:severity=2,device={leaf},start=2", seed)
    top = verdict.candidates[0]
    assert (top.kind, top.device) == (DeviceKind.SWITCH, leaf)
    assert not top.tied_with
    assert all(c.score < top.score for c in verdict.candidates[1:])


def test_healthy_job_names_no_network_device() -> None:
    res = simulate(SimConfig(gpus=128, model="llama2-7b", tp=2, pp=2, iterations=8, seed=22))
    verdict = analyze(res.ops.drop(columns=["abnormal", "fault_id"]), res.topology, model="rule")
    assert verdict.candidates == ()


@pytest.mark.parametrize("seed", [7, 31])
def test_devices_of_a_pair_with_no_other_traffic_are_reported_tied(seed: int) -> None:
    # GPU 4 of a host is no ring edge (rings leave a host through GPUs 0/1 and 6/7), so its NIC
    # carries only its pipeline send/recv pair: that pair's two NICs (and any leaf-spine link
    # on its way that nothing else crosses) slow the same operators by the same amount, and the
    # verdict must say they are tied rather than pick one silently.
    res = simulate(SimConfig(gpus=128, model="llama2-7b", tp=2, pp=2, iterations=8, seed=seed))
    rank = int(res.topology.ranks.query("gpu == 4 and pp == 1")["rank"].iloc[0])
    nic = res.topology.nic_of(rank)
    res, verdict = _verdict(f"nic_slow:severity=10,device={nic},start=2", seed)
    assert res.faults[0].devices == (nic,)
    alike = _alike(res, nic)
    assert sum(d.startswith("nic:") for d in alike) == 2  # the pair's two ends
    top = verdict.candidates[0]
    assert top.kind == DeviceKind.NIC  # the more specific device first among equals
    assert {top.device, *top.tied_with} == alike
    for c in verdict.candidates:
        if c.device in alike:
            assert {c.device, *c.tied_with} == alike
    assert verdict.to_dict()["candidates"][0]["tied_with"] == list(top.tied_with)


def test_a_nic_and_the_link_only_its_flows_cross_are_reported_tied() -> None:
    # A leaf-spine link that carries nothing but the flows of one NIC fails exactly like that
    # NIC: the verdict names both, with the same score, each tied with the other.
    res, verdict = _verdict("link_slow:severity=2,start=2", 12)
    link = res.faults[0].devices[0]
    alike = _alike(res, link)
    named = {c.device: c for c in verdict.candidates}
    assert link in named
    assert {link, *named[link].tied_with} == alike
    assert any(d.startswith("nic:") for d in alike), alike


def test_a_slow_nic_on_a_noisy_job_is_named() -> None:
    # 10 % compute jitter: over 24 steps jitter slows a flow here and there, so each spine
    # collects more "slow" flows than the faulty NIC ever carries (its ring and its pipeline
    # pair). What sets the NIC apart is that those two are slow as a whole (several transfers
    # each) together, step after step.
    res = simulate(SimConfig(
        gpus=128, model="mixtral-8x7b", tp=2, pp=2, ep=2, iterations=24, seed=7057, jitter=0.1,
        faults=(FaultSpec.parse("nic_slow:rank=19,severity=0.5,start=10"),)))
    verdict = analyze(res.ops.drop(columns=["abnormal", "fault_id"]), res.topology)
    assert verdict.candidates, verdict
    assert verdict.candidates[0].device == res.faults[0].devices[0]


def test_one_flow_slow_as_a_whole_tells_no_device_apart() -> None:
    from holmes_ml.localize.rules import _repeated_peak

    assert _repeated_peak({8: 1, 9: 1}) == 0  # one flow: every device it crosses alike
    assert _repeated_peak({4: 2}) == 0  # together once: may be chance
    assert _repeated_peak({4: 2, 5: 2, 6: 1}) == 2
    assert _repeated_peak({4: 3, 5: 2}) == 2
