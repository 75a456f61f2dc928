"""Checks of the options the commands share, run before any work.

Each raises ``ValueError`` naming the option, the value and what was expected, which the CLI
prints as one ``error:`` line (exit status 2): a typo fails at once, not after minutes of
simulation or training.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import re
import typing
from pathlib import Path
from typing import Any


def format_help(what: str = "Log format") -> str:
    """``--format`` of the commands that read logs: the choices as words a narrow terminal
    can wrap (one ``auto|native|...`` token is cut short at 80 columns)."""
    from holmes_ml.io import FORMATS

    return (f"{what}: auto (told from each file's content), " + ", ".join(FORMATS[:-1])
            + f" or {FORMATS[-1]}.")


def format_option(value: str) -> str:
    """``--format``'s callback: an unknown format is refused by the option parser, before any
    work, in its words (``Invalid value for '--format': ...``)."""
    import typer

    from holmes_ml.io import FORMATS

    if value != "auto" and value not in FORMATS:
        raise typer.BadParameter(f"{value!r}; expected auto, " + ", ".join(FORMATS[:-1])
                                 + f" or {FORMATS[-1]}")
    return value


#: ``--trust-pickle`` of the commands that read logs
TRUST_PICKLE_HELP = (
    "Read Flight Recorder dumps that torch pickled (its default before JSON dumps). "
    "Unpickling runs code stored in the file: only for dumps you produced yourself; without "
    "this, such a dump is refused naming it."
)


def as_options(message: str, fields: dict[str, str]) -> str:
    """``message`` of a configuration class with its field names (``SimConfig.gpus: ...``,
    ``compute_s=-1: ...``) replaced by the options the user typed (``--gpus``,
    ``--compute-s -1``): ``fields`` maps field to option."""
    for field_name, option in fields.items():
        m = re.match(rf"(\w+Config\.)?{field_name}(=|: )", message)
        if m is not None:
            said = f"{option} " if m.group(2) == "=" else f"{option}: "
            # "None" is the Python spelling of leaving an option out
            rest = re.sub(r" or None\b", " (or leave the option out)", message[m.end():])
            return said + rest
    return message


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


def iteration_range(text: str) -> tuple[int | None, int | None]:
    """``--iterations A:B`` as its first and last iteration, both included; either side may
    be left open (``A:``, ``:B``), and ``A:A`` is one iteration. A lone number is refused: it
    reads as one iteration as well as a count of the last ones, or a first one.

    >>> iteration_range("20:40"), iteration_range("41:"), iteration_range("7:7")
    ((20, 40), (41, None), (7, 7))
    >>> iteration_range("40:20")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --iterations 40:20: expected A:B with 0 <= A <= B (both included; ...)
    >>> iteration_range("7")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --iterations 7: one number, ...; expected A:B (both included), e.g. 7: for ...
    """
    expected = ("expected A:B with 0 <= A <= B (both included; A: or :B leave a side open, A:A "
                "is iteration A alone)")
    first, colon, last = text.strip().partition(":")
    try:
        a = int(first) if first.strip() else None
        b = int(last) if last.strip() else None
    except ValueError:
        raise ValueError(f"--iterations {text}: {expected}") from None
    if not colon and a is not None and a >= 0:
        raise ValueError(f"--iterations {text}: one number, which could mean iteration {a} "
                         f"alone, the last {a} or those from {a} on; expected A:B (both "
                         f"included), e.g. {a}: for iteration {a} onwards or {a}:{a} for it "
                         "alone")
    if (a is None and b is None) or any(v is not None and v < 0 for v in (a, b)) or (
            a is not None and b is not None and a > b):
        raise ValueError(f"--iterations {text}: {expected}")
    return a, b


def check_writable(path: Path, option: str, *, directory: bool = False) -> None:
    """Refuse an output ``path`` that cannot be written once the work is done.

    Missing parent directories are fine (the commands create them); the nearest one that
    exists must be a writable directory. A file output must not be an existing directory, a
    directory output not an existing file.

    Writable is tried, not read off the mode: root passes every ``os.access`` test, yet /proc
    (or a full or foreign filesystem) refuses the file at the end of the work. A probe entry is
    created and removed in the directory written into (a directory where missing ones would be
    created there), and an existing output file is opened for writing, unchanged:
    ``--out /proc/x.parquet`` is refused as ``directory /proc is not writable (No such file or
    directory)``.
    """
    if directory:
        if path.exists() and not path.is_dir():
            raise ValueError(f"{option} {path}: exists and is not a directory; expected a "
                             "directory (created when missing)")
    elif path.is_dir():
        raise ValueError(f"{option} {path}: is a directory; expected a file name, e.g. "
                         f"{path / 'NAME'}")
    elif path.exists() and not _opens_for_writing(path):
        raise ValueError(f"{option} {path}: the file is not writable; expected a file this "
                         "user may replace")
    # ``exists()`` is False under a file too (/dev/null/x): walk up to what is there.
    there = path if directory and path.is_dir() else path.parent
    while not there.exists() and there != there.parent:
        there = there.parent
    if not there.is_dir():
        raise ValueError(f"{option} {path}: {there} is not a directory; expected a path in a "
                         "writable directory")
    if not os.access(there, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path}: directory {there} is not writable; expected a path "
                         "in a writable directory")
    # what is created there: the output file itself, or the first missing directory
    made_dir = there != (path if directory else path.parent)
    refused = _refuses_new_entries(there, made_dir)
    if refused:
        raise ValueError(f"{option} {path}: directory {there} is not writable ({refused}); "
                         "expected a path in a writable directory")


def _refuses_new_entries(directory: Path, make_dir: bool) -> str | None:
    """Why ``directory`` takes no new file (or, ``make_dir``, subdirectory): ``None`` when a
    probe entry could be created there (it is removed at once)."""
    import tempfile

    try:
        if make_dir:
            os.rmdir(tempfile.mkdtemp(prefix=".holmes-check-", dir=directory))
        else:
            fd, name = tempfile.mkstemp(prefix=".holmes-check-", dir=directory)
            os.close(fd)
            os.unlink(name)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _opens_for_writing(path: Path) -> bool:
    """Whether the existing file ``path`` opens for writing (appending: its content is left
    as it is). Only a regular file is opened (a FIFO would block); others are judged by their
    mode."""
    if not path.is_file():
        return os.access(path, os.W_OK)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
    except OSError:
        return False
    return True


def check_not_input(path: Path, option: str, inputs: list[Path] | list[str]) -> None:
    """Refuse an output ``path`` that would replace one of the inputs: a file given as input,
    or a file that exists inside an input directory (the logs read from it).

    >>> check_not_input(Path(__file__), "--out", [Path(__file__).parent])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --out ...: would replace a file read from the input ...
    """
    target = path.resolve()
    for given in map(Path, inputs):
        where = given.resolve()
        if target == where or (where.is_dir() and target.is_file()
                               and target.is_relative_to(where)):
            raise ValueError(f"{option} {path}: would replace a file read from the input "
                             f"{given}; expected a path outside the inputs")


def config_overrides(items: list[str], config: type, option: str = "--set",
                     own: dict[str, str] | None = None) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as keyword arguments of the dataclass ``config``.

    Each key must be one of its fields, except those in ``own`` (a field: the command's own
    option for it, which is then asked for instead); the value is read as the field's type (an int, a number,
    ``true``/``false``, or ``none`` where the field may be unset). The dataclass's own checks
    of the values run when it is built.

    >>> from holmes_ml.localize import LocalizeConfig
    >>> config_overrides(["late_fraction=0.3", "with_rule=false"], LocalizeConfig)
    {'late_fraction': 0.3, 'with_rule': False}
    >>> config_overrides(["late_fraction=half"], LocalizeConfig)
    Traceback (most recent call last):
    ...
    ValueError: --set late_fraction=half: expected a finite number
    """
    hints = typing.get_type_hints(config)
    own = own or {}
    fields = {f.name for f in dataclasses.fields(config)} - set(own)
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or not key:
            raise ValueError(f"{option} {item!r}: expected KEY=VALUE, e.g. late_fraction=0.3")
        if key in own:  # two places for one setting: say which one counts
            raise ValueError(f"{option} {key}: has its own option; expected {own[key]} {text} "
                             "instead")
        if key not in fields:
            raise ValueError(f"{option} {item}: no setting {key!r}; expected one of "
                             f"{', '.join(sorted(fields))}")
        args = typing.get_args(hints[key])
        optional = type(None) in args
        kind = next(a for a in args if a is not type(None)) if optional else hints[key]
        expected = {bool: "true or false", int: "an integer"}.get(kind, "a finite number")
        try:
            if optional and text.lower() == "none":
                out[key] = None
            elif kind is bool:
                out[key] = {"true": True, "yes": True, "1": True,
                            "false": False, "no": False, "0": False}[text.lower()]
            elif kind is int:
                out[key] = int(text)
            else:
                out[key] = float(text)
                if not math.isfinite(out[key]):
                    raise ValueError
        except (KeyError, ValueError):
            raise ValueError(f"{option} {item}: expected {expected}"
                             + (" or none" if optional else "")) from None
    return out


#: Spellings of an ``abnormal`` label, compared in lower case.
TRUE_LABELS, FALSE_LABELS = ("true", "1"), ("false", "0")


def _label_text(value: object) -> str:
    import numpy as np

    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, numbers.Real) and value in (0, 1):
        return "1" if value == 1 else "0"  # 1.0 from a column with gaps reads as 1
    return str(value).strip().lower()


def op_named(row: Any) -> str:
    """One operator of a CommOps table (a row) as a message names it: its rank, iteration,
    op, seq and communicator; what a row number cannot do once a reader reordered rows."""
    return (f"rank {row['rank']}, iteration {row['iteration']}, {row['op']} seq {row['seq']} "
            f"in {row['group']!r}")


def bad_labels(labels: Any) -> tuple[Any, Any]:
    """``(y, bad)`` for a Series of ``abnormal`` labels: the labels as booleans and where they
    are not true/false/1/0 (a gap included), both numpy arrays."""
    import numpy as np
    import pandas as pd

    if pd.api.types.is_bool_dtype(labels) and not labels.isna().any():
        y = labels.to_numpy(dtype=bool)
        return y, np.zeros(len(y), dtype=bool)
    if pd.api.types.is_numeric_dtype(labels):
        v = labels.to_numpy(dtype=np.float64, na_value=np.nan)
        return v == 1, ~((v == 0) | (v == 1))
    try:  # each distinct value spelled once (a column of millions holds a handful of them)
        spelled: Any = {v: _label_text(v) for v in pd.unique(labels.dropna())}
    except TypeError:  # unhashable values (a JSON list): spelled one by one
        spelled = _label_text
    text = labels.map(spelled, na_action="ignore").to_numpy(dtype=object)
    y = np.isin(text, TRUE_LABELS)
    return y, ~(y | np.isin(text, FALSE_LABELS))
