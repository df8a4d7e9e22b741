"""Which all-reduces XLA's all-reduce combiner merges, and the merged collectives.

XLA combines all-reduces that cannot depend on each other into one instruction: the bytes
add up and the latency is paid once. Every costing of a strategy (``predict``, the
baselines, a search's choice) merges its predicted all-reduces the same way, here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from shardlab.parallel.cost.profiles import wire_bytes
from shardlab.parallel.graph.opgraph import OpGraph
from shardlab.parallel.records import Collective

HEAVY = frozenset({"dot_general", "conv_general_dilated"})


def terminal_nodes(g: OpGraph, live: list[bool]) -> list[bool]:
    """Per node: live, and no matmul/convolution downstream (weight gradients, the loss, the
    optimizer update): the all-reduces such nodes need are mutually independent."""
    heavy_below = [False] * len(g.nodes)
    for node in reversed(g.nodes):
        if not live[node.index]:
            continue
        heavy_below[node.index] = any(
            g.nodes[c].primitive in HEAVY or heavy_below[c]
            for v in node.outputs
            for c in g.consumers(v)
            if live[c]
        )
    return [live[i] and not heavy_below[i] for i in range(len(g.nodes))]


def loop_of(g: OpGraph, node: int) -> tuple[int, int] | None:
    """``(scan group, iteration)`` of a node of an unrolled scan (``None`` outside scans or
    for ``node`` -1): the compiled program runs the scan as a loop, whose collectives XLA's
    combiner cannot merge across iterations or with those outside it."""
    if node < 0:
        return None
    origin = g.nodes[node].origin
    return None if origin is None else (origin[0], origin[1])


def post_order(g: OpGraph) -> dict[int, int]:
    """Per node, its position in a depth-first post order from the graph's outputs
    (``HloComputation::MakeInstructionPostOrder``, the order XLA's all-reduce combiner
    visits); nodes no output reads come after, in program order.

    Operands are visited last first. XLA:CPU combines after fusion, where an instruction's
    operands are no longer in the jaxpr's order; visiting the jaxpr's operands last first
    reproduces the compiled grouping where first-first did not (the PINN's grad-of-grad
    step: 13 combined all-reduces, as compiled, not 11; corpus communication within 5%
    123 -> 128 of 144 baselines, none worse: ``tools/corpus_fidelity.py``)."""
    pos: dict[int, int] = {}
    for out in g.outputs:
        root = g.producer(out)
        if root < 0 or root in pos:
            continue
        stack: list[tuple[int, int]] = [(root, 0)]
        seen = {root}
        while stack:
            i, k = stack.pop()
            inputs = g.nodes[i].inputs[::-1]
            while k < len(inputs):
                p = g.producer(inputs[k])
                k += 1
                if p >= 0 and p not in pos and p not in seen:
                    stack.append((i, k))
                    stack.append((p, 0))
                    seen.add(p)
                    break
            else:
                pos[i] = len(pos)
    for node in g.nodes:
        pos.setdefault(node.index, len(pos))
    return pos


def all_reduce_groups(
    g: OpGraph, collectives: Sequence[Collective], nodes: Sequence[int]
) -> list[tuple[int, tuple[str, ...]] | None]:
    """Per collective, the group XLA's all-reduce combiner would merge it into (``None``
    for other kinds). As the combiner does, walk the all-reduces in post order from the
    outputs (``post_order``, the order the combiner visits HLO instructions), per set of
    mesh axes: each joins the open group unless it depends on a member (its node is
    downstream of a reduced value in the group), which closes the group and opens the next.
    Only all-reduces over the same axes order each other: a Megatron layer's reductions over
    ``model`` between data-parallel gradients do not split them; a forward reduction the
    loss's backward reads (a load-balancing mean) closes its group before the gradients."""
    reducing: dict[tuple[str, ...], set[int]] = {}
    for c, n in zip(collectives, nodes, strict=True):
        if c.kind == "all-reduce" and n >= 0:
            reducing.setdefault(c.mesh_axes, set()).add(n)
    group_of: dict[tuple[tuple[str, ...], int], int] = {}
    order = post_order(g) if reducing else {}
    for axes, here in reducing.items():
        bit = {n: 1 << k for k, n in enumerate(sorted(here))}
        below = [0] * len(g.nodes)  # reduced values (as bits) each node's inputs descend from
        for node in g.nodes:
            deps = 0
            for v in node.inputs:
                p = g.producer(v)
                if p >= 0:
                    deps |= below[p] | bit.get(p, 0)
            below[node.index] = deps
        group, members = 0, 0
        for n in sorted(here, key=order.__getitem__):
            if below[n] & members:
                group, members = group + 1, 0
            members |= bit[n]
            group_of[(axes, n)] = group
    return [
        (group_of[(c.mesh_axes, n)], c.mesh_axes) if c.kind == "all-reduce" and n >= 0 else None
        for c, n in zip(collectives, nodes, strict=True)
    ]


def combine_all_reduces(
    g: OpGraph, collectives: Sequence[Collective], nodes: Sequence[int]
) -> list[Collective]:
    """Merge all-reduces that cannot depend on each other, as XLA's all-reduce combiner
    does (see ``all_reduce_groups``). One that runs in a loop body (``count`` > 1, e.g. the
    per-layer gradient of a scanned stack) merges only with those of the same body, per
    iteration: the combiner does not move collectives out of loops. In a graph with its scans
    unrolled, that is each iteration's all-reduces apart (``loop_of``)."""
    out: list[Collective] = []
    merged: dict[tuple[Any, ...], Collective] = {}
    groups = all_reduce_groups(g, collectives, nodes)
    for c, group, node in zip(collectives, groups, nodes, strict=True):
        if group is None:
            out.append(c)
            continue
        key = (*group, loop_of(g, node) if c.count == 1 else (node, c.count))
        old = merged.get(key)
        if old is None:
            merged[key] = c
            continue
        nbytes = old.bytes + c.bytes
        merged[key] = dataclasses.replace(
            old,
            bytes=nbytes,
            wire_bytes=wire_bytes("all-reduce", nbytes, old.group_size),
            operands=old.operands + c.operands,
        )
    return out + list(merged.values())
