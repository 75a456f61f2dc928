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


def duration(us: float) -> str:
    """Microseconds in the unit a reader takes in at a glance, about three digits shown.

    >>> duration(420.4), duration(4_210.0), duration(886_273.0), duration(1_912_000.0)
    ('420 us', '4.2 ms', '886 ms', '1.9 s')
    """
    us = float(us)
    for unit, scale in (("s", 1e6), ("ms", 1e3)):
        if abs(us) >= scale:
            value = us / scale
            return f"{value:.1f} {unit}" if abs(value) < 10 else f"{value:.0f} {unit}"
    return f"{us:.0f} us"
