"""Evaluating a jaxpr equation by equation: eager, recorded, in float64, or a prefix of it.

``%%compare`` and ``shardlab.bisect`` need four evaluations of one traced program: op by op
at the user's precision (what eager JAX does: every primitive dispatched alone), the same
with every intermediate kept, a float64 reference, and prefixes of it compiled as programs.
All four walk the same flat list of equations, so an equation index means the same thing in
each. Nested calls (``jit``, ``custom_jvp_call``, ``custom_vjp_call``, ``remat``) are inlined
by :func:`flatten`; loops and conditionals stay one equation each.

The float64 reference evaluates the *float32 trace* with floating operands upcast, rather
than re-running the Python under x64: measured on JAX 0.10.2, ``jax.random.normal(key, s)``
draws other numbers when x64 is on (the sampler works on 64 random bits), and dtypes the
user wrote (``x.astype(jnp.float32)``) would pin parts of the reference to float32. Here the
random bits and their bitcast to floats are the user's; every arithmetic equation after them
runs in float64. x64 is switched on only around the reference, with the scoped
``jax.enable_x64`` context, which restores the session's setting on exit (thread-local).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from shardlab._core.jaxprs import bind, bind_params, equation_context, inlined_body

__all__ = ["Evaluation", "ancestors", "evaluate", "flatten", "float64", "upcast"]

# Equations the reference runs at the user's dtypes: they reinterpret bits.
_KEEP_DTYPES = frozenset({"bitcast_convert_type"})


@contextmanager
def float64() -> Iterator[None]:
    """x64 on for the block only (``jax.enable_x64`` is scoped and thread-local)."""
    with jax.enable_x64(True):
        yield


def _is_low_float(dtype: Any) -> bool:
    try:
        kind = np.dtype(dtype)
    except TypeError:  # extended dtypes (PRNG keys)
        return False
    return jnp.issubdtype(kind, jnp.inexact) and kind.itemsize < (16 if kind.kind == "c" else 8)


def _wide(dtype: Any) -> Any:
    return jnp.complex128 if np.dtype(dtype).kind == "c" else jnp.float64


def upcast(value: Any) -> Any:
    """A floating value below 64 bits as float64 (complex128); anything else as it is."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or not _is_low_float(dtype):
        return value
    return jnp.asarray(value, _wide(dtype))


def _cast_to(value: Any, aval: Any) -> Any:
    dtype = getattr(aval, "dtype", None)
    if dtype is None or getattr(value, "dtype", dtype) == dtype:
        return value
    return jnp.asarray(value, dtype)


def _upcast_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    params = dict(params)
    for key in ("new_dtype", "dtype", "preferred_element_type"):
        dtype = params.get(key)
        if dtype is not None and _is_low_float(dtype):
            params[key] = np.dtype(_wide(dtype))
    return params


def flatten(closed: Any) -> Any:
    """``closed`` (a ClosedJaxpr) with nested calls inlined, source lines kept."""
    avals = [v.aval for v in closed.jaxpr.invars]

    def inlined(*args: Any) -> list[Any]:
        return evaluate(closed.jaxpr, closed.consts, args).outputs

    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]
    return jax.make_jaxpr(inlined)(*specs)


@dataclass
class Evaluation:
    """Outputs of an evaluation and, when recorded, every equation's inputs and outputs."""

    outputs: list[Any]
    inputs_of: dict[int, list[Any]]
    outputs_of: dict[int, list[Any]]
    at_user_precision: tuple[int, ...] = ()  # reference equations that could not run in f64


def evaluate(
    jaxpr: Any,
    consts: Sequence[Any],
    args: Sequence[Any],
    *,
    wide: bool = False,
    record: bool = False,
    only: frozenset[int] | None = None,
    stop: int | None = None,
) -> Evaluation:
    """Evaluates ``jaxpr`` equation by equation (binding each primitive in its source
    context, as ``jax.core.eval_jaxpr`` does: ``_core.jaxprs.bind``), inlining nested calls.

    Args:
        wide: the float64 reference: floating operands upcast (call under :func:`float64`).
        record: keep every top-level equation's inputs and outputs.
        only: evaluate just these top-level equations (a prefix's dependency cone).
        stop: return the outputs of top-level equation ``stop`` instead of the jaxpr's.
    """
    env: dict[Any, Any] = {}
    low_precision: list[int] = []

    def read(atom: Any) -> Any:
        if isinstance(atom, jex_core.Literal):
            return upcast(atom.val) if wide else atom.val
        return env[atom]

    for var, value in zip(jaxpr.constvars, consts, strict=True):
        env[var] = upcast(value) if wide else value
    for var, value in zip(jaxpr.invars, args, strict=True):
        env[var] = upcast(value) if wide else value
    inputs_of: dict[int, list[Any]] = {}
    outputs_of: dict[int, list[Any]] = {}
    for index, eqn in enumerate(jaxpr.eqns):
        if only is not None and index not in only:
            continue
        invals = [read(v) for v in eqn.invars]
        outvals, kept = _apply(eqn, invals, wide=wide)
        if kept:
            low_precision.append(index)
        for var, value in zip(eqn.outvars, outvals, strict=True):
            env[var] = value
        if record:
            inputs_of[index] = invals
            outputs_of[index] = outvals
        if stop == index:
            return Evaluation(outvals, inputs_of, outputs_of, tuple(low_precision))
    outputs = [read(v) for v in jaxpr.outvars]
    return Evaluation(outputs, inputs_of, outputs_of, tuple(low_precision))


def apply_equation(eqn: Any, invals: Sequence[Any], *, wide: bool = False) -> list[Any]:
    """One equation on ``invals`` (a replay): its outputs."""
    return _apply(eqn, invals, wide=wide)[0]


def _apply(eqn: Any, invals: Sequence[Any], *, wide: bool) -> tuple[list[Any], bool]:
    """The outputs of ``eqn`` and whether the reference had to run it at the user's dtypes."""
    name = eqn.primitive.name
    body = inlined_body(name, eqn.params)
    with equation_context(eqn):
        if body is not None:
            inner, consts = body
            done = evaluate(
                inner, consts, [upcast(v) for v in invals] if wide else invals, wide=wide
            )
            return done.outputs, bool(done.at_user_precision)
        if wide and name == "reduce_precision":  # the reference keeps full precision
            return [invals[0]], False
        if wide and name in _CONTROL:
            try:
                return _CONTROL[name](eqn.params, [upcast(v) for v in invals]), False
            except Exception:  # a body whose types do not widen: run it as traced
                pass
        if wide and name not in _KEEP_DTYPES:
            try:
                wide_in = [upcast(v) for v in invals]  # bitcast results arrive as float32
                return bind(eqn, wide_in, _upcast_params(name, bind_params(eqn))), False
            except Exception:  # a primitive that takes no f64 runs as traced
                pass
        exact = [_cast_to(v, a.aval) for v, a in zip(invals, eqn.invars, strict=True)]
        outs = bind(eqn, exact)
        if wide:
            kept = name not in _KEEP_DTYPES and any(_is_low_float(a.aval.dtype) for a in eqn.invars)
            return [upcast(o) for o in outs] if kept else outs, kept
        return outs, False


def _body(closed: Any) -> Callable[..., list[Any]]:
    """A traced body (ClosedJaxpr) as a function evaluated in float64."""
    return lambda *args: evaluate(closed.jaxpr, closed.consts, args, wide=True).outputs


def _cond(params: dict[str, Any], invals: list[Any]) -> list[Any]:
    branches = [_body(b) for b in params["branches"]]
    return list(jax.lax.switch(invals[0], branches, *invals[1:]))


def _while(params: dict[str, Any], invals: list[Any]) -> list[Any]:
    nc, nb = params["cond_nconsts"], params["body_nconsts"]
    cond_consts, body_consts, carry = invals[:nc], invals[nc : nc + nb], invals[nc + nb :]
    cond, body = _body(params["cond_jaxpr"]), _body(params["body_jaxpr"])
    return list(
        jax.lax.while_loop(
            lambda c: cond(*cond_consts, *c)[0],
            lambda c: tuple(body(*body_consts, *c)),
            tuple(carry),
        )
    )


def _scan(params: dict[str, Any], invals: list[Any]) -> list[Any]:
    consts_n, carry_n = params["num_consts"], params["num_carry"]
    consts, carry, xs = (
        invals[:consts_n],
        invals[consts_n : consts_n + carry_n],
        invals[consts_n + carry_n :],
    )
    body = _body(params["jaxpr"])

    def step(c: tuple[Any, ...], x: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        out = body(*consts, *c, *x)
        return tuple(out[:carry_n]), tuple(out[carry_n:])

    final, ys = jax.lax.scan(
        step, tuple(carry), tuple(xs), length=params["length"], reverse=params["reverse"]
    )
    return [*final, *ys]


# Loops and conditionals in the reference: their bodies re-traced in float64.
_CONTROL: dict[str, Callable[[dict[str, Any], list[Any]], list[Any]]] = {
    "cond": _cond,
    "while": _while,
    "scan": _scan,
}


def ancestors(jaxpr: Any, index: int) -> frozenset[int]:
    """The top-level equations ``index`` depends on, itself included."""
    producer: dict[Any, int] = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for var in eqn.outvars:
            producer[var] = i
    seen: set[int] = set()
    todo = [index]
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        for var in jaxpr.eqns[i].invars:
            if not isinstance(var, jex_core.Literal) and var in producer:
                todo.append(producer[var])
    return frozenset(seen)


def producers(jaxpr: Any) -> dict[Any, int]:
    """Var -> the index of the top-level equation that binds it."""
    return {var: i for i, eqn in enumerate(jaxpr.eqns) for var in eqn.outvars}


def prefix_program(closed: Any, index: int) -> Callable[..., list[Any]]:
    """A function of the jaxpr's inputs returning equation ``index``'s outputs, evaluating
    only the equations it depends on; jit it to compile the prefix."""
    cone = ancestors(closed.jaxpr, index)

    def prefix(*args: Any) -> list[Any]:
        return evaluate(closed.jaxpr, closed.consts, args, only=cone, stop=index).outputs

    return prefix
