"""A timeline as lanes of intervals, reduced fairly when there are too many to draw.

One lane per device for a measured trace; for the cost model's schedule, which every device
runs alike (SPMD), one lane standing for all devices; for a pipelined plan's model
(``schedule.stage_timeline``), one lane per stage, and in a measured trace of it ``stage_of``
names a device's stage in its lane. Each lane has two rows, compute and communication, so a
collective is never drawn under a kernel.

Reduction (``reduce_fairly``): a drawing budget is shared between the rows by water-filling —
a row with fewer intervals than its share keeps all of them and leaves the rest to the others
— so every device is drawn, none is cut because the devices before it spent the budget. A row
over its share aggregates *adjacent* intervals: first the same-kind neighbours with the
smallest gaps between them, then, if still too many, any neighbours, smallest gaps first. An
aggregate spans its first start to its last end, carries its intervals' busy time, bytes and
exposure, takes the kind that was busiest in it, and says how many intervals it holds.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from shardlab.parallel.cost.schedule import Event, Timeline

STREAMS = ("compute", "communication")


@dataclasses.dataclass(frozen=True)
class Interval:
    """One drawn interval (or an aggregate of ``count`` adjacent ones). Seconds."""

    lane: int
    stream: str  # "compute" | "communication"
    start: float
    end: float
    kind: str  # "compute" or a collective kind
    label: str
    source: str = ""
    wire_bytes: float = 0.0
    exposed: float = 0.0
    busy: float = 0.0  # seconds the intervals are busy (an aggregate has gaps)
    count: int = 1


@dataclasses.dataclass(frozen=True)
class Lanes:
    """The lanes of one timeline and what was drawn of it."""

    title: str
    lanes: tuple[str, ...]
    intervals: tuple[Interval, ...]
    total: float
    original: int  # intervals before reduction
    measured: bool

    @property
    def reduced(self) -> bool:
        return len(self.intervals) < self.original

    def note(self) -> str:
        """What the reduction did, in a sentence ('' when nothing was reduced)."""
        if not self.reduced:
            return ""
        return (
            f"{self.original:,} intervals drawn as {len(self.intervals):,}: adjacent intervals "
            f"aggregated, the budget shared fairly between the {len(self.lanes)} lanes (every "
            "lane drawn); hover an aggregate for how many it holds"
        )


def lanes_of(
    timeline: Timeline, *, stage_of: Mapping[int, int] | None = None
) -> tuple[tuple[str, ...], list[tuple[int, Event]]]:
    """The lane names and each event's lane index."""
    if timeline.stages and not timeline.measured:  # the pipeline model: a lane per stage
        names = tuple(f"stage {s}" for s in range(timeline.stages))
        return names, [(max(e.stage, 0), e) for e in timeline.events]
    devices = sorted({e.device for e in timeline.events if e.device >= 0})
    if not devices:  # the model: the same schedule on every device
        span = f"devices 0–{timeline.devices - 1}" if timeline.devices > 1 else "device 0"
        return (f"{span} (SPMD)",), [(0, e) for e in timeline.events]
    index = {d: i for i, d in enumerate(devices)}
    names = tuple(
        f"stage {stage_of[d]} · device {d}" if stage_of and d in stage_of else f"device {d}"
        for d in devices
    )
    return names, [(index[e.device] if e.device >= 0 else 0, e) for e in timeline.events]


def _interval(lane: int, event: Event) -> Interval:
    kind = event.kind or "compute"
    return Interval(
        lane,
        event.stream,
        event.start,
        event.end,
        kind,
        event.label,
        event.source,
        event.wire_bytes,
        event.exposed,
        max(0.0, event.end - event.start),
    )


def shares(counts: Sequence[int], budget: int) -> list[int]:
    """Water-filling: each row gets ``min(count, fair share)``; what a small row leaves goes
    to the others. ``sum(result) <= budget`` and every non-empty row gets at least one."""
    result = [0] * len(counts)
    order = sorted(range(len(counts)), key=lambda i: counts[i])
    left, rows = max(budget, 0), len(counts)
    for position, i in enumerate(order):
        fair = max(1, left // max(1, rows - position))
        result[i] = min(counts[i], fair)
        left -= result[i]
    return result


def _boundaries_to_keep(items: list[Interval], keep: int) -> np.ndarray:
    """Which of the ``len(items) - 1`` boundaries between neighbours stay, so that ``keep``
    groups remain: same-kind boundaries with the smallest gaps go first, then any."""
    n = len(items)
    starts = np.fromiter((i.start for i in items), float, n)
    ends = np.fromiter((i.end for i in items), float, n)
    gaps = np.maximum(starts[1:] - ends[:-1], 0.0)
    kinds = [(i.kind, i.exposed > 0) for i in items]
    differs = np.fromiter((a != b for a, b in itertools.pairwise(kinds)), bool, n - 1)
    # Sort key: same-kind boundaries before mixed ones, smaller gaps first.
    order = np.lexsort((gaps, differs))
    stay = np.ones(n - 1, bool)
    stay[order[: n - keep]] = False
    return stay


def _aggregate(group: list[Interval]) -> Interval:
    if len(group) == 1:
        return group[0]
    busy_by_kind: dict[str, float] = {}
    labels: Counter[str] = Counter()
    for item in group:
        busy_by_kind[item.kind] = busy_by_kind.get(item.kind, 0.0) + (item.busy or 1e-30)
        labels[item.label] += item.count
    kind = max(busy_by_kind, key=lambda k: busy_by_kind[k])
    count = sum(i.count for i in group)
    top = ", ".join(f"{name} ×{n}" for name, n in labels.most_common(3))
    more = " …" if len(labels) > 3 else ""
    sources = {i.source for i in group if i.source}
    return Interval(
        group[0].lane,
        group[0].stream,
        min(i.start for i in group),
        max(i.end for i in group),
        kind,
        f"{count} intervals: {top}{more}",
        sources.pop() if len(sources) == 1 else ("several lines" if sources else ""),
        sum(i.wire_bytes for i in group),
        sum(i.exposed for i in group),
        sum(i.busy for i in group),
        count,
    )


def reduce_row(items: list[Interval], keep: int) -> list[Interval]:
    """``items`` (one row, by start) as at most ``keep`` intervals, adjacent ones aggregated."""
    if len(items) <= keep or len(items) < 2:
        return items
    stay = _boundaries_to_keep(items, max(1, keep))
    out, group = [], [items[0]]
    for boundary, item in zip(stay, items[1:], strict=True):
        if boundary:
            out.append(_aggregate(group))
            group = [item]
        else:
            group.append(item)
    out.append(_aggregate(group))
    return out


def reduce_fairly(intervals: Sequence[Interval], budget: int) -> list[Interval]:
    """At most ``budget`` intervals (at least one per non-empty row), shared by water-filling
    between the (lane, stream) rows."""
    rows: dict[tuple[int, str], list[Interval]] = {}
    for item in intervals:
        rows.setdefault((item.lane, item.stream), []).append(item)
    keys = sorted(rows)
    allowed = shares([len(rows[k]) for k in keys], budget)
    out: list[Interval] = []
    for key, keep in zip(keys, allowed, strict=True):
        row = sorted(rows[key], key=lambda i: (i.start, i.end))
        out.extend(reduce_row(row, keep))
    return out


def build_lanes(
    timeline: Timeline, *, budget: int, stage_of: Mapping[int, int] | None = None
) -> Lanes:
    """The lanes of ``timeline``, at most ``budget`` intervals drawn (fairly reduced)."""
    names, placed = lanes_of(timeline, stage_of=stage_of)
    intervals = [_interval(lane, e) for lane, e in placed]
    drawn = reduce_fairly(intervals, budget)
    title = "measured" if timeline.measured else "cost model"
    return Lanes(title, names, tuple(drawn), timeline.total, len(intervals), timeline.measured)
