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


def all_reduce_groups(
    g: OpGraph, collectives: Sequence[Collective], nodes: Sequence[int]
) -> list[tuple[int, tuple[str, ...]] | None]:
    """Per collective, the group XLA's all-reduce combiner would merge it into (``None``
    for other kinds). Per set of mesh axes, an all-reduce's level is one more than the
    highest level upstream of the node it reduces, counting only all-reduces over the same
    axes: one that depends on another of its axes is a level above it, so all-reduces of one
    level over the same axes are independent (reductions over other axes in between, a
    Megatron layer's all-reduces over ``model`` between data-parallel gradients, do not
    order them)."""
    reducing: dict[tuple[str, ...], set[int]] = {}
    for c, n in zip(collectives, nodes, strict=True):
        if c.kind == "all-reduce" and n >= 0:
            reducing.setdefault(c.mesh_axes, set()).add(n)
    levels: dict[tuple[str, ...], list[int]] = {}
    for axes, here in reducing.items():
        level = [0] * len(g.nodes)
        for node in g.nodes:
            lvl = 0
            for v in node.inputs:
                p = g.producer(v)
                if p >= 0 and level[p] > lvl:
                    lvl = level[p]
            level[node.index] = lvl + (node.index in here)
        levels[axes] = level
    return [
        (levels[c.mesh_axes][n], c.mesh_axes) if c.kind == "all-reduce" and n >= 0 else None
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
            old, bytes=nbytes, wire_bytes=wire_bytes("all-reduce", nbytes, old.group_size)
        )
    return out + list(merged.values())
