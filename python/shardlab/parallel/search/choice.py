"""From a search's choice (one candidate per unit) to a ``Plan`` record.

The plan's ``CostBreakdown`` is the cost model's own account of the choice: the partial-sum
all-reduces of the chosen splits, the reshards on edges (one per variable and target layout,
as XLA's CSE does), compute per device, and per-device memory from the chosen layouts.
Constraints pin the choice for the partitioner: every op output that is not a unary
elementwise follower, and every operand the model reshards before an op.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

import numpy as np

from shardlab.parallel.cost import layouts as L
from shardlab.parallel.cost.combine import combine_all_reduces
from shardlab.parallel.cost.memory import (
    Liveness,
    device_memory,
    expansion_scratch,
    held_at_peak,
    liveness,
)
from shardlab.parallel.cost.predict import memory_estimate
from shardlab.parallel.cost.profiles import wire_bytes
from shardlab.parallel.cost.propagate import Propagation
from shardlab.parallel.graph.rules import RULES
from shardlab.parallel.plan.binding import Binding
from shardlab.parallel.plan.plan import Plan
from shardlab.parallel.records import Collective, CostBreakdown, DeviceMemoryEstimate, PlanRow
from shardlab.parallel.search.space.space import Space, is_follower


def var_layouts(space: Space, choice: list[int]) -> dict[int, L.DimAxes]:
    """Per variable (including inside merged chains), the layout the choice gives it."""
    g = space.graph
    out: dict[int, L.DimAxes] = {}
    for u in space.units:
        cand = u.cands[choice[u.index]]
        if len(u.nodes) > 1:
            for i in u.nodes:
                out[g.nodes[i].outputs[0]] = cand.outs[0]
        else:
            for v, lay in zip(u.outs, cand.outs, strict=True):
                out[v] = lay
    return out


def _memory_parts(space: Space, choice: list[int]):
    """Per-variable ``local``, ``extra`` (copies in other layouts), ``output_local``, and
    per-node ``transient`` bytes."""
    g, sizes = space.graph, space.sizes
    lays = var_layouts(space, choice)
    copies: dict[int, set[L.DimAxes]] = {}
    for e in space.edges:
        src = space.units[e.src].cands[choice[e.src]].outs[e.src_out]
        dst_c = space.units[e.dst].cands[choice[e.dst]]
        dst = dst_c.ins[e.dst_slot] if e.dst_slot >= 0 else dst_c.outs[0]
        if dst != src:
            copies.setdefault(e.var, set()).add(dst)
    final = {
        v: lays.get(g.inputs[space.ties[pos]])
        for pos, v in enumerate(g.outputs)
        if pos in space.ties
    }

    def local(v: int) -> int:
        lay = lays.get(v)
        return L.local_bytes(g.nbytes(v), lay or L.replicated(len(g.shapes[v])), sizes)

    def output_local(v: int) -> int:
        lay = final.get(v) or lays.get(v) or L.replicated(len(g.shapes[v]))
        return L.local_bytes(g.nbytes(v), lay, sizes)

    def extra(v: int) -> int:
        held = sum(L.local_bytes(g.nbytes(v), lay, sizes) for lay in copies.get(v, ()))
        if final.get(v) is not None and final[v] != lays.get(v):
            held += local(v)  # computed in another layout, resharded into its output buffer
        return held

    partial_bytes: dict[int, int] = {}
    for u in space.units:
        cand = u.cands[choice[u.index]]
        if cand.partial:
            node = g.nodes[u.nodes[0]]
            partial_bytes[node.index] = sum(
                L.local_bytes(g.nbytes(v), lay, sizes)
                for v, lay in zip(node.outputs, cand.outs, strict=False)
            )

    scratch = (
        expansion_scratch(g, local) if space.profile.compiler.expands_select_and_scatter else None
    )

    def transient(i: int) -> int:
        # the unreduced buffer of an all-reduced partial sum, and any expansion's scratch
        return partial_bytes.get(i, 0) + (scratch(i) if scratch else 0)

    return local, extra, output_local, transient


def plan_memory(space: Space, choice: list[int]) -> DeviceMemoryEstimate:
    """Per-device memory of a choice (``memory_model.device_memory``): arguments, outputs in
    their final layouts, and the peak of intermediates XLA gives a buffer, where a variable
    also holds one copy per other layout its consumers need (a gathered parameter, a
    resharded activation)."""
    local, extra, output_local, transient = _memory_parts(space, choice)
    return device_memory(
        space.graph,
        space.live,
        local,
        extra,
        output_local,
        lv=space_liveness(space),
        transient=transient,
    )


def peak_buffers(space: Space, choice: list[int]) -> frozenset[int]:
    """The buffers live at a choice's memory peak (``memory_model.held_at_peak``)."""
    local, extra, _, transient = _memory_parts(space, choice)
    return held_at_peak(
        space.graph, space.live, local, extra, lv=space_liveness(space), transient=transient
    )


def space_liveness(space: Space) -> Liveness:
    """``memory_model.liveness`` of the space's graph, computed once per space."""
    if space.liveness is None:
        space.liveness = liveness(space.graph, space.live)
    return space.liveness


def memory_of(space: Space, choice: list[int]) -> float:
    """Per-device peak memory (``plan_memory(...).peak``) of a choice."""
    return float(plan_memory(space, choice).peak)


def _priced_memory(
    space: Space, choice: list[int], colls: list[Collective], emitters: list[int]
) -> DeviceMemoryEstimate:
    """The plan's memory as ``predict`` prices a propagated strategy (``memory_estimate``:
    all-reduce spans, buffers XLA writes that the program does not name, outputs moved into
    their layouts), on the choice's layouts and collectives. The search's own rows
    (``plan_memory``) stay the coarser model its budgets use."""
    g, sizes = space.graph, space.sizes
    lays = var_layouts(space, choice)
    copies: dict[int, set[L.DimAxes]] = {}
    for e in space.edges:
        src = space.units[e.src].cands[choice[e.src]].outs[e.src_out]
        dst_c = space.units[e.dst].cands[choice[e.dst]]
        dst = dst_c.ins[e.dst_slot] if e.dst_slot >= 0 else dst_c.outs[0]
        if dst != src:
            copies.setdefault(e.var, set()).add(dst)
    layouts: list[L.DimAxes | None] = [lays.get(v) for v in range(len(g.shapes))]
    computed: dict[int, L.DimAxes] = {}
    for pos, v in enumerate(g.outputs):
        final = lays.get(g.inputs[space.ties[pos]]) if pos in space.ties else None
        now = lays.get(v) or L.replicated(len(g.shapes[v]))
        if final is not None and final != now:
            computed[v] = now
            copies.setdefault(v, set()).add(now)
            layouts[v] = final
    prop = Propagation(
        layouts,
        colls,
        0.0,
        [],
        list(space.live),
        collective_nodes=emitters,
        copies=copies,
        computed=computed,
    )
    return memory_estimate(g, prop, sizes, space.profile)


def cost_of(space: Space, choice: list[int]) -> CostBreakdown:
    """The cost model's ``CostBreakdown`` of a choice."""
    g, sizes, profile = space.graph, space.sizes, space.profile
    colls: list[Collective] = []
    emitters: list[int] = []

    def add(kind: str, nbytes: int, group: int, axes: tuple[str, ...], node: int) -> None:
        if group <= 1:
            return
        n = g.nodes[node] if node >= 0 else None
        emitters.append(node)
        colls.append(
            Collective(
                kind=kind,
                bytes=int(nbytes),
                group_size=int(group),
                mesh_axes=tuple(a for a in sizes if a in axes),
                wire_bytes=wire_bytes(kind, nbytes, group),
                op_name=n.primitive if n else "output",
                source=n.source if n else "",
            )
        )

    compute = flops = 0.0
    for u in space.units:
        cand = u.cands[choice[u.index]]
        compute += cand.cost - cand.comm
        flops += cand.flops
        if cand.partial:
            node = g.nodes[u.nodes[0]]
            group = math.prod(sizes[a] for a in cand.partial)
            for v, lay in zip(node.outputs, cand.outs, strict=False):
                nbytes = L.local_bytes(g.nbytes(v), lay, sizes)
                add("all-reduce", nbytes, group, cand.partial, node.index)
    seen: set[tuple[int, L.DimAxes]] = set()
    for e in space.edges:
        src_lay = space.units[e.src].cands[choice[e.src]].outs[e.src_out]
        dst_u = space.units[e.dst]
        dst_cand = dst_u.cands[choice[e.dst]]
        dst_lay = dst_cand.ins[e.dst_slot] if e.dst_slot >= 0 else dst_cand.outs[0]
        if src_lay == dst_lay or (e.var, dst_lay) in seen:
            continue
        seen.add((e.var, dst_lay))
        node = dst_u.nodes[0] if dst_u.nodes else -1
        for kind, nbytes, group, axes in L.reshard(src_lay, dst_lay, g.wire_nbytes(e.var), sizes):
            add(kind, nbytes, group, axes, node)
    memory = _priced_memory(space, choice, colls, emitters)
    colls = combine_all_reduces(g, colls, emitters)  # as XLA's all-reduce combiner does
    unknown = {
        g.nodes[u.nodes[0]].primitive
        for u in space.units
        if u.kind == "node"
        and g.nodes[u.nodes[0]].primitive not in RULES
        and g.nodes[u.nodes[0]].primitive not in ("sharding_constraint", "reshard")
    }
    warnings = tuple(
        f"no sharding rule for primitive {p!r} (control flow and unknown ops stay "
        "replicated; their bodies are not searched)"
        for p in sorted(unknown)
    )
    return CostBreakdown.from_collectives(
        colls,
        profile,
        flops=flops,
        compute_time=compute,
        memory=memory,
        warnings=warnings,
    )


def _rows(space: Space, choice: list[int], paths: list[str]) -> tuple[PlanRow, ...]:
    g = space.graph
    local = [np.array([c.cost for c in u.cands]) for u in space.units]
    for e in space.edges:
        local[e.dst] = local[e.dst] + e.matrix[choice[e.src]]
    pos_of_input = {v: i for i, v in enumerate(g.inputs)}
    rows = []
    for u in space.units:
        if len(u.cands) < 2:
            continue
        k = choice[u.index]
        order = [j for j in np.argsort(local[u.index], kind="stable") if j != k][:3]
        if u.kind == "input":
            op = "input"
            where = paths[pos_of_input[u.outs[0]]] if u.outs[0] in pos_of_input else ""
        else:
            op = "+".join(g.nodes[i].primitive for i in u.nodes)
            where = g.nodes[u.nodes[0]].source
        rows.append(
            PlanRow(
                op=op,
                where=where,
                chosen=u.cands[k].label,
                cost=float(local[u.index][k]),
                alternatives=tuple((u.cands[j].label, float(local[u.index][j])) for j in order),
            )
        )
    return tuple(rows)


def _constraints(space: Space, choice: list[int], lays: dict[int, L.DimAxes]):
    """The plan's constraints: per searched node, its outputs' layouts; per operand the
    choice reads in another layout, that layout (``operand_constraints``).

    A merged chain of unary elementwise followers (``is_follower``) takes its head's
    layout unconstrained, except its tail when a consumer reads it resharded: left open,
    XLA's propagation computes the chain in the consumer's more specific layout (a
    softmax's ``exp``, read split over the experts by the division, is computed split, so
    its sum over the experts becomes a partial sum and an all-reduce the plan did not
    price)."""
    g = space.graph
    resharded = set()
    for e in space.edges:
        src = space.units[e.src].cands[choice[e.src]].outs[e.src_out]
        dst_c = space.units[e.dst].cands[choice[e.dst]]
        if (dst_c.ins[e.dst_slot] if e.dst_slot >= 0 else dst_c.outs[0]) != src:
            resharded.add(e.var)
    outs = []
    for u in space.units:
        if u.kind != "node" or u.fixed:
            continue
        node = g.nodes[u.nodes[0]]
        if is_follower(node, g) is not None:
            continue
        specs = tuple(lays.get(v) if g.shapes[v] else None for v in node.outputs)
        if any(s is not None for s in specs):
            outs.append((node.index, node.primitive, specs))
        tail = g.nodes[u.nodes[-1]]
        if len(u.nodes) > 1 and tail.outputs[0] in resharded:
            outs.append((tail.index, tail.primitive, (lays.get(tail.outputs[0]),)))
    operands = []
    for u in space.units:
        if u.kind != "node" or u.fixed:
            continue
        cand = u.cands[choice[u.index]]
        node = g.nodes[u.nodes[0]]
        for pos, v in enumerate(u.slots):
            have = lays.get(v)
            if have is None or not g.shapes[v] or cand.ins[pos] == have:
                continue
            operands.append((node.index, pos, cand.ins[pos]))
    return tuple(outs), tuple(operands)


def make_plan(
    space: Space,
    choice: list[int],
    binding: Binding,
    *,
    method: str,
    optimal: bool | None,
    complete: bool,
    notes: list[str],
    memory_budget: float | None,
    start: float,
) -> Plan:
    """The ``Plan`` record of a choice."""
    g = space.graph
    lays = var_layouts(space, choice)
    ins = tuple(lays.get(v, L.replicated(len(g.shapes[v]))) for v in g.inputs)
    outs = []
    for pos, v in enumerate(g.outputs):
        if pos in space.ties:
            outs.append(ins[space.ties[pos]])
        else:
            outs.append(lays.get(v, L.replicated(len(g.shapes[v]))))
    constraints, operands = _constraints(space, choice, lays)
    cost = cost_of(space, choice)
    if memory_budget is not None and cost.memory.peak > memory_budget:
        notes.append(
            f"predicted {cost.memory.peak} B/device exceeds the budget {memory_budget:.0f} B"
        )
    plan = Plan.of_binding(
        binding,
        method=method,
        input_specs=ins,
        output_specs=outs,
        cost=cost,
        constraints=constraints,
        operand_constraints=operands,
        optimal=optimal,
        complete=complete,
        rows=_rows(space, choice, list(binding.traced.paths)),
        notes=tuple(notes),
        memory_budget=None if memory_budget is None else int(memory_budget),
    )
    return dataclasses.replace(plan, search_time=time.perf_counter() - start)


def choice_from_layouts(space: Space, layouts: Sequence[L.DimAxes | None]) -> list[int]:
    """The choice closest to per-variable ``layouts`` (e.g. a baseline's propagation): per
    unit, a candidate producing those layouts, needing as few operands resharded as possible,
    then the cheapest; a unit with no such candidate takes its cheapest."""
    g = space.graph

    def want(v: int) -> L.DimAxes:
        return layouts[v] or L.replicated(len(g.shapes[v]))

    choice = []
    for u in space.units:
        outs = tuple(want(v) for v in u.outs)

        def key(k: int, u=u, outs=outs) -> tuple[int, int, float]:
            c = u.cands[k]
            moved = sum(
                1 for v, lay in zip(u.slots, c.ins, strict=False) if g.shapes[v] and want(v) != lay
            )
            return (c.outs != outs, moved, c.cost)

        choice.append(min(range(len(u.cands)), key=key))
    return choice
