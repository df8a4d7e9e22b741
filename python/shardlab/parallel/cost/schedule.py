"""The step's compute and communication over time: as the cost model schedules it, and as a
``jax.profiler`` trace measured it.

Model (``schedule``): the two streams of ``overlap.py`` — one in-order compute stream, one
communication stream, overlapping only where the profile's compiler makes collectives
asynchronous — with every event kept for drawing. ``predict`` runs the same streams, so the
timeline's step and the predicted step are one number. Collectives stay separate here, each
in its place in the program, and each takes its share of the time of the combined
collectives ``predict`` prices (XLA's combiner pays one latency for a group of independent
all-reduces, and a larger message runs nearer the link's bandwidth).

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
from shardlab.parallel.cost.combine import combine_all_reduces
from shardlab.parallel.cost.overlap import Event as Event
from shardlab.parallel.cost.overlap import run_streams
from shardlab.parallel.cost.pipeline import PipelineCost
from shardlab.parallel.cost.predict import prepare_strategy
from shardlab.parallel.records import COLLECTIVE_KINDS, _Record
from shardlab.parallel.specs import resolve_shardings, unflatten_like

MAX_EVENTS = 4000  # compute events are merged into segments beyond this


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
    combined = combine_all_reduces(graph, prop.collectives, prop.collective_nodes)
    streams = run_streams(graph, prop, profile, combined=combined, events=True)
    return Timeline(
        events=_merge(list(streams.events)),
        total=streams.total,
        compute=streams.compute,
        communication=streams.communication,
        exposed=streams.exposed,
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
