"""The ``holmes`` command line: a thin shell over the library.

Each sub-module registers its commands with :func:`register`; the library never imports this
package.
"""

from __future__ import annotations

import importlib
import logging

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
)

#: Modules that add commands, in the order they appear in --help.
COMMAND_MODULES: tuple[str, ...] = (
    "holmes_ml.cli.demo",
    "holmes_ml.cli.simulate",
    "holmes_ml.cli.train",
    "holmes_ml.cli.detect",
    "holmes_ml.cli.localize",
    "holmes_ml.cli.drill",
    "holmes_ml.cli.serve",
    "holmes_ml.cli.bench",
)


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress details to stderr."),
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )


for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(app)


def main() -> None:
    """Console-script entry point."""
    app()
