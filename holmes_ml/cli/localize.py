"""``holmes localize PATH...``: name the device slowing a job (thin shell over the pipeline)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from holmes_ml.io import FORMATS


def register(app: typer.Typer) -> None:
    """Add ``localize`` to ``app``."""

    @app.command("localize")
    def localize(
        paths: list[Path] = typer.Argument(
            ..., help="Log files or a simulator output directory.", show_default=False
        ),
        model: Path | None = typer.Option(
            None, "--model", help="Detector file (default: the bundled model, or the rule "
            "baseline when none is installed). 'rule' forces the baseline."
        ),
        format: str = typer.Option(
            "auto", "--format",
            help="auto|" + "|".join(FORMATS),
        ),
        top_k: int = typer.Option(5, "--top-k", min=1, help="Candidates shown at most."),
        delta: float = typer.Option(
            1.1, "--delta", min=1.0001,
            help="Irregularity factor: an iteration this many times longer than its robust "
            "reference is analysed (below ~1.04 jitter swamps the signal).",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
        plot: Path | None = typer.Option(
            None, "--plot", help="Write PNG plots into this dir: iteration time with the "
            "irregular iterations, a rank x iteration heat map, the top suspect's evidence, and "
            "the slow communicators around the first suspects.",
        ),
        graph: Path | None = typer.Option(
            None, "--graph", help="Write the operator-device graph behind the verdict to this "
            "GraphML file (networkx; opens in Gephi or Cytoscape): a node per communicator with "
            "abnormal copies and per device it crosses, suspects marked with their place.",
        ),
        topology: Path | None = typer.Option(
            None, "--topology", help="topology.json (otherwise derived from the logs)."
        ),
    ) -> None:
        """Localize the GPU/NIC/link/switch/host (or workload cause) slowing the job."""
        from holmes_ml import pipeline
        from holmes_ml.localize import LocalizeConfig
        from holmes_ml.topology import Topology

        cfg = replace(LocalizeConfig(), top_k=top_k, delta=delta)
        mdl: object = None
        if model is not None:
            if str(model) == "rule":
                mdl = "rule"
            else:
                from holmes_ml.models import load_model  # type: ignore[attr-defined]

                mdl = load_model(model)
        topo = Topology.from_json(topology) if topology is not None else None
        files, topo = pipeline.resolve_paths(paths, topo)
        ops = pipeline.read_paths(files, format)
        summary = pipeline.summarize(ops, mdl, cfg)
        verdict = pipeline.localize_summaries([summary], topo, cfg)
        evidence = None
        if graph is not None or plot is not None:
            from holmes_ml.localize.graph import evidence_graph

            job_topo = topo if topo is not None else pipeline.topology_from_summary(summary)
            evidence = evidence_graph(summary, verdict, job_topo)
        if plot is not None:
            from holmes_ml.report import write_plots

            write_plots(verdict, summary.iterations, plot, evidence)
        if graph is not None:
            import networkx as nx

            graph.parent.mkdir(parents=True, exist_ok=True)
            nx.write_graphml(evidence, graph)
        if as_json:
            typer.echo(json.dumps(verdict.to_dict()))
            return
        console = Console()
        console.print(
            f"irregular iterations: {list(verdict.irregular_iterations) or 'none'}"
        )
        if not verdict.irregular and (verdict.candidates or verdict.workload_findings):
            n = int(verdict.stats.get("analysed_iterations", 0))
            console.print(
                f"no iteration is {delta}x slower than the ones before it; the suspects come "
                f"from the abnormal operators of the last {n} iteration(s) (a slowdown present "
                "since the log began, or smaller than delta, makes no iteration stand out)"
            )
        if not verdict.candidates:
            console.print("[green]no device blamed[/green]")
        else:
            table = Table(title="suspects (best first)")
            for col in ("#", "kind", "device", "ranks", "score", "coords", "top evidence"):
                table.add_column(col)
            for i, c in enumerate(verdict.candidates, 1):
                ev = c.evidence[0].detail if c.evidence else ""
                device = c.device + (f"\n(tied with {len(c.tied_with)})" if c.tied_with else "")
                table.add_row(str(i), c.kind.value, device, " ".join(map(str, c.ranks[:8])),
                              f"{c.score:.3f}", json.dumps(c.coords) if c.coords else "", ev)
            console.print(table)
            if any(c.tied_with for c in verdict.candidates):
                console.print("[yellow]tied[/yellow]: these devices carry the same slow flows and "
                              "the logs cannot tell them apart; check each (e.g. a bandwidth test "
                              "between their hosts)")
        for w in verdict.workload_findings:
            console.print(f"[yellow]workload ({w.kind})[/yellow]: {w.detail}")
