"""The factor model every sharding rule is written in, and the rules the others build on.

An ``OpRule`` says which dimensions of a node's operands and results move together
("factors"), which factors are summed over (a sharded one leaves partial sums) and which must
stay whole. This is the factor model of Shardy's ``OpShardingRule``: e.g. for ``dot_general``
the batch, lhs-free and rhs-free factors appear in the result; the contracting factor does
not, so sharding it needs an all-reduce (or reduce-scatter) of the result.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from shardlab.parallel.graph.opgraph import Node, OpGraph

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


class Factors:
    """Allocates factors; a dimension of size 1 gets none."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def new(self, size: int) -> Dim:
        if size <= 1:
            return ()
        self.sizes.append(size)
        return (len(self.sizes) - 1,)


RuleFn = Callable[[Node, OpGraph], OpRule]


def shape_of(g: OpGraph, var: int) -> tuple[int, ...]:
    return g.shapes[var]


def size_of(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def elementwise(node: Node, g: OpGraph, flops_per_element: float = 1.0) -> OpRule:
    """Every result dimension is a factor; an operand dimension of the same size shares it."""
    out = shape_of(g, node.outputs[0])
    f = Factors()
    dims = [f.new(s) for s in out]
    operands = []
    for v in node.inputs:
        shp = shape_of(g, v)
        if len(shp) == len(out):
            operands.append(tuple(d if shp[i] == out[i] else () for i, d in enumerate(dims)))
        else:
            operands.append(tuple(() for _ in shp))
    results = tuple(tuple(dims) for _ in node.outputs)
    return OpRule(tuple(operands), results, tuple(f.sizes), flops=flops_per_element * size_of(out))


def replicated_rule(node: Node, g: OpGraph) -> OpRule:
    """Replicated in, replicated out: the rule of a primitive no family knows."""
    return OpRule(
        tuple(tuple(() for _ in shape_of(g, v)) for v in node.inputs),
        tuple(tuple(() for _ in shape_of(g, v)) for v in node.outputs),
        (),
        known=False,
    )
