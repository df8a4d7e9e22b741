"""The strategy space the searches choose from: units, candidates and edge-cost matrices.

A *unit* is one decision: a graph input (its layout) or a node (which mesh axes go to which of
its factors, see ``graph/rules/``). Chains of unary elementwise nodes are merged into their
producer (they follow it anyway), so the searches see fewer units. Every candidate lists the
layout it produces for each variable of the unit and the layout it needs for each operand it
reads from another unit; its own cost is compute (flops / devices used / peak) plus the
all-reduce of partial sums. An *edge* is a variable read by another unit: its cost matrix is
the alpha-beta time of ``layouts.reshard`` from each producer candidate's layout to each
consumer candidate's. Costs are seconds, so they compare with compiled-collective time.

Candidates are enumerated by ``candidates.py`` (cached by structural signature, so identical
layers are enumerated once), edges by ``edges.py``; ``build.py`` assembles the space.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardlab.parallel.cost import layouts as L
from shardlab.parallel.cost.profiles import DeviceProfile
from shardlab.parallel.graph.opgraph import Node, OpGraph
from shardlab.parallel.graph.rules import ELEMENTWISE, FREE

FOLLOWERS = ELEMENTWISE | FREE | {"copy", "copy_p"}


@dataclasses.dataclass(frozen=True)
class Cand:
    """One strategy of a unit.

    Attributes:
        label: human-readable split, e.g. ``"f0:data f2:model"`` or ``"P('data', None)"``.
        outs: per variable of ``Unit.outs``, the layout this candidate produces.
        ins: per operand slot of ``Unit.slots``, the layout this candidate needs.
        cost: own seconds (compute + partial-sum all-reduce).
        comm: the communication part of ``cost``.
        partial: mesh axes of pending partial sums of the node (reduced at the node).
        axis_of: per mesh axis, the factor (or input dimension) it splits; -1 for none.
        flops: per-device flops of the unit's operations.
    """

    label: str
    outs: tuple[L.DimAxes, ...]
    ins: tuple[L.DimAxes, ...]
    cost: float
    comm: float = 0.0
    partial: tuple[str, ...] = ()
    axis_of: tuple[int, ...] = ()
    flops: float = 0.0


@dataclasses.dataclass
class Unit:
    """One decision: a graph input or a (merged chain of) node(s)."""

    index: int
    kind: str  # "input" or "node"
    nodes: tuple[int, ...]
    outs: tuple[int, ...]
    slots: tuple[int, ...]
    cands: list[Cand]
    signature: Any = None
    fixed: bool = False
    terminal: bool = False


@dataclasses.dataclass
class Edge:
    """A variable produced by unit ``src`` (its ``src_out``-th) read by ``dst`` (slot)."""

    src: int
    src_out: int
    dst: int
    dst_slot: int
    var: int
    matrix: np.ndarray  # seconds, shape (len(src cands), len(dst cands))


@dataclasses.dataclass
class Space:
    """Units, edges and what the plan needs to map choices back to variables."""

    graph: OpGraph
    sizes: dict[str, int]
    profile: DeviceProfile
    units: list[Unit]
    edges: list[Edge]
    unit_of_var: dict[int, tuple[int, int]]  # var -> (unit, out index)
    live: list[bool]
    ties: dict[int, int]  # output position -> input position (updated state keeps its layout)
    liveness: Any = dataclasses.field(default=None, repr=False)  # memory_model.Liveness, lazily

    def incident(self) -> list[list[int]]:
        """Per unit, the indices of its edges."""
        out: list[list[int]] = [[] for _ in self.units]
        for i, e in enumerate(self.edges):
            out[e.src].append(i)
            out[e.dst].append(i)
        return out

    def total(self, choice: Sequence[int]) -> float:
        """Model seconds of an assignment (one candidate index per unit)."""
        own = sum(u.cands[choice[u.index]].cost for u in self.units)
        return own + sum(float(e.matrix[choice[e.src], choice[e.dst]]) for e in self.edges)

    def layouts(self, choice: Sequence[int]) -> dict[int, L.DimAxes]:
        """Per variable, the layout the assignment gives it."""
        out: dict[int, L.DimAxes] = {}
        for u in self.units:
            cand = u.cands[choice[u.index]]
            for v, lay in zip(u.outs, cand.outs, strict=True):
                out[v] = lay
        return out


def is_follower(node: Node, g: OpGraph) -> int | None:
    """The operand position a unary elementwise node follows, or None."""
    if node.primitive not in FOLLOWERS or len(node.outputs) != 1:
        return None
    out_shape = g.shapes[node.outputs[0]]
    big = [i for i, v in enumerate(node.inputs) if g.shapes[v]]
    if len(big) != 1 or g.shapes[node.inputs[big[0]]] != out_shape:
        return None
    return big[0]
