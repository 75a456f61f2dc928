"""Small text helpers shared by printed output and reports."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

#: Seconds in each unit :func:`seconds_of` reads.
_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


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


def few(items: Iterable[Any], n: int = 8, sep: str = " ") -> str:
    """The first ``n`` of ``items`` and how many more, for a message naming a long list.

    >>> few(range(3)), few(range(10), 4), few(["a.log", "b.log", "c.log"], 2, ", ")
    ('0 1 2', '0 1 2 3 and 6 more', 'a.log, b.log and 1 more')
    """
    items = list(items)
    return sep.join(map(str, items[:n])) + (f" and {len(items) - n} more" if len(items) > n
                                            else "")


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


def seconds_of(text: str) -> float:
    """A duration as a person types it, in seconds: a number of seconds, or one with a unit
    (``s``, ``m`` or ``min``, ``h``, ``d``); ``ValueError`` saying what was expected otherwise.

    >>> seconds_of("90"), seconds_of("30m"), seconds_of("1.5h"), seconds_of("2d")
    (90.0, 1800.0, 5400.0, 172800.0)
    """
    m = re.fullmatch(r"\s*(\d+\.?\d*|\.\d+)\s*(s|m|min|h|d)?\s*", text.lower())
    if m is None:
        raise ValueError(f"{text!r}: expected a duration like 90s, 30m, 6h or 2d")
    return float(m[1]) * _UNITS[m[2] or "s"]


def span(seconds: float) -> str:
    """Seconds as :func:`seconds_of` reads them, in the largest unit they are a whole number of.

    >>> span(21600), span(5400), span(90), span(2.5)
    ('6h', '90m', '90s', '2.5s')
    """
    for unit in ("d", "h", "m"):
        n = seconds / _UNITS[unit]
        if n >= 1 and n == int(n):
            return f"{int(n)}{unit}"
    return f"{seconds:g}s"


def shown(value: Any) -> Any:
    """``value`` as an error message shows it: a numpy scalar as the plain Python value, a JSON
    container by its kind, text cut to 40 characters, and a number of more than 40 digits by
    its start and length (``str()`` of an int of over 4,300 digits is itself an error).

    >>> shown(10**400), shown("7" * 50), shown("x" * 50), shown({"a": 1}), shown(2.5)
    ('100000000000000000000000... (401 digits)', '777777777777777777777777... (50 digits)', 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...', 'dict', 2.5)
    >>> shown(-(10**5000))
    'an integer of about 5001 digits'
    """
    if hasattr(value, "item") and getattr(value, "shape", None) == ():  # a numpy scalar
        value = value.item()
    if isinstance(value, (dict, list)):
        return type(value).__name__
    if isinstance(value, int) and not isinstance(value, bool):
        digits = int(value.bit_length() * 0.30103) + 1
        if digits <= 40:
            return value
        if digits > 4000:
            return f"an integer of about {digits} digits"
    if not isinstance(value, (int, str)) or isinstance(value, bool):
        return value
    text = str(value).strip()
    if len(text) <= 40:
        return value
    number = text.lstrip("-+")
    if number.isdigit():
        return f"{text[:24]}... ({len(number)} digits)"
    return text[:40] + "..."
