"""Human units for what users read: bytes in binary units, times from µs to s.

One home for every view, note and message (the plan table, the search's notes, ``%release``,
``%devices``, the explorer's axes), so the same quantity reads the same everywhere.
"""

from __future__ import annotations

__all__ = ["byte_unit", "human_bytes", "human_time", "time_unit"]

_BYTE_UNITS = (
    ("EiB", 2**60),
    ("PiB", 2**50),
    ("TiB", 2**40),
    ("GiB", 2**30),
    ("MiB", 2**20),
    ("KiB", 2**10),
)


def byte_unit(num: float) -> tuple[str, float]:
    """The largest binary unit not above ``|num|`` and the factor into it: ``(MiB, 2**-20)``
    (an axis of sizes is drawn in one unit)."""
    for unit, factor in _BYTE_UNITS:
        if abs(num) >= factor:
            return unit, 1 / factor
    return "B", 1.0


def human_bytes(num: float, *, digits: int = 1) -> str:
    """``512 B``, ``1.5 KiB``, ``3.2 MiB`` (``digits`` decimals past bytes)."""
    unit, factor = byte_unit(num)
    return f"{num:.0f} B" if unit == "B" else f"{num * factor:.{digits}f} {unit}"


def time_unit(seconds: float) -> tuple[str, float]:
    """The unit a person reads a span of ``seconds`` in, and its factor."""
    if seconds >= 1:
        return "s", 1.0
    if seconds >= 1e-3:
        return "ms", 1e3
    return "µs", 1e6


def human_time(seconds: float) -> str:
    """``3.12 ms``, ``41.0 µs``, ``1.20 s``."""
    unit, factor = time_unit(seconds)
    return f"{seconds * factor:.{1 if unit == 'µs' else 2}f} {unit}"
