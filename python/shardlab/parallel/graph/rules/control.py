"""Rules of ``cond`` and ``while`` nodes, derived from their bodies.

A body is a graph of primitives with rules of their own; a dimension of the node's operands
and results can be sharded when, in every body (each ``cond`` branch; a ``while``'s cond and
body functions), it is linked to the dims it meets only by pass-through factors: chains of
factors that stay whole-dimension (size = dim size) and are neither summed over (a
reduction) nor kept whole (replicated) by any equation, and that never put two dims of one
value in the same chain. Such a chain is one factor of the node's rule; every other dim stays
whole. Sharding one therefore needs no communication inside the bodies. A ``while`` loop's
carry keeps one layout: operand, body input, body output and result of a carry share their
factors. Flops: the most expensive branch of a ``cond``; a ``while`` body once (its trip
count is unknown, as in ``cost/propagate.py``).

The rules need ``rule_for`` for the bodies' equations, so this module takes it as an
argument (``control_rules(rule_for)``; the registry in ``__init__.py`` passes its own).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from shardlab.parallel.graph.opgraph import Node, OpGraph, live_nodes
from shardlab.parallel.graph.rules.base import Dim, Factors, OpRule, RuleFn, shape_of

Key = tuple  # a position: ("in", operand, dim), ("out", result, dim), ("v", body, var, dim)


class _Links:
    """Union-find over dim positions, with positions that must stay whole."""

    def __init__(self) -> None:
        self.parent: dict[Key, Key] = {}
        self.size: dict[Key, int] = {}
        self.whole: set[Key] = set()

    def add(self, key: Key, size: int) -> Key:
        if key not in self.parent:
            self.parent[key] = key
            self.size[key] = size
        return key

    def find(self, key: Key) -> Key:
        root = key
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[key] != root:
            self.parent[key], key = root, self.parent[key]
        return root

    def union(self, a: Key, b: Key) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb

    def classes(self) -> dict[Key, list[Key]]:
        out: dict[Key, list[Key]] = {}
        for key in self.parent:
            out.setdefault(self.find(key), []).append(key)
        return out


def _walk_body(
    links: _Links,
    body: OpGraph,
    tag: int,
    boundary_in: Sequence[int | None],
    boundary_out: Sequence[Sequence[Key] | None],
    rule_for: Callable[[Node, OpGraph], OpRule],
) -> float:
    """Link the dims of one body's values through its equations; ``boundary_in[i]``: the
    node operand that body input ``i`` is (``None``: none); ``boundary_out[j]``: the node
    positions (operands or results) that body output ``j`` is. Returns the body's flops."""

    def pos(var: int, d: int) -> Key:
        return links.add(("v", tag, var, d), body.shapes[var][d])

    for i, var in enumerate(body.inputs):
        k = boundary_in[i] if i < len(boundary_in) else None
        for d, s in enumerate(body.shapes[var]):
            if s > 1 and k is not None:
                links.union(pos(var, d), links.add(("in", k, d), s))
    for j, var in enumerate(body.outputs):
        targets = boundary_out[j] if j < len(boundary_out) else None
        for d, s in enumerate(body.shapes[var]):
            if s > 1 and targets is not None:
                for t in targets:
                    links.union(pos(var, d), links.add((*t, d), s))
    flops = 0.0
    live = live_nodes(body)
    for node in body.nodes:
        if not live[node.index]:
            continue
        rule = rule_for(node, body)
        flops += rule.flops
        values = [(v, dims) for v, dims in zip(node.inputs, rule.operands, strict=True)]
        values += [(v, dims) for v, dims in zip(node.outputs, rule.results, strict=True)]
        bad_factors = set(rule.reduction) | set(rule.replicated)
        at: dict[int, list[Key]] = {}
        for v, dims in values:
            for d, (s, fs) in enumerate(zip(body.shapes[v], dims, strict=True)):
                if s <= 1:
                    continue
                key = pos(v, d)
                if not rule.known or len(fs) != 1 or rule.factor_sizes[fs[0]] != s:
                    links.whole.add(key)  # unsplit here, or merged / split into factors
                    bad_factors.update(fs)
                    continue
                at.setdefault(fs[0], []).append(key)
        for f, keys in at.items():
            for key in keys[1:]:
                links.union(keys[0], key)
            if f in bad_factors:
                links.whole.add(keys[0])
    return flops


def _rule(node: Node, g: OpGraph, links: _Links, flops: float) -> OpRule:
    """The node's rule from its linked positions: one factor per class that is shardable."""
    f = Factors()
    factor_of: dict[Key, Dim] = {}
    for root, members in links.classes().items():
        owners = [(m[0], m[1]) if m[0] != "v" else (m[1], m[2]) for m in members]
        ok = (
            not any(m in links.whole for m in members)
            and len({links.size[m] for m in members}) == 1
            and len(set(owners)) == len(owners)  # no value has two dims in one chain
        )
        if ok and any(m[0] != "v" for m in members):
            factor_of[root] = f.new(links.size[root])

    def dims(kind: str, k: int, var: int) -> tuple[Dim, ...]:
        out = []
        for d, s in enumerate(shape_of(g, var)):
            key = (kind, k, d)
            out.append(factor_of.get(links.find(key), ()) if s > 1 and key in links.parent else ())
        return tuple(out)

    operands = tuple(dims("in", k, v) for k, v in enumerate(node.inputs))
    results = tuple(dims("out", j, v) for j, v in enumerate(node.outputs))
    return OpRule(operands, results, tuple(f.sizes), flops=flops)


def control_rules(rule_for: Callable[[Node, OpGraph], OpRule]) -> dict[str, RuleFn]:
    """The ``cond`` and ``while`` rules, with ``rule_for`` for their bodies' equations."""

    def cond(node: Node, g: OpGraph) -> OpRule:
        links = _Links()
        n_ops = len(node.inputs) - 1
        outs = [[("out", j)] for j in range(len(node.outputs))]
        flops = 0.0
        for b, branch in enumerate(node.subgraphs):
            ins = [k + 1 for k in range(n_ops)]  # operand 0 is the branch index
            flops = max(flops, _walk_body(links, branch, b, ins, outs, rule_for))
        return _rule(node, g, links, flops)

    def while_(node: Node, g: OpGraph) -> OpRule:
        cond_graph, body = node.subgraphs
        cc = int(node.params.get("cond_nconsts", 0))
        bc = int(node.params.get("body_nconsts", 0))
        carry = list(range(cc + bc, len(node.inputs)))
        links = _Links()
        flops = _walk_body(links, cond_graph, 0, [*range(cc), *carry], [], rule_for)
        outs = [[("out", j), ("in", k)] for j, k in enumerate(carry)]
        flops += _walk_body(links, body, 1, [*range(cc, cc + bc), *carry], outs, rule_for)
        return _rule(node, g, links, flops)

    return {"cond": cond, "while": while_}
