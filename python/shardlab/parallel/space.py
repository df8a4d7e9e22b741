"""The strategy space the searches choose from: units, candidates and edge-cost matrices.

A *unit* is one decision: a graph input (its layout) or a node (which mesh axes go to which of
its factors, see ``rules.py``). Chains of unary elementwise nodes are merged into their
producer (they follow it anyway), so the searches see fewer units. Every candidate lists the
layout it produces for each variable of the unit and the layout it needs for each operand it
reads from another unit; its own cost is compute (flops / devices used / peak) plus the
all-reduce of partial sums. An *edge* is a variable read by another unit: its cost matrix is
the alpha-beta time of ``layouts.reshard`` from each producer candidate's layout to each
consumer candidate's. Costs are seconds, so they compare with compiled-collective time.

Candidate sets and reshard times are cached by structural signature, so identical layers
(repeated blocks) are enumerated once and reused.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shardlab.parallel import layouts as L
from shardlab.parallel.cost import DeviceProfile, wire_bytes
from shardlab.parallel.memory_model import Liveness, liveness, moved, traffic
from shardlab.parallel.opgraph import Node, OpGraph
from shardlab.parallel.propagate import live_nodes
from shardlab.parallel.rules import ELEMENTWISE, FREE, OpRule, rule_for

FOLLOWERS = ELEMENTWISE | FREE | {"copy", "copy_p"}
_SIG_PARAMS = (
    "dimension_numbers", "axes", "broadcast_dimensions", "permutation", "new_sizes", "dimensions",
    "padding_config", "dimension", "axis", "feature_group_count", "batch_group_count", "y",
    "window_strides", "padding", "lhs_dilation", "rhs_dilation",
)  # fmt: skip


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


class _Builder:
    def __init__(
        self, graph: OpGraph, sizes: Mapping[str, int], profile: DeviceProfile, lv: Liveness
    ):
        self.g = graph
        self.lv = lv
        self.graph_inputs = frozenset(graph.inputs)
        self.sizes = dict(sizes)
        self.axes = list(sizes)
        self.profile = profile
        self.reshard_cache: dict[tuple[L.DimAxes, L.DimAxes, int], float] = {}
        self.cand_cache: dict[Any, tuple[OpRule, list[Cand]]] = {}

    # -- costs ---------------------------------------------------------------------------
    def collective_time(self, kind: str, nbytes: int, group: int, axes: tuple[str, ...]):
        if group <= 1:
            return 0.0
        wire = wire_bytes(kind, nbytes, group)
        return self.profile.collective_time(kind, wire, group, axes)

    def reshard_time(self, src: L.DimAxes, dst: L.DimAxes, nbytes: int) -> float:
        if src == dst:
            return 0.0
        key = (src, dst, nbytes)
        got = self.reshard_cache.get(key)
        if got is None:
            got = sum(
                self.collective_time(k, b, n, a) for k, b, n, a in L.reshard(src, dst, nbytes,
                                                                              self.sizes)
            )  # fmt: skip
            self.reshard_cache[key] = got
        return got

    # -- candidates ----------------------------------------------------------------------
    def assignments(self, sizes: Sequence[int], whole: frozenset[int]):
        """Every way to give each mesh axis to one factor (or none), divisibility respected."""
        free = [f for f in range(len(sizes)) if f not in whole]
        for pick in itertools.product([None, *free], repeat=len(self.axes)):
            fa: dict[int, tuple[str, ...]] = {}
            for axis, f in zip(self.axes, pick, strict=True):
                if f is not None:
                    fa[f] = (*fa.get(f, ()), axis)
            if all(sizes[f] % math.prod(self.sizes[a] for a in ax) == 0 for f, ax in fa.items()):
                yield fa

    def axis_of(self, fa: Mapping[int, tuple[str, ...]]) -> tuple[int, ...]:
        where = {a: f for f, ax in fa.items() for a in ax}
        return tuple(where.get(a, -1) for a in self.axes)

    def input_cands(self, var: int) -> list[Cand]:
        shape = self.g.shapes[var]
        if ("in", shape) in self.cand_cache:
            return self.cand_cache[("in", shape)][1]
        dims = [(i,) if s > 1 else () for i, s in enumerate(shape)]
        out = []
        for fa in self.assignments(shape, frozenset(i for i, s in enumerate(shape) if s <= 1)):
            lay = L.from_factors(dims, fa, shape, self.sizes)
            out.append(Cand(_spec_text(lay), (lay,), (), 0.0, axis_of=self.axis_of(fa)))
        self.cand_cache[("in", shape)] = (_NO_RULE, out)
        return out

    def node_cands(self, node: Node) -> tuple[OpRule, list[Cand]]:
        sig = self.signature(node)
        if sig is not None and sig in self.cand_cache:
            return self.cand_cache[sig]
        rule = rule_for(node, self.g)
        cands: dict[tuple[Any, ...], Cand] = {}
        for fa in self.assignments(rule.factor_sizes, rule.replicated):
            outs = []
            ok = True
            for dims in rule.results:
                lay = L.from_factors(dims, fa, rule.factor_sizes, self.sizes)
                want = {a for d in dims for f in d for a in fa.get(f, ())}
                if {a for ax in lay for a in ax} != want:
                    ok = False  # a result would silently drop axes: not a valid split
                outs.append(lay)
            if not ok:
                continue
            ins = tuple(
                L.from_factors(dims, fa, rule.factor_sizes, self.sizes) for dims in rule.operands
            )
            partial = tuple(a for f in sorted(rule.reduction) for a in fa.get(f, ()))
            used = math.prod(self.sizes[a] for ax in fa.values() for a in ax)
            comm = 0.0
            if partial:
                group = math.prod(self.sizes[a] for a in partial)
                for v, lay in zip(node.outputs, outs, strict=True):
                    local = L.local_bytes(self.g.nbytes(v), lay, self.sizes)
                    comm += self.collective_time("all-reduce", local, group, partial)
            nbytes = traffic(
                self.g, self.lv, self.graph_inputs, node,
                [L.local_bytes(self.g.nbytes(v), lay, self.sizes)
                 for v, lay in zip(node.inputs, ins, strict=True)],
                [L.local_bytes(self.g.nbytes(v), lay, self.sizes)
                 for v, lay in zip(node.outputs, outs, strict=True)],
            )  # fmt: skip
            cost = self.profile.op_time(rule.flops / used, nbytes) + comm  # fmt: skip
            label = _label(outs, ins, partial, node.inputs, self.g)
            key = (tuple(outs), ins)
            old = cands.get(key)
            if old is None or cost < old.cost:
                cands[key] = Cand(label, tuple(outs), ins, cost, comm, partial, self.axis_of(fa),
                                  rule.flops / used)  # fmt: skip
        result = (rule, list(cands.values()))
        if sig is not None:
            self.cand_cache[sig] = result
        return result

    def signature(self, node: Node) -> Any:
        if node.subgraphs:
            return None
        params = []
        for k in _SIG_PARAMS:
            if k in node.params:
                params.append((k, repr(node.params[k])))
        g, lv, args = self.g, self.lv, self.graph_inputs
        ins = tuple(
            (g.shapes[v], g.dtypes[v], g.literal[v] is not None,
             moved(lv, args, v, g.literal[v] is not None))
            for v in node.inputs
        )  # fmt: skip
        outs = tuple((g.shapes[v], g.dtypes[v], moved(lv, args, v, False)) for v in node.outputs)
        return (node.primitive, ins, outs, tuple(params))


_NO_RULE = OpRule((), (), ())


def _label(outs, ins, partial, inputs, g: OpGraph) -> str:
    """``P(out) <- P(a) · P(b) [sum over axes]``: what a split means for the tensors."""
    if not any(a for lay in (*outs, *ins) for a in lay) and not partial:
        return "replicated"
    operands = " · ".join(_spec_text(lay) for v, lay in zip(inputs, ins, strict=False)
                          if g.shapes[v])  # fmt: skip
    text = f"{_spec_text(outs[0]) if outs else '()'} <- {operands or 'scalars'}"
    return text + (f" [sum over {'+'.join(partial)}]" if partial else "")


def _layout_axes(lay: L.DimAxes, axes: Sequence[str]) -> tuple[int, ...]:
    where = {a: d for d, ax in enumerate(lay) for a in ax}
    return tuple(where.get(a, -1) for a in axes)


def _spec_text(lay: L.DimAxes) -> str:
    parts = ["None" if not ax else repr(ax[0]) if len(ax) == 1 else repr(ax) for ax in lay]
    return "P(" + ", ".join(parts) + ")"


def _is_follower(node: Node, g: OpGraph) -> int | None:
    """The operand position a unary elementwise node follows, or None."""
    if node.primitive not in FOLLOWERS or len(node.outputs) != 1:
        return None
    out_shape = g.shapes[node.outputs[0]]
    big = [i for i, v in enumerate(node.inputs) if g.shapes[v]]
    if len(big) != 1 or g.shapes[node.inputs[big[0]]] != out_shape:
        return None
    return big[0]


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
    b = _Builder(graph, sizes, profile, lv)
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
            cands = [Cand(_spec_text(lay), (lay,), (), 0.0, axis_of=_layout_axes(lay, b.axes))]
        unit_of_var[var] = (len(units), 0)
        units.append(Unit(len(units), "input", (), (var,), (), cands, ("in", var), fixed))
    consumers = {v: graph.consumers(v) for v in range(len(graph.shapes))}
    outputs = set(graph.outputs)
    for node in graph.nodes:
        if not live[node.index]:
            continue
        follow = _is_follower(node, graph)
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
                        new.append(dataclasses.replace(c, cost=c.cost + extra,
                                                       flops=c.flops + flops / n))  # fmt: skip
                    b.cand_cache[merged_key] = (_NO_RULE, new)
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
            cands = [Cand(_spec_text(lay), (lay,), (lay,), 0.0, axis_of=_layout_axes(lay, b.axes))]
        else:
            _, cands = b.node_cands(node)
            if not cands:  # no valid split at all: everything replicated
                outs = tuple(L.replicated(len(graph.shapes[v])) for v in node.outputs)
                ins = tuple(L.replicated(len(graph.shapes[v])) for v in node.inputs)
                cands = [Cand("repl", outs, ins, 0.0, axis_of=(-1,) * len(b.axes))]
        u = Unit(len(units), "node", (node.index,), tuple(node.outputs), tuple(node.inputs),
                 cands, b.signature(node), fixed)  # fmt: skip
        for k, v in enumerate(node.outputs):
            unit_of_var[v] = (u.index, k)
        units.append(u)
    from shardlab.parallel.edges import combine_terminal, edges_of, tie_outputs

    combine_terminal(b, units, live)
    edges = edges_of(b, units, unit_of_var)
    space = Space(graph, b.sizes, profile, units, edges, unit_of_var, live, dict(ties or {}), lv)
    tie_outputs(b, space)
    return space
