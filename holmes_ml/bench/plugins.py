"""Plug-in point: benchmark your own localizer on the same scenarios as the built-in ones.

A localizer is any Python callable (a function, or an instance of a class with ``__call__``)::

    def my_localizer(ops: pandas.DataFrame, topology: holmes_ml.topology.Topology) -> list:
        ...

It receives a copy of the canonical CommOps table of one simulated job **without** the label
columns, and the job's topology, and returns a list (or any iterable; ``None``: no suspect) of
its suspects best first. Each suspect may be

* an integer (``int`` or a numpy integer) — a global rank (read as "the GPU of that rank"),
* a ``str`` device id — ``gpu:H/g``, ``nic:H/g``, ``host:H``, ``switch:...``, ``link:...``
  (see :mod:`holmes_ml.topology`),
* an object with ``ranks`` and ``device`` attributes (such as
  :class:`holmes_ml.localize.Candidate`), or a dict with those keys: scored as its device. Without
  a device it may hold one rank only: any set of ranks would share one with some fault.

A suspect outside the job (a rank beyond its world, a device it does not have), one of another
type, a pandas Series (iterated, it would give its values, not its labels) or a single suspect
instead of a list is that method's error, counted in the results.

The benchmark scores a suspect by the ranks it stands for (:func:`names_fault`): it hits when it
shares a rank with the faulty device (:func:`fault_ranks`: for a link or switch, the ranks
under it whose traffic crosses it) and stands for no more ranks than that device
(:func:`fault_breadth`): a host does not name one slow GPU of its own, nor a spine switch above
everyone a leaf's fault (the bench's ``device_top1`` asks for the device itself). A localizer
that raises is counted as that method's error too.

A localizer that also takes a ``delta`` keyword (``def loc(ops, topology, delta=1.1)``, or
``**kwargs``) is told each trial's irregularity factor: the bench runs its grid at several
(the built-in methods localize with ``LocalizeConfig(delta=...)`` of the trial), and a fault is
scored only where it made some iteration ``delta`` times slower.

A ranking always names someone, so on a healthy job a plug-in counts as having flagged it. A
localizer that returns an empty list when it sees nothing wrong says so with a true
``abstains`` attribute; its healthy jobs are then flagged only when it names a suspect.

Give it to the benchmark as ``module:attribute`` (the module must be importable, e.g. on
``PYTHONPATH``); a class is instantiated with no arguments::

    holmes bench localize --localizer mypkg.loc:my_localizer

and, first, tried in seconds on one small job per fault kind
(:func:`holmes_ml.bench.localize.try_localizer`, scored the same way).

Example
-------
>>> loc = load_localizer("holmes_ml.bench.plugins:example_longest_comm")
>>> loc.__name__
'example_longest_comm'
"""

from __future__ import annotations

import importlib
import inspect
import numbers
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from holmes_ml._text import shown
from holmes_ml.topology import Topology

Localizer = Callable[[pd.DataFrame, Topology], Sequence[Any]]


def load_localizer(spec: str) -> Localizer:
    """Import ``module:attribute`` and return a callable localizer.

    Raises
    ------
    ValueError
        When ``spec`` is not ``module:attribute``, cannot be imported, or is not callable.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--localizer {spec!r}: expected 'module:attribute', e.g. 'mypkg.loc:rank_it'")
    if module_name.endswith(".py") or "/" in module_name or module_name.startswith("."):
        raise ValueError(f"--localizer {spec!r}: {module_name!r} is a file path; expected an "
                         "importable module name (mymod:fn, with mymod.py's directory on "
                         "PYTHONPATH)")
    try:
        obj: Any = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        missing = isinstance(exc, ModuleNotFoundError) and exc.name is not None \
            and module_name.startswith(exc.name)
        hint = ("; a module of your own must be importable: put its directory on PYTHONPATH "
                "(PYTHONPATH=. holmes bench ...) or install it") if missing else ""
        raise ValueError(f"--localizer {spec!r}: cannot import it ({exc}){hint}") from exc
    except Exception as exc:  # noqa: BLE001 - the module's own code failed while importing
        raise ValueError(f"--localizer {spec!r}: importing {module_name} raised "
                         f"{type(exc).__name__}: {exc}") from exc
    if inspect.isclass(obj):
        try:
            obj = obj()
        except Exception as exc:  # noqa: BLE001 - whatever the class's __init__ raises
            raise ValueError(f"--localizer {spec!r}: a class is made with no arguments, and "
                             f"{attr}() raised {type(exc).__name__}: {exc}") from exc
    if not callable(obj):
        raise ValueError(f"--localizer {spec!r}: {type(obj).__name__} is not callable")
    try:  # checked now, not as a failure on every trial of a long run
        inspect.signature(obj).bind(None, None)
    except TypeError as exc:
        raise ValueError(f"--localizer {spec!r}: cannot be called as (ops, topology) ({exc}); "
                         "expected a callable taking the operator table and the topology"
                         ) from None
    except ValueError:  # no signature to read (some builtins): it is called as it is
        pass
    return obj


def takes_delta(localizer: Any) -> bool:
    """Does ``localizer`` accept a ``delta`` keyword (by name, or through ``**kwargs``)?

    >>> takes_delta(lambda ops, topology, delta=1.1: []), takes_delta(lambda ops, topology: [])
    (True, False)
    """
    try:
        params = inspect.signature(localizer).parameters.values()
    except (TypeError, ValueError):  # no signature to read: called as (ops, topology)
        return False
    return any(p.kind is p.VAR_KEYWORD or (p.name == "delta" and p.kind in (
        p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)) for p in params)


def call_localizer(localizer: Any, ops: pd.DataFrame, topology: Topology,
                   delta: float) -> list[Any]:
    """The suspects ``localizer`` names for one job, telling it ``delta`` when it takes it.

    It gets a copy of ``ops`` (a plug-in that changed the table would change what the next
    method reads). ``None`` is no suspect; one suspect, or a pandas object (whose values a
    list would take, not its labels), is refused with a TypeError saying what to return.
    """
    kwargs = {"delta": delta} if takes_delta(localizer) else {}
    got = localizer(ops.copy(), topology, **kwargs)
    if got is None:
        return []
    if isinstance(got, (pd.Series, pd.DataFrame, pd.Index)):
        raise TypeError(f"localizer returned a pandas {type(got).__name__}; expected a list of "
                        "suspects best first (e.g. series.index.tolist() for its labels)")
    if isinstance(got, (str, bytes, dict, numbers.Number)) or hasattr(got, "ranks"):
        raise TypeError(f"localizer returned one suspect ({type(got).__name__}); expected a "
                        "list of suspects best first")
    return list(got)


def suspect_ranks(suspect: Any, topology: Topology) -> frozenset[int]:
    """The global ranks a suspect stands for (a rank of any integer type, numpy's included; a
    device id; or a candidate)."""
    if isinstance(suspect, numbers.Integral) and not isinstance(suspect, (bool, np.bool_)):
        return frozenset([int(suspect)])
    device = suspect_device(suspect)
    if device is not None and (isinstance(suspect, str) or topology is not None):
        # a candidate stands for its device, whatever ranks it lists (without a topology, a
        # test's, for the ranks it lists)
        return frozenset(int(r) for r in topology.ranks_on(device))
    ranks = getattr(suspect, "ranks", None)
    if ranks is None and isinstance(suspect, dict):
        ranks = suspect.get("ranks")
    if ranks is None:
        raise TypeError(
            f"localizer returned a suspect of type {type(suspect).__name__} "
            f"({shown(suspect)!r}); expected an int rank, a device id string or an object "
            "with .ranks"
        )
    out = frozenset(int(r) for r in ranks)
    if len(out) > 1:
        # any set of ranks would name every fault it shares a rank with
        raise TypeError(f"localizer returned a suspect of {len(out)} ranks and no device; "
                        "expected one rank, or a device (a device id string, or .device "
                        "beside .ranks) that stands for several")
    return out


def suspect_device(suspect: Any) -> str | None:
    """The device id a suspect names (a device id string, or a candidate's ``device``), or
    ``None`` for a bare rank."""
    if isinstance(suspect, str):
        return suspect
    if isinstance(suspect, dict):
        device = suspect.get("device")
    elif hasattr(suspect, "ranks"):  # a candidate (numpy scalars have a .device too: "cpu")
        device = getattr(suspect, "device", None)
    else:
        device = None
    return str(device) if device else None


def names_fault(suspect: Any, truth: set[int] | frozenset[int], topology: Topology,
                widest: int | None = None) -> bool:
    """How the benchmark scores one suspect: does it name the fault whose device holds the
    ranks ``truth``? It must hold one of them (a device id stands for the ranks under it), and
    stand for at most ``widest`` ranks (:func:`fault_breadth`: no broader than the faulty
    device itself), so that naming a spine switch above everyone, or a whole host for one
    slow GPU, is no hit. ``widest=None`` sets no bound.

    Example
    -------
    >>> names_fault(5, {5}, topology=None), names_fault(6, {5}, topology=None)
    (True, False)
    """
    ranks = suspect_ranks(suspect, topology)
    return bool(ranks & truth) and (widest is None or len(ranks) <= widest)


def fault_ranks(ranks: Iterable[int], devices: Iterable[str], topology: Topology
                ) -> frozenset[int]:
    """The ranks a suspect must hold to name a fault whose simulator record lists ``ranks``
    (for a link or switch: every rank whose traffic crosses it) and ``devices``: for a slow
    GPU, NIC or host, its own; for a link or a switch, those of the crossing ranks that sit
    under it (a leaf-spine link, a leaf: the ranks below the leaf; a spine: all). A GPU on
    another leaf whose ring crosses a slow link names another device, not that link, just as
    a NIC carrying the same flows as a slow NIC does not name it (the bench's ``top1_ties``
    counts both apart)."""
    crossing = frozenset(int(r) for r in ranks)
    under = crossing
    for d in devices:
        if d.startswith(("link:", "switch:")):
            under = under & frozenset(int(r) for r in topology.ranks_on(d))
    return under or crossing


def fault_breadth(truth: set[int] | frozenset[int], devices: Sequence[str],
                  topology: Topology) -> int:
    """How many ranks a suspect naming the fault may stand for: those of its widest device
    (a slow GPU or NIC: its own; a host: its GPUs; a leaf switch or a leaf-spine link: the
    ranks below the leaf; a spine: everyone), or of ``truth`` when that is more."""
    sizes = [len(topology.ranks_on(d)) for d in devices]
    return max([len(truth), *sizes])


def example_longest_comm(ops: pd.DataFrame, topology: Topology) -> list[int]:
    """A tiny example plug-in: ranks ordered by total communication time, longest first."""
    total = ops.groupby("rank")["duration_us"].sum().sort_values(ascending=False)
    return [int(r) for r in total.index]
