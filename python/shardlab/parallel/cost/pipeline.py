"""Pipeline stages in the cost model: a schedule simulator and a plan's per-stage times.

``simulate`` runs a pipeline schedule over ``p`` stages and ``m`` microbatches as a list
scheduler: each stage is one in-order lane running its own order of work, and each piece of
work waits for the data it needs. Schedules:

- ``gpipe``: every forward, then every backward;
- ``1f1b``: PipeDream-flush, warm-up forwards then one forward one backward;
- ``interleaved``: Megatron's interleaved 1F1B (Narayanan et al. 2021, arXiv 2104.04473
  §2.2.2): each stage holds ``v`` model chunks (virtual stages; stage s holds layer chunks
  s, s+p, s+2p, …), runs the forwards of ``p`` microbatches through one chunk before the
  next chunk, in Megatron's warm-up/steady/cool-down order (``schedules.py``
  ``forward_backward_pipelining_with_interleaving``). Bubble ``(p-1)/(v·m)`` of the ideal
  for uniform stages; stage-to-stage transfers ``v`` times as many. ``v = 1`` is 1F1B.

Dependencies, with virtual stage ``k = c·p + s`` (chunk c on stage s; ``v = 1``: k = s): a
forward of microbatch j on k waits for k-1's forward of j (chunk c on stage s-1, or chunk
c-1 on the last stage) and its transfer, a backward for k+1's backward of j (or its own
forward on the last virtual stage). Stage-to-stage transfers (a collective-permute of one
microbatch's activation) are charged on the sender's lane, not overlapped with its compute
(MaxText PR #701: PP comms are exposed).

Bubble fractions, both labelled: ``bubble_share_of_step`` (MaxText's and GPipe's: idle time
over the step, ``(p-1)/(m+p-1)`` for uniform stages) and ``bubble_over_ideal`` (Megatron's
``t_pb / t_id``: bubble time over the ideal ``m·(t_f+t_b)``, ``(p-1)/m``; interleaved
``(p-1)/(v·m)``).

``predict_pipeline`` derives the per-stage times from the op graph of a plan: the layers are
the iterations of a layer scan and of the backward scan that reads its residuals
(``cost/remat.layer_scans``), each costed node by node with the roofline and alpha-beta
model on the plan's per-device layouts (the stage axis taken out: each stage's devices run
the whole microbatch), plus, under a remat policy, the forward equations the backward
recomputes (``cost/remat.recomputed_nodes``); the rest of the graph (embedding, head,
optimizer update) is charged once, outside the pipeline. A microbatch's time is the full
batch's over ``m`` (flops and activation bytes scale with the batch; the weight reads do
not, so small microbatches are priced optimistically).

The compiled program (``plan/pipeline.py``) runs every schedule as the same SPMD GPipe loop:
1F1B and interleaved are priced, not executed (``docs/design/pipeline.md``, "Limits").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from shardlab.parallel.cost import layouts as L
from shardlab.parallel.cost.compilers import held_graph
from shardlab.parallel.cost.predict import layout_cost
from shardlab.parallel.cost.profiles import DeviceProfile, resolve_profile, wire_bytes
from shardlab.parallel.cost.propagate import Propagation
from shardlab.parallel.cost.remat import LayerScan, layer_scans, recomputed_nodes
from shardlab.parallel.errors import SearchError
from shardlab.parallel.graph.opgraph import OpGraph
from shardlab.parallel.records import (
    PIPELINE_SCHEDULES,
    Collective,
    CostBreakdown,
    DeviceMemoryEstimate,
    PipelineSpec,
    _Record,
)


@dataclasses.dataclass(frozen=True)
class StageEvent(_Record):
    """One interval on a stage's lane (seconds from the start of the pipelined part).

    ``kind``: ``forward``, ``backward``, ``send`` (a transfer to the next/previous stage,
    exposed) or ``idle`` (a bubble); ``microbatch`` -1 for idle gaps; ``chunk``: the model
    chunk (virtual stage ``chunk · p + stage``) of an interleaved schedule, else 0."""

    stage: int
    kind: str
    microbatch: int
    start: float
    end: float
    chunk: int = 0


@dataclasses.dataclass(frozen=True)
class ScheduleResult(_Record):
    """A simulated pipeline schedule.

    Attributes:
        schedule: ``gpipe``, ``1f1b`` or ``interleaved``.
        stages: p.
        microbatches: m.
        step_time: seconds from the first forward to the last backward.
        busy: per stage, seconds computing (forward + backward, all its chunks).
        sending: per stage, seconds of exposed transfers.
        bubble_share_of_step: MaxText / GPipe definition, idle share of the step
            (``1 - Σ busy / (p · step)``).
        bubble_over_ideal: Megatron definition, ``(step - ideal) / ideal`` with ideal
            ``m · max_s (t_f + t_b)`` (a stage's chunks summed).
        bubble_share_of_step_formula: ``(p-1)/(v·m+p-1)`` (v = 1 but for interleaved).
        bubble_over_ideal_formula: ``(p-1)/(v·m)``.
        in_flight: per stage, the most microbatches whose forward ran and backward did not
            (m for GPipe, p - s for 1F1B; interleaved: counted per model chunk, each
            holding 1/v of the stage's layers).
        events: per stage, its forward/backward/send events and idle gaps, in time order.
        virtual_stages: v, the model chunks per stage (1 but for interleaved).
    """

    schedule: str
    stages: int
    microbatches: int
    step_time: float
    busy: tuple[float, ...]
    sending: tuple[float, ...]
    bubble_share_of_step: float
    bubble_over_ideal: float
    bubble_share_of_step_formula: float
    bubble_over_ideal_formula: float
    in_flight: tuple[int, ...]
    events: tuple[StageEvent, ...]
    virtual_stages: int = 1

    @property
    def peak_in_flight(self) -> int:
        return max(self.in_flight)


Work = tuple[str, int, int]  # (kind "F" or "B", microbatch, chunk)


def _orders(schedule: str, p: int, m: int, v: int = 1) -> list[list[Work]]:
    """Per stage, its forwards and backwards in the order it runs them."""
    if schedule == "gpipe":
        return [[("F", j, 0) for j in range(m)] + [("B", j, 0) for j in range(m)] for _ in range(p)]
    if schedule == "interleaved" and v > 1:
        return [_interleaved_order(p, v, m, s) for s in range(p)]
    out = []
    for s in range(p):
        warm = min(p - s - 1, m)
        order: list[Work] = [("F", j, 0) for j in range(warm)]
        f, b = warm, 0
        while f < m:
            order += [("F", f, 0), ("B", b, 0)]
            f, b = f + 1, b + 1
        order += [("B", j, 0) for j in range(b, m)]
        out.append(order)
    return out


def _interleaved_order(p: int, v: int, m: int, s: int) -> list[Work]:
    """Stage ``s``'s order under Megatron's interleaved 1F1B (Megatron-LM
    ``forward_backward_pipelining_with_interleaving``): the k-th forward runs chunk
    ``(k mod pv) // p`` of microbatch ``(k // pv)·p + k mod p`` (p microbatches through one
    chunk, then the next chunk), the k-th backward the same microbatch through chunk
    ``v - 1 - (k mod pv) // p``; ``2(p-s-1) + (v-1)p`` warm-up forwards, then one forward
    one backward, then the remaining backwards."""

    def unit(kind: str, k: int) -> Work:
        group, r = divmod(k, p * v)
        chunk = r // p if kind == "F" else v - 1 - r // p
        return (kind, group * p + r % p, chunk)

    total = m * v
    warm = min(total, 2 * (p - s - 1) + (v - 1) * p)
    order = [unit("F", k) for k in range(warm)]
    for k in range(total - warm):
        order += [unit("F", warm + k), unit("B", k)]
    order += [unit("B", k) for k in range(total - warm, total)]
    return order


def _check_schedule(schedule: str, virtual_stages: int) -> None:
    if schedule not in PIPELINE_SCHEDULES:
        raise SearchError(
            f"unknown pipeline schedule {schedule!r}: use one of "
            f"{', '.join(map(repr, PIPELINE_SCHEDULES))}"
        )
    if isinstance(virtual_stages, bool) or not isinstance(virtual_stages, int):
        raise SearchError(f"virtual_stages={virtual_stages!r}: a whole number, 1 or more")
    if virtual_stages < 1:
        raise SearchError(f"virtual_stages={virtual_stages}: use 1 or more model chunks per stage")
    if virtual_stages > 1 and schedule != "interleaved":
        raise SearchError(
            f"virtual_stages={virtual_stages} is for schedule='interleaved' (got "
            f"{schedule!r}); use schedule='interleaved' or virtual_stages=1"
        )


def simulate(
    forward: Sequence[float],
    backward: Sequence[float],
    microbatches: int,
    *,
    schedule: str = "gpipe",
    transfer: Sequence[float] | float = 0.0,
    virtual_stages: int = 1,
) -> ScheduleResult:
    """Simulate one step's pipelined part.

    Args:
        forward: per virtual stage (``p · v`` values in pipeline order: virtual stage
            ``k = c · p + s`` is chunk c on stage s; per stage when ``v = 1``), seconds of
            one microbatch's forward.
        backward: the same for one microbatch's backward (0 for inference).
        microbatches: m.
        schedule: ``gpipe``, ``1f1b`` or ``interleaved``.
        transfer: per virtual-stage boundary k → k+1 (``p·v - 1`` values, or one for all),
            seconds of one microbatch's activation transfer (and of its gradient back).
        virtual_stages: v, model chunks per stage (``interleaved`` only).

    Raises:
        SearchError: an unknown schedule, m < 1, v < 1 or v > 1 with another schedule, or
            lengths that do not match.
    """
    _check_schedule(schedule, virtual_stages)
    v, m = virtual_stages, int(microbatches)
    if m < 1 or not forward or len(forward) % v or len(backward) != len(forward):
        raise SearchError(
            f"a pipeline needs m >= 1 microbatches ({m}) and one forward and backward time "
            f"per virtual stage, stages × virtual_stages={v} of each ({len(forward)} "
            f"forward, {len(backward)} backward)"
        )
    n = len(forward)  # virtual stages
    p = n // v
    xfer = (
        [float(transfer)] * max(0, n - 1) if isinstance(transfer, (int, float)) else list(transfer)
    )
    if len(xfer) != n - 1:
        raise SearchError(f"transfer: {len(xfer)} values for {n - 1} stage boundaries")
    has_backward = any(b > 0 for b in backward)
    orders = _orders(schedule, p, m, v)
    if not has_backward:
        orders = [[w for w in o if w[0] == "F"] for o in orders]
    done: dict[tuple[str, int, int], float] = {}  # (kind, virtual stage, mb) -> end incl. send
    clock = [0.0] * p
    pos = [0] * p
    events: list[StageEvent] = []
    sending = [0.0] * p
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            while pos[s] < len(orders[s]):
                kind, j, c = orders[s][pos[s]]
                k = c * p + s
                if kind == "F":
                    dep = ("F", k - 1, j) if k > 0 else None
                else:
                    dep = ("B", k + 1, j) if k < n - 1 else ("F", k, j)
                if dep is not None and dep not in done:
                    break
                start = max(clock[s], done[dep] if dep is not None else 0.0)
                seconds = forward[k] if kind == "F" else backward[k]
                end = start + seconds
                name = "forward" if kind == "F" else "backward"
                events.append(StageEvent(s, name, j, start, end, c))
                # The transfer to the next virtual stage (forward) or the previous one
                # (backward): on the stage ring, the last stage's chunk c feeds stage 0's c+1.
                target = k + 1 if kind == "F" else k - 1
                if 0 <= target < n:
                    t = xfer[min(k, target)]
                    if t > 0:
                        events.append(StageEvent(s, "send", j, end, end + t, c))
                        sending[s] += t
                        end += t
                done[(kind, k, j)] = end
                clock[s] = end
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - the orders above never deadlock
            raise RuntimeError("pipeline schedule deadlocked")
    step = max(clock)
    per_stage = [
        sum(forward[c * p + s] + (backward[c * p + s] if has_backward else 0.0) for c in range(v))
        for s in range(p)
    ]
    busy = [m * t for t in per_stage]
    lanes: list[StageEvent] = []
    in_flight = []
    for s in range(p):
        mine = sorted((e for e in events if e.stage == s), key=lambda e: e.start)
        t = 0.0
        for e in mine:
            if e.start > t + 1e-15:
                lanes.append(StageEvent(s, "idle", -1, t, e.start))
            lanes.append(e)
            t = e.end
        if step > t + 1e-15:
            lanes.append(StageEvent(s, "idle", -1, t, step))
        live = peak = 0
        for e in mine:
            if e.kind == "forward":
                live += 1
                peak = max(peak, live)
            elif e.kind == "backward":
                live -= 1
        in_flight.append(peak if has_backward else 1)
    ideal = m * max(per_stage)
    return ScheduleResult(
        schedule=schedule,
        stages=p,
        microbatches=m,
        step_time=step,
        busy=tuple(busy),
        sending=tuple(sending),
        bubble_share_of_step=1.0 - sum(busy) / (p * step) if step > 0 else 0.0,
        bubble_over_ideal=(step - ideal) / ideal if ideal > 0 else 0.0,
        bubble_share_of_step_formula=(p - 1) / (v * m + p - 1),
        bubble_over_ideal_formula=(p - 1) / (v * m),
        in_flight=tuple(in_flight),
        events=tuple(lanes),
        virtual_stages=v,
    )


@dataclasses.dataclass(frozen=True)
class LayerTimes(_Record):
    """Per layer of a layer scan, from the op graph (full batch, per device, stage axis out).

    Attributes:
        forward: per layer, seconds of its forward (roofline + the collectives it needs).
        backward: per layer, seconds of its backward (0 without a backward scan), the
            recompute of a remat policy included.
        residual_bytes: per layer, per-device bytes its forward keeps for the backward
            (the forward scan's stacked outputs the backward scan reads).
        activation_bytes: per-device bytes of the activation passed between layers (the
            scan's carry), full batch.
        carry_batch_dim_split: devices the carry's leading (batch) dimension is split over.
        outside: seconds of everything else (prologue, epilogue, optimizer), run once.
        outside_collectives: the collectives of that part.
        layer_collectives: per layer, the collectives inside it (forward and backward).
        scan: the forward layer scan's group index (``OpGraph.scan_groups``).
        backward_scan: the backward scan's group index, or -1.
        recompute: per layer, the seconds of the forward equations the backward recomputes
            under the remat policy (their roofline and their collectives; part of
            ``backward``); empty without a policy.
    """

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    residual_bytes: tuple[int, ...]
    activation_bytes: int
    carry_batch_dim_split: int
    carry_rows: int
    outside: float
    outside_collectives: tuple[Collective, ...]
    layer_collectives: tuple[tuple[Collective, ...], ...]
    scan: int
    backward_scan: int
    recompute: tuple[float, ...] = ()

    @property
    def layers(self) -> int:
        return len(self.forward)


def _strip(lay: L.DimAxes, axis: str) -> L.DimAxes:
    return tuple(tuple(a for a in ax if a != axis) for ax in lay)


def _pick_scan(graph: OpGraph, scans: Sequence[int]) -> tuple[int, LayerScan | None]:
    pairs = layer_scans(graph)
    if scans:
        f = next((k for k in scans if not graph.scan_groups[k].reverse), scans[0])
        return f, pairs.get(f)
    if pairs:
        f = max(pairs, key=lambda k: graph.scan_groups[k].length)
        return f, pairs[f]
    forward = [k for k, g in enumerate(graph.scan_groups) if g.length > 1 and not g.reverse]
    if not forward:
        raise SearchError(
            "the function has no repeated layer scan to cut into pipeline stages (no "
            "lax.scan over stacked layers was found in its graph); write the repeated "
            "blocks as jax.lax.scan over stacked parameters, or use pipeline=False"
        )
    f = max(
        forward, key=lambda k: graph.scan_groups[k].length * len(graph.scan_groups[k].body.nodes)
    )
    return f, None


def layer_times(
    graph: OpGraph,
    input_layouts: Sequence[L.DimAxes],
    sizes: Mapping[str, int],
    profile: DeviceProfile,
    *,
    axis: str = "stage",
    scans: Sequence[int] = (),
    policy: str = "none",
    output_layouts: Sequence[L.DimAxes | None] | None = None,
    constraints: Mapping[int, L.DimAxes] | None = None,
) -> tuple[LayerTimes, CostBreakdown]:
    """Per-layer times and bytes of ``graph``'s layer scan under ``input_layouts`` with the
    stage ``axis`` taken out (``policy``: the remat policy deciding the residuals kept and
    the forward equations each layer's backward recomputes, priced as the forward's own:
    ``cost/remat.recomputed_nodes``, collectives included, as a recomputed Megatron
    forward repeats its all-reduces; ``constraints``: ``{variable: layout}`` inside the
    function, a plan's, e.g. ZeRO-3's per-layer gathers).

    Returns the layer times and the unpipelined ``CostBreakdown`` of the same layouts."""
    ins = [_strip(lay, axis) for lay in input_layouts]
    outs = (
        None
        if output_layouts is None
        else [None if o is None else _strip(o, axis) for o in output_layouts]
    )
    inside = None if not constraints else {v: _strip(lay, axis) for v, lay in constraints.items()}
    cost, prop = layout_cost(graph, ins, sizes, profile, constraints=inside, output_layouts=outs)
    f, pair = _pick_scan(graph, scans)
    fwd = graph.scan_groups[f]
    b = pair.backward if pair is not None else -1
    n = fwd.length
    t_f, t_b = [0.0] * n, [0.0] * n
    coll: list[list[Collective]] = [[] for _ in range(n)]
    outside = 0.0
    out_coll: list[Collective] = []
    covered = 0
    for index, first, last, seconds in prop.spans:
        node = graph.nodes[index]
        here = prop.collectives[first:last]
        comm = sum(profile.time_of(c) for c in here)
        origin = node.origin
        if origin is not None and origin[0] == f:
            layer = n - 1 - origin[1] if fwd.reverse else origin[1]
            t_f[layer] += seconds + comm
            coll[layer].extend(here)
        elif origin is not None and origin[0] == b:
            bg = graph.scan_groups[b]
            layer = bg.length - 1 - origin[1] if bg.reverse else origin[1]
            t_b[layer] += seconds + comm
            coll[layer].extend(here)
        else:
            outside += seconds + comm
            out_coll.extend(here)
        covered = last
    tail = prop.collectives[covered:]
    outside += sum(profile.time_of(c) for c in tail)
    out_coll.extend(tail)
    recompute = [0.0] * n
    if pair is not None and policy != "none" and b >= 0:
        node_seconds = {
            index: seconds + sum(profile.time_of(c) for c in prop.collectives[first:last])
            for index, first, last, seconds in prop.spans
        }
        again = recomputed_nodes(fwd, pair, policy)
        for i, start in enumerate(fwd.iteration_starts):
            layer = n - 1 - i if fwd.reverse else i
            recompute[layer] = sum(node_seconds.get(start + k, 0.0) for k in again)
            t_b[layer] += recompute[layer]
    residual = [0] * n
    if pair is not None:
        kept = pair.kept(policy)
        ys = fwd.outputs[fwd.num_carry :]
        for k in kept:
            v = ys[k]
            per = _local(graph, prop, v, sizes) // n
            residual = [r + per for r in residual]
    carry = fwd.outputs[0] if fwd.num_carry else fwd.outputs[-1]
    lay = prop.layouts[carry] or L.replicated(len(graph.shapes[carry]))
    split = math.prod(prop.sizes_or(sizes)[a] for a in lay[0]) if lay else 1
    rows = graph.shapes[carry][0] if graph.shapes[carry] else 1
    times = LayerTimes(
        forward=tuple(t_f),
        backward=tuple(t_b),
        residual_bytes=tuple(residual),
        activation_bytes=_local(graph, prop, carry, sizes),
        carry_batch_dim_split=split,
        carry_rows=rows,
        outside=outside,
        outside_collectives=tuple(out_coll),
        layer_collectives=tuple(tuple(c) for c in coll),
        scan=f,
        backward_scan=b,
        recompute=tuple(recompute) if any(recompute) else (),
    )
    return times, cost


def _local(graph: OpGraph, prop: Propagation, v: int, sizes: Mapping[str, int]) -> int:
    lay = prop.layouts[v] or L.replicated(len(graph.shapes[v]))
    return L.local_bytes(graph.nbytes(v), lay, prop.sizes_or(sizes))


def microbatch_bytes(times: LayerTimes, m: int) -> int:
    """Per-device bytes of one microbatch's activation (what one stage sends the next): the
    carry's rows over ``m``, split over the carry's batch axes while they divide (a one-row
    microbatch no longer splits over a data axis)."""
    rows, split = times.carry_rows, times.carry_batch_dim_split
    per_row_local = times.activation_bytes * split / max(1, rows)
    mb_rows = rows // m
    local_rows = mb_rows // split if split > 1 and mb_rows % split == 0 else mb_rows
    return round(local_rows * per_row_local)


@dataclasses.dataclass(frozen=True)
class PipelineCost(_Record):
    """``predict_pipeline``'s answer.

    Attributes:
        spec: the pipeline.
        schedule: the simulated schedule (per-stage lanes, bubbles, in-flight counts).
        stage_forward: per stage, seconds of one microbatch's forward (all its chunks).
        stage_backward: per stage, seconds of one microbatch's backward (all its chunks).
        layers_per_stage: the layers each stage runs, all its chunks (equal: the SPMD
            pipeline's layout).
        transfer_time: seconds of one stage-to-stage transfer (alpha-beta, stage axis).
        microbatch_bytes: per-device bytes of that transfer.
        permute_count: collective-permutes per step per device in the SPMD loop
            (``2 (m + p - 1)`` shifts for a train step, ``m + p - 1`` forward only, + 1 for
            the last stage's carry leaving the pipeline).
        permute_bytes: per-device bytes of those per step.
        in_flight_bytes: per device, the residuals the busiest stage holds at its peak: all
            ``m + p - 1`` iterations' of the SPMD loop, whose backward is the loop's
            autodiff — for 1F1B too, which runs in that loop (its own in-flight counts are
            in ``schedule.in_flight``).
        outside_time: seconds outside the pipeline (prologue/epilogue/optimizer, once).
        cost: a ``CostBreakdown`` comparable with unpipelined plans: ``time`` is the step
            (outside + pipelined step; ``compute_time`` includes the bubbles), memory the
            estimate with in-flight activations.
        notes: the assumptions.
    """

    spec: PipelineSpec
    schedule: ScheduleResult
    stage_forward: tuple[float, ...]
    stage_backward: tuple[float, ...]
    layers_per_stage: tuple[int, ...]
    transfer_time: float
    microbatch_bytes: int
    permute_count: int
    permute_bytes: int
    in_flight_bytes: int
    outside_time: float
    cost: CostBreakdown
    notes: tuple[str, ...] = ()

    @property
    def time(self) -> float:
        return self.cost.time


def _stacked_leaves(graph: OpGraph, times: LayerTimes) -> set[int]:
    """Graph-input positions of the layer-stacked leaves (the scan's ``xs`` read straight
    from the arguments, and every input leaf of the same shape: its optimizer state)."""
    fwd = graph.scan_groups[times.scan]
    xs = set(fwd.inputs[fwd.num_consts + fwd.num_carry :])
    shapes = {graph.shapes[v] for v in xs if v in set(graph.inputs)}
    return {
        i
        for i, v in enumerate(graph.inputs)
        if graph.shapes[v] in shapes and graph.shapes[v][:1] == (times.layers,)
    }


def _check_interleaving(
    spec: PipelineSpec, layers: int, rows: int, assignment: Sequence[int] | None
) -> int:
    """``spec.virtual_stages`` once valid for these layers and this batch."""
    v, p, m = spec.virtual_stages, spec.stages, spec.microbatches
    _check_schedule(spec.schedule, v)
    if v > 1 and assignment is None and p >= 1 and layers % (p * v):
        per_stage = layers // p if layers % p == 0 else 0
        good = [d for d in divisors(per_stage) if d > 1] if per_stage else []
        hint = (
            f"use virtual_stages in {good}"
            if good
            else f"stages={p} does not divide them either; use stages in {divisors(layers)}"
        )
        raise SearchError(
            f"stages={p} × virtual_stages={v} = {p * v} does not divide the {layers} scanned "
            f"layers; {hint} (or pass assignment= with {p * v} layer counts)"
        )
    if v > 1 and p >= 1 and m % p:
        good = [d for d in divisors(rows) if d % p == 0]
        raise SearchError(
            f"microbatches={m}: Megatron's interleaved schedule needs a multiple of the "
            f"stages ({p}); use one of {good or [p]}"
            + ("" if good else f" (a batch of {rows} has none: change the batch)")
        )
    return v


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n``, ascending (the valid stage or microbatch counts)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def predict_pipeline(
    plan_or_binding: Any,
    spec: PipelineSpec,
    *,
    input_layouts: Sequence[L.DimAxes] | None = None,
    device: str | DeviceProfile | None = None,
    policy: str | None = None,
    assignment: Sequence[int] | None = None,
    layers: tuple[LayerTimes, CostBreakdown] | None = None,
) -> PipelineCost:
    """The cost of running ``plan_or_binding``'s step with ``spec``'s pipeline.

    Args:
        plan_or_binding: a ``Plan`` (its input layouts are used, its remat policy too) or a
            ``plan.binding.Binding`` (replicated layouts unless ``input_layouts``).
        spec: stages, microbatches, axis, schedule.
        input_layouts: per flat argument leaf, its layout (overrides the plan's).
        device: the device profile (default: the plan's, else by backend).
        policy: remat policy of the layer scan (default: the plan's, else ``none``).
        assignment: layers per stage (default: equal, ``layers / stages`` each); for
            ``interleaved``, per virtual stage ``k = c · stages + s`` (chunk c on stage s),
            ``stages × virtual_stages`` counts.
        layers: ``layer_times(...)`` of these layouts already computed (they do not depend
            on the stages, microbatches or schedule).

    Raises:
        SearchError: no layer scan, stages that do not divide the layers, microbatches that
            do not divide the batch, a mesh without ``spec.axis``; for ``interleaved``,
            stages × virtual_stages not dividing the layers, or microbatches not a
            multiple of the stages (Megatron's requirement).
    """
    binding = getattr(plan_or_binding, "binding", None) or plan_or_binding
    graph: OpGraph = binding.graph
    mesh = binding.mesh
    sizes = {str(k): int(v) for k, v in mesh.shape.items()}
    if spec.axis not in sizes:
        raise SearchError(
            f"pipeline axis {spec.axis!r} is not a mesh axis (axes: {list(sizes)}); make "
            f"the mesh with a stage axis, e.g. shardlab.mesh(stage={spec.stages}, ...)"
        )
    plan_cost = getattr(plan_or_binding, "cost", None)
    profile = resolve_profile(
        device if device is not None else getattr(plan_cost, "device", None), mesh
    )
    graph = held_graph(graph, profile.compiler)
    if input_layouts is None:
        specs = getattr(plan_or_binding, "input_specs", None)
        input_layouts = (
            list(specs)
            if specs is not None
            else [L.replicated(len(graph.shapes[v])) for v in graph.inputs]
        )
    remat = getattr(plan_or_binding, "remat", None)
    kept: str = policy or (remat.policy if remat is not None else "none")
    # A plan's constraints inside the function (ZeRO-3's per-layer gathers) price here too.
    inside = {
        graph.nodes[i].outputs[0]: lays[0]
        for i, _, lays in getattr(plan_or_binding, "constraints", ()) or ()
        if lays and lays[0]
    }
    times, flat = layers or layer_times(
        graph,
        input_layouts,
        sizes,
        profile,
        axis=spec.axis,
        scans=spec.scans,
        policy=kept,
        constraints=inside or None,
    )
    p, m, n = spec.stages, spec.microbatches, times.layers
    v = _check_interleaving(spec, n, times.carry_rows, assignment)
    if p < 1 or (assignment is None and n % p):
        good = divisors(n)
        raise SearchError(f"stages={p} does not divide the {n} scanned layers; use one of {good}")
    if m < 1 or times.carry_rows % m:
        rows = times.carry_rows
        good = divisors(rows)
        raise SearchError(
            f"microbatches={m} does not divide the batch of {rows}; use one of {good}"
        )
    # Per virtual stage k = c·p + s (chunk c on stage s; k = s without interleaving).
    virtual = list(assignment) if assignment is not None else [n // (p * v)] * (p * v)
    if len(virtual) != p * v or sum(virtual) != n or min(virtual) < 1:
        what = f"{p} stages" if v == 1 else f"{p} stages × {v} virtual stages = {p * v}"
        raise SearchError(f"assignment {virtual}: {what} positive layer counts summing to {n}")
    bounds = [sum(virtual[:k]) for k in range(p * v + 1)]
    fw_v = [sum(times.forward[bounds[k] : bounds[k + 1]]) / m for k in range(p * v)]
    bw_v = [sum(times.backward[bounds[k] : bounds[k + 1]]) / m for k in range(p * v)]
    counts = [sum(virtual[c * p + s] for c in range(v)) for s in range(p)]
    fw = tuple(sum(fw_v[c * p + s] for c in range(v)) for s in range(p))
    bw = tuple(sum(bw_v[c * p + s] for c in range(v)) for s in range(p))
    mb_bytes = microbatch_bytes(times, m)
    xfer = (
        profile.collective_time(
            "collective-permute", wire_bytes("collective-permute", mb_bytes, 2), 2, (spec.axis,)
        )
        if p > 1
        else 0.0
    )
    sim = simulate(fw_v, bw_v, m, schedule=spec.schedule, transfer=xfer, virtual_stages=v)
    train = any(t > 0 for t in times.backward)
    shifts = (2 if train else 1) * (m + p - 1) if p > 1 else 0
    exit_bytes = times.activation_bytes if p > 1 else 0
    permute_count = shifts + (1 if p > 1 else 0)
    permute_bytes = shifts * mb_bytes + exit_bytes
    # Memory: arguments/outputs with the stacked layers split over the stages, plus the
    # busiest stage's in-flight residuals, plus one microbatch's share of the rest.
    stacked = _stacked_leaves(graph, times)
    stacked_bytes = sum(
        L.local_bytes(graph.nbytes(graph.inputs[i]), _strip(input_layouts[i], spec.axis), sizes)
        for i in stacked
    )
    saved = stacked_bytes - stacked_bytes // p
    tied_out = saved  # updated parameters and state leave in the same split
    residual_total = sum(times.residual_bytes)
    # A microbatch too small to split over the carry's batch axes is held whole.
    whole = microbatch_bytes(times, m) / max(1, times.activation_bytes) * m
    stage_res = [
        int(
            sum(
                sum(times.residual_bytes[bounds[c * p + s] : bounds[c * p + s + 1]])
                for c in range(v)
            )
            / m
            * whole
        )
        for s in range(p)
    ]
    # The SPMD GPipe loop (plan/pipeline.py) differentiates m + p - 1 iterations, so its
    # backward keeps the residuals of every iteration, the bubbles' too. Every schedule runs
    # in that loop (1F1B's order is simulated for its bubble and in-flight counts, but one
    # SPMD program cannot interleave the two scans), so the memory is the loop's for all.
    held = [m + p - 1] * p if p > 1 and train else list(sim.in_flight)
    in_flight_bytes = max(c * r for c, r in zip(held, stage_res, strict=True))
    rest = int(max(0, flat.memory.activations - residual_total) / m * whole)
    params = max(0, flat.memory.parameters - saved)
    outs = max(0, flat.memory.outputs - tied_out)
    memory = DeviceMemoryEstimate(
        params, outs, in_flight_bytes + rest, params + outs + in_flight_bytes + rest
    )
    # One stage's layers' collectives (full-batch bytes: its m microbatches together).
    layer_coll = [c for layer in times.layer_collectives[: counts[0]] for c in layer]
    permutes = (
        [
            Collective(
                "collective-permute",
                mb_bytes,
                2,
                (spec.axis,),
                float(mb_bytes),
                op_name="pipeline shift",
                count=shifts,
            )
        ]
        if shifts
        else []
    )
    if p > 1:
        permutes.append(
            Collective(
                "collective-permute",
                exit_bytes,
                2,
                (spec.axis,),
                float(exit_bytes),
                op_name="pipeline exit",
            )
        )
    collectives = [*times.outside_collectives, *layer_coll, *permutes]
    exit_time = profile.time_of(permutes[-1]) if p > 1 else 0.0
    total = times.outside + sim.step_time + exit_time
    comm = sum(profile.time_of(c) for c in collectives)
    cost = CostBreakdown.from_collectives(
        collectives,
        profile,
        flops=flat.flops / p,
        compute_time=max(0.0, total - comm),
        memory=memory,
        warnings=flat.warnings,
    )
    notes = (
        f"layers = iterations of scan group {times.scan}"
        + (
            f" and backward scan {times.backward_scan}"
            if times.backward_scan >= 0
            else " (no backward scan)"
        ),
        f"a microbatch costs 1/{m} of the full batch's layer time; transfers exposed, "
        f"{xfer * 1e6:.2f} us each on {spec.axis!r}",
        *(
            [
                f"interleaved: {v} model chunks per stage, {sum(sim.sending) / max(xfer, 1e-30):.0f} "
                f"transfers simulated (priced only: the compiled program runs the SPMD GPipe "
                f"loop, whose collective-permutes are counted here)"
            ]
            if v > 1
            else []
        ),
        *(
            [f"recompute ({kept}) in the backward: {sum(times.recompute) * 1e3:.3f} ms"]
            if times.recompute
            else []
        ),
        f"outside the pipeline (run once): {times.outside * 1e3:.3f} ms",
    )
    return PipelineCost(
        spec=spec,
        schedule=sim,
        stage_forward=fw,
        stage_backward=bw,
        layers_per_stage=tuple(counts),
        transfer_time=xfer,
        microbatch_bytes=mb_bytes,
        permute_count=permute_count,
        permute_bytes=permute_bytes,
        in_flight_bytes=in_flight_bytes,
        outside_time=times.outside,
        cost=cost,
        notes=notes,
    )
