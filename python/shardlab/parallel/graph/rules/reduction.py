"""Reductions, arg-reductions and scans along an axis (cumulative ops, sort, reverse,
top_k): sharding a summed dimension leaves partial sums; others keep their axis whole.
"""

from __future__ import annotations

import dataclasses

from shardlab.parallel.graph.opgraph import Node, OpGraph
from shardlab.parallel.graph.rules.base import (
    Factors,
    OpRule,
    RuleFn,
    elementwise,
    shape_of,
    size_of,
)


def _reduce(node: Node, g: OpGraph, *, summable: bool = True) -> OpRule:
    shp = shape_of(g, node.inputs[0])
    axes = set(node.params.get("axes", ()))
    f = Factors()
    dims = [f.new(s) for s in shp]
    reduced = {x for i in axes for x in dims[i]}
    out = tuple(d for i, d in enumerate(dims) if i not in axes)
    rule = OpRule((tuple(dims),), (out,) * len(node.outputs), tuple(f.sizes), flops=size_of(shp))
    if summable:
        return dataclasses.replace(rule, reduction=frozenset(reduced))
    return dataclasses.replace(rule, replicated=frozenset(reduced))


def _argreduce(node: Node, g: OpGraph) -> OpRule:
    node = dataclasses.replace(node, params={"axes": node.params.get("axes", ())})
    return _reduce(node, g, summable=False)


def _along_axis(node: Node, g: OpGraph, whole: set[int], flops: float = 1.0) -> OpRule:
    """Elementwise-like, except dimensions in ``whole`` must stay unsharded."""
    rule = elementwise(node, g, flops)
    keep = {x for i in whole for x in rule.results[0][i]}
    return dataclasses.replace(rule, replicated=frozenset(keep))


def _cumulative(node: Node, g: OpGraph) -> OpRule:
    return _along_axis(node, g, {node.params["axis"]})


def _sort(node: Node, g: OpGraph) -> OpRule:
    return _along_axis(node, g, {node.params["dimension"]})


def _rev(node: Node, g: OpGraph) -> OpRule:
    return _along_axis(node, g, set(node.params["dimensions"]), 0.0)


def _top_k(node: Node, g: OpGraph) -> OpRule:
    """``top_k`` along ``axis``: XLA's SPMD partitioner does not partition its ``TopK``
    custom call (checked against compiled HLO: a batch-sharded or sort-sharded operand is
    all-gathered first), so every operand dim stays whole; the results (values, indices)
    are computed whole on every device, so any layout of them is a local slice: fresh
    factors, as ``iota``'s."""
    ins, out = shape_of(g, node.inputs[0]), shape_of(g, node.outputs[0])
    f = Factors()
    dims = tuple(f.new(s) for s in ins)
    res = tuple(f.new(s) for s in out)
    return OpRule(
        (dims,),
        (res,) * len(node.outputs),
        tuple(f.sizes),
        replicated=frozenset(x for d in dims for x in d),
        flops=float(size_of(ins)),
    )


RULES: dict[str, RuleFn] = {
    **dict.fromkeys(
        "reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or reduce_xor".split(),
        _reduce,
    ),
    "argmax": _argreduce,
    "argmin": _argreduce,
    **dict.fromkeys(("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"), _cumulative),
    "sort": _sort,
    "rev": _rev,
    "top_k": _top_k,
}
