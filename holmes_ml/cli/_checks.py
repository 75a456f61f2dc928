"""Checks of the options the commands share, run before any work.

Each raises ``ValueError`` naming the option, the value and what was expected, which the CLI
prints as one ``error:`` line (exit status 2): a typo fails at once, not after minutes of
simulation or training.
"""

from __future__ import annotations

import math


def check_seed(seed: int) -> None:
    """``--seed`` must be a non-negative integer (numpy's generators refuse the others).

    >>> check_seed(-1)
    Traceback (most recent call last):
    ...
    ValueError: --seed -1: expected an integer >= 0
    """
    if seed < 0:
        raise ValueError(f"--seed {seed}: expected an integer >= 0")


def check_delta(delta: float) -> None:
    """``--delta`` must be a finite factor above 1 (a slow iteration is ``delta`` x longer).

    >>> check_delta(float("inf"))
    Traceback (most recent call last):
    ...
    ValueError: --delta inf: expected a finite factor > 1 (e.g. 1.1)
    """
    if not (math.isfinite(delta) and delta > 1.0):
        raise ValueError(f"--delta {delta:g}: expected a finite factor > 1 (e.g. 1.1)")

