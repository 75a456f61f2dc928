"""``python -m holmes_ml.cli``: the ``holmes`` command, for environments without its script."""

from holmes_ml.cli import main

main()
