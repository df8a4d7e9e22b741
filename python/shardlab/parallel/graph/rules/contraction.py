"""Contractions: ``dot_general`` and convolutions (sharding a contracted factor leaves
partial sums; a convolution's spatial dimensions stay whole: no halo exchange).
"""

from __future__ import annotations

import math

from shardlab.parallel.graph.opgraph import Node, OpGraph
from shardlab.parallel.graph.rules.base import Dim, Factors, OpRule, RuleFn, shape_of, size_of


def _dot_general(node: Node, g: OpGraph) -> OpRule:
    (lc, rc), (lb, rb) = node.params["dimension_numbers"]
    ls, rs = shape_of(g, node.inputs[0]), shape_of(g, node.inputs[1])
    f = Factors()
    lhs: list[Dim] = [()] * len(ls)
    rhs: list[Dim] = [()] * len(rs)
    out: list[Dim] = []
    for a, b in zip(lb, rb, strict=True):
        lhs[a] = rhs[b] = d = f.new(ls[a])
        out.append(d)
    reduction = set()
    for a, b in zip(lc, rc, strict=True):
        lhs[a] = rhs[b] = d = f.new(ls[a])
        reduction.update(d)
    for i, s in enumerate(ls):
        if i not in lc and i not in lb:
            lhs[i] = d = f.new(s)
            out.append(d)
    for i, s in enumerate(rs):
        if i not in rc and i not in rb:
            rhs[i] = d = f.new(s)
            out.append(d)
    contract = math.prod(ls[a] for a in lc)
    flops = 2.0 * size_of(shape_of(g, node.outputs[0])) * contract
    return OpRule(
        (tuple(lhs), tuple(rhs)), (tuple(out),), tuple(f.sizes), frozenset(reduction), flops=flops
    )


def _conv(node: Node, g: OpGraph) -> OpRule:
    dn = node.params["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    ls, rs, os_ = (
        shape_of(g, node.inputs[0]),
        shape_of(g, node.inputs[1]),
        shape_of(g, node.outputs[0]),
    )
    f = Factors()
    lhs: list[Dim] = [()] * len(ls)
    rhs: list[Dim] = [()] * len(rs)
    out: list[Dim] = [()] * len(os_)
    replicated: set[int] = set()
    reduction: set[int] = set()
    grouped = node.params.get("feature_group_count", 1) != 1
    grouped = grouped or node.params.get("batch_group_count", 1) != 1
    lhs[lhs_spec[0]] = out[out_spec[0]] = d = f.new(ls[lhs_spec[0]])  # batch
    if grouped:
        replicated.update(d)
    lhs[lhs_spec[1]] = rhs[rhs_spec[1]] = d = f.new(ls[lhs_spec[1]])  # input features
    (replicated if grouped else reduction).update(d)
    rhs[rhs_spec[0]] = out[out_spec[1]] = d = f.new(rs[rhs_spec[0]])  # output features
    if grouped:
        replicated.update(d)
    for a, b, c in zip(lhs_spec[2:], rhs_spec[2:], out_spec[2:], strict=True):
        lhs[a] = d = f.new(ls[a])  # spatial dims would need halo exchange: keep whole
        out[c] = e = f.new(os_[c])
        rhs[b] = k = f.new(rs[b])
        replicated.update(d + e + k)
    window = math.prod(rs[b] for b in rhs_spec[2:])
    flops = 2.0 * size_of(os_) * window * rs[rhs_spec[1]]
    return OpRule(
        (tuple(lhs), tuple(rhs)),
        (tuple(out),),
        tuple(f.sizes),
        frozenset(reduction),
        frozenset(replicated),
        flops,
    )


RULES: dict[str, RuleFn] = {
    "dot_general": _dot_general,
    "conv_general_dilated": _conv,
}
