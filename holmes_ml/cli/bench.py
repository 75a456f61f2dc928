"""``holmes bench NAME``: run a benchmark and write its JSON result with the git commit."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from holmes_ml.bench import BENCHMARKS
from holmes_ml.bench.plugins import load_localizer
from holmes_ml.bench.record import git_commit, write_result
from holmes_ml.cli._checks import check_writable


def _runner(name: str) -> Callable[..., Any]:
    """Benchmark ``name``'s run function."""
    module, _, func = BENCHMARKS[name].partition(":")
    return getattr(importlib.import_module(module), func)


def _accepts(name: str, param: str) -> bool:
    """Whether benchmark ``name``'s run function takes the keyword ``param``."""
    return param in inspect.signature(_runner(name)).parameters


def _run_one(
    name: str, quick: bool, out: Path, console: Console, localizers: dict, model: object = None,
    awake: bool = False, log_format: str | None = None, methods: tuple[str, ...] = (),
) -> str:
    run = _runner(name)
    kwargs: dict = {"quick": quick}
    params = inspect.signature(run).parameters
    if "out_dir" in params:
        kwargs["out_dir"] = out
    if localizers and "localizers" in params:
        kwargs["localizers"] = localizers
    if model is not None and "model" in params:
        kwargs["model"] = model
    if awake and "keep_cores_awake" in params:
        kwargs["keep_cores_awake"] = True
    if log_format is not None and "fmt" in params:
        kwargs["fmt"] = log_format
    if methods and "methods" in params:
        kwargs["methods"] = methods
    commit = git_commit()  # of the start: a commit made while it runs is not what it measured
    result = run(**kwargs)
    path = write_result(result, out, commit)
    table = Table(title=f"holmes bench {name}" + (" --quick" if quick else ""))
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("goal")
    for key, value in result.figures.items():
        shown = f"{value:,.4g}" if isinstance(value, float) else str(value)
        table.add_row(key, shown, result.goals.get(key, ""))
    console.print(table)
    console.print(f"written {path} and {path.with_suffix('.md')}")
    return path.with_suffix(".md").name


def register(app: typer.Typer) -> None:
    @app.command("bench")
    def bench(
        name: str = typer.Argument(
            ..., help=f"Which benchmark: {', '.join(BENCHMARKS)} or 'all'.", show_default=False
        ),
        quick: bool = typer.Option(
            False, "--quick", help="Small sizes: about 5 minutes per benchmark on 2 cores "
            "(localize, detector), less for the others."
        ),
        out: Path = typer.Option(
            Path("bench-results"), "--out", help="Directory for NAME.json, NAME.md, the PNG plots of the benchmarks that draw them and (localize) every trial as localize-trials.csv.gz."
        ),
        localizer: list[str] = typer.Option(
            [],
            "--localizer",
            help="Your own localizer, as module:callable, benchmarked beside the built-in ones on "
            "the same scenarios: called as f(ops, topology) (and delta=..., if it takes it), "
            "it returns suspects best first (ranks, device ids like nic:node003/5, or "
            "candidates); see holmes_ml/bench/plugins.py. Repeatable.",
        ),
        model: Path = typer.Option(
            None, "--model", exists=True, dir_okay=False,
            help="A model envelope (holmes train --out) to time instead of the bundled default "
            "(benchmarks that score operators: features).",
        ),
        keep_cores_awake: bool = typer.Option(
            False, "--keep-cores-awake",
            help="logger: run a lowest-priority spinning process beside the measurement, as the "
            "busy cores of a training job would be. On an otherwise idle machine every gloo "
            "call hands over to a sleeping core, whose wake-up inflates the op and the "
            "logger's share alike; the JSON records the condition.",
        ),
        log_format: str = typer.Option(
            None, "--log-format",
            help="logger: the file format the logger writes while measured: arrow (the "
            "default a user gets: an Arrow IPC stream, readable while written), parquet or "
            "jsonl. The JSON records it.",
        ),
        method: list[str] = typer.Option(
            [], "--method",
            help="detector: score only this method beside the shipped one (lgbm, always run: "
            "the per-run table and the kind grid are of it), e.g. --method rf to compare the "
            "forest without the hour of every baseline. Repeatable; default every method: "
            "lgbm, lgbm-absolute, lgbm-small, rf, tuned-lgbm, 3sigma, knn, svm, iforest.",
        ),
    ) -> None:
        """Measure speed, memory or accuracy.

        Each benchmark writes OUT/NAME.json (every figure, the config, git commit, machine and
        library versions), OUT/NAME.md (tables) and, for the benchmarks that draw them, PNG
        plots; `all` also writes OUT/index.md.

        Examples: `holmes bench simulator`, `holmes bench all --quick --out /tmp/b`,
        `holmes bench localize --localizer mypkg.loc:my_localizer`,
        `holmes bench detector --method knn` (the shipped detector and KNN only).
        """
        console = Console()
        try:
            plugins = {spec: load_localizer(spec) for spec in localizer}
        except ValueError as exc:
            # the option is named by the parser's own "Invalid value for --localizer: "
            raise typer.BadParameter(str(exc).removeprefix("--localizer "),
                                     param_hint="--localizer") from exc
        detector = None
        if model is not None:
            from holmes_ml.models import ModelFileError, load_model

            try:
                detector = load_model(model)
            except ModelFileError as exc:
                raise typer.BadParameter(str(exc), param_hint="--model") from exc
        names = list(BENCHMARKS) if name == "all" else [name]
        unknown = [n for n in names if n not in BENCHMARKS]
        if unknown:
            raise typer.BadParameter(
                f"unknown benchmark {unknown[0]!r}; expected one of {', '.join(BENCHMARKS)} or 'all'",
                param_hint="NAME",
            )
        for given, option, param in ((localizer, "--localizer", "localizers"),
                                     (model is not None, "--model", "model"),
                                     (keep_cores_awake, "--keep-cores-awake",
                                      "keep_cores_awake"),
                                     (log_format is not None, "--log-format", "fmt"),
                                     (method, "--method", "methods")):
            if not given:
                continue
            users = [n for n in BENCHMARKS if _accepts(n, param)]
            if not any(n in users for n in names):
                # it would be ignored without a word, and the figures read as if it was used
                raise typer.BadParameter(f"{option} does not apply to bench {name}; it applies "
                                         f"to {', '.join(users)}", param_hint=option)
        from holmes_ml.collect.writer import FORMATS as LOG_FORMATS

        if log_format is not None and log_format not in LOG_FORMATS:
            raise typer.BadParameter(f"{log_format!r} is not a log format; expected one of "
                                     f"{', '.join(LOG_FORMATS)}", param_hint="--log-format")
        if method:
            from holmes_ml.bench.detector import choose_methods

            try:
                choose_methods(tuple(method))
            except ValueError as exc:
                raise typer.BadParameter(str(exc).removeprefix("--method "),
                                         param_hint="--method") from exc
        check_writable(out, "--out", directory=True)
        out.mkdir(parents=True, exist_ok=True)  # now: not after an hour of work
        reports = [_run_one(n, quick, out, console, plugins, detector, keep_cores_awake,
                            log_format, tuple(method)) for n in names]
        if name == "all":
            index = out / "index.md"
            index.write_text(
                "# holmes bench all" + (" --quick" if quick else "") + "\n\n"
                + "\n".join(f"- [{r[:-3]}]({r})" for r in reports) + "\n"
            )
            console.print(f"written {index}")
