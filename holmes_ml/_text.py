"""Small text helpers shared by printed output and reports."""

from __future__ import annotations

from collections.abc import Iterable


def spans(values: Iterable[int]) -> str:
    """Sorted integers as runs: ``[3, 4, 5, 9]`` -> ``"3-5 9"``; ``"none"`` when empty.

    >>> spans([9, 3, 4, 5]), spans([])
    ('3-5 9', 'none')
    """
    vals = sorted(set(int(v) for v in values))
    if not vals:
        return "none"
    runs: list[str] = []
    first = last = vals[0]
    for v in vals[1:] + [None]:  # type: ignore[list-item]
        if v is not None and v == last + 1:
            last = v
            continue
        runs.append(str(first) if first == last else f"{first}-{last}")
        if v is not None:
            first = last = v
    return " ".join(runs)
