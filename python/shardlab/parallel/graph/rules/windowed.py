"""Windowed reductions (pooling) and their gradient: ``reduce_window_*``, generic
``reduce_window``, ``select_and_scatter_add`` (max pooling's VJP) and
``select_and_gather_add`` (its JVP).

A dimension whose window is trivial (size 1, stride 1, no padding, no dilation) passes
through like an elementwise one (pooling's batch and channel dims); a windowed (spatial)
dimension stays whole on both sides: sharding it would need a halo exchange, which the model
does not price (as for a convolution's spatial dims in ``contraction.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from shardlab.parallel.graph.opgraph import Node, OpGraph
from shardlab.parallel.graph.rules.base import Dim, Factors, OpRule, RuleFn, shape_of, size_of


def _trivial(params: dict[str, Any], rank: int) -> list[bool]:
    """Per dimension, whether its window is the identity (the dim passes through)."""
    ones = (1,) * rank
    window = tuple(params["window_dimensions"])
    strides = tuple(params.get("window_strides") or ones)
    padding = tuple(tuple(p) for p in (params.get("padding") or ((0, 0),) * rank))
    base = tuple(params.get("base_dilation") or ones)
    dil = tuple(params.get("window_dilation") or ones)
    return [
        window[i] == 1 and strides[i] == 1 and padding[i] == (0, 0) and base[i] == 1 and dil[i] == 1
        for i in range(rank)
    ]


def _window_dims(
    f: Factors, trivial: Sequence[bool], ins: Sequence[int], out: Sequence[int]
) -> tuple[list[Dim], list[Dim], set[int]]:
    """Factors of the input and output dims: trivial ones shared, windowed ones separate
    and whole."""
    in_dims: list[Dim] = []
    out_dims: list[Dim] = []
    whole: set[int] = set()
    for t, s, o in zip(trivial, ins, out, strict=True):
        if t and s == o:
            d = f.new(s)
            in_dims.append(d)
            out_dims.append(d)
        else:
            d, e = f.new(s), f.new(o)
            whole.update(d + e)
            in_dims.append(d)
            out_dims.append(e)
    return in_dims, out_dims, whole


def _reduce_window(node: Node, g: OpGraph) -> OpRule:
    """``reduce_window_{sum,max,min}`` (one operand) and generic ``reduce_window`` (n
    operands, then n scalar init values; one result per operand)."""
    n = len(node.outputs)
    ins, out = shape_of(g, node.inputs[0]), shape_of(g, node.outputs[0])
    f = Factors()
    in_dims, out_dims, whole = _window_dims(f, _trivial(node.params, len(ins)), ins, out)
    inits = tuple(tuple(() for _ in shape_of(g, v)) for v in node.inputs[n:])
    window = math.prod(node.params["window_dimensions"])
    return OpRule(
        (*(tuple(in_dims) for _ in range(n)), *inits),
        tuple(tuple(out_dims) for _ in range(n)),
        tuple(f.sizes),
        replicated=frozenset(whole),
        flops=float(n * size_of(out) * window),
    )


def _select_and_scatter_add(node: Node, g: OpGraph) -> OpRule:
    """``select_and_scatter_add(source, operand)``: ``source`` has the pooled (window
    output) shape, ``operand`` and the result the input's."""
    src, operand = shape_of(g, node.inputs[0]), shape_of(g, node.inputs[1])
    f = Factors()
    op_dims, src_dims, whole = _window_dims(f, _trivial(node.params, len(operand)), operand, src)
    window = math.prod(node.params["window_dimensions"])
    return OpRule(
        (tuple(src_dims), tuple(op_dims)),
        (tuple(op_dims),),
        tuple(f.sizes),
        replicated=frozenset(whole),
        flops=float(2 * size_of(src) * window),
    )


def _select_and_gather_add(node: Node, g: OpGraph) -> OpRule:
    """``select_and_gather_add(tangents, operand)``: both of the input's shape; the result
    has the pooled shape."""
    operand, out = shape_of(g, node.inputs[1]), shape_of(g, node.outputs[0])
    f = Factors()
    in_dims, out_dims, whole = _window_dims(f, _trivial(node.params, len(operand)), operand, out)
    window = math.prod(node.params["window_dimensions"])
    return OpRule(
        (tuple(in_dims), tuple(in_dims)),
        (tuple(out_dims),),
        tuple(f.sizes),
        replicated=frozenset(whole),
        flops=float(2 * size_of(out) * window),
    )


RULES: dict[str, RuleFn] = {
    **dict.fromkeys(
        ("reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window"),
        _reduce_window,
    ),
    "select_and_scatter_add": _select_and_scatter_add,
    "select_and_gather_add": _select_and_gather_add,
}
