"""Converted loops at run time: ``while`` and ``for`` as Python, ``lax.while_loop`` or
``lax.scan``, and :class:`Runtime`, the whole ``__sl__`` object converted code calls.

- ``while test:`` runs as Python while the test is a concrete value; as soon as it is traced
  (at the start, or after a ``break`` flag became traced), the rest of the loop is staged as
  ``lax.while_loop`` from the state at that point.
- ``for i in range(n)`` with a traced bound is a ``lax.while_loop`` over a counter; with
  concrete bounds it stays a Python loop (unrolled), which reverse-mode AD can go through.
- ``for row in xs`` over a traced array is ``lax.scan`` (reverse-differentiable); a body the
  scan cannot carry (a value whose shape grows, say) falls back to the Python loop, which
  JAX unrolls over the array's rows, with a note naming the line (an error when strict).
- a ``break`` (or early ``return``) flag that becomes traced inside a Python-iterated loop
  guards the remaining iterations' bodies with a cond instead of stopping the loop.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
from jax import lax

from shardlab._core.trees import is_array
from shardlab.engine.convert.carry import CarryOps, _dynamic, _is_unbound, _Layout, _rebuild
from shardlab.engine.convert.ops import (
    _REVERSE_AD,
    ControlFlowError,
    ConversionNote,
    Undefined,
    _flatten,
    _is_traced,
    _TracedRange,
)
from shardlab.engine.convert.undefined import is_internal


class Runtime(CarryOps):
    """``__sl__``: conds (``CondOps``), the carry (``CarryOps``) and loops."""

    # -- while --------------------------------------------------------------------------------
    def while_stmt(
        self,
        k: int,
        test: Callable[..., Any],
        body: Callable[..., tuple[Any, ...]],
        state: tuple[Any, ...],
        names: tuple[str, ...],
        live: tuple[str, ...],
    ) -> tuple[Any, ...]:
        __tracebackhide__ = True
        while True:
            go = test(*state)
            if _is_traced(go):
                return self._while(k, test, body, state, names, live)
            if not go:
                self.python["while"] += 1
                return state
            state = tuple(body(*state))

    def _while(
        self,
        k: int,
        test: Callable[..., Any],
        body: Callable[..., Any],
        state: tuple[Any, ...],
        names: tuple[str, ...],
        live: tuple[str, ...],
    ) -> tuple[Any, ...]:
        __tracebackhide__ = True
        layout, step = self._carry(k, "while", names, state, lambda st, _: body(*st), None)
        self._refuse_zero_trip(k, "while", layout, state, names, live)
        self._refuse_reverse_ad(k, layout, "while")

        def cond_fun(arrays: list[Any]) -> Any:
            __tracebackhide__ = True
            return self._predicate(k, jnp.asarray(test(*_rebuild(layout, arrays))))

        final = lax.while_loop(
            cond_fun, lambda arrays: step(None, arrays), self._init(layout, state)
        )
        self.staged["while_loop"] += 1
        return _rebuild(layout, final)

    # -- for ----------------------------------------------------------------------------------
    def for_stmt(
        self,
        k: int,
        iterable: Any,
        extra: Callable[..., Any] | None,
        body: Callable[..., tuple[Any, ...]],
        state: tuple[Any, ...],
        names: tuple[str, ...],
        live: tuple[str, ...],
        unroll: bool = False,
    ) -> tuple[Any, ...]:
        __tracebackhide__ = True
        if isinstance(iterable, _TracedRange):
            return self._range(k, iterable, extra, body, state, names, live)
        if _is_traced(iterable) and np.ndim(iterable) >= 1 and np.shape(iterable)[0] == 0:
            self._refuse_zero_trip(k, "empty", [], state, names, live)
        elif _is_traced(iterable) and np.ndim(iterable) >= 1 and not unroll:
            try:
                return self._scan(k, iterable, extra, body, state, names, live)
            except Exception as error:  # the Python loop is correct too: unrolled rows
                reason = (
                    error.reason
                    if isinstance(error, ControlFlowError)
                    else f"{type(error).__name__}: {error}"
                )
                if self.strict:
                    raise self.error(
                        k,
                        f"this loop over a traced array could not be staged as lax.scan ({reason})",
                        "fix the loop body so every iteration keeps the same types and shapes, "
                        "or turn strict conversion off to run it as an unrolled Python loop.",
                    ) from error
                self.note(
                    k,
                    f"`for` over a traced array runs as an unrolled Python loop: lax.scan could not carry it ({reason.splitlines()[0][:200]})",
                )
                if self.warn:
                    warnings.warn(self.notes[-1], ConversionNote, stacklevel=2)
        elif isinstance(iterable, range) and self.long_range and len(iterable) >= self.long_range:
            staged = self._long_range(k, iterable, extra, body, state, names, live, unroll)
            if staged is not None:
                return staged
        self.python["for"] += 1
        for item in iterable:
            if extra is not None:
                go = extra(*state)
                if _is_traced(go):
                    state = self._cond(
                        k,
                        go,
                        lambda *s, item=item: body(item, *s),
                        lambda *s: s,
                        state,
                        names,
                        names,  # the next iteration reads the state, not only after the loop
                    )
                    continue
                if not go:
                    break
            state = tuple(body(item, *state))
        return state

    def _long_range(
        self,
        k: int,
        span: range,
        extra: Callable[..., Any] | None,
        body: Callable[..., tuple[Any, ...]],
        state: tuple[Any, ...],
        names: tuple[str, ...],
        live: tuple[str, ...],
        unroll: bool,
    ) -> tuple[Any, ...] | None:
        """A long concrete ``range`` over array state (a training loop in a graph cell):
        ``lax.scan`` over the indices, so the program holds the body once, not once per
        step; None when it stays a Python loop (unrolled, with a note saying how long)."""
        __tracebackhide__ = True
        if unroll:
            why = "its body prints, and a graph cell keeps its prints in program order"
        elif not any(is_array(leaf) for value in state for leaf in _flatten(value)[0]):
            return None  # Python values only: the Python loop stages nothing per step
        else:
            try:
                indices = jnp.arange(span.start, span.stop, span.step, dtype=jnp.int32)
                return self._scan(k, indices, extra, body, state, names, live)
            except Exception as error:  # the Python loop is correct too: unrolled
                if isinstance(error, ControlFlowError):
                    reason = error.reason
                else:
                    reason = f"{type(error).__name__}: {error}"
                why = f"lax.scan could not carry it: {reason.splitlines()[0][:200]}"
        self.note(
            k,
            f"`for` over range({span.start}, {span.stop}, {span.step}) runs unrolled: "
            f"{len(span)} copies of its body in the program ({why}). Compiling takes longer "
            "the longer the loop; `jax.lax.fori_loop` or `jax.lax.scan` keeps one copy.",
        )
        return None

    def _guarded(
        self,
        k: int,
        extra: Callable[..., Any] | None,
        body: Callable[..., Any],
        names: tuple[str, ...],
        live: tuple[str, ...],
    ) -> Callable[[tuple[Any, ...], Any], tuple[Any, ...]]:
        """One iteration, skipped (by a cond when traced) once ``extra`` (no break, no return
        yet) is false."""

        def step(st: tuple[Any, ...], item: Any) -> tuple[Any, ...]:
            __tracebackhide__ = True
            if extra is None:
                return tuple(body(item, *st))
            go = extra(*st)
            if _is_traced(go):  # every name is read by the next iteration
                return self._cond(k, go, lambda *s: body(item, *s), lambda *s: s, st, names, names)
            return tuple(body(item, *st)) if go else st

        return step

    def _scan(
        self,
        k: int,
        xs: Any,
        extra: Any,
        body: Any,
        state: tuple[Any, ...],
        names: tuple[str, ...],
        live: tuple[str, ...],
    ) -> tuple[Any, ...]:
        __tracebackhide__ = True
        row = jax.ShapeDtypeStruct(np.shape(xs)[1:], xs.dtype)
        layout, step = self._carry(
            k, "for", names, state, self._guarded(k, extra, body, names, live), row
        )
        final, _ = lax.scan(
            lambda arrays, item: (step(item, arrays), None), self._init(layout, state), xs
        )
        self.staged["scan"] += 1
        return _rebuild(layout, final)

    def _range(
        self,
        k: int,
        span: _TracedRange,
        extra: Any,
        body: Any,
        state: tuple[Any, ...],
        names: tuple[str, ...],
        live: tuple[str, ...],
    ) -> tuple[Any, ...]:
        __tracebackhide__ = True
        count = span.trip_count()
        start, stride = jnp.asarray(span.start, jnp.int32), jnp.asarray(span.step, jnp.int32)
        index = jax.ShapeDtypeStruct((), jnp.int32)
        guarded = self._guarded(k, None, body, names, live)
        layout, step = self._carry(
            k, "for", names, state, lambda st, item: guarded(st, start + item * stride), index
        )
        self._refuse_zero_trip(k, "range", layout, state, names, live)
        self._refuse_reverse_ad(k, layout, "range")

        def cond_fun(carry: tuple[Any, list[Any]]) -> Any:
            i, arrays = carry
            go = i < count
            if extra is not None:
                go = jnp.logical_and(go, jnp.asarray(extra(*_rebuild(layout, arrays))))
            return go

        _, final = lax.while_loop(
            cond_fun,
            lambda carry: (carry[0] + 1, step(carry[0], carry[1])),
            (jnp.int32(0), self._init(layout, state)),
        )
        self.staged["fori_loop"] += 1
        return _rebuild(layout, final)

    def _refuse_zero_trip(
        self,
        k: int,
        kind: str,
        layout: _Layout,
        state: tuple[Any, ...],
        names: tuple[str, ...],
        live: tuple[str, ...],
    ) -> None:
        """A staged loop that may run zero times must not bind, from nothing, a name read
        after it: Python would raise UnboundLocalError there, the staged loop would give
        zeros."""
        for i, name in enumerate(names):
            if name not in live or is_internal(name) or not isinstance(state[i], Undefined):
                continue
            if layout and _is_unbound(layout[i][1]):
                continue  # the body never binds it either: reading it says so
            why = {
                "while": "the loop's condition is a traced value, so it may be false at the "
                "start and the loop run zero times",
                "range": "the `range` has a traced bound, so the loop may run zero times",
                "empty": "it runs zero times (the array it loops over is empty)",
            }[kind]
            raise self.error(
                k,
                f"`{name}` is bound inside this loop and read after it, but has no value "
                f"before it: {why}, and then `{name}` would have no value after it (Python "
                "raises UnboundLocalError).",
                f"bind `{name}` before the loop (`{name} = ...` with the value it should "
                "have when the loop does not run).",
            )

    def _refuse_reverse_ad(self, k: int, layout: _Layout, kind: str) -> None:
        if not _REVERSE_AD.get():
            return
        if not any(jnp.issubdtype(s.dtype, jnp.inexact) for s in _dynamic(layout)):
            return
        loop = (
            "`while` loop on a traced condition"
            if kind == "while"
            else "`for` loop over a traced `range`"
        )
        raise self.error(
            k,
            f"this {loop} is staged as lax.while_loop, and reverse-mode differentiation "
            "(jax.grad, jax.vjp) cannot go through a while_loop: its number of iterations is "
            "known only when the program runs, so there is no fixed sequence of steps to run "
            "backwards.",
            "give the loop a static trip count: `for i in range(N)` with a Python int N (or "
            "lax.fori_loop with static bounds), or lax.scan over a fixed length with the steps "
            "after the exit condition masked (`jnp.where(done, carry, new)`); forward mode "
            "(jax.jvp, jax.jacfwd) works as it is.",
        )
