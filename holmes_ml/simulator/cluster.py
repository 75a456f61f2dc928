"""Placement of a parallel layout on the cluster, and the job's communicators.

Ranks are laid out in Megatron order ``tp-cp-ep-dp-pp`` (tp fastest, pp slowest) and placed on
hosts consecutively, 8 per host, so tensor-parallel groups of up to 8 stay inside one NVLink
domain. GPU ``g`` of a host is served by NIC ``g`` which hangs off the rail-``g`` leaf of its pod
(rail-optimized fabric); leaves connect to every spine.

Communicators ("families", each simulated as one vectorized step):

==========  ==========================  ===============================================
family      group name                  members
==========  ==========================  ===============================================
``tp``      ``tp-<i>``                  same (pp, dp, ep, cp), all tp
``cp``      ``cp-<i>``                  same (pp, dp, ep, tp), all cp
``ep``      ``ep-<i>``                  same (pp, dp, cp, tp), all ep
``dp``      ``dp-<i>``                  same (pp, ep, cp, tp), all dp (gradient sync);
                                        with HSDP (``dp_replicate > 1``) only the
                                        ``dp_shard`` ranks of one replica
``dpr``     ``dp_replicate-<i>``        HSDP only: same (pp, shard index, ep, cp, tp),
                                        all replicas (group kind ``dp_replicate``)
``ppf``     ``pp-<src>-<dst>``          one *directional* pair per pipeline hop: stage s
                                        sends activations to s+1 (``ppf``) and s+1 sends
``ppb``                                 gradients back to s (``ppb``). The sender only
                                        sends and the receiver only receives in a group,
                                        so the k-th send and k-th recv share ``seq``.
==========  ==========================  ===============================================

``i`` numbers the groups of a family in rank order of their first member. Expert-parallel
simplification: dense and expert gradients are both reduced over the ``dp`` group.

HSDP families live in the stage array viewed as ``(dp_replicate, dp_shard, ep, cp, tp)``
(:attr:`Family.grid_shape`); the flat order of that view is the flat order of the stage array.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from holmes_ml.simulator.config import Layout
from holmes_ml.topology import Group, Topology

GPUS_PER_HOST = 8
#: Axis of each collective family inside a stage array shaped ``(dp, ep, cp, tp)``.
FAMILY_AXIS: dict[str, int] = {"dp": 0, "ep": 1, "cp": 2, "tp": 3}


@dataclass
class Family:
    """Groups of one kind at one pipeline stage (or one pipeline hop for P2P).

    ``gid`` holds the global group index for every rank of the stage, shaped ``(dp, ep, cp, tp)``
    (for P2P: for every sender/receiver pair). ``inst_shape`` is the shape of per-group arrays,
    i.e. the stage shape with 1 on the member axis; ``members`` lists each group's ranks,
    one row per group in the flattened order of ``inst_shape``.
    """

    kind: str
    axis: int | None
    gid: np.ndarray
    inst_shape: tuple[int, ...]
    members: np.ndarray
    inter: np.ndarray  # bool, inst_shape: the group spans more than one host
    #: Shape of the stage array this family's ``axis`` refers to; None = ``(dp, ep, cp, tp)``.
    grid_shape: tuple[int, ...] | None = None


class Cluster:
    """Rank placement, topology and communicator families for one :class:`Layout`."""

    def __init__(self, layout: Layout, hosts_per_pod: int, spines: int) -> None:
        self.layout = layout
        lay = layout
        self.world = lay.world
        # rank_grid[s, d, e, c, t] = global rank (Megatron order, tp fastest, pp slowest)
        self.rank_grid = np.arange(self.world, dtype=np.int64).reshape(
            lay.pp, lay.dp, lay.ep, lay.cp, lay.tp
        )
        self.host_idx = np.arange(self.world) // GPUS_PER_HOST
        n_hosts = int(self.host_idx.max()) + 1
        width = max(3, len(str(n_hosts - 1)))
        self.host_names = np.array([f"node{h:0{width}d}" for h in range(n_hosts)], dtype=object)
        self.gpu_idx = np.arange(self.world) % GPUS_PER_HOST
        self.pod_idx = self.host_idx // hosts_per_pod
        multi_leaf = n_hosts > 1 and int(self.pod_idx.max()) >= 1
        coords = np.stack(np.unravel_index(np.arange(self.world), self.rank_grid.shape), axis=1)
        ranks = pd.DataFrame(
            {
                "rank": np.arange(self.world, dtype=np.int64),
                "host": self.host_names[self.host_idx].astype(str),
                "gpu": self.gpu_idx.astype(np.int64),
                "pod": self.pod_idx.astype(np.int64),
                "tp": coords[:, 4],
                "cp": coords[:, 3],
                "ep": coords[:, 2],
                "dp": coords[:, 1],
                "pp": coords[:, 0],
            }
        )
        self.coords = coords  # (world, 5): s, d, e, c, t
        self.names: list[str] = []
        self.kinds: list[str] = []
        self.member_lists: list[np.ndarray] = []
        self.families: dict[tuple[str, int], Family] = {}
        self._build_collectives()
        self._build_p2p()
        groups = {
            n: Group(n, k, tuple(int(x) for x in m))
            for n, k, m in zip(self.names, self.kinds, self.member_lists, strict=True)
        }
        # Spines exist even in a single-pod job (the topology names them); they only carry
        # traffic once the job spans pods.
        self.topology = Topology(
            ranks=ranks,
            groups=groups,
            spines=spines,
            parallel=lay.as_dict(),
            gpus_per_host=GPUS_PER_HOST,
        )
        self.multi_pod = multi_leaf
        self.group_ranks_str = [" ".join(str(int(x)) for x in m) for m in self.member_lists]

    # ----------------------------------------------------------------- families
    def _add_groups(
        self, kind: str, members: np.ndarray, prefix_names: list[str] | None = None
    ) -> np.ndarray:
        start = len(self.names)
        n = members.shape[0]
        if prefix_names is None:
            count = sum(1 for k in self.kinds if k == kind)
            prefix_names = [f"{kind}-{count + i}" for i in range(n)]
        self.names.extend(prefix_names)
        self.kinds.extend([kind] * n)
        self.member_lists.extend(list(members))
        return np.arange(start, start + n, dtype=np.int32)

    def _inter(self, members: np.ndarray) -> np.ndarray:
        hosts = self.host_idx[members]
        return hosts.max(axis=-1) != hosts.min(axis=-1)

    def _build_collectives(self) -> None:
        lay = self.layout
        hsdp = lay.dp_replicate > 1
        sizes = {"dp": lay.dp_shard, "ep": lay.ep, "cp": lay.cp, "tp": lay.tp,
                 "dpr": lay.dp_replicate}
        split = (lay.dp_replicate, lay.dp_shard, lay.ep, lay.cp, lay.tp)
        # Number groups family by family across all stages so names are tp-0..tp-N in rank order.
        for kind in ("tp", "cp", "ep", "dp", "dpr"):
            if sizes[kind] < 2:
                continue
            # HSDP: dp (the shard group) and dpr (the replicas) act on one axis of the split view.
            grid_shape = split if hsdp and kind in ("dp", "dpr") else None
            axis = {"dp": 1, "dpr": 0}[kind] if grid_shape else FAMILY_AXIS[kind]
            group_kind = "dp_replicate" if kind == "dpr" else kind
            for s in range(lay.pp):
                grid = self.rank_grid[s]
                if grid_shape is not None:
                    grid = grid.reshape(grid_shape)
                moved = np.moveaxis(grid, axis, -1)
                members = moved.reshape(-1, sizes[kind])
                gids = self._add_groups(group_kind, members)
                inst_shape = list(grid.shape)
                inst_shape[axis] = 1
                gid_moved = gids.reshape(moved.shape[:-1])
                gid = np.broadcast_to(np.expand_dims(gid_moved, axis), grid.shape)
                inter = np.expand_dims(self._inter(members).reshape(moved.shape[:-1]), axis)
                self.families[(kind, s)] = Family(
                    kind, axis, np.ascontiguousarray(gid), tuple(inst_shape), members, inter,
                    grid_shape,
                )

    def _build_p2p(self) -> None:
        lay = self.layout
        for s in range(lay.pp - 1):
            a = self.rank_grid[s]
            b = self.rank_grid[s + 1]
            for kind, src, dst in (("ppf", a, b), ("ppb", b, a)):
                members = np.stack([src.ravel(), dst.ravel()], axis=1)
                names = [f"pp-{x}-{y}" for x, y in members]
                start = len(self.names)
                self.names.extend(names)
                self.kinds.extend(["pp"] * len(names))
                self.member_lists.extend(list(members))
                gid = np.arange(start, start + len(names), dtype=np.int32).reshape(a.shape)
                inter = self._inter(members).reshape(a.shape)
                self.families[(kind, s)] = Family(kind, None, gid, a.shape, members, inter)
