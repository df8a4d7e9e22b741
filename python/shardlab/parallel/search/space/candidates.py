"""Candidate strategies per unit: every way to give mesh axes to a node's factors.

``Candidates`` enumerates, per graph input and per node, the layouts a unit can produce and
the operand layouts each needs, with its own cost (compute from the roofline, plus the
all-reduce of partial sums). Candidate sets and reshard times are cached by structural
signature, so identical layers (repeated blocks) are enumerated once and reused.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from shardlab.parallel.cost import layouts as L
from shardlab.parallel.cost.memory import Liveness, moved, traffic
from shardlab.parallel.cost.profiles import DeviceProfile, wire_bytes
from shardlab.parallel.graph.opgraph import Node, OpGraph
from shardlab.parallel.graph.rules import OpRule, rule_for
from shardlab.parallel.search.space.space import Cand

# The node parameters that make two nodes of the same shapes behave alike (signature).
_SIG_PARAMS = (
    "dimension_numbers",
    "axes",
    "broadcast_dimensions",
    "permutation",
    "new_sizes",
    "dimensions",
    "padding_config",
    "dimension",
    "axis",
    "feature_group_count",
    "batch_group_count",
    "y",
    "window_strides",
    "padding",
    "lhs_dilation",
    "rhs_dilation",
)


class Candidates:
    """Candidate enumeration and reshard times for one graph, mesh and profile."""

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
        self.sig_cache: dict[int, Any] = {}  # node index -> structural signature

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
                self.collective_time(k, b, n, a)
                for k, b, n, a in L.reshard(src, dst, nbytes, self.sizes)
            )
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
            out.append(Cand(spec_text(lay), (lay,), (), 0.0, axis_of=self.axis_of(fa)))
        # Most-sharded first: where layouts tie on time, solvers (argmin: first) keep the
        # one that holds the least per device, as an input that arrives sharded would be.
        out.sort(key=lambda c: -L.shard_count(c.outs[0], self.sizes))
        self.cand_cache[("in", shape)] = (NO_RULE, out)
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
                self.g,
                self.lv,
                self.graph_inputs,
                node,
                [
                    L.local_bytes(self.g.nbytes(v), lay, self.sizes)
                    for v, lay in zip(node.inputs, ins, strict=True)
                ],
                [
                    L.local_bytes(self.g.nbytes(v), lay, self.sizes)
                    for v, lay in zip(node.outputs, outs, strict=True)
                ],
            )
            features = L.convolution_features(node, self.g.shapes, ins, outs, self.sizes)
            matmul = L.matmul_dims(node, self.g.shapes, ins, self.sizes)
            seconds = self.profile.op_time(
                rule.flops / used, nbytes, features=features, matmul=matmul
            )
            cost = seconds + comm
            label = _label(outs, ins, partial, node.inputs, self.g)
            key = (tuple(outs), ins)
            old = cands.get(key)
            if old is None or cost < old.cost:
                cands[key] = Cand(
                    label,
                    tuple(outs),
                    ins,
                    cost,
                    comm,
                    partial,
                    self.axis_of(fa),
                    rule.flops / used,
                )
        result = (rule, list(cands.values()))
        if sig is not None:
            self.cand_cache[sig] = result
        return result

    def signature(self, node: Node) -> Any:
        got = self.sig_cache.get(node.index, self)
        if got is self:
            got = self.sig_cache[node.index] = self._signature(node)
        return got

    def _signature(self, node: Node) -> Any:
        if node.subgraphs:
            return None
        params = []
        for k in _SIG_PARAMS:
            if k in node.params:
                params.append((k, repr(node.params[k])))
        g, lv, args = self.g, self.lv, self.graph_inputs
        ins = tuple(
            (
                g.shapes[v],
                g.dtypes[v],
                g.literal[v] is not None,
                moved(lv, args, v, g.literal[v] is not None),
            )
            for v in node.inputs
        )
        outs = tuple((g.shapes[v], g.dtypes[v], moved(lv, args, v, False)) for v in node.outputs)
        return (node.primitive, ins, outs, tuple(params))


NO_RULE = OpRule((), (), ())


def _label(outs, ins, partial, inputs, g: OpGraph) -> str:
    """``P(out) <- P(a) · P(b) [sum over axes]``: what a split means for the tensors."""
    if not any(a for lay in (*outs, *ins) for a in lay) and not partial:
        return "replicated"
    operands = " · ".join(
        spec_text(lay) for v, lay in zip(inputs, ins, strict=False) if g.shapes[v]
    )
    text = f"{spec_text(outs[0]) if outs else '()'} <- {operands or 'scalars'}"
    return text + (f" [sum over {'+'.join(partial)}]" if partial else "")


def layout_axes(lay: L.DimAxes, axes: Sequence[str]) -> tuple[int, ...]:
    where = {a: d for d, ax in enumerate(lay) for a in ax}
    return tuple(where.get(a, -1) for a in axes)


def spec_text(lay: L.DimAxes) -> str:
    parts = ["None" if not ax else repr(ax[0]) if len(ax) == 1 else repr(ax) for ax in lay]
    return "P(" + ", ".join(parts) + ")"
