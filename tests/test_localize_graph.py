"""The operator-device graph: `holmes localize --graph` writes what the rules read as GraphML."""

from __future__ import annotations

import json

import networkx as nx
import numpy as np
import pandas as pd
import pytest
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
    verdict = json.loads(r.stdout)  # (stderr says where the graph went)
    assert f"graph: {out} (GraphML)" in r.stderr
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


def _iterations(ranks: int, iters: int, seed: int) -> pd.DataFrame:
    """A NodeSummary-like iterations table: comm time ~1 s +- 2 % per rank and step."""
    rng = np.random.default_rng(seed)
    it, rk = np.meshgrid(np.arange(iters), np.arange(ranks), indexing="ij")
    comm = rng.normal(1e6, 2e4, size=it.shape)
    return pd.DataFrame({"iteration": it.ravel(), "rank": rk.ravel(),
                         "start_ns": it.ravel() * 2_000_000_000,
                         "end_ns": it.ravel() * 2_000_000_000 + 1_900_000_000,
                         "comm_us": comm.ravel()})


@pytest.mark.parametrize("seed", [0, 1])
def test_one_deviating_rank_stays_visible_in_a_heat_map_of_thousands(seed):
    from holmes_ml.report import rank_heat

    rng = np.random.default_rng(seed)
    fast, slow = (int(r) for r in rng.choice(8192, size=2, replace=False))
    table = _iterations(8192, 12, seed)
    late = table["iteration"] >= 6
    table.loc[late & (table["rank"] == fast), "comm_us"] *= 0.5  # a straggler waits less
    table.loc[late & (table["rank"] == slow), "comm_us"] *= 1.6  # its link's ranks wait more
    heat, starts = rank_heat(table, max_rows=256)
    assert heat.shape == (256, 12) and starts[0] == 0 and np.all(np.diff(starts) == 32)
    values = heat.to_numpy()
    row_fast, row_slow = fast // 32, slow // 32
    if row_fast != row_slow:
        assert np.allclose(values[row_fast, 6:], -1.0, atol=0.15)
        assert np.allclose(values[row_slow, 6:], np.log2(1.6), atol=0.15)
    others = np.delete(values, [row_fast, row_slow], axis=0)
    assert np.abs(others).max() < 0.2  # +-2 % noise: the extreme of 32 ranks stays small
    assert np.abs(values[row_fast, :6]).max() < 0.2  # before the fault, nothing stands out
    # few ranks: one row each, nothing grouped
    small, small_starts = rank_heat(table[table["rank"] < 100], max_rows=256)
    assert small.shape == (100, 12) and list(small_starts) == list(range(100))


def test_heat_map_ticks_fall_on_round_numbers():
    from holmes_ml.report import _round_ticks

    assert [int(v) for v in np.arange(256)[_round_ticks(np.arange(256), 12)]] == \
        list(range(0, 256, 50))
    it = np.arange(1000, 1040)
    assert list(it[_round_ticks(it, 8)]) == list(range(1000, 1040, 5))
    assert len(_round_ticks(np.array([7]), 8)) == 1
    assert len(_round_ticks(np.array([], dtype=int), 8)) == 0


# ----------------------------------------------------------------- what the plots draw


@pytest.mark.parametrize("seed", [0, 1])
def test_a_slow_flows_evidence_points_at_its_slowest_instance(seed):
    res = simulate(SimConfig(gpus=128, model="llama2-7b", iterations=16, seed=seed,
                             faults=(FaultSpec.parse("nic_slow:rank=9,severity=2,start=6"),)))
    summary = pipeline.summarize(without_labels(res.ops))
    verdict = pipeline.localize_summaries([summary], res.topology)
    comm = [e for c in verdict.candidates[:1] for e in c.evidence if e.rule == "communication"
            and e.op != "send/recv"]
    assert comm, verdict.to_dict()
    ab = summary.abnormal.assign(group=summary.abnormal["group"].astype(str))
    size = ab.groupby("group")["rank"].nunique()
    for e in comm:
        copies = ab[ab["group"] == e.group]
        # instances with every member's copy abnormal, by their median excess (the event weight)
        inst = copies.groupby(["iteration", "seq"]).agg(n=("rank", "nunique"),
                                                        excess=("excess_us", "median"))
        whole = inst[inst["n"] >= size[e.group]]
        assert whole["excess"].idxmax() == (e.iteration, e.seq)
        # the sentence says how many instances the bar adds up, and over which iterations
        first, last = (int(x) for x in e.detail.split("over iterations ")[1].split(" ")[0]
                       .split("-"))
        assert first <= e.iteration <= last
        assert f"in iteration {e.iteration}," in e.detail


def test_heat_map_scale_leaves_the_warm_up_out():
    from holmes_ml.report import heat_limit, rank_heat

    table = _iterations(64, 20, 0)
    table.loc[(table["iteration"] == 0) & (table["rank"] < 32), "comm_us"] *= 3.0  # warm-up
    late = (table["iteration"] >= 10) & (table["rank"] == 7)
    table.loc[late, "comm_us"] *= 1.5
    log_rel, _ = rank_heat(table)
    assert np.isclose(heat_limit(log_rel), np.log2(1.5), atol=0.05)
    # jitter of 2 % alone: the floor, so it stays pale
    assert np.isclose(heat_limit(rank_heat(_iterations(64, 20, 1))[0]), np.log2(1.25))
    # too few iterations to spare any: every one counts
    assert heat_limit(rank_heat(table[table["iteration"] < 5])[0]) > 1.0


def test_iteration_plot_breaks_at_gaps_and_draws_the_monitors_line():
    from holmes_ml.features.iterations import IrregularityConfig, detect_irregular
    from holmes_ml.report import iteration_line

    table = _iterations(4, 40, 0)
    table = table[(table["iteration"] < 12) | (table["iteration"] >= 30)]  # two stretches
    long = table["iteration"] == 33
    table.loc[long, "end_ns"] += 1_000_000_000
    line = iteration_line(table, delta=1.2)
    assert list(line.index) == list(range(12)) + list(range(30, 40))
    assert list(line["x"]) == list(range(12)) + list(range(13, 23))  # the gap: one step
    assert list(np.flatnonzero(line["gap_before"])) == [12]
    spans = pd.DataFrame({"duration_s": line["seconds"]})
    spans.index.name = "iteration"
    ref = detect_irregular(spans, IrregularityConfig(delta=1.2))
    has = np.arange(len(line)) >= IrregularityConfig().min_history
    assert np.allclose(line["threshold"][has], 1.2 * ref["reference_s"][has])
    # the monitor's warm-up flags nothing: no line there (it read as "irregular above")
    assert line["threshold"][~has].isna().all()
    assert line.loc[33, "seconds"] > line.loc[33, "threshold"]
    rest = line.drop(index=33)[has[line.index != 33]]
    assert (rest["seconds"] < rest["threshold"]).all()
    assert iteration_line(table[table["iteration"] == 5], delta=1.2)["threshold"].isna().all()


def test_a_host_suspects_graph_reaches_its_communicators_through_its_gpus(tmp_path):
    from holmes_ml.report import _touching

    res = simulate(SimConfig(gpus=64, model="llama2-7b", tp=2, pp=2, iterations=12, seed=3,
                             faults=(FaultSpec.parse("host_stall:rank=20,severity=0.2,start=5"),)))
    summary = pipeline.summarize(without_labels(res.ops))
    verdict = pipeline.localize_summaries([summary], res.topology)
    top = verdict.candidates[0]
    assert top.kind.value == "host", verdict.to_dict()
    g = evidence_graph(summary, verdict, res.topology)
    comms = _touching(g, top.device)
    assert comms and all(g.nodes[c]["kind"] == "communicator" for c in comms)
    assert not any(g.nodes[m]["kind"] == "communicator" for m in g.neighbors(top.device))
    # each is a communicator of one of the host's GPUs, and each GPU's are all there
    gpus = [m for m in g.neighbors(top.device) if g.nodes[m]["kind"] == "gpu"]
    assert gpus
    assert comms == {c for m in gpus for c in g.neighbors(m)
                     if g.nodes[c]["kind"] == "communicator"}
    assert "graph.png" in {p.name for p in write_plots(verdict, summary.iterations, tmp_path, g)}
