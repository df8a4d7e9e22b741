"""Sharding rules per primitive, as data: which dimensions of which operands and results move
together ("factors"), which factors are summed over (a sharded one leaves partial sums) and
which must stay whole.

A rule is an ``OpRule``; a *strategy* for a node assigns mesh axes to its factors (see
``strategies.py``). This is the factor model of Shardy's ``OpShardingRule``: e.g. for
``dot_general`` the batch, lhs-free and rhs-free factors appear in the result; the contracting
factor does not, so sharding it needs an all-reduce (or reduce-scatter) of the result.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from shardlab.parallel.opgraph import Node, OpGraph

Dim = tuple[int, ...]  # the factors of one dimension, major first


@dataclasses.dataclass(frozen=True)
class OpRule:
    """How a node's operand and result dimensions map onto shared factors.

    Attributes:
        operands: per operand, per dimension, its factors.
        results: per result, per dimension, its factors.
        factor_sizes: size of each factor.
        reduction: factors summed over (absent from results): sharding one leaves the
            result a partial sum over those axes.
        replicated: factors that must not be sharded (the op needs the whole dimension).
        flops: compute of the whole (unsharded) op.
        known: False when the primitive has no rule (replicated in, replicated out).
    """

    operands: tuple[tuple[Dim, ...], ...]
    results: tuple[tuple[Dim, ...], ...]
    factor_sizes: tuple[int, ...]
    reduction: frozenset[int] = frozenset()
    replicated: frozenset[int] = frozenset()
    flops: float = 0.0
    known: bool = True


class _Factors:
    def __init__(self) -> None:
        self.sizes: list[int] = []

    def new(self, size: int) -> Dim:
        if size <= 1:
            return ()
        self.sizes.append(size)
        return (len(self.sizes) - 1,)


def _shape(g: OpGraph, var: int) -> tuple[int, ...]:
    return g.shapes[var]


def _size(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _elementwise(node: Node, g: OpGraph, flops_per_element: float = 1.0) -> OpRule:
    out = _shape(g, node.outputs[0])
    f = _Factors()
    dims = [f.new(s) for s in out]
    operands = []
    for v in node.inputs:
        shp = _shape(g, v)
        if len(shp) == len(out):
            operands.append(tuple(d if shp[i] == out[i] else () for i, d in enumerate(dims)))
        else:
            operands.append(tuple(() for _ in shp))
    results = tuple(tuple(dims) for _ in node.outputs)
    return OpRule(tuple(operands), results, tuple(f.sizes), flops=flops_per_element * _size(out))


def _free(node: Node, g: OpGraph) -> OpRule:
    return _elementwise(node, g, 0.0)


def _fallback(node: Node, g: OpGraph) -> OpRule:
    return OpRule(
        tuple(tuple(() for _ in _shape(g, v)) for v in node.inputs),
        tuple(tuple(() for _ in _shape(g, v)) for v in node.outputs),
        (),
        known=False,
    )


def _dot_general(node: Node, g: OpGraph) -> OpRule:
    (lc, rc), (lb, rb) = node.params["dimension_numbers"]
    ls, rs = _shape(g, node.inputs[0]), _shape(g, node.inputs[1])
    f = _Factors()
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
    flops = 2.0 * _size(_shape(g, node.outputs[0])) * contract
    return OpRule((tuple(lhs), tuple(rhs)), (tuple(out),), tuple(f.sizes), frozenset(reduction),
                  flops=flops)  # fmt: skip


def _reduce(node: Node, g: OpGraph, *, summable: bool = True) -> OpRule:
    shp = _shape(g, node.inputs[0])
    axes = set(node.params.get("axes", ()))
    f = _Factors()
    dims = [f.new(s) for s in shp]
    reduced = {x for i in axes for x in dims[i]}
    out = tuple(d for i, d in enumerate(dims) if i not in axes)
    rule = OpRule((tuple(dims),), (out,) * len(node.outputs), tuple(f.sizes), flops=_size(shp))
    if summable:
        return dataclasses.replace(rule, reduction=frozenset(reduced))
    return dataclasses.replace(rule, replicated=frozenset(reduced))


def _argreduce(node: Node, g: OpGraph) -> OpRule:
    node = dataclasses.replace(node, params={"axes": node.params.get("axes", ())})
    return _reduce(node, g, summable=False)


def _broadcast_in_dim(node: Node, g: OpGraph) -> OpRule:
    out = _shape(g, node.outputs[0])
    ins = _shape(g, node.inputs[0])
    f = _Factors()
    dims = [f.new(s) for s in out]
    bdims = node.params["broadcast_dimensions"]
    operand = tuple(dims[o] if ins[i] == out[o] else () for i, o in enumerate(bdims))
    extra = tuple(tuple(() for _ in _shape(g, v)) for v in node.inputs[1:])
    return OpRule((operand, *extra), (tuple(dims),), tuple(f.sizes))


def _transpose(node: Node, g: OpGraph) -> OpRule:
    ins = _shape(g, node.inputs[0])
    f = _Factors()
    dims = [f.new(s) for s in ins]
    perm = node.params["permutation"]
    return OpRule((tuple(dims),), (tuple(dims[p] for p in perm),), tuple(f.sizes),
                  flops=_size(ins))  # fmt: skip


def _reshape(node: Node, g: OpGraph) -> OpRule:
    ins, out = _shape(g, node.inputs[0]), _shape(g, node.outputs[0])
    f = _Factors()
    in_dims: list[Dim] = [()] * len(ins)
    out_dims: list[Dim] = [()] * len(out)
    replicated: set[int] = set()
    i = j = 0
    while i < len(ins) or j < len(out):
        if i < len(ins) and ins[i] == 1:
            i += 1
            continue
        if j < len(out) and out[j] == 1:
            j += 1
            continue
        if i >= len(ins) or j >= len(out):
            break
        gi, gj = [i], [j]
        pi, pj = ins[i], out[j]
        while pi != pj:
            if pi < pj:
                i += 1
                gi.append(i)
                pi *= ins[i]
            else:
                j += 1
                gj.append(j)
                pj *= out[j]
        gi = [k for k in gi if ins[k] != 1]
        gj = [k for k in gj if out[k] != 1]
        if len(gi) == 1:  # one input dim split into several output dims
            parts = [f.new(out[k]) for k in gj]
            for k, p in zip(gj, parts, strict=True):
                out_dims[k] = p
            in_dims[gi[0]] = tuple(x for p in parts for x in p)
        elif len(gj) == 1:  # several input dims merged into one
            parts = [f.new(ins[k]) for k in gi]
            for k, p in zip(gi, parts, strict=True):
                in_dims[k] = p
            out_dims[gj[0]] = tuple(x for p in parts for x in p)
        else:  # a general regrouping: keep whole
            for k in gi:
                in_dims[k] = d = f.new(ins[k])
                replicated.update(d)
        i += 1
        j += 1
    extra = tuple(tuple(() for _ in _shape(g, v)) for v in node.inputs[1:])
    return OpRule(((*in_dims,), *extra), (tuple(out_dims),), tuple(f.sizes),
                  replicated=frozenset(replicated))  # fmt: skip


def _squeeze(node: Node, g: OpGraph) -> OpRule:
    ins = _shape(g, node.inputs[0])
    dropped = {d % len(ins) for d in node.params["dimensions"]}
    f = _Factors()
    dims = [f.new(s) for s in ins]
    return OpRule((tuple(dims),), (tuple(d for i, d in enumerate(dims) if i not in dropped),),
                  tuple(f.sizes))  # fmt: skip


def _along_axis(node: Node, g: OpGraph, whole: set[int], flops: float = 1.0) -> OpRule:
    """Elementwise-like, except dimensions in ``whole`` must stay unsharded."""
    rule = _elementwise(node, g, flops)
    keep = {x for i in whole for x in rule.results[0][i]}
    return dataclasses.replace(rule, replicated=frozenset(keep))


def _cumulative(node: Node, g: OpGraph) -> OpRule:
    return _along_axis(node, g, {node.params["axis"]})


def _sort(node: Node, g: OpGraph) -> OpRule:
    return _along_axis(node, g, {node.params["dimension"]})


def _rev(node: Node, g: OpGraph) -> OpRule:
    return _along_axis(node, g, set(node.params["dimensions"]), 0.0)


def _concatenate(node: Node, g: OpGraph) -> OpRule:
    axis = node.params["dimension"]
    rule = _elementwise(node, g, 0.0)
    cat = rule.results[0][axis]
    operands = tuple(
        tuple(() if i == axis else d for i, d in enumerate(op)) for op in rule.operands
    )
    results = (tuple(() if i == axis else d for i, d in enumerate(rule.results[0])),)
    return dataclasses.replace(rule, operands=operands, results=results, replicated=frozenset(cat))


def _pad(node: Node, g: OpGraph) -> OpRule:
    ins = _shape(g, node.inputs[0])
    f = _Factors()
    dims = []
    out_dims = []
    for s, (lo, hi, interior) in zip(ins, node.params["padding_config"], strict=True):
        d = f.new(s) if (lo, hi, interior) == (0, 0, 0) else ()
        dims.append(d)
        out_dims.append(d)
    return OpRule((tuple(dims), ()), (tuple(out_dims),), tuple(f.sizes))


def _dynamic_slice(node: Node, g: OpGraph) -> OpRule:
    ins, out = _shape(g, node.inputs[0]), _shape(g, node.outputs[0])
    f = _Factors()
    dims = [f.new(s) if s == o else () for s, o in zip(ins, out, strict=True)]
    idx = tuple(tuple(() for _ in _shape(g, v)) for v in node.inputs[1:])
    return OpRule((tuple(dims), *idx), (tuple(dims),), tuple(f.sizes))


def _slice(node: Node, g: OpGraph) -> OpRule:
    """Static slice: dimensions taken whole (start 0, full size, stride 1) pass through."""
    ins, out = _shape(g, node.inputs[0]), _shape(g, node.outputs[0])
    strides = node.params.get("strides") or (1,) * len(ins)
    f = _Factors()
    dims = [
        f.new(s) if s == o and start == 0 and step == 1 else ()
        for s, o, start, step in zip(ins, out, node.params["start_indices"], strides,
                                     strict=True)
    ]  # fmt: skip
    return OpRule((tuple(dims),), (tuple(dims),), tuple(f.sizes))


def _dynamic_update_slice(node: Node, g: OpGraph) -> OpRule:
    ins, upd = _shape(g, node.inputs[0]), _shape(g, node.inputs[1])
    f = _Factors()
    dims = [f.new(s) if s == u else () for s, u in zip(ins, upd, strict=True)]
    idx = tuple(tuple(() for _ in _shape(g, v)) for v in node.inputs[2:])
    return OpRule((tuple(dims), tuple(dims), *idx), (tuple(dims),), tuple(f.sizes))


def _conv(node: Node, g: OpGraph) -> OpRule:
    dn = node.params["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    ls, rs, os_ = (_shape(g, node.inputs[0]), _shape(g, node.inputs[1]),
                   _shape(g, node.outputs[0]))  # fmt: skip
    f = _Factors()
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
    flops = 2.0 * _size(os_) * window * rs[rhs_spec[1]]
    return OpRule((tuple(lhs), tuple(rhs)), (tuple(out),), tuple(f.sizes), frozenset(reduction),
                  frozenset(replicated), flops)  # fmt: skip


def _gather_like(node: Node, g: OpGraph) -> OpRule:
    """scatter (and gathers of unusual form): conservatively replicated."""
    return dataclasses.replace(_fallback(node, g), known=True)


def _gather(node: Node, g: OpGraph) -> OpRule:
    """gather: index batch dims pass through to the result; fully sliced operand dims that
    are not indexed pass through too; indexed dims stay whole (no masked lookups)."""
    dn = node.params["dimension_numbers"]
    operand, indices = _shape(g, node.inputs[0]), _shape(g, node.inputs[1])
    out = _shape(g, node.outputs[0])
    f = _Factors()
    op_dims: list[Dim] = [()] * len(operand)
    idx_dims: list[Dim] = [()] * len(indices)
    out_dims: list[Dim] = [()] * len(out)
    batch_pos = [i for i in range(len(out)) if i not in dn.offset_dims]
    if len(batch_pos) != len(indices) - 1:
        return _gather_like(node, g)
    for j, pos in enumerate(batch_pos):
        idx_dims[j] = out_dims[pos] = d = f.new(indices[j])
        if j in dn.start_indices_batching_dims:
            k = dn.operand_batching_dims[dn.start_indices_batching_dims.index(j)]
            if operand[k] != indices[j]:
                return _gather_like(node, g)
            op_dims[k] = d
    skip = set(dn.collapsed_slice_dims) | set(dn.operand_batching_dims)
    window = [i for i in range(len(operand)) if i not in skip]
    for i, pos in zip(window, dn.offset_dims, strict=True):
        full = node.params["slice_sizes"][i] == operand[i] and i not in dn.start_index_map
        if full:
            op_dims[i] = out_dims[pos] = f.new(operand[i])
    extra = tuple(tuple(() for _ in _shape(g, v)) for v in node.inputs[2:])
    return OpRule((tuple(op_dims), tuple(idx_dims), *extra), (tuple(out_dims),),
                  tuple(f.sizes))  # fmt: skip


def _scatter_add(node: Node, g: OpGraph) -> OpRule:
    """scatter-add: update windows that cover whole operand dims pass through; sharding the
    scattered (index batch) dims leaves partial sums of the result."""
    dn = node.params["dimension_numbers"]
    operand, indices = _shape(g, node.inputs[0]), _shape(g, node.inputs[1])
    updates = _shape(g, node.inputs[2])
    f = _Factors()
    op_dims: list[Dim] = [()] * len(operand)
    idx_dims: list[Dim] = [()] * len(indices)
    upd_dims: list[Dim] = [()] * len(updates)
    reduction: set[int] = set()
    scatter_pos = [i for i in range(len(updates)) if i not in dn.update_window_dims]
    if len(scatter_pos) != len(indices) - 1:
        return _gather_like(node, g)
    for j, pos in enumerate(scatter_pos):
        idx_dims[j] = upd_dims[pos] = d = f.new(indices[j])
        if j in dn.scatter_indices_batching_dims:
            k = dn.operand_batching_dims[dn.scatter_indices_batching_dims.index(j)]
            if operand[k] != indices[j]:
                return _gather_like(node, g)
            op_dims[k] = d
        else:
            reduction.update(d)
    skip = set(dn.inserted_window_dims) | set(dn.operand_batching_dims)
    window = [i for i in range(len(operand)) if i not in skip]
    for i, pos in zip(window, dn.update_window_dims, strict=True):
        if updates[pos] == operand[i] and i not in dn.scatter_dims_to_operand_dims:
            op_dims[i] = upd_dims[pos] = f.new(operand[i])
    return OpRule((tuple(op_dims), tuple(idx_dims), tuple(upd_dims)), (tuple(op_dims),),
                  tuple(f.sizes), frozenset(reduction), flops=_size(updates))  # fmt: skip


def _iota(node: Node, g: OpGraph) -> OpRule:
    f = _Factors()
    dims = tuple(f.new(s) for s in _shape(g, node.outputs[0]))
    return OpRule((), (dims,), tuple(f.sizes))


ELEMENTWISE = frozenset(
    """abs acos acosh add add_any and asin asinh atan atan2 atanh cbrt ceil clamp
    complex conj copy copy_p cos cosh digamma div eq erf erf_inv erfc exp exp2 expm1 floor ge gt
    igamma imag integer_pow is_finite le lgamma log log1p logistic lt max min mul ne neg
    nextafter not or population_count pow real reduce_precision rem round rsqrt select_n
    shift_left shift_right_arithmetic shift_right_logical sign sin sinh sqrt square sub tan
    tanh xor""".split()
)
FREE = frozenset(
    "convert_element_type bitcast_convert_type stop_gradient optimization_barrier".split()
)

RULES: dict[str, Callable[[Node, OpGraph], OpRule]] = {
    **dict.fromkeys(ELEMENTWISE, _elementwise),
    **dict.fromkeys(FREE, _free),
    "sharding_constraint": _free,
    "reshard": _free,
    "dot_general": _dot_general,
    "reduce_sum": _reduce,
    "reduce_max": _reduce,
    "reduce_min": _reduce,
    "reduce_prod": _reduce,
    "reduce_and": _reduce,
    "reduce_or": _reduce,
    "reduce_xor": _reduce,
    "argmax": _argreduce,
    "argmin": _argreduce,
    "broadcast_in_dim": _broadcast_in_dim,
    "transpose": _transpose,
    "reshape": _reshape,
    "squeeze": _squeeze,
    "expand_dims": _reshape,
    "concatenate": _concatenate,
    "pad": _pad,
    "dynamic_slice": _dynamic_slice,
    "slice": _slice,
    "dynamic_update_slice": _dynamic_update_slice,
    "conv_general_dilated": _conv,
    "cumsum": _cumulative,
    "cumprod": _cumulative,
    "cummax": _cumulative,
    "cummin": _cumulative,
    "cumlogsumexp": _cumulative,
    "sort": _sort,
    "rev": _rev,
    "gather": _gather,
    "scatter": _gather_like,
    "scatter-add": _scatter_add,
    "scatter_add": _scatter_add,
    "iota": _iota,
}


def rule_for(node: Node, graph: OpGraph) -> OpRule:
    """The ``OpRule`` of one node; unknown primitives get replicated-in/replicated-out with
    ``known=False`` (the caller records a warning)."""
    fn = RULES.get(node.primitive)
    if fn is None:
        return _fallback(node, graph)
    try:
        return fn(node, graph)
    except (KeyError, ValueError, TypeError, IndexError, AttributeError):
        return _fallback(node, graph)


# The synthetic nodes of unrolled scans register their rules into RULES on import.
from shardlab.parallel import rules_scan  # noqa: E402, F401 (registration, after RULES exists)
