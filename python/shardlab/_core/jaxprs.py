"""What every jaxpr walk in shardlab shares: which equations a body stands for, and how one
equation is bound again as the user's line.

Two walks re-evaluate traced programs: the compare tool's evaluator
(``engine/compare/evaluate.py``: op by op, in float64, prefixes) and the plan interpreter
(``parallel/graph/interpret.py``: the search's op graph with layouts constrained). They walk
different things (a jaxpr's variables; the op graph's numbered values, with scans folded back)
but inline the same calls, descend into the same control flow, and bind each equation the
same way: :func:`equation_context` and :func:`bind` here, as ``jax.core.eval_jaxpr`` does, so
that a compiled instruction (a collective the partitioner inserts included) names the user's
source line.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from jax._src import source_info_util  # private: the source context eval_jaxpr binds in
from jax.extend import core as jex_core

__all__ = [
    "CONTROL_FLOW",
    "INLINED",
    "bind",
    "bind_params",
    "equation_context",
    "inlined_body",
    "source_context",
    "split_closed",
]

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


@contextmanager
def source_context(eqn: Any) -> Iterator[None]:
    """``eqn``'s source line and name stack (under the current one, as
    ``jax.core.eval_jaxpr`` binds): what the compiled instructions staged inside are named
    after. Enter it once per equation: the name stack is relative, so nesting the same
    equation's context would repeat its names."""
    name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
    with source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack):
        yield


@contextmanager
def equation_context(eqn: Any) -> Iterator[None]:
    """The whole context ``eqn`` was traced in: :func:`source_context` and ``eqn.ctx`` (e.g.
    the abstract mesh it saw). Bind an equation inside it."""
    with source_context(eqn), eqn.ctx.manager:
        yield


def _bind_parts(eqn: Any) -> tuple[Sequence[Any], dict[str, Any]]:
    got = eqn.primitive.get_bind_params(eqn.params)
    return got if isinstance(got, tuple) else ((), got)  # a dict in older JAX


def bind_params(eqn: Any) -> dict[str, Any]:
    """A copy of the parameters ``eqn``'s primitive is bound with (to edit, then
    :func:`bind` with them)."""
    return dict(_bind_parts(eqn)[1])


def bind(eqn: Any, invals: Sequence[Any], params: dict[str, Any] | None = None) -> list[Any]:
    """``eqn``'s primitive bound on ``invals`` (with ``params`` in place of the equation's
    bind parameters, when given), in the current context: call it inside
    :func:`equation_context`. Returns the list of outputs."""
    subfuns, own = _bind_parts(eqn)
    out = eqn.primitive.bind(*subfuns, *invals, **(own if params is None else params))
    return list(out) if eqn.primitive.multiple_results else [out]
