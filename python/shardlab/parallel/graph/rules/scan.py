"""Sharding rules of the synthetic nodes of an unrolled ``scan`` (``graph/opgraph.py``).

``scan_slice`` takes slice i of a stacked operand: the result's dimension d is the operand's
dimension d + 1, and the stacked (leading) dimension must stay whole, as ``lax.scan`` slices
it. ``scan_stack`` writes an iteration's output (its last operand) into slice i of the
stacked buffer (its first operand, from the previous iteration; absent in the first): the
output's dimension d is the result's dimension d + 1, the buffer's dimensions are the
result's, and the stacked dimension stays whole. Neither moves data when the layouts agree
(no flops).
"""

from __future__ import annotations

from shardlab.parallel.graph.opgraph import Node, OpGraph
from shardlab.parallel.graph.rules.base import Factors, OpRule, RuleFn


def _scan_slice(node: Node, g: OpGraph) -> OpRule:
    f = Factors()
    stacked = f.new(g.shapes[node.inputs[0]][0])
    dims = tuple(f.new(s) for s in g.shapes[node.outputs[0]])
    return OpRule(((stacked, *dims),), (dims,), tuple(f.sizes), replicated=frozenset(stacked))


def _scan_stack(node: Node, g: OpGraph) -> OpRule:
    shape = g.shapes[node.outputs[0]]
    f = Factors()
    stacked = f.new(shape[0])
    dims = tuple(f.new(s) for s in shape[1:])
    buffer = ((stacked, *dims),) if len(node.inputs) == 2 else ()
    return OpRule(
        (*buffer, dims), ((stacked, *dims),), tuple(f.sizes), replicated=frozenset(stacked)
    )


RULES: dict[str, RuleFn] = {"scan_slice": _scan_slice, "scan_stack": _scan_stack}
