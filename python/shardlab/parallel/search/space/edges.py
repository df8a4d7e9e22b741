"""Edges of the strategy space: reshard-cost matrices between units, output ties, and the
shared latency of independent terminal all-reduces (see ``space.py``; which all-reduces XLA
combines is ``cost/combine.py``)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from shardlab.parallel.cost import layouts as L
from shardlab.parallel.cost.combine import loop_of, terminal_nodes
from shardlab.parallel.search.space.candidates import Candidates
from shardlab.parallel.search.space.space import Cand, Edge, Space, Unit


def combine_terminal(b: Candidates, units: list[Unit], live: list[bool]) -> None:
    """All-reduces after the last matmul/conv of every path (weight gradients, the loss) are
    independent of each other, and XLA's all-reduce combiner merges them into one: such
    units pay the latency (alpha) of their all-reduce shared with the others."""
    terminal_node = terminal_nodes(b.g, live)
    terminal = [
        u
        for u in units
        if u.kind == "node"
        and all(terminal_node[i] for i in u.nodes)
        and any(c.partial for c in u.cands)
    ]
    together: dict[Any, int] = {}  # a scan iteration's all-reduces merge only with each other
    for u in terminal:
        key = loop_of(b.g, u.nodes[0])
        together[key] = together.get(key, 0) + 1
    adjusted: dict[tuple[int, int], list[Cand]] = {}
    for u in terminal:
        n = together[loop_of(b.g, u.nodes[0])]
        if n < 2:
            continue
        share = 1.0 - 1.0 / n
        u.terminal = True
        got = adjusted.get((id(u.cands), n))
        if got is None:
            got = []
            for c in u.cands:
                if c.partial:
                    group = math.prod(b.sizes[a] for a in c.partial)
                    # the latency a combined all-reduce pays once: a zero-byte one's time
                    saved = share * b.profile.collective_time(
                        "all-reduce", 0.0, group, tuple(c.partial)
                    )
                    c = dataclasses.replace(c, cost=c.cost - saved, comm=c.comm - saved)
                got.append(c)
            adjusted[(id(u.cands), n)] = got
        u.cands = got


def edges_of(
    b: Candidates, units: list[Unit], unit_of_var: dict[int, tuple[int, int]]
) -> list[Edge]:
    g = b.g
    edges: list[Edge] = []
    # Candidate lists are shared between units of the same signature (repeated layers), so
    # distinct layouts and whole edge matrices are cached by the lists' identity.
    layout_index: dict[tuple[int, int], tuple[list[L.DimAxes], np.ndarray]] = {}
    matrices: dict[tuple[int, int, int, int, int], np.ndarray | None] = {}

    def distinct(cands: list[Cand], pos: int, outs: bool) -> tuple[list[L.DimAxes], np.ndarray]:
        key = (id(cands), pos if outs else -1 - pos)
        got = layout_index.get(key)
        if got is None:
            lays: dict[L.DimAxes, int] = {}
            idx = [lays.setdefault(c.outs[pos] if outs else c.ins[pos], len(lays)) for c in cands]
            got = (list(lays), np.asarray(idx))
            layout_index[key] = got
        return got

    for u in units:
        for slot, var in enumerate(u.slots):
            owner = unit_of_var.get(var)
            if owner is None or not g.shapes[var]:
                continue  # literal, constant or scalar: free to lay out
            src, out_pos = owner
            nbytes = g.wire_nbytes(var)
            key = (id(units[src].cands), out_pos, id(u.cands), slot, nbytes)
            if key in matrices:
                matrix = matrices[key]
            else:
                src_lays, src_idx = distinct(units[src].cands, out_pos, True)
                dst_lays, dst_idx = distinct(u.cands, slot, False)
                small = np.array(
                    [[b.reshard_time(s, d, nbytes) for d in dst_lays] for s in src_lays]
                )
                matrix = small[np.ix_(src_idx, dst_idx)] if small.any() else None
                matrices[key] = matrix
            if matrix is not None:
                edges.append(Edge(src, out_pos, u.index, slot, var, matrix))
    return edges


def tie_outputs(b: Candidates, space: Space) -> None:
    """Outputs tied to an input end in that input's layout: an edge producer -> input unit."""
    g = space.graph
    for out_pos, in_pos in space.ties.items():
        var_out, var_in = g.outputs[out_pos], g.inputs[in_pos]
        src = space.unit_of_var.get(var_out)
        dst = space.unit_of_var.get(var_in)
        if src is None or dst is None or src[0] == dst[0]:
            continue
        su, du = space.units[src[0]], space.units[dst[0]]
        nbytes = g.wire_nbytes(var_out)
        matrix = np.array(
            [
                [b.reshard_time(cs.outs[src[1]], cd.outs[0], nbytes) for cd in du.cands]
                for cs in su.cands
            ]
        )
        if matrix.any():
            space.edges.append(Edge(src[0], src[1], dst[0], -1, var_out, matrix))
