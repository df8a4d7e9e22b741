"""Buffer assignment: the buffers ``liveness`` found, placed in the outputs' allocations and
the ``temp`` heap, and the walks over program points.

* **Output buffers.** An output's allocation exists for the whole program, so XLA puts
  temporaries in it before the output is computed (first fit, whole buffers).

``_assigned`` (first fit over ``_Bins``, then the heap's peak) is XLA's buffer assignment,
what ``device_memory`` reports; ``_walk``, ``_steps`` and ``_snapshots`` hold buffers from
their producer to their last use; ``handed_over`` is a scan's stacked output updated in
place; ``peak_points`` are the points linear memory constraints bound.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Collection, Sequence

import numpy as np

from shardlab.parallel.cost.memory.live_ranges import Liveness, liveness
from shardlab.parallel.graph.opgraph import OpGraph

# Per node, bytes it needs only while it runs: one buffer, or several (the operands of a
# combined all-reduce), each of which may sit in an output buffer not yet written.
Transient = Callable[[int], "int | tuple[int, ...]"]
# Per all-reduced variable: (node after which its all-reduce runs, unreduced bytes, reduced
# bytes).
Reductions = dict[int, tuple[int, int, int]]


def _walk(
    graph: OpGraph,
    lv: Liveness,
    held: Callable[[int], int],
    start: Sequence[int],
    transient: Transient = lambda i: 0,
    slots: dict[int, int] | None = None,
) -> tuple[int, frozenset[int]]:
    """Walk the program order holding ``held(v)`` bytes per buffer, plus ``transient(i)``
    bytes while node ``i`` runs: (peak, buffers at it). With ``slots`` (output → bytes),
    what XLA places in the outputs' buffers does not count (``_assigned``)."""
    sizes: dict[int, int] = {}

    def size_of(v: int) -> int:
        got = sizes.get(v)
        if got is None:
            got = sizes[v] = held(v)
        return got

    if slots:
        return _assigned(graph, lv, size_of, start, transient, slots)
    raw = [now for now, _ in _steps(graph, lv, size_of, start, transient)]
    if not raw:
        return 0, frozenset()
    best = max(range(len(raw)), key=raw.__getitem__)
    return raw[best], _snapshots(graph, lv, size_of, start, transient, {best})[best][0]


def _assigned(
    graph: OpGraph,
    lv: Liveness,
    size_of: Callable[[int], int],
    start: Sequence[int],
    transient: Transient,
    slots: dict[int, int],
    reductions: Reductions | None = None,
    brief: Collection[int] = (),
    own: Callable[[int], int] | None = None,
    into: dict[int, int] | None = None,
    scratch: Sequence[tuple[int, int, int]] = (),
) -> tuple[int, frozenset[int]]:
    """Peak temp bytes when temporaries are first placed in output buffers, as XLA's buffer
    assignment does before the heap: largest first, each into the smallest output buffer
    that holds it, is written only after the temporary is dead, and holds no other
    temporary at the same time (one at a time, at offset 0). What is left is the heap,
    whose peak over the program points is ``temp``. ``into``: results written over an
    operand's buffer (``written_over``), one span with it; ``scratch``: buffers the
    program does not name, ``(bytes, first node, last node)``.

    A combined all-reduce runs between the node after which it is scheduled and the next
    (program points are doubled, the all-reduce at the odd one between): the buffers that
    node read for the last time are freed before the all-reduce writes its results, so a
    weight gradient's reduced buffer is never live with its convolution's operands."""
    point = {i: 2 * p for p, i in enumerate(lv.order, start=1)}
    end = 2 * len(lv.order)
    outputs = set(graph.outputs)
    # A stacked buffer handed to the next iteration's update ends one point early.
    handed = handed_over(graph, lv, size_of)
    spans: list[tuple[int, int, int, int]] = []  # (bytes, first, last, var; -1: transient)
    mains: dict[int, int] = {}  # var → index of its own buffer's span
    for v in start:
        if size_of(v):
            last = point.get(lv.last_use.get(v, -1))
            spans.append((size_of(v), 0, end if last is None else last, v))
    reductions = reductions or {}
    for i in lv.order:
        p = point[i]
        for v in graph.nodes[i].outputs:
            size = size_of(v)
            red = reductions.get(v)
            if red is not None and red[0] in point:
                at, unreduced, result = red
                last = point.get(lv.last_use.get(v, -1))
                stays = v in outputs or last is None
                if v in outputs:
                    size = result = 0  # reduced into the output's own buffer
                # Read by the all-reduce, which runs just after ``at`` (an odd point).
                spans.append((unreduced, p, point[at] + 1, v))
                size = max(size, result)
                if size:
                    until = end if stays or last is None else max(last, point[at] + 1)
                    spans.append((size, point[at] + 1, until, v))
                continue
            if size:
                last = point.get(lv.last_use.get(v, -1))
                if v in outputs:
                    # An output's own buffer is counted apart; what it holds in temp (the
                    # layout it was computed in before moving into the output's, copies
                    # for its consumers) is freed after its last use.
                    until = p if last is None or v in brief else max(p, last)
                else:
                    until = end if last is None else max(p, last - 2 * (v in handed))
                mine = own(v) if own is not None else size
                if 0 < mine < size:  # its copies are buffers of their own
                    spans.append((size - mine, p, until, v))
                    size = mine
                    if v in lv.direct and v not in outputs:  # read in a convolution's copy
                        until = min(until, max(p, point.get(lv.direct[v], p)))
                host = into.get(v) if into else None
                while into and host is not None and host not in mains:
                    host = into.get(host)
                if host is not None:  # the same buffer as the operand it writes over
                    k = mains.pop(host)
                    a, first, last, b = spans[k]
                    spans[k] = (a, first, max(last, until), b)
                    mains[v] = k
                    continue
                mains[v] = len(spans)
                spans.append((size, 1 if v in lv.early else p, until, v))
        extra = transient(i)
        for piece in (extra,) if isinstance(extra, int) else extra:
            if piece:
                spans.append((piece, p, p, -1))
    for size, first, last in scratch:
        if size and first in point and last in point:
            spans.append((size, point[first], point[last], -1))

    def written(o: int) -> float:  # an all-reduced output is written by its all-reduce
        red = reductions.get(o)
        if red is not None and red[0] in point:
            return point[red[0]] + 1
        return point[graph.producer(o)]

    bins = sorted((size, written(o)) for o, size in slots.items() if graph.producer(o) in point)
    bin_sizes = [b[0] for b in bins]
    hosts = _Bins([b[1] for b in bins], end)
    heap: list[tuple[int, int, int, int]] = []
    for j in sorted(range(len(spans)), key=lambda j: (-spans[j][0], spans[j][1])):
        span = spans[j]
        size, first, last, _ = span
        if not hosts.place(bisect.bisect_left(bin_sizes, size), first, last, last):
            heap.append(span)
    delta = [0] * (end + 3)  # an all-reduce after the last node runs at end + 1
    for size, first, last, _ in heap:
        delta[first] += size
        delta[last + 1] -= size
    peak, now, at = 0, 0, 0
    for p in range(end + 2):
        now += delta[p]
        if now > peak:
            peak, at = now, p
    alive = frozenset(v for _, first, last, v in heap if v >= 0 and first <= at <= last)
    return peak, alive


class _Bins:
    """Output buffers that host temporaries (``_assigned``), first fit in bin order.

    A bin takes a temporary if it is written after the temporary's last read and none of
    the temporaries it hosts overlaps it in time. First fit over thousands of bins is
    quadratic when most bins are taken (a deep train step's activations all span the turn
    from forward to backward), so each bin's occupancy is also kept at up to 256 probe
    points, and per gap between two probes whether one hosted temporary covers it: a
    temporary skips, in a few array operations, every bin holding something at a probe
    inside its own span (or across the gap it lies in), and only the rest are checked
    exactly. The result is the plain first fit's."""

    PROBES = 256
    ROWS = 8  # probes consulted per temporary

    def __init__(self, written: Sequence[float], end: int):
        self.written = np.asarray(written, dtype=float)
        self.probes = np.unique(np.linspace(0, end, min(self.PROBES, end + 1)).round())
        self.at = np.tile(self.written, (len(self.probes), 1))  # -inf: taken at the probe
        self.across = np.tile(self.written, (len(self.probes), 1))  # gap after the probe
        self.starts: list[list[int]] = [[] for _ in written]
        self.ends: list[list[int]] = [[] for _ in written]

    def place(self, lo: int, first: int, last: int, read: float) -> bool:
        a = int(np.searchsorted(self.probes, first, "left"))
        b = int(np.searchsorted(self.probes, last, "right"))
        if a < b:
            rows = np.unique(np.linspace(a, b - 1, min(self.ROWS, b - a)).round().astype(int))
            free = self.at[rows, lo:].min(axis=0)
        else:  # between probes a - 1 and a
            free = self.across[a - 1, lo:]
        for k in np.flatnonzero(free > read):
            k = int(k) + lo
            at = bisect.bisect_right(self.starts[k], last)
            if at == 0 or self.ends[k][at - 1] < first:  # no hosted span overlaps
                self.starts[k].insert(at, first)
                self.ends[k].insert(at, last)
                self.at[a:b, k] = -math.inf
                self.across[a : b - 1, k] = -math.inf
                return True
        return False


def _steps(
    graph: OpGraph,
    lv: Liveness,
    size_of: Callable[[int], int],
    start: Sequence[int],
    transient: Transient,
):
    """Per program point (the start, then each node while it runs): ``(bytes held,
    buffers alive)``; the set is the walk's own, changed as the walk goes on."""
    outputs = set(graph.outputs)
    frees: dict[int, list[int]] = {}
    for v, i in lv.last_use.items():
        frees.setdefault(i, []).append(v)
    alive = {v for v in start if size_of(v)}
    temp = sum(size_of(v) for v in alive)
    yield temp, alive
    handed = handed_over(graph, lv, size_of)
    for i in lv.order:
        for v in graph.nodes[i].inputs:
            if v in handed and lv.last_use.get(v) == i and v in alive:
                alive.discard(v)
                temp -= size_of(v)
        for v in graph.nodes[i].outputs:
            size = size_of(v)
            if size:
                temp += size
                alive.add(v)
        yield temp + _total(transient(i)), alive
        for v in frees.get(i, ()):
            if v in alive and v not in outputs:
                alive.discard(v)
                temp -= size_of(v)


def _snapshots(
    graph: OpGraph,
    lv: Liveness,
    size_of: Callable[[int], int],
    start: Sequence[int],
    transient: Transient,
    points: set[int],
) -> dict[int, tuple[frozenset[int]]]:
    """At the given program points: (buffers alive,)."""
    out: dict[int, tuple[frozenset[int]]] = {}
    for p, (_, alive) in enumerate(_steps(graph, lv, size_of, start, transient)):
        if p in points:
            out[p] = (frozenset(alive),)
            if len(out) == len(points):
                break
    return out


def handed_over(graph: OpGraph, lv: Liveness, size_of: Callable[[int], int]) -> frozenset[int]:
    """Stacked buffers an unrolled scan's next ``scan_stack`` updates in place: the loop's
    ``ys`` buffer is one allocation written slice by slice (a dynamic-update-slice in the
    while loop's state), so a stack's version before an iteration and after it are never
    held together."""
    out: set[int] = set()
    for i in lv.order:
        node = graph.nodes[i]
        if node.primitive != "scan_stack" or len(node.inputs) != 2:
            continue
        u = node.inputs[0]
        if (
            lv.last_use.get(u) == i
            and u in lv.materialized
            and size_of(u) == size_of(node.outputs[0])
        ):
            out.add(u)
    return frozenset(out)


def _total(extra: int | tuple[int, ...]) -> int:
    return extra if isinstance(extra, int) else sum(extra)


def peak_points(
    graph: OpGraph,
    live: Sequence[bool],
    nbytes: Callable[[int], int],
    count: int = 8,
    lv: Liveness | None = None,
) -> list[frozenset[int]]:
    """The intermediates held at the ``count`` program points with the most bytes held
    (by ``nbytes``, e.g. replicated sizes): what linear memory constraints bound."""
    lv = lv or liveness(graph, live)
    keep = set(graph.inputs) | set(graph.outputs)
    frees: dict[int, list[int]] = {}
    for v, i in lv.last_use.items():
        frees.setdefault(i, []).append(v)
    held: set[int] = set()
    points: list[tuple[int, frozenset[int]]] = []
    total = 0
    for i in lv.order:
        for v in graph.nodes[i].outputs:
            if v in lv.materialized and v not in keep:
                held.add(v)
                total += nbytes(v)
        points.append((total, frozenset(held)))
        for v in frees.get(i, ()):
            if v in held:
                held.discard(v)
                total -= nbytes(v)
    points.sort(key=lambda p: -p[0])
    return [p[1] for p in points[:count]]
