"""Elementwise and free (layout-preserving) primitives: every dimension passes through."""

from __future__ import annotations

from shardlab.parallel.graph.opgraph import Node, OpGraph
from shardlab.parallel.graph.rules.base import OpRule, RuleFn, elementwise

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


def _free(node: Node, g: OpGraph) -> OpRule:
    return elementwise(node, g, 0.0)


RULES: dict[str, RuleFn] = {
    **dict.fromkeys(ELEMENTWISE, elementwise),
    **dict.fromkeys(FREE, _free),
    "sharding_constraint": _free,
    "reshard": _free,
}
