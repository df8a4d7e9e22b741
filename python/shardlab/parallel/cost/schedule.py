"""The step's compute and communication over time: as the cost model schedules it, and as a
``jax.profiler`` trace measured it.

Model (``schedule``): one in-order compute stream and one communication stream per device
(SPMD: every device runs the same schedule). The streams overlap only where the profile's
compiler makes collectives asynchronous (XLA:GPU, XLA:TPU); on XLA:CPU each collective runs
between two operations, all of it exposed. Operations compute in program order, each for
its roofline time (per-device flops over the device peak, or the bytes it moves over the
memory bandwidth, whichever is longer). The collectives an operation needs (resharding
its inputs, reducing partial sums) start as soon as their data is ready — when the producers
of the operation's inputs have computed — and the communication stream is free; the
operation waits for them. Communication that runs while the compute stream is busy is
hidden; the time the compute stream waits is *exposed* communication. Collectives stay
separate here (what an asynchronous runtime could overlap); ``predict`` combines independent
all-reduces as XLA's combiner does, so its communication time can be lower by the latencies
combining saves, while the bytes are the same.

Measured (``measure``): runs the compiled program under ``jax.profiler.trace`` and reads the
trace's complete events of that program per device (on CPU, collective times include
waiting for peers, so they are not pure wire time).

Pipelined (``stage_timeline``): a plan with pipeline stages runs a different schedule on each
stage, so its model timeline is the pipeline simulator's (``cost/pipeline.py``), one lane per
stage, each event naming its stage and microbatch.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import os
import re
import tempfile
from collections.abc import Callable
from typing import Any

from shardlab.parallel.arguments import abstract_args, bind, split
from shardlab.parallel.cost.pipeline import PipelineCost
from shardlab.parallel.cost.predict import prepare_strategy
from shardlab.parallel.records import COLLECTIVE_KINDS, _Record
from shardlab.parallel.specs import resolve_shardings, unflatten_like

MAX_EVENTS = 4000  # compute events are merged into segments beyond this


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
class Timeline(_Record):
    """A timeline: events and totals."""

    events: tuple[Event, ...]
    total: float
    compute: float
    communication: float
    exposed: float
    devices: int
    measured: bool = False
    note: str = ""
    stages: int = 0  # pipeline stages, one lane each (``stage_timeline``); 0: SPMD

    @property
    def hidden(self) -> float:
        return max(0.0, self.communication - self.exposed)


def stage_timeline(cost: PipelineCost, *, devices: int) -> Timeline:
    """A pipelined plan's schedule (``cost/pipeline.py``'s simulator) as a ``Timeline``: per
    stage, its forward and backward of each microbatch on the compute stream and its
    stage-to-stage transfers (collective-permutes, exposed) on the communication stream;
    the idle gaps are the bubble. Totals are per device, the mean over the stages; the
    step is the pipelined part (what runs outside it, once, is in the note)."""
    s, p = cost.schedule, cost.schedule.stages
    events = []
    for e in s.events:
        if e.kind == "idle":
            continue
        send = e.kind == "send"
        what = f"{e.kind} of microbatch {e.microbatch}" if e.microbatch >= 0 else e.kind
        events.append(
            Event(
                "communication" if send else "compute",
                e.start,
                e.end,
                what,
                "collective-permute" if send else "",
                exposed=e.end - e.start if send else 0.0,
                wire_bytes=float(cost.microbatch_bytes) if send else 0.0,
                stage=e.stage,
                microbatch=e.microbatch,
            )
        )
    sending = sum(s.sending) / p
    spec = cost.spec
    return Timeline(
        events=tuple(events),
        total=s.step_time,
        compute=sum(s.busy) / p,
        communication=sending,
        exposed=sending,  # pipeline transfers are charged exposed (cost/pipeline.py)
        devices=devices,
        note=(
            f"cost model: {spec.stages} stages × {spec.microbatches} microbatches "
            f"({spec.schedule}), one lane per stage; the pipelined part only, "
            f"{cost.outside_time * 1e3:.3f} ms outside it (embedding, head, update: run once)"
        ),
        stages=p,
    )


def schedule(
    fn: Callable[..., Any],
    *args: Any,
    mesh: Any,
    in_shardings: Any,
    constraints: Any = None,
    device: Any = None,
) -> Timeline:
    """The cost model's schedule of one step of ``fn`` under a fully specified strategy."""
    prepared = prepare_strategy(
        fn, *args, mesh=mesh, in_shardings=in_shardings, constraints=constraints, device=device
    )
    graph, prop, profile = prepared.graph, prepared.propagate(), prepared.profile
    overlaps = profile.compiler.async_collectives
    end_of: dict[int, float] = {}  # node index -> compute end
    state = {"compute": 0.0, "comm": 0.0, "compute_total": 0.0, "comm_total": 0.0, "exposed": 0.0}
    events: list[Event] = []

    def communicate(first: int, last: int, ready: float) -> list[tuple[Any, float, float]]:
        """Schedules collectives ``first:last`` on the communication stream, earliest data
        first (a list scheduler), each starting when its data is ready and the stream free."""
        queue = []
        for position in range(first, last):
            owner = prop.collective_nodes[position] if prop.collective_nodes else -1
            # A partial sum can be reduced as soon as its producer computed it; a compiler
            # without asynchronous collectives (XLA:CPU) runs it between two operations.
            at = end_of.get(owner, ready)
            queue.append((at if overlaps else max(at, state["compute"]), position))
        done = []
        for data_ready, position in sorted(queue):
            collective = prop.collectives[position]
            seconds = profile.time_of(collective)
            start = max(state["comm"], data_ready)
            state["comm"] = start + seconds
            state["comm_total"] += seconds
            done.append((collective, start, state["comm"]))
        return done

    def record(done: list[tuple[Any, float, float]], needed_by: float, waited_until: float):
        for collective, c_start, c_end in done:
            exposed = max(0.0, min(c_end, waited_until) - max(c_start, needed_by))
            events.append(
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
        needed_by = state["compute"]
        start = max([needed_by] + [end for _, _, end in done])
        state["exposed"] += start - needed_by
        record(done, needed_by, start)
        state["compute_total"] += seconds
        end_of[index] = state["compute"] = start + seconds
        if seconds > 0:
            events.append(Event("compute", start, start + seconds, node.primitive, "", node.source))
        covered = last
    # Collectives for the outputs' layouts (e.g. data-parallel gradient all-reduces): the
    # step ends when they finish.
    done = communicate(covered, len(prop.collectives), state["compute"])
    finish = max([state["compute"]] + [end for _, _, end in done])
    state["exposed"] += finish - state["compute"]
    record(done, state["compute"], finish)
    compute_clock, comm_clock = state["compute"], state["comm"]
    compute_total, comm_total = state["compute_total"], state["comm_total"]
    exposed_total = state["exposed"]
    total = max(compute_clock, comm_clock)
    return Timeline(
        events=_merge(events),
        total=total,
        compute=compute_total,
        communication=comm_total,
        exposed=exposed_total,
        devices=int(mesh.size),
        note=f"cost model ({profile.name}); every device runs the same schedule (SPMD)",
    )


def _merge(events: list[Event]) -> tuple[Event, ...]:
    """Adjacent compute events merged when there are too many to draw."""
    if len(events) <= MAX_EVENTS:
        return tuple(events)
    merged: list[Event] = []
    for event in events:
        last = merged[-1] if merged else None
        if (
            last is not None
            and event.stream == "compute" == last.stream
            and event.device == last.device  # a measured trace is sorted device by device
            and event.start - last.end < 1e-12
        ):
            merged[-1] = dataclasses.replace(last, end=max(last.end, event.end), label="compute")
        else:
            merged.append(event)
    return tuple(merged)


_KIND = re.compile("|".join(COLLECTIVE_KINDS))


def measure(
    fn: Callable[..., Any], *args: Any, mesh: Any, in_shardings: Any, runs: int = 1
) -> Timeline:
    """Runs the compiled program under ``jax.profiler.trace`` and reads its events per device.

    Compiled on the arguments' shapes (``arguments.abstract_args``), then run on them placed
    as the program wants (``jax.device_put``; a ``jax.ShapeDtypeStruct`` leaf runs on zeros).
    """
    import jax
    import jax.numpy as jnp

    args = tuple(args)
    parts = split(args, fn)
    dynamic = parts.dynamic(args)
    resolved = resolve_shardings(in_shardings, args, mesh, what="in_shardings")
    shardings = unflatten_like(dynamic, [s for _, _, s in resolved])
    jitted = jax.jit(bind(fn, parts), in_shardings=shardings)
    compiled = jitted.lower(*parts.dynamic(abstract_args(args))).compile()
    leaves = jax.tree_util.tree_leaves(dynamic)
    placed = [
        jax.device_put(jnp.zeros(x.shape, x.dtype) if isinstance(x, jax.ShapeDtypeStruct) else x, s)
        for x, s in zip(leaves, jax.tree_util.tree_leaves(compiled.input_shardings[0]), strict=True)
    ]
    run_args = jax.tree_util.tree_unflatten(parts.dynamic_treedef, placed)
    module = (compiled.as_text() or "").split("\n", 1)[0].split()[1].split(",")[0]
    jax.block_until_ready(compiled(*run_args))  # warm
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder, create_perfetto_trace=True):
            for _ in range(runs):
                jax.block_until_ready(compiled(*run_args))
        files = glob.glob(os.path.join(folder, "**", "*.trace.json.gz"), recursive=True)
        if not files:
            raise RuntimeError("jax.profiler wrote no trace; is the profiler available here?")
        with gzip.open(files[0]) as handle:
            trace = json.load(handle)
    raw = trace["traceEvents"] if isinstance(trace, dict) else trace
    ours = [
        e
        for e in raw
        if e.get("ph") == "X" and e.get("args", {}).get("hlo_module", "").startswith(module)
    ]
    if not ours:
        raise RuntimeError(f"the trace has no events of program {module!r}")
    origin = min(float(e["ts"]) for e in ours)
    events = []
    compute = comm = 0.0
    for e in ours:
        start = (float(e["ts"]) - origin) * 1e-6
        seconds = float(e.get("dur", 0.0)) * 1e-6
        name = e["args"].get("hlo_op", e.get("name", ""))
        match = _KIND.search(name)
        stream = "communication" if match else "compute"
        if match:
            comm += seconds
        else:
            compute += seconds
        events.append(
            Event(
                stream,
                start,
                start + seconds,
                name,
                match.group(0) if match else "",
                device=int(e["args"].get("device_ordinal", -1)),
            )
        )
    devices = len({e.device for e in events}) or 1
    total = max(e.end for e in events)
    return Timeline(
        events=_merge(sorted(events, key=lambda e: (e.device, e.start))),
        total=total,
        compute=compute / devices,
        communication=comm / devices,
        exposed=comm / devices,  # CPU collectives run on the compute thread: none hidden
        devices=devices,
        measured=True,
        note=f"jax.profiler trace of {runs} run(s) of {module}, per device; on CPU "
        "collective times include waiting for peers",
    )
