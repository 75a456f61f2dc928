"""``holmes localize PATH...``: name the device slowing a job (thin shell over the pipeline)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import typer
from rich.console import Console

from holmes_ml.cli._checks import (
    TRUST_PICKLE_HELP,
    check_delta,
    check_not_input,
    check_writable,
    config_overrides,
    format_help,
    format_option,
    iteration_range,
)
from holmes_ml.cli._verdict import print_verdict, slice_note
from holmes_ml.io._common import stage

#: The irregularity monitor's reference: the regular iterations before each one it judges
#: (``holmes_ml.features.IrregularityConfig.window``; not imported, --help needs no pandas).
_REFERENCE = 20


def register(app: typer.Typer) -> None:
    """Add ``localize`` to ``app``."""

    @app.command("localize")
    def localize(
        paths: list[Path] = typer.Argument(
            ..., help="Log files, directories of them, or a simulator output directory.",
            show_default=False
        ),
        model: Path | None = typer.Option(
            None, "--model", help="Detector file (default: the bundled model, or the rule "
            "baseline when none is installed). 'rule' forces the baseline."
        ),
        format: str = typer.Option(
            "auto", "--format",
            help=format_help(), callback=format_option,
        ),
        trust_pickle: bool = typer.Option(False, "--trust-pickle", help=TRUST_PICKLE_HELP),
        top_k: int = typer.Option(5, "--top-k", min=1, help="Candidates shown at most."),
        delta: float = typer.Option(
            1.1, "--delta",
            help="Irregularity factor (finite, > 1): an iteration this many times longer than "
            "its robust reference is analysed (below ~1.04 jitter swamps the signal).",
        ),
        iterations: str | None = typer.Option(
            None, "--iterations", metavar="A:B",
            help="Analyse only iterations A to B (both included; A: or :B leave a side "
            f"open, A:A is iteration A alone). Start A at least {_REFERENCE} iterations before "
            "the episode: the irregularity monitor judges each iteration against up to "
            f"{_REFERENCE} regular ones before it, so a slice that starts inside a slowdown "
            "shows no iteration as irregular (the verdict then says how to widen it). By "
            "default the 50 most recent iterations with abnormal operators are "
            "analysed, reaching back to the last irregular one when it is older; the "
            "verdict's note names irregular iterations left out, e.g. an earlier episode.",
        ),
        settings: list[str] = typer.Option(
            [], "--set", metavar="KEY=VALUE",
            help="Override one setting of the localizer (repeatable): any field of "
            "holmes_ml.localize.LocalizeConfig, whose docstring explains each, e.g. --set "
            "late_fraction=0.3 --set quiet_persistence=0 --set with_rule=false (delta and "
            "top_k: --delta and --top-k). An unknown key or a value out of range is an error "
            "naming it.",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
        plot: Path | None = typer.Option(
            None, "--plot", help="Write PNG plots into this dir: iteration time with the "
            "irregular iterations and the line they crossed, a rank x iteration heat map of communication time (the first "
            "suspects marked), the top suspect's evidence, "
            "the slow communicators around the first suspects, and - when the logs carry "
            "each step's compute time (step_compute_us), or a heavier stage was read off "
            "the time outside communication - a compute-time heat map.",
        ),
        graph: Path | None = typer.Option(
            None, "--graph", help="Write the operator-device graph behind the verdict to this "
            "GraphML file (networkx; opens in Gephi or Cytoscape): a node per communicator with "
            "abnormal copies and per device it crosses, suspects marked with their place.",
        ),
        topology: Path | None = typer.Option(
            None, "--topology", help="topology.json of the job (what `holmes simulate` writes; "
            "it places ranks on hosts, NICs and switches). Default: a topology.json beside the "
            "logs, else one derived from the logs, which can name GPUs, NICs and hosts but no "
            "link or switch."
        ),
    ) -> None:
        """Localize the GPU/NIC/link/switch/host (or workload cause) slowing the job.

        Reads the logs, scores every operator with the detector, and ranks the devices that
        explain the slow iterations. Examples:

        * `holmes localize sim/` — a `holmes simulate` output directory (its topology too);

        * `holmes localize traces/ --format kineto --json` — PyTorch profiler traces of every
        rank, the verdict as one JSON object;

        * `holmes localize trace-AR.parquet --plot plots/ --graph evidence.graphml`;

        * `holmes localize run/ --iterations 1200:1400` — one episode of a long log, from
        1220 on: the slice starts 20 regular iterations before it, the monitor's
        reference to judge it against.
        """
        # the options first, the heavy imports after: a refusal comes at once
        check_delta(delta)
        span = iteration_range(iterations) if iterations is not None else None
        inputs = [*paths, *([topology] if topology is not None else [])]
        if plot is not None:
            check_writable(plot, "--plot", directory=True)
            _check_plot_names(plot)
        if graph is not None:
            check_writable(graph, "--graph")
            check_not_input(graph, "--graph", inputs)
            from holmes_ml.report import PLOT_NAMES

            if plot is not None and graph.resolve() in {(plot / n).resolve()
                                                          for n in PLOT_NAMES}:
                raise ValueError(f"--graph {graph}: is one of the plots --plot writes "
                                 f"({', '.join(PLOT_NAMES)}); expected another file name, "
                                 "e.g. evidence.graphml")
        import numpy as np

        from holmes_ml import pipeline
        from holmes_ml.localize import LocalizeConfig
        from holmes_ml.topology import Topology

        overrides = config_overrides(settings, LocalizeConfig,
                                     own={"delta": "--delta", "top_k": "--top-k"})
        cfg = replace(LocalizeConfig(), **{"top_k": top_k, "delta": delta, **overrides})
        mdl: object = None
        if model is not None:
            if str(model) == "rule":
                mdl = "rule"
            else:
                from holmes_ml.models import load_model  # type: ignore[attr-defined]

                mdl = load_model(model)
        topo = Topology.from_json(topology) if topology is not None else None
        files, topo = pipeline.resolve_paths(paths, topo)
        ops = pipeline.read_paths(files, format, progress=sys.stderr.isatty(),
                                  trust_pickle=trust_pickle)
        held_before: list[int] = []
        if span is not None:
            if span[0] is not None:
                held = np.unique(ops["iteration"].to_numpy(dtype=np.int64))
                held_before = held[held < span[0]].tolist()
            ops = pipeline.only_iterations(ops, *span)
        tty = sys.stderr.isatty()
        with stage(f"scoring {len(ops):,} operators", show=tty):
            summary = pipeline.summarize(ops, mdl, cfg)
        with stage("localizing", show=tty):
            verdict = pipeline.note_input(pipeline.localize_summaries([summary], topo, cfg), ops)
        evidence = None
        if graph is not None or plot is not None:
            from holmes_ml.localize.graph import evidence_graph

            job_topo = topo if topo is not None else pipeline.topology_from_summary(summary)
            evidence = evidence_graph(summary, verdict, job_topo)
        if plot is not None:
            from holmes_ml.report import write_plots

            written = write_plots(verdict, summary.iterations, plot, evidence, cfg.delta)
            # on stderr: stdout may be the --json verdict
            typer.echo(f"plots: {', '.join(p.name for p in written)} in {plot}", err=True)
        if graph is not None:
            import networkx as nx

            graph.parent.mkdir(parents=True, exist_ok=True)
            nx.write_graphml(evidence, graph)
            typer.echo(f"graph: {graph} (GraphML)", err=True)
        body = verdict.to_dict()
        said = None
        if span is not None and span[0] is not None and iterations is not None:
            from holmes_ml.features import IrregularityConfig

            said = slice_note(body, iterations.strip(), span[0], span[1], held_before,
                              IrregularityConfig().window)
        if as_json:
            if said:
                body["note"] = f"{body['note']}; {said}" if body.get("note") else said
            typer.echo(json.dumps(body))
            return
        print_verdict(body, Console(), cfg.delta, notes=[said] if said else [])


def _check_plot_names(plot: Path) -> None:
    """Refuse a ``--plot`` directory holding, under one of the plots' names, what cannot be
    replaced (a directory, a file this user may not write)."""
    if not plot.is_dir():
        return  # created with nothing in it
    from holmes_ml.report import PLOT_NAMES

    expected = f"expected a directory where the plots ({', '.join(PLOT_NAMES)}) can be written"
    for name in PLOT_NAMES:
        target = plot / name
        if target.is_dir():
            raise ValueError(f"--plot {plot}: {target} is a directory; {expected}")
        if target.exists():
            try:
                check_writable(target, "--plot")
            except ValueError:
                raise ValueError(f"--plot {plot}: {target} is not writable; {expected}") from None
