"""Print a verdict as the ``holmes`` commands show it, from its JSON contract
(:meth:`holmes_ml.localize.Verdict.to_dict`, also what ``holmes serve`` answers), so that a
verdict computed here and one fetched from the service read the same."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from holmes_ml._text import spans


def print_verdict(body: dict[str, Any], console: Console, delta: float | None = None,
                  notes: Sequence[str] = ()) -> None:
    """Irregular iterations, what the verdict was computed from, its note, the suspects table
    (with ties spelled out) and the workload findings. ``delta``: the irregularity factor the
    verdict used, added to a note that mentions it; ``notes``: more caveats, a line each after
    the verdict's own (what the command knows and the verdict does not, e.g.
    :func:`slice_note`)."""
    console.print(irregular_line(body))
    read = body.get("input")
    if read:
        usual = read.get("usual_iteration_s")
        console.print(f"read {read['ops']:,} ops of {read['ranks']:,} rank(s) over "
                      f"{read['iterations']:,} iteration(s)"
                      + (f" (usually {usual:.4g} s each)" if usual else ""))
    note = body.get("note")
    if note:
        said = f" (delta = {delta})" if delta is not None and "delta" in note else ""
        console.print(f"[yellow]note[/yellow]: {escape(note)}{said}")
    for more in notes:
        console.print(f"[yellow]note[/yellow]: {escape(more)}")
    candidates = body.get("candidates") or []
    if not candidates:
        console.print("[green]no device blamed[/green]")
    else:
        _suspects(candidates, console)
    workload = body.get("workload")
    for w in [workload, *workload.get("others", [])] if isinstance(workload, dict) else []:
        console.print(f"[yellow]workload ({w['kind']})[/yellow]: {escape(w['detail'])}")


def slice_note(body: dict[str, Any], given: str, first: int, last: int | None,
               held_before: Sequence[int], window: int) -> str | None:
    """What to say of an ``--iterations {given}`` slice (``first`` to ``last``, ``None``: open)
    whose verdict (``body``) has no irregular iteration although the logs hold the iterations
    ``held_before`` (ascending) before ``first``: the irregularity monitor judges each iteration
    against up to ``window`` regular ones before it, and the slice starts with none, so a
    slowdown already under way at ``first`` shows no irregular iteration. ``None`` otherwise.

    >>> slice_note({"irregular_iterations": []}, "32:39", 32, 39, range(32), 20)
    ... # doctest: +ELLIPSIS
    '--iterations 32:39 leaves out the 32 iteration(s) ... (holmes localize --iterations 12:39)'
    >>> slice_note({"irregular_iterations": [33]}, "32:39", 32, 39, range(32), 20) is None
    True
    """
    if body.get("irregular_iterations") or not held_before:
        return None
    since = list(held_before)[-window:][0]
    return (f"--iterations {given} leaves out the {len(held_before):,} iteration(s) the logs "
            f"hold before {first}, and the irregularity monitor judges each iteration against "
            f"up to {window} regular ones before it: the slice has no regular iterations before "
            f"it to judge against, so a slowdown already under way at {first} shows no "
            f"iteration as irregular; widen it to start {window} iterations before the episode "
            f"(holmes localize --iterations {since}:{'' if last is None else last})")


def irregular_line(body: dict[str, Any]) -> str:
    """``irregular iterations: 11-29 (the slowest 1.34x the usual time)`` from a verdict's
    JSON."""
    line = f"irregular iterations: {spans(body.get('irregular_iterations') or ())}"
    slowdown = body.get("slowdown")
    return line + (f" (the slowest {slowdown:.3g}x the usual time)" if slowdown else "")


def _suspects(candidates: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="suspects (best first)")
    # Device ids are long (link:leaf-p0-r2~spine-2): keep them whole on their line and let the
    # evidence wrap instead.
    for col in ("#", "kind", "device", "ranks", "score", "top evidence"):
        table.add_column(col, no_wrap=col == "device",
                         overflow="ellipsis" if col == "device" else "fold")
    for i, c in enumerate(candidates, 1):
        evidence = c.get("evidence") or []
        device = str(c.get("device") or "")
        if c.get("coords"):  # the rank's place in the parallel layout, under its device
            device += "\n" + " ".join(f"{k}{v}" for k, v in c["coords"].items())
        if c.get("tied_with"):
            n = len(c["tied_with"])
            device += f"\n(tied with {n} other{'s' * (n != 1)})"
        table.add_row(str(i), c["kind"], escape(device), _ranks(c.get("ranks") or []),
                      f"{c['score']:.3f}", escape(evidence[0]["detail"]) if evidence else "")
    console.print(table)
    tied = [c for c in candidates if c.get("tied_with")]
    for c in tied:
        if c["kind"] == "gpu":  # a GPU tied with its host (LocalizeConfig.kind_min_ops)
            rank = _ranks(c.get("ranks") or [])
            console.print(f"[yellow]tied[/yellow]: {escape(c['device'])} and "
                          f"{escape(', '.join(c['tied_with']))} (a pause of rank {rank}'s host "
                          f"process): rank {rank} meets its peers too rarely in a step for the "
                          "logs to tell a slow GPU (late a little at each operator) from a "
                          "host pause (late all at once); check both")
    network = [c for c in tied if c["kind"] != "gpu"]
    if not network:
        return
    console.print("[yellow]tied[/yellow]: these devices carry the same slow flows and the logs "
                  "cannot tell them apart; check each (e.g. a bandwidth test between their "
                  "hosts)")
    seen: set[frozenset[str]] = set()
    for c in network:
        names = [c["device"], *c["tied_with"]]
        if frozenset(names) not in seen:
            seen.add(frozenset(names))
            console.print(f"  {len(names)} tied: " + escape(", ".join(names[:8]))
                          + (f" (+{len(names) - 8})" if len(names) > 8 else ""))


def _ranks(ranks: list[int], shown: int = 8) -> str:
    text = " ".join(map(str, ranks[:shown]))
    return text + (f" (+{len(ranks) - shown})" if len(ranks) > shown else "")
