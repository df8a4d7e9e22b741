"""Sharding rules per primitive, as data (the factor model is in ``base.py``).

One module per family of primitives, each with its own ``RULES`` table; the registry here is
their union, built explicitly (no import side effects). A *strategy* for a node assigns mesh
axes to its rule's factors (``search/candidates.py``, ``cost/propagate.py``).

A primitive no family knows gets ``replicated_rule`` (``known=False``; the cost model records a
warning). A rule that raises is a bug in the rule: with ``SHARDLAB_STRICT_RULES=1`` (the test
suite sets it) it propagates; otherwise the node is costed as replicated (``known=False``, so
the cost model's warning names the primitive) and the failure is kept in ``rule_failures``.
"""

from __future__ import annotations

import os

from shardlab.parallel.graph.opgraph import Node, OpGraph
from shardlab.parallel.graph.rules import (
    contraction,
    control,
    elementwise,
    indexing,
    prng,
    reduction,
    scan,
    shape,
    windowed,
)
from shardlab.parallel.graph.rules.base import Factors, OpRule, RuleFn, replicated_rule
from shardlab.parallel.graph.rules.elementwise import ELEMENTWISE, FREE

RULES: dict[str, RuleFn] = {
    **elementwise.RULES,
    **contraction.RULES,
    **reduction.RULES,
    **shape.RULES,
    **indexing.RULES,
    **scan.RULES,
    **windowed.RULES,
    **prng.RULES,
}

# (primitive, error text) of rules that raised, in this process (strict mode off).
rule_failures: list[tuple[str, str]] = []


def _rule_for(node: Node, graph: OpGraph) -> OpRule:
    return rule_for(node, graph)


# cond/while rules are derived from their bodies, whose equations take the rules above
RULES.update(control.control_rules(_rule_for))


def strict_rules() -> bool:
    """Whether a rule that raises should propagate (``SHARDLAB_STRICT_RULES=1``)."""
    return os.environ.get("SHARDLAB_STRICT_RULES", "") not in ("", "0")


def rule_for(node: Node, graph: OpGraph) -> OpRule:
    """The ``OpRule`` of one node; unknown primitives get replicated-in/replicated-out with
    ``known=False`` (the caller records a warning)."""
    fn = RULES.get(node.primitive)
    if fn is None:
        return replicated_rule(node, graph)
    try:
        return fn(node, graph)
    except Exception as e:
        if strict_rules():
            raise
        rule_failures.append((node.primitive, f"{type(e).__name__}: {e}"))
        return replicated_rule(node, graph)


__all__ = ["ELEMENTWISE", "FREE", "RULES", "Factors", "OpRule", "RuleFn", "rule_for"]
