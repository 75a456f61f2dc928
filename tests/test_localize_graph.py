"""The operator-device graph: `holmes localize --graph` writes what the rules read as GraphML."""

from __future__ import annotations

import json

import networkx as nx
from typer.testing import CliRunner

from holmes_ml import pipeline
from holmes_ml.cli import app
from holmes_ml.io.schema import without_labels
from holmes_ml.localize.graph import evidence_graph
from holmes_ml.report import write_plots
from holmes_ml.simulator import FaultSpec, SimConfig, simulate

# the network test's 128-GPU layout (data-parallel rings cross spines); a slow leaf-spine link
LINK_JOB = SimConfig(gpus=128, model="llama2-7b", tp=2, pp=2, iterations=8, seed=22,
                     faults=(FaultSpec.parse("link_slow:severity=2,start=2"),))


def test_cli_writes_the_graph_of_a_slow_link(tmp_path):
    res = simulate(LINK_JOB)
    res.write(tmp_path / "job")
    out = tmp_path / "plots" / "graph.graphml"
    r = CliRunner().invoke(app, ["localize", str(tmp_path / "job"), "--model", "rule",
                                 "--graph", str(out), "--json"])
    assert r.exit_code == 0, r.output
    verdict = json.loads(r.output)
    g = nx.read_graphml(out)
    top = verdict["candidates"][0]
    assert top["kind"] == "link" and g.nodes[top["device"]]["suspect"] == 1
    # compressed by communicator: one node per communicator with abnormal copies, not per copy
    summary = pipeline.summarize(without_labels(res.ops), "rule")
    comms = [n for n, d in g.nodes(data=True) if d["kind"] == "communicator"]
    assert sorted(comms) == sorted(f"comm:{x}" for x in summary.abnormal["group"].astype(str)
                                   .unique())
    assert sum(d["abnormal_copies"] for n, d in g.nodes(data=True) if n in comms) == len(
        summary.abnormal)
    # the suspect link is crossed by slow communicators; each GPU and NIC hangs off its host
    assert any(g.edges[top["device"], n]["rel"] == "crosses" for n in g.neighbors(top["device"]))
    for n, d in g.nodes(data=True):
        if d["kind"] in ("gpu", "nic"):
            assert [m for m in g.neighbors(n) if g.nodes[m]["kind"] == "host"] == [
                "host:" + n.split(":", 1)[1].split("/", 1)[0]]


def test_a_healthy_job_has_no_suspect_in_its_graph(tmp_path):
    res = simulate(SimConfig(gpus=128, model="llama2-7b", tp=2, pp=2, iterations=8, seed=22))
    summary = pipeline.summarize(without_labels(res.ops), "rule")
    verdict = pipeline.localize_summaries([summary], res.topology)
    g = evidence_graph(summary, verdict, res.topology)
    assert verdict.candidates == ()
    assert all(d.get("suspect", 0) == 0 for _, d in g.nodes(data=True))
    assert g.graph["irregular"] == verdict.irregular
    written = write_plots(verdict, summary.iterations, tmp_path, g)
    assert tmp_path / "graph.png" in written and (tmp_path / "graph.png").stat().st_size > 1000
