"""``build_space``: the strategy space of a graph on a mesh (``space.py`` says what it is).

Inputs and live nodes become units with their candidates (``candidates.py``); chains of unary
elementwise nodes merge into their producer; then terminal all-reduces share their latency,
edges get their reshard matrices and updated outputs are tied to their inputs (``edges.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from shardlab.parallel.cost import layouts as L
from shardlab.parallel.cost.memory import liveness, moved
from shardlab.parallel.cost.profiles import DeviceProfile
from shardlab.parallel.graph.opgraph import OpGraph, live_nodes
from shardlab.parallel.graph.rules import rule_for
from shardlab.parallel.search.space.candidates import NO_RULE, Candidates, layout_axes, spec_text
from shardlab.parallel.search.space.edges import combine_terminal, edges_of, tie_outputs
from shardlab.parallel.search.space.space import Cand, Space, Unit, is_follower


def build_space(
    graph: OpGraph,
    sizes: Mapping[str, int],
    profile: DeviceProfile,
    *,
    fixed_inputs: Mapping[int, L.DimAxes] | None = None,
    ties: Mapping[int, int] | None = None,
) -> Space:
    """Units, candidates and edge matrices for ``graph`` on a mesh of ``sizes``.

    Args:
        graph: the op graph.
        sizes: ``{axis: size}``.
        profile: the device profile (alpha, bandwidth, peak flops).
        fixed_inputs: ``{input position: layout}`` the user fixed (annotations).
        ties: ``{output position: input position}``: outputs that must end in their input's
            layout (updated parameters and optimizer state).
    """
    live = live_nodes(graph)
    lv = liveness(graph, live)
    b = Candidates(graph, sizes, profile, lv)
    fixed_inputs = dict(fixed_inputs or {})
    units: list[Unit] = []
    unit_of_var: dict[int, tuple[int, int]] = {}
    used = {v for n in graph.nodes if live[n.index] for v in n.inputs} | set(graph.outputs)
    for pos, var in enumerate(graph.inputs):
        if var in unit_of_var or (var not in used and pos not in fixed_inputs):
            continue  # unused arguments stay replicated unless annotated
        cands = b.input_cands(var)
        fixed = pos in fixed_inputs
        if fixed:
            lay = fixed_inputs[pos]
            cands = [Cand(spec_text(lay), (lay,), (), 0.0, axis_of=layout_axes(lay, b.axes))]
        unit_of_var[var] = (len(units), 0)
        units.append(Unit(len(units), "input", (), (var,), (), cands, ("in", var), fixed))
    consumers = {v: graph.consumers(v) for v in range(len(graph.shapes))}
    outputs = set(graph.outputs)
    for node in graph.nodes:
        if not live[node.index]:
            continue
        follow = is_follower(node, graph)
        if follow is not None:
            var = node.inputs[follow]
            live_cons = [c for c in consumers[var] if live[c]]
            owner = unit_of_var.get(var)
            if (
                owner is not None
                and units[owner[0]].kind == "node"
                and len(units[owner[0]].outs) == 1
                and live_cons == [node.index]
                and var not in outputs
                and not units[owner[0]].fixed
            ):
                u = units[owner[0]]
                merged_key = ("merged", id(u.cands), b.signature(node))
                if merged_key not in b.cand_cache:
                    flops = rule_for(node, graph).flops
                    traffic = graph.nbytes(var) * moved(lv, b.graph_inputs, var, False)
                    traffic += graph.nbytes(node.outputs[0]) * moved(
                        lv, b.graph_inputs, node.outputs[0], False
                    )
                    new = []
                    for c in u.cands:
                        n = L.shard_count(c.outs[0], b.sizes)
                        extra = profile.op_time(flops / n, traffic / n)
                        new.append(
                            dataclasses.replace(c, cost=c.cost + extra, flops=c.flops + flops / n)
                        )
                    b.cand_cache[merged_key] = (NO_RULE, new)
                u.cands = b.cand_cache[merged_key][1]
                del unit_of_var[var]
                u.outs = (node.outputs[0],)
                u.nodes = (*u.nodes, node.index)
                u.signature = (u.signature, b.signature(node))
                unit_of_var[node.outputs[0]] = (u.index, 0)
                continue
        fixed = node.primitive in ("sharding_constraint", "reshard")
        if fixed:
            sharding = node.params.get("sharding", node.params.get("dst_sharding"))
            lay = L.from_spec(sharding, len(graph.shapes[node.outputs[0]]))
            cands = [Cand(spec_text(lay), (lay,), (lay,), 0.0, axis_of=layout_axes(lay, b.axes))]
        else:
            _, cands = b.node_cands(node)
            if not cands:  # no valid split at all: everything replicated
                outs = tuple(L.replicated(len(graph.shapes[v])) for v in node.outputs)
                ins = tuple(L.replicated(len(graph.shapes[v])) for v in node.inputs)
                cands = [Cand("repl", outs, ins, 0.0, axis_of=(-1,) * len(b.axes))]
        u = Unit(
            len(units),
            "node",
            (node.index,),
            tuple(node.outputs),
            tuple(node.inputs),
            cands,
            b.signature(node),
            fixed,
        )
        for k, v in enumerate(node.outputs):
            unit_of_var[v] = (u.index, k)
        units.append(u)
    combine_terminal(b, units, live)
    edges = edges_of(b, units, unit_of_var)
    space = Space(graph, b.sizes, profile, units, edges, unit_of_var, live, dict(ties or {}), lv)
    tie_outputs(b, space)
    return space
