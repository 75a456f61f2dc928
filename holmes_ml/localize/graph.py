"""The operator-device graph behind a verdict, as a networkx graph to inspect or export.

The rules in :mod:`holmes_ml.localize.rules` work on tables, communicator by communicator. This
module draws what they read as one graph, compressed by communicator: a node per communicator with
abnormal copies in the window (not one per operator copy, so its size follows the communicators and
devices, not the iterations or the operators), a node per device (GPU, NIC, leaf-spine link, switch,
host), and edges from each communicator to the GPUs of its ranks and to every network device its
ring or send/recv pair crosses; GPUs and NICs hang off their hosts. The verdict's suspects carry
their place and score. ``holmes localize --graph FILE`` writes it as GraphML (Gephi, Cytoscape,
``networkx.read_graphml``).

Example
-------
>>> from holmes_ml import pipeline
>>> from holmes_ml.simulator import FaultSpec, SimConfig, simulate
>>> res = simulate(SimConfig(gpus=32, model="llama2-7b", iterations=8, seed=0,
...     faults=(FaultSpec.parse("gpu_slow:rank=5,severity=0.5"),)))
>>> summary = pipeline.summarize(res.ops, "rule")
>>> verdict = pipeline.localize_summaries([summary], res.topology)
>>> g = evidence_graph(summary, verdict, res.topology)
>>> top = verdict.candidates[0].device
>>> g.nodes[top]["suspect"], g.nodes[top]["kind"]
(1, 'gpu')
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import networkx as nx

from holmes_ml.localize.fabric import Fabric
from holmes_ml.localize.rules import parse_members
from holmes_ml.localize.types import DeviceKind, Verdict

if TYPE_CHECKING:
    from holmes_ml.pipeline import NodeSummary
    from holmes_ml.topology import Topology

__all__ = ["evidence_graph"]


def evidence_graph(summary: NodeSummary, verdict: Verdict, topology: Topology) -> nx.Graph:
    """Communicators with abnormal copies, the devices they cross, and the verdict's suspects.

    Parameters
    ----------
    summary:
        What the verdict was localized from (:func:`holmes_ml.pipeline.summarize`, or merged
        node summaries).
    verdict:
        The verdict of ``summary``.
    topology:
        Placement of the job's ranks.

    Returns
    -------
    networkx.Graph
        Communicator nodes ``comm:<group>`` (``kind="communicator"``, ``group_kind``,
        ``abnormal_copies``, ``iterations``, ``excess_us``) and device nodes named like the
        verdict's devices (``kind`` = gpu, nic, link, switch or host; ``suspect`` = place in the
        verdict, 1 = first, 0 = not a suspect; ``score``). Each edge says what it is
        (``rel``): ``member`` joins a communicator to the GPU of each of its ranks (its
        ``abnormal_copies``: that rank's abnormal copies in the communicator), ``crosses`` to
        each network device its ring or send/recv pair crosses, ``on`` a GPU or NIC to its
        host.
    """
    fabric = Fabric(topology)
    g = nx.Graph(irregular=bool(verdict.irregular),
                 irregular_iterations=" ".join(map(str, verdict.irregular_iterations)))
    ab = summary.abnormal
    if len(ab):
        groups = summary.groups.drop_duplicates("group")
        groups.index = groups["group"].astype(str)
        members = parse_members(groups["group_ranks"]).groupby("group")["rank"].apply(tuple)
        rows = ab.assign(group=ab["group"].astype(str))
        per_comm = rows.groupby("group").agg(
            abnormal_copies=("rank", "size"), iterations=("iteration", "nunique"),
            excess_us=("excess_us", "sum"))
        per_rank = rows.groupby(["group", "rank"]).size()
        ranks: set[int] = set()
        for name, row in per_comm.iterrows():
            node = f"comm:{name}"
            kind = groups["group_kind"].get(name, "") if "group_kind" in groups else ""
            g.add_node(node, kind="communicator", group_kind=str(kind),
                       abnormal_copies=int(row["abnormal_copies"]),
                       iterations=int(row["iterations"]), excess_us=float(row["excess_us"]))
            ring = tuple(r for r in members.get(name, ()) if fabric.known(r))
            for d in fabric.devices(ring):
                g.add_edge(node, d, rel="crosses", abnormal_copies=0)
            for r in ring:
                g.add_edge(node, fabric.gpu(r), rel="member",
                           abnormal_copies=int(per_rank.get((name, r), 0)))
            ranks.update(ring)
        for r in ranks:  # each GPU and NIC hangs off its host once
            host = f"host:{fabric.host(r)}"
            g.add_edge(fabric.gpu(r), host, rel="on", abnormal_copies=0)
            g.add_edge(fabric.nic(r), host, rel="on", abnormal_copies=0)
    for i, c in enumerate(verdict.candidates, 1):
        g.add_node(c.device, suspect=i, score=float(c.score))
    for node, data in g.nodes(data=True):
        if data.get("kind") != "communicator":
            data["kind"] = DeviceKind.of(node).value
            data.setdefault("suspect", 0)
            data.setdefault("score", 0.0)
    return g
