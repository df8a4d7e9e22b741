"""The equations whose body stands for them, shared by every jaxpr walk in shardlab: the
search's op graph (``parallel/graph/opgraph.py``) and the compare tool's evaluator
(``engine/compare/evaluate.py``) inline the same calls and descend into the same control flow.
"""

from __future__ import annotations

from typing import Any

from jax.extend import core as jex_core

__all__ = ["CONTROL_FLOW", "INLINED", "inlined_body", "split_closed"]

# Calls whose body is evaluated (traced, priced) in place of the call: the parameter holding
# the body, or None where it has no fixed name (the one jaxpr among the parameters).
INLINED: dict[str, str | None] = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "remat": "jaxpr",
    "remat2": "jaxpr",
    "checkpoint": "jaxpr",
    "custom_lin": None,
}
# Control flow: the parameters holding its bodies.
CONTROL_FLOW: dict[str, tuple[str, ...]] = {
    "scan": ("jaxpr",),
    "while": ("cond_jaxpr", "body_jaxpr"),
    "cond": ("branches",),
}


def split_closed(jaxpr: Any) -> tuple[Any, list[Any]]:
    """``(jaxpr, consts)`` of a closed jaxpr; an open one with no consts."""
    if hasattr(jaxpr, "jaxpr") and hasattr(jaxpr, "consts"):
        return jaxpr.jaxpr, list(jaxpr.consts)
    return jaxpr, []


def inlined_body(name: str, params: dict[str, Any]) -> tuple[Any, list[Any]] | None:
    """The body (and its consts) that stands for an equation of primitive ``name``; None
    when the equation is not an inlined call or its body cannot be found."""
    if name not in INLINED:
        return None
    key = INLINED[name]
    if key is None or key not in params:
        found = list(jex_core.jaxprs_in_params(params))
        return (found[0], []) if len(found) == 1 else None
    return split_closed(params[key])
