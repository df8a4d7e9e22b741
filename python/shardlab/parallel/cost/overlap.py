"""Compute and communication as two streams: how much communication the compute hides.

One in-order compute stream and one communication stream per device (SPMD: every device
runs the same schedule). Operations compute in program order, each for its roofline time
(``Propagation.spans``). The collectives an operation needs (resharding its inputs, reducing
partial sums) start as soon as their data is ready — when the producers of the operation's
inputs have computed — and the communication stream is free; the operation waits for them.
Communication that runs while the compute stream is busy is hidden; the time the compute
stream waits is *exposed*.

The streams overlap only where the profile's compiler makes collectives asynchronous
(``Compiler.async_collectives``: XLA:GPU, XLA:TPU); on XLA:CPU each collective runs between
two operations, all of it exposed. ``predict`` charges a step its compute plus the exposed
share of its communication (``CostBreakdown.hidden_comm_time``); the timeline view draws the
same two streams (``schedule.py``), so the two numbers agree.

A layer scan's body is one span per operation, its seconds summed over the trips, and a
collective inside it carries its trip count: the streams overlap a scanned layer's
collectives with the compute of the layers around them, as XLA's pipelining of collectives
across loop iterations (``collective_pipeliner``) lets them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from shardlab.parallel.graph.opgraph import OpGraph
from shardlab.parallel.records import Collective, _Record


@dataclasses.dataclass(frozen=True)
class Event(_Record):
    """One interval on a stream. Times in seconds from the start of the step."""

    stream: str  # "compute" | "communication"
    start: float
    end: float
    label: str  # primitive or collective kind
    kind: str = ""  # collective kind ("" for compute)
    source: str = ""
    exposed: float = 0.0  # seconds of this collective the compute stream waited for
    device: int = -1  # -1: the same on every device (model)
    wire_bytes: float = 0.0  # per device, for collectives
    stage: int = -1  # a pipeline stage's lane (``stage_timeline``); -1: not pipelined
    microbatch: int = -1  # the microbatch a pipeline stage's event works on


@dataclasses.dataclass(frozen=True)
class Streams:
    """The two streams of one step: events (when asked for) and totals in seconds."""

    events: tuple[Event, ...]
    total: float
    compute: float
    communication: float
    exposed: float

    @property
    def exposed_share(self) -> float:
        """The share of the communication the compute stream waits for (1 with none)."""
        return min(1.0, self.exposed / self.communication) if self.communication > 0 else 1.0


def run_streams(
    graph: OpGraph,
    prop: Any,
    profile: Any,
    *,
    combined: Sequence[Collective] | None = None,
    events: bool = False,
) -> Streams:
    """Schedules ``prop``'s operations and collectives (a ``propagate.Propagation`` of
    ``graph`` priced by ``profile``) on the two streams (the module docstring).

    ``combined``: the same collectives as XLA's combiner groups them (``combine.py``); each
    collective then takes its share of their time (the combined time over the separate
    one), so the streams' communication is the predicted one and the step the predicted
    step, while each collective keeps its own place in the program."""
    overlaps = profile.compiler.async_collectives
    scale = 1.0
    if combined is not None:
        separate = sum(profile.time_of(c) for c in prop.collectives)
        if separate > 0:
            scale = sum(profile.time_of(c) for c in combined) / separate
    end_of: dict[int, float] = {}  # node index -> compute end
    compute_clock = comm_clock = compute_total = comm_total = exposed_total = 0.0
    out: list[Event] = []

    def communicate(first: int, last: int, ready: float) -> list[tuple[Any, float, float]]:
        """Collectives ``first:last`` on the communication stream, earliest data first (a
        list scheduler), each starting when its data is ready and the stream free."""
        nonlocal comm_clock, comm_total
        queue = []
        for position in range(first, last):
            owner = prop.collective_nodes[position] if prop.collective_nodes else -1
            owner = prop.ready_nodes.get(position, owner)
            # A partial sum can be reduced as soon as its producer computed it; a compiler
            # without asynchronous collectives (XLA:CPU) runs it between two operations.
            at = end_of.get(owner, ready)
            queue.append((at if overlaps else max(at, compute_clock), position))
        done = []
        for data_ready, position in sorted(queue):
            collective = prop.collectives[position]
            seconds = profile.time_of(collective) * scale
            start = max(comm_clock, data_ready)
            comm_clock = start + seconds
            comm_total += seconds
            done.append((collective, start, comm_clock))
        return done

    def record(done: list[tuple[Any, float, float]], needed_by: float, waited_until: float):
        if not events:
            return
        for collective, c_start, c_end in done:
            exposed = max(0.0, min(c_end, waited_until) - max(c_start, needed_by))
            out.append(
                Event(
                    "communication",
                    c_start,
                    c_end,
                    collective.kind,
                    collective.kind,
                    collective.source,
                    exposed,
                    wire_bytes=collective.wire_bytes * collective.count,
                )
            )

    covered = 0
    for index, first, last, seconds in prop.spans:
        node = graph.nodes[index]
        ready = max((end_of.get(graph.producer(v), 0.0) for v in node.inputs), default=0.0)
        done = communicate(first, last, ready)
        needed_by = compute_clock
        start = max([needed_by] + [end for _, _, end in done])
        exposed_total += start - needed_by
        record(done, needed_by, start)
        compute_total += seconds
        end_of[index] = compute_clock = start + seconds
        if events and seconds > 0:
            out.append(Event("compute", start, start + seconds, node.primitive, "", node.source))
        covered = last
    # Collectives for the outputs' layouts (e.g. data-parallel gradient all-reduces): the
    # step ends when they finish.
    done = communicate(covered, len(prop.collectives), compute_clock)
    finish = max([compute_clock] + [end for _, _, end in done])
    exposed_total += finish - compute_clock
    record(done, compute_clock, finish)
    return Streams(
        events=tuple(out),
        total=max(compute_clock, comm_clock),
        compute=compute_total,
        communication=comm_total,
        exposed=exposed_total,
    )
