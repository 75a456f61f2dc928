"""Network devices of a communicator: :class:`Fabric` resolves the GPUs, NICs, leaf-spine links
and switches that a ring (or a send/recv pair) of ranks crosses.

It follows :meth:`holmes_ml.topology.Topology.path` exactly (a test checks it) but precomputes
the per-rank lookups, because the topology's pandas row access is far too slow for thousands of
rings.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from holmes_ml.io.schema import member_ranks
from holmes_ml.topology import Topology, route


class Fabric:
    """Fast, cached network-device resolution over a :class:`Topology`."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        r = topology.ranks
        self._host = dict(zip(r["rank"].astype(int), r["host"].astype(str), strict=True))
        self._gpu = dict(zip(r["rank"].astype(int), r["gpu"].astype(int), strict=True))
        self._pod = dict(zip(r["rank"].astype(int), r["pod"].astype(int), strict=True))
        self._ring: dict[tuple[int, ...], frozenset[str]] = {}

    def known(self, rank: int) -> bool:
        return int(rank) in self._host

    def host(self, rank: int) -> str:
        return self._host[int(rank)]

    def hosts(self, ranks: np.ndarray) -> np.ndarray:
        """:meth:`host` of each of ``ranks`` (one vectorized lookup; KeyError on an unknown
        rank, like :meth:`host`)."""
        out = pd.Series(np.asarray(ranks, dtype=np.int64)).map(self._host)
        if out.isna().any():
            raise KeyError(int(np.asarray(ranks)[out.isna().to_numpy()][0]))
        return out.to_numpy(dtype=object)

    def gpu(self, rank: int) -> str:
        return f"gpu:{self._host[int(rank)]}/{self._gpu[int(rank)]}"

    def nic(self, rank: int) -> str:
        return f"nic:{self._host[int(rank)]}/{self._gpu[int(rank)]}"

    def leaf(self, rank: int) -> str:
        return f"switch:leaf-p{self._pod[int(rank)]}-r{self._gpu[int(rank)]}"

    def path(self, a: int, b: int) -> tuple[str, ...]:
        """Same devices, same order as :meth:`Topology.path` (shares :func:`route`), with
        array lookups instead of table rows."""
        return route(a, b, (self._host[a], self.nic(a), self.leaf(a)),
                     (self._host[b], self.nic(b), self.leaf(b)), self.topology.spines)

    def devices(self, members: Sequence[int]) -> frozenset[str]:
        """Network devices a ring over ``members`` crosses (cached per member tuple)."""
        key = tuple(int(m) for m in members)
        hit = self._ring.get(key)
        if hit is not None:
            return hit
        members = [m for m in key if m in self._host]
        out: set[str] = set()
        if len(members) == 2:
            out.update(self.path(members[0], members[1]))
        elif len(members) > 2:
            for i, a in enumerate(members):
                out.update(self.path(a, members[(i + 1) % len(members)]))
        result = frozenset(out)
        self._ring[key] = result
        return result

    def flows_by_device(self, flows: Iterable[str]) -> dict[str, frozenset[str]]:
        """Per network device (NIC, leaf-spine link, switch), the flows that cross it.

        ``flows`` are member lists as in the ``group_ranks`` column (``"0 8 16"``: a ring;
        two ranks: a send/recv pair or a two-member group). Devices crossed by exactly the same
        flows slow exactly the same operators when they fail: no operator log tells them apart.
        """
        out: dict[str, set[str]] = {}
        for text in dict.fromkeys(str(f) for f in flows):
            for d in self.devices(list(member_ranks(text))):
                out.setdefault(d, set()).add(text)
        return {d: frozenset(fl) for d, fl in out.items()}
