"""Shape ops: broadcast, transpose, reshape, squeeze, concatenate, split, stack, unstack,
pad, iota. Dimensions that survive unchanged keep their factors; regrouped, padded, split,
stacked or unstacked ones stay whole.
"""

from __future__ import annotations

import dataclasses

from shardlab.parallel.graph.opgraph import Node, OpGraph
from shardlab.parallel.graph.rules.base import (
    Dim,
    Factors,
    OpRule,
    RuleFn,
    elementwise,
    shape_of,
    size_of,
)


def _broadcast_in_dim(node: Node, g: OpGraph) -> OpRule:
    out = shape_of(g, node.outputs[0])
    ins = shape_of(g, node.inputs[0])
    f = Factors()
    dims = [f.new(s) for s in out]
    bdims = node.params["broadcast_dimensions"]
    operand = tuple(dims[o] if ins[i] == out[o] else () for i, o in enumerate(bdims))
    extra = tuple(tuple(() for _ in shape_of(g, v)) for v in node.inputs[1:])
    return OpRule((operand, *extra), (tuple(dims),), tuple(f.sizes))


def _transpose(node: Node, g: OpGraph) -> OpRule:
    ins = shape_of(g, node.inputs[0])
    f = Factors()
    dims = [f.new(s) for s in ins]
    perm = node.params["permutation"]
    return OpRule(
        (tuple(dims),), (tuple(dims[p] for p in perm),), tuple(f.sizes), flops=size_of(ins)
    )


def _reshape(node: Node, g: OpGraph) -> OpRule:
    ins, out = shape_of(g, node.inputs[0]), shape_of(g, node.outputs[0])
    f = Factors()
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
    extra = tuple(tuple(() for _ in shape_of(g, v)) for v in node.inputs[1:])
    return OpRule(
        ((*in_dims,), *extra), (tuple(out_dims),), tuple(f.sizes), replicated=frozenset(replicated)
    )


def _squeeze(node: Node, g: OpGraph) -> OpRule:
    ins = shape_of(g, node.inputs[0])
    dropped = {d % len(ins) for d in node.params["dimensions"]}
    f = Factors()
    dims = [f.new(s) for s in ins]
    return OpRule(
        (tuple(dims),), (tuple(d for i, d in enumerate(dims) if i not in dropped),), tuple(f.sizes)
    )


def _concatenate(node: Node, g: OpGraph) -> OpRule:
    axis = node.params["dimension"]
    rule = elementwise(node, g, 0.0)
    cat = rule.results[0][axis]
    operands = tuple(
        tuple(() if i == axis else d for i, d in enumerate(op)) for op in rule.operands
    )
    results = (tuple(() if i == axis else d for i, d in enumerate(rule.results[0])),)
    return dataclasses.replace(rule, operands=operands, results=results, replicated=frozenset(cat))


def _split(node: Node, g: OpGraph) -> OpRule:
    """``split`` along ``axis``: the split axis stays whole (a piece's rows would otherwise
    sit on other devices than the operand's shard), every other dim passes through to every
    result."""
    ins = shape_of(g, node.inputs[0])
    axis = node.params["axis"] % len(ins)
    f = Factors()
    dims = [f.new(s) for s in ins]
    out = tuple(() if i == axis else d for i, d in enumerate(dims))
    return OpRule(
        (tuple(dims),),
        (out,) * len(node.outputs),
        tuple(f.sizes),
        replicated=frozenset(dims[axis]),
    )


def _stack(node: Node, g: OpGraph) -> OpRule:
    """``stack`` along a new ``axis``: the new dim is unsplit, the others pass through."""
    out = shape_of(g, node.outputs[0])
    axis = node.params["axis"] % len(out)
    f = Factors()
    dims = [f.new(s) for i, s in enumerate(out) if i != axis]
    operand = tuple(dims)
    result = (*dims[:axis], (), *dims[axis:])
    return OpRule((operand,) * len(node.inputs), (result,), tuple(f.sizes))


def _unstack(node: Node, g: OpGraph) -> OpRule:
    """``unstack`` along ``axis`` (the inverse of ``stack``): the unstacked dim stays whole,
    the others pass through to every result."""
    ins = shape_of(g, node.inputs[0])
    axis = node.params["axis"] % len(ins)
    f = Factors()
    dims = [f.new(s) for s in ins]
    out = tuple(d for i, d in enumerate(dims) if i != axis)
    return OpRule(
        (tuple(dims),),
        (out,) * len(node.outputs),
        tuple(f.sizes),
        replicated=frozenset(dims[axis]),
    )


def _pad(node: Node, g: OpGraph) -> OpRule:
    ins = shape_of(g, node.inputs[0])
    f = Factors()
    dims = []
    out_dims = []
    for s, (lo, hi, interior) in zip(ins, node.params["padding_config"], strict=True):
        d = f.new(s) if (lo, hi, interior) == (0, 0, 0) else ()
        dims.append(d)
        out_dims.append(d)
    return OpRule((tuple(dims), ()), (tuple(out_dims),), tuple(f.sizes))


def _iota(node: Node, g: OpGraph) -> OpRule:
    f = Factors()
    dims = tuple(f.new(s) for s in shape_of(g, node.outputs[0]))
    return OpRule((), (dims,), tuple(f.sizes))


RULES: dict[str, RuleFn] = {
    "broadcast_in_dim": _broadcast_in_dim,
    "transpose": _transpose,
    "reshape": _reshape,
    "squeeze": _squeeze,
    "expand_dims": _reshape,
    "concatenate": _concatenate,
    "split": _split,
    "stack": _stack,
    "unstack": _unstack,
    "pad": _pad,
    "iota": _iota,
}
