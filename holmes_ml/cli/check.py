"""``holmes check PATH...``: what the logs hold and what localization can make of them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from holmes_ml.cli._checks import TRUST_PICKLE_HELP, format_help, format_option
from holmes_ml.io._common import stage


def register(app: typer.Typer) -> None:
    """Add ``holmes check`` to ``app``."""

    @app.command("check")
    def check(
        paths: list[Path] = typer.Argument(
            ..., help="Log files or directories, as for `holmes localize`.", show_default=False
        ),
        format: str = typer.Option("auto", "--format", help=format_help(),
                                   callback=format_option),
        trust_pickle: bool = typer.Option(False, "--trust-pickle", help=TRUST_PICKLE_HELP),
        topology: Path | None = typer.Option(
            None, "--topology", help="topology.json of the job (default: one beside the logs, "
            "as `holmes localize` finds it)."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Read and validate logs, then say what they hold and what localization can use.

        Runs no model: it checks a new log source (another logger, a profiler export, a
        sampled job) before agents are wired to it. Every rank, communicator, host and
        iteration is counted, and each thing the localization relies on gets a line: several
        ranks to compare, every rank the member lists name, communicator members, hosts, a
        topology with switches, enough iterations for the irregularity monitor, send/recv
        peers. Input that breaks the schema (a missing column, an unknown op, a rank on two
        hosts, files that contradict each other) is one `error:` line with exit status 2;
        otherwise the exit status is 0, whatever the checks say.

        Examples: `holmes check traces/ --format kineto`; `holmes check sim/ --json`.
        """
        from rich.console import Console
        from rich.table import Table

        from holmes_ml import pipeline
        from holmes_ml._text import spans
        from holmes_ml.io.inventory import inventory
        from holmes_ml.topology import Topology

        topo = Topology.from_json(topology) if topology is not None else None
        files, topo = pipeline.resolve_paths(paths, topo)
        ops = pipeline.read_paths(files, format, progress=sys.stderr.isatty(),
                                  trust_pickle=trust_pickle, warn=False)  # (a check below)
        if topo is not None:
            pipeline.check_topology(topo, ops)  # one localize would refuse is no help here
        with stage(f"taking stock of {len(ops):,} operators", show=sys.stderr.isatty()):
            report = inventory(ops, topo)
        if as_json:
            typer.echo(json.dumps(report))
            return
        console = Console()
        median = report["median_iteration_s"]
        console.print(
            f"read {report['ops']:,} ops of {report['ranks']:,} rank(s) "
            f"({spans(report['rank_list'])}) over {report['iterations']:,} iteration(s) "
            f"({spans(report['iteration_list'])}"
            + (f"; median {median:.4g} s each, irregular ones included)" if median is not None
               else ")"))
        kinds = ", ".join(f"{k} {n}" for k, n in report["communicators_by_kind"].items())
        console.print(f"{report['communicators']:,} communicator(s): {kinds}")
        console.print("ops: " + ", ".join(f"{k} {n:,}" for k, n in report["op_types"].items()))
        if report["coordinates"]:
            console.print("parallel coordinates: " + ", ".join(report["coordinates"]))
        if report.get("compute_times"):
            console.print("compute time per step and rank: logged (a pipeline stage heavier "
                          "than the others can be named as a workload cause)")
        elif {"send", "recv"} & set(report["op_types"]):
            console.print("compute time per step and rank: not logged; read as each rank's "
                          "time outside communication (a pipeline stage heavier than the "
                          "others can still be named as a workload cause)")
        table = Table(title="what localization can use")
        table.add_column("", no_wrap=True)
        table.add_column("check", overflow="fold")
        for c in report["checks"]:
            table.add_row("[green]ok[/green]" if c["ok"] else "[yellow]--[/yellow]", c["what"])
        console.print(table)
