"""Resolve user fault specs against a cluster: which device, which groups it slows, when it fires.

A fault is resolved once, before simulating, into plain arrays the engine applies per iteration:
the ranks whose compute slows or pauses, and for bandwidth faults the communicator instances
whose ring (or P2P path) crosses the faulty device according to
:meth:`holmes_ml.topology.Topology.collective_devices`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import numpy as np

from holmes_ml.simulator.cluster import Cluster, Family
from holmes_ml.simulator.config import FaultSpec
from holmes_ml.topology import Topology

logger = logging.getLogger(__name__)

BANDWIDTH_KINDS = frozenset({"nic_slow", "link_slow", "switch_congested"})


@dataclass
class ResolvedFault:
    """Engine-side view of one fault."""

    spec: FaultSpec
    active: np.ndarray  # bool per iteration
    ranks: np.ndarray  # ranks whose device is faulty (gpu/nic/host) or whose traffic crosses it
    #: family key -> flat indices (in inst_shape order) of the groups whose transfers slow down
    slowed: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    #: family key -> bool array (inst_shape) of groups the fault touches (for fault_id labels)
    touch: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    #: host_stall: iteration -> microbatch before whose forward pass the pause happens
    stall_microbatch: dict[int, int] = field(default_factory=dict)


def _idle_network(i: int, kind: str) -> str:
    """The error for a network fault drawn on a job none of whose traffic it would carry."""
    # (a pinned NIC is refused as well, see _idle_nic: only a switch can be pinned regardless)
    return (f"faults[{i}] {kind}: no traffic of this job leaves its hosts, so a drawn "
            f"{'NIC' if kind == 'nic_slow' else 'switch'} would slow nothing (the job would "
            "carry a fault its logs cannot show); expected a job spanning hosts (more GPUs, "
            "or a layout whose groups cross hosts)"
            + ("" if kind == "nic_slow" else ", or a device= / rank= to inject it on regardless"))


def _idle_nic(i: int, cluster: Cluster, devices: tuple[str, ...]) -> str:
    """The error for a NIC fault pinned (rank= / device=) on NICs no traffic of the job crosses."""
    busy = _busy_nic_ranks(cluster, most=12)
    shown = ", ".join(map(str, busy[:12])) + (", ..." if len(busy) > 12 else "")
    where = (f"expected a rank whose NIC carries traffic, e.g. {shown}" if busy else
             "no NIC of this job carries any (every collective stays inside its host); "
             "expected a job spanning hosts (more GPUs, or a layout whose groups cross hosts)")
    return (f"faults[{i}] nic_slow: no traffic of this job crosses {', '.join(devices)} (its "
            "ranks' groups stay inside their host, or leave it through other ranks' NICs), so "
            "the NIC would slow nothing (the job would carry a fault its logs cannot show); "
            f"{where}")


def _busy_nic_ranks(cluster: Cluster, most: int) -> list[int]:
    """More than ``most`` ranks (when there are) whose NIC some group's traffic crosses,
    sorted; a group crosses only its members' NICs. Stops early: routing every group takes
    1-2 s at 1,024 GPUs and grows with the job."""
    topo = cluster.topology
    busy: set[int] = set()
    for fam in cluster.families.values():
        for j in np.flatnonzero(fam.inter.reshape(-1)):
            members = fam.members[j].tolist()
            nics = {d for d in topo.collective_devices(members) if d.startswith("nic:")}
            busy.update(int(r) for r in members if topo.nic_of(int(r)) in nics)
            if len(busy) > most:
                return sorted(busy)
    return sorted(busy)


def _pick_rank(cluster: Cluster, rng: np.random.Generator, inter_only: bool) -> int:
    """Draw a rank; for network faults prefer ranks that have inter-host traffic at all."""
    if inter_only:
        busy = np.zeros(cluster.world, dtype=bool)
        for fam in cluster.families.values():
            inter_rows = fam.inter.reshape(-1)
            busy[fam.members[inter_rows].ravel()] = True
        pool = np.flatnonzero(busy)
        if len(pool):
            return int(rng.choice(pool))
    return int(rng.integers(cluster.world))


def _uplinks(cluster: Cluster, rank: int) -> set[str]:
    """Leaf-spine links above ``rank``'s leaf that its groups' traffic crosses."""
    topo = cluster.topology
    leaf = topo.leaf_of(rank)
    if leaf is None:  # no fabric known
        return set()
    prefix = f"link:{leaf.split(':', 1)[1]}~"
    used: set[str] = set()
    for fam in cluster.families.values():
        for j in _instances_with(fam, np.asarray([rank])):
            if fam.inter.reshape(-1)[j]:
                used.update(d for d in topo.collective_devices(fam.members[j].tolist())
                            if d.startswith(prefix))
    return used


def _instances_with(fam: Family, ranks: np.ndarray) -> np.ndarray:
    """Flat indices of the family's groups that contain any of ``ranks``."""
    return np.flatnonzero(np.isin(fam.members, ranks).any(axis=1))


def _crossing(
    cluster: Cluster, device: str, candidates_from: np.ndarray | None
) -> dict[tuple[str, int], np.ndarray]:
    """Groups whose traffic crosses ``device``; only groups containing ``candidates_from``
    ranks are routed (all inter-host groups when None, e.g. for a spine)."""
    topo = cluster.topology
    out: dict[tuple[str, int], np.ndarray] = {}
    for key, fam in cluster.families.items():
        inter = fam.inter.reshape(-1)
        idx = np.flatnonzero(inter)
        if candidates_from is not None:
            idx = np.intersect1d(idx, _instances_with(fam, candidates_from))
        hit = [i for i in idx if device in topo.collective_devices(fam.members[i].tolist())]
        if hit:
            out[key] = np.asarray(hit, dtype=np.int64)
    return out


def _active_iterations(spec: FaultSpec, iterations: int, rng: np.random.Generator) -> np.ndarray:
    active = np.zeros(iterations, dtype=bool)
    start = spec.start_iteration
    if spec.pattern == "spike":
        end = (
            spec.end_iteration
            if spec.end_iteration is not None
            else start + int(rng.integers(1, 3)) - 1
        )
        active[start : min(end, iterations - 1) + 1] = True
    else:
        end = (
            iterations - 1
            if spec.end_iteration is None
            else min(spec.end_iteration, iterations - 1)
        )
        active[start : end + 1] = True
        if spec.pattern == "fluctuation":
            draws = rng.random(iterations) < spec.probability
            active &= draws
            if not active.any():
                # A fault that never fires would be a mislabeled scenario; fire at onset instead.
                active[start] = True
    return active


def _touch_masks(
    cluster: Cluster, per_family: dict[tuple[str, int], np.ndarray]
) -> dict[tuple[str, int], np.ndarray]:
    out = {}
    for key, idx in per_family.items():
        fam = cluster.families[key]
        mask = np.zeros(int(np.prod(fam.inst_shape)), dtype=bool)
        mask[idx] = True
        out[key] = _to_inst(fam, mask)
    return out


def _to_inst(fam: Family, flat: np.ndarray) -> np.ndarray:
    """Reshape a flat per-group array (members order) to ``inst_shape``."""
    if fam.axis is None:
        return flat.reshape(fam.inst_shape)
    moved = [n for i, n in enumerate(fam.inst_shape) if i != fam.axis]
    return np.expand_dims(flat.reshape(moved), fam.axis)


def resolve_faults(
    faults: tuple[FaultSpec, ...],
    cluster: Cluster,
    iterations: int,
    microbatches: int,
    rng: np.random.Generator,
) -> list[ResolvedFault]:
    """Fill in ranks/devices/active iterations and precompute what each fault slows."""
    topo = cluster.topology
    resolved: list[ResolvedFault] = []
    for i, spec in enumerate(faults):
        kind = spec.kind
        links: tuple[str, ...] = ()
        if kind in ("gpu_slow", "nic_slow", "host_stall"):
            if spec.ranks:
                ranks = np.asarray(spec.ranks, dtype=np.int64)
            elif spec.device is not None:
                ranks = np.asarray(topo.ranks_on(spec.device), dtype=np.int64)
                if not len(ranks):
                    raise ValueError(
                        f"faults[{i}].device: {spec.device!r} hosts no rank of this job"
                    )
            else:
                ranks = np.asarray([_pick_rank(cluster, rng, kind == "nic_slow")], dtype=np.int64)
            prefix = {"gpu_slow": "gpu", "nic_slow": "nic", "host_stall": "host"}[kind]

            def devices_of(ranks: np.ndarray, prefix: str = prefix) -> tuple[str, ...]:
                if prefix == "host":
                    return tuple(dict.fromkeys(f"host:{topo.host_of(int(r))}" for r in ranks))
                return tuple(topo.gpu_of(int(r)) if prefix == "gpu" else topo.nic_of(int(r))
                             for r in ranks)

            devices = devices_of(ranks)
            if spec.ranks and spec.device is not None:
                # both given: the ranks were used and the device silently dropped (faults.json
                # then said both); they must name the same devices
                named = devices_of(np.asarray(topo.ranks_on(spec.device), dtype=np.int64))
                if set(named) != set(devices):
                    raise ValueError(
                        f"faults[{i}]: ranks {'+'.join(map(str, spec.ranks))} "
                        f"({', '.join(devices)}) and device {spec.device!r} "
                        f"({', '.join(named) or 'no rank of this job'}) name different "
                        "devices; expected one of the two")
            slowed: dict[tuple[str, int], np.ndarray] = {}
            if kind == "nic_slow":
                for dev in devices:
                    for key, idx in _crossing(cluster, dev, ranks).items():
                        slowed[key] = np.union1d(slowed.get(key, np.empty(0, np.int64)), idx)
                if not slowed and not spec.ranks and spec.device is None:
                    # a drawn rank whose groups leave the host through other ranks' NICs (a
                    # ring's middle members): another drawn rank whose NIC carries traffic
                    for other in rng.permutation(cluster.world):
                        found = _crossing(cluster, topo.nic_of(int(other)),
                                          np.asarray([other], dtype=np.int64))
                        if found:
                            ranks = np.asarray([other], dtype=np.int64)
                            devices = (topo.nic_of(int(other)),)
                            slowed = found
                            break
                if not slowed and not spec.ranks and spec.device is None:
                    raise ValueError(_idle_network(i, kind))
                if not slowed:
                    # pinned too: it was injected with a warning, and the job written as
                    # faulty (faults.json listing it active) had not one abnormal op
                    raise ValueError(_idle_nic(i, cluster, devices))
            touched = {key: _instances_with(fam, ranks) for key, fam in cluster.families.items()}
            touched = {k: v for k, v in touched.items() if len(v)}
        else:
            device = spec.device
            if device is None:
                anchor = int(spec.ranks[0]) if spec.ranks else _pick_rank(cluster, rng, True)
                leaf = topo.leaf_of(anchor)
                if kind == "switch_congested":
                    device = leaf
                else:
                    # Links actually used by the anchor's groups, so the fault has an effect;
                    # a drawn anchor whose traffic stays below its leaf gives way to another
                    # drawn rank whose traffic does not (a pinned rank does not)
                    used = _uplinks(cluster, anchor)
                    if not used and not spec.ranks:
                        for other in rng.permutation(cluster.world):
                            used = _uplinks(cluster, int(other))
                            if used:
                                anchor = int(other)
                                break
                    if not used:
                        who = f"rank {anchor}" if spec.ranks else "any rank"
                        raise ValueError(
                            f"faults[{i}] link_slow: no traffic of {who} crosses a leaf-spine "
                            "link (every collective of the job stays below one leaf switch); "
                            "expected a job whose groups span leaves: more GPUs, smaller "
                            "hosts_per_pod, or an explicit device=link:..."
                        )
                    device = sorted(used)[int(rng.integers(len(used)))]
            assert device is not None
            _check_fabric_device(i, kind, device, topo)
            body = device.split(":", 1)[1]
            below = (
                None
                if body.startswith("spine-")
                else np.asarray(topo.ranks_on(device), dtype=np.int64)
            )
            slowed = _crossing(cluster, device, below)
            if not slowed and not spec.ranks and spec.device is None:
                raise ValueError(_idle_network(i, kind))
            if not slowed:
                logger.warning(
                    "fault %d (%s on %s) crosses no traffic of this job", i, kind, device
                )
            touched = slowed
            members = [cluster.families[k].members[idx].ravel() for k, idx in slowed.items()]
            ranks = np.unique(np.concatenate(members)) if members else np.empty(0, np.int64)
            devices = (device,)
            if kind == "link_slow":
                links = (device,)
        active = _active_iterations(spec, iterations, rng)
        stall = {}
        if kind == "host_stall":
            stall = {int(it): int(rng.integers(microbatches)) for it in np.flatnonzero(active)}
        hosts = tuple(dict.fromkeys(topo.host_of(int(r)) for r in ranks))
        new_spec = replace(
            spec,
            ranks=tuple(int(r) for r in ranks),
            hosts=hosts,
            links=links,
            devices=devices,
            device=spec.device
            if spec.device is not None
            else (devices[0] if len(devices) == 1 else None),
            active_iterations=tuple(int(x) for x in np.flatnonzero(active)),
        )
        resolved.append(
            ResolvedFault(
                spec=new_spec,
                active=active,
                ranks=ranks,
                slowed=slowed,
                touch=_touch_masks(cluster, touched),
                stall_microbatch=stall,
            )
        )
    return resolved


def _check_fabric_device(i: int, kind: str, device: str, topo: Topology) -> None:
    """Refuse a switch or link that this job's fabric does not have (a typo would otherwise
    inject a fault that touches nothing)."""
    pods = sorted(set(topo.ranks["pod"].astype(int)))
    rails = sorted(set(topo.ranks["gpu"].astype(int)))
    leaves = {f"leaf-p{p}-r{r}" for p in pods for r in rails}
    spines = {f"spine-{s}" for s in range(topo.spines)}
    prefix, _, body = device.partition(":")
    leaf, _, spine = body.partition("~")
    if prefix == "switch":
        ok = body in leaves or body in spines
        expected = "switch:leaf-p{pod}-r{rail} or switch:spine-{s}"
    elif prefix == "link":
        ok = leaf in leaves and spine in spines
        expected = "link:leaf-p{pod}-r{rail}~spine-{s}"
    else:
        ok, expected = False, "a switch:... or link:... device"
    if not ok:
        raise ValueError(
            f"faults[{i}].device ({kind}): got {device!r}; expected {expected} of this job "
            f"(pods {pods[0]}-{pods[-1]}, rails {rails[0]}-{rails[-1]}, spines 0-"
            f"{topo.spines - 1})"
        )
