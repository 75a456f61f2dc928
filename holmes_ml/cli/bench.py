"""``holmes bench NAME``: run a benchmark and write its JSON result with the git commit."""

from __future__ import annotations

import importlib
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from holmes_ml.bench import BENCHMARKS
from holmes_ml.bench.record import write_result


def _run_one(name: str, quick: bool, out: Path, console: Console) -> None:
    module, _, func = BENCHMARKS[name].partition(":")
    result = getattr(importlib.import_module(module), func)(quick=quick)
    path = write_result(result, out)
    table = Table(title=f"holmes bench {name}" + (" --quick" if quick else ""))
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("goal")
    for key, value in result.figures.items():
        shown = f"{value:,.4g}" if isinstance(value, float) else str(value)
        table.add_row(key, shown, result.goals.get(key, ""))
    console.print(table)
    console.print(f"written {path}")


def register(app: typer.Typer) -> None:
    @app.command("bench")
    def bench(
        name: str = typer.Argument(
            ..., help=f"Which benchmark: {', '.join(BENCHMARKS)} or 'all'.", show_default=False
        ),
        quick: bool = typer.Option(
            False, "--quick", help="Small sizes that finish in a few minutes (what CI runs)."
        ),
        out: Path = typer.Option(
            Path("bench-results"), "--out", help="Directory for <name>.json results."
        ),
    ) -> None:
        """Measure speed, memory or accuracy; results go to OUT/NAME.json with the git commit,
        machine and library versions."""
        console = Console()
        names = list(BENCHMARKS) if name == "all" else [name]
        unknown = [n for n in names if n not in BENCHMARKS]
        if unknown:
            raise typer.BadParameter(
                f"unknown benchmark {unknown[0]!r}; expected one of {', '.join(BENCHMARKS)} or 'all'",
                param_hint="NAME",
            )
        for n in names:
            _run_one(n, quick, out, console)
