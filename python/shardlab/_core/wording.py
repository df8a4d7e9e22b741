"""How counts, ratios and FLOPs read: ``1 collective``, ``2.3×``, ``88.6 kFLOP``.

One home for every layer (``engine`` may not import ``parallel``): the plan and report text,
compare and bisect, the timeline. Re-exported by ``parallel/display.py``.
"""

from __future__ import annotations

import math

__all__ = ["TIME_RESOLUTION", "human_flops", "plural", "ratio_text", "time_ratio_text"]

# the smallest span ``human_time`` shows as non-zero (``0.1 µs``): a ratio against less reads
# as noise (an idle of 1e-12 s left by a subtraction gave "6151749412966776.0×")
TIME_RESOLUTION = 5e-8


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``1 collective``, ``0 collectives``, ``3 outputs``: a count and its noun, agreeing
    (``many``: an irregular plural, ``plural(2, "entry", "entries")``)."""
    if count == 1:
        return f"1 {noun}"
    return f"{count:,} {many if many is not None else noun + 's'}"


_FLOP_UNITS = (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3))


def human_flops(flops: float) -> str:
    """``88.6 kFLOP``, ``1.23 GFLOP``, ``512 FLOP``: three significant digits in the unit
    that keeps the number between 1 and 1000."""
    for unit, factor in _FLOP_UNITS:
        if abs(flops) >= factor:
            return f"{flops / factor:.3g} {unit}"
    return f"{flops:.0f} FLOP"


def ratio_text(numerator: float, denominator: float, *, resolution: float = 0.0) -> str:
    """``2.3×``, or ``""`` when the ratio means nothing to a reader: a zero, negative or
    not-finite denominator, one at or below ``resolution`` (what its own text shows as zero:
    ``0.0 µs`` is below 5e-8 s), or one a billion times smaller than the numerator (a
    rounding residue of a subtraction)."""
    if not (math.isfinite(numerator) and math.isfinite(denominator)):
        return ""
    if denominator <= max(resolution, 0.0) or denominator <= 1e-9 * abs(numerator):
        return ""
    ratio = numerator / denominator
    return f"{ratio:.1f}×" if ratio < 100 else f"{ratio:,.0f}×"


def time_ratio_text(numerator: float, denominator: float) -> str:
    """``ratio_text`` of two spans of seconds, "" against what ``human_time`` shows as 0."""
    return ratio_text(numerator, denominator, resolution=TIME_RESOLUTION)
