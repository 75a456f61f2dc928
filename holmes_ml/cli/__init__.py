"""The ``holmes`` command line: a thin shell over the library.

Each sub-module registers its commands with :func:`register`; the library never imports this
package.
"""

from __future__ import annotations

import functools
import importlib
import logging
import traceback
from collections.abc import Callable
from typing import Any

import typer

app = typer.Typer(
    name="holmes",
    help=(
        "Find which GPU, NIC, link or host silently slows a distributed training job, from "
        "communication-operator (CommOps) logs.\n\n"
        "Typical flow: `holmes simulate` a job with a fault (or collect real logs), "
        "`holmes localize` the logs, and read the ranked suspects. `holmes train` re-trains the "
        "detector on new traces; `holmes bench` measures speed and accuracy."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    # Docstrings are wrapped at the source's width; markdown mode re-flows each paragraph to
    # the terminal instead of keeping those line breaks.
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)

#: Modules that add commands, in the order they appear in --help.
COMMAND_MODULES: tuple[str, ...] = (
    "holmes_ml.cli.demo",
    "holmes_ml.cli.simulate",
    "holmes_ml.cli.train",
    "holmes_ml.cli.detect",
    "holmes_ml.cli.localize",
    "holmes_ml.cli.check",
    "holmes_ml.cli.drill",
    "holmes_ml.cli.serve",
    "holmes_ml.cli.jobs",
    "holmes_ml.cli.bench",
)


def _print_version(value: bool) -> None:
    if value:
        from holmes_ml import __version__

        typer.echo(f"holmes_ml {__version__}")
        raise typer.Exit()


#: Commands that run for long beside a job or as a service: malloc gives back what they free.
_LONG_RUNNING = ("agent", "serve")


@app.callback()
def _root(
    ctx: typer.Context,
    verbose: bool = typer.Option(
        False, "--verbose", "-v",
        help="Log progress details to stderr, and show the traceback behind an `error:` line. "
        "Goes before the command: `holmes -v localize ...`.",
    ),
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True,
        help="Print the holmes_ml version and exit.",
    ),
) -> None:
    _VERBOSE[0] = verbose
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if ctx.invoked_subcommand not in _LONG_RUNNING:
        from holmes_ml._malloc import keep_freed_memory

        keep_freed_memory()  # a batch command: freed arrays' memory is kept for the next ones


#: Whether ``-v`` was given (the root logger's level says so only when the CLI configured it).
_VERBOSE = [False]


def _input_errors() -> tuple[type[Exception], ...]:
    """Errors that mean the user's input is not what a command expects. Their messages
    already name the file, field and value and what was expected, so the user gets them in
    one line on stderr (exit status 2) instead of a traceback.

    ``ValueError`` is among them because every configuration class and estimator of the
    library validates its arguments with one (``SimConfig.faults[0].start_iteration: got 10;
    expected < iterations (10)``); a ValueError from a bug reads the same way, so ``-v`` shows
    the traceback behind any of these lines. Any other exception is a bug and keeps its
    traceback. (:class:`~holmes_ml.io.schema.SchemaError` and
    :class:`~holmes_ml.models.persist.ModelFileError` are ValueErrors: importing them here
    loaded the models package, 2.6 s, before every error line.)"""
    # OSError: a file that cannot be opened or written (a loop of links, a full disk)
    return (ValueError, OSError)


def _reporting_input_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(command)  # typer reads the parameters through __wrapped__
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except _input_errors() as exc:
            if _VERBOSE[0]:
                traceback.print_exc()
            typer.secho(f"error: {_one_line(exc)}", err=True, fg=typer.colors.RED)
            # 1: a service that did not answer or took none of it (holmes jobs: try again, as
            # holmes agent exits); 2: what the command was given
            raise typer.Exit(getattr(exc, "exit_code", 2)) from None
        except MemoryError:
            # e.g. a "CSV" of one line of gigabytes; no traceback helps, but where it was does
            if _VERBOSE[0]:
                traceback.print_exc()
            typer.secho("error: out of memory: the job or the input is larger than this "
                        "machine holds (an input of one line of gigabytes, say; -v shows where)",
                        err=True, fg=typer.colors.RED)
            raise typer.Exit(1) from None

    return run


def _one_line(exc: Exception) -> str:
    """The message of ``exc``; an OSError without a message of ours gets its file named."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(app)
for _info in app.registered_commands:
    if _info.callback is not None:
        _info.callback = _reporting_input_errors(_info.callback)


def main() -> None:
    """Console-script entry point.

    A usage error (an option value out of range or of the wrong type, an unknown option, a
    job layout that does not add up) is one ``error:`` line on stderr, exit status 2, like
    every other input error, instead of click's boxed usage text; the line says where the
    help is. Help asked for (or shown for no arguments) is unchanged.
    """
    import sys

    try:
        from typer._click import exceptions  # the click typer vendors (typer >= 0.26)
    except ImportError:  # pragma: no cover - an older typer on click itself
        from click import exceptions  # type: ignore[no-redef]

    try:
        code = app(standalone_mode=False)
    except exceptions.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError" or exc.ctx is None:
            exc.show()
            sys.exit(exc.exit_code)
        typer.secho(f"error: {exc.format_message()} (see '{exc.ctx.command_path} -h')",
                    err=True, fg=typer.colors.RED)
        sys.exit(2)
    except exceptions.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("Aborted!", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
