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
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
from jax import lax

from shardlab._core.trees import is_array
from shardlab.engine.convert.ops import (
    _REVERSE_AD,
    CondOps,
    ControlFlowError,
    ConversionNote,
    Undefined,
    _describe,
    _Dynamic,
    _flatten,
    _is_number,
    _is_traced,
    _same,
    _Static,
    _TracedRange,
)

_Layout = list[tuple[Any, list[Any]]]  # per name: (treedef, leaf specs)


def _initial(value: Any) -> tuple[Any, list[Any]]:
    leaves, treedef = _flatten(value)
    return treedef, [
        _Dynamic(tuple(np.shape(v)), jnp.asarray(v).dtype) if is_array(v) else _Static(v)
        for v in leaves
    ]


def _rebuild(layout: _Layout, arrays: Sequence[Any]) -> tuple[Any, ...]:
    values = iter(arrays)
    return tuple(
        jax.tree_util.tree_unflatten(
            t, [next(values) if isinstance(s, _Dynamic) else s.value for s in specs]
        )
        for t, specs in layout
    )


def _dynamic(layout: _Layout) -> list[_Dynamic]:
    return [s for _, specs in layout for s in specs if isinstance(s, _Dynamic)]


class Runtime(CondOps):
    """``__sl__``: conds (``CondOps``) and loops."""

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
                return self._while(k, test, body, state, names)
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
    ) -> tuple[Any, ...]:
        __tracebackhide__ = True
        layout, step = self._carry(k, "while", names, state, lambda st, _: body(*st), None)
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
        if _is_traced(iterable) and np.ndim(iterable) >= 1 and not unroll:
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
                        live,
                    )
                    continue
                if not go:
                    break
            state = tuple(body(item, *state))
        return state

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
            if _is_traced(go):
                return self._cond(k, go, lambda *s: body(item, *s), lambda *s: s, st, names, live)
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

    # -- the carry ----------------------------------------------------------------------------
    def _init(self, layout: _Layout, state: tuple[Any, ...]) -> list[Any]:
        arrays = []
        for (treedef, specs), value in zip(layout, state, strict=True):
            leaves, given = _flatten(value)
            same = given == treedef
            for j, spec in enumerate(specs):
                if not isinstance(spec, _Dynamic):
                    continue
                if same and (is_array(leaves[j]) or _is_number(leaves[j])):
                    arrays.append(lax.convert_element_type(jnp.asarray(leaves[j]), spec.dtype))
                else:  # first bound inside the loop: carried from zeros
                    arrays.append(jnp.zeros(spec.shape, spec.dtype))
        return arrays

    def _carry(
        self,
        k: int,
        kind: str,
        names: tuple[str, ...],
        state: tuple[Any, ...],
        step: Callable[[tuple[Any, ...], Any], tuple[Any, ...]],
        item: Any,
    ) -> tuple[_Layout, Callable[[Any, list[Any]], list[Any]]]:
        """The loop's carry (types settled over the body's outputs) and one step on it, as a
        replay of the body's traced jaxpr."""
        __tracebackhide__ = True
        layout: _Layout = [_initial(v) for v in state]
        for _ in range(6):
            record: dict[str, Any] = {}

            def probe(
                item: Any, arrays: list[Any], layout: _Layout = layout, record: dict = record
            ) -> list[Any]:
                __tracebackhide__ = True
                result = step(_rebuild(layout, arrays), item)
                outs: list[Any] = []
                kinds = []
                for value in result:
                    leaves, treedef = _flatten(value)
                    leaf_kinds = []
                    for leaf in leaves:
                        if is_array(leaf) or _is_number(leaf):
                            leaf_kinds.append((len(outs), leaf if _is_number(leaf) else None))
                            outs.append(jnp.asarray(leaf))
                        else:
                            leaf_kinds.append((None, leaf))
                    kinds.append((treedef, leaf_kinds))
                record["kinds"] = kinds
                return outs

            examples = [jax.ShapeDtypeStruct(s.shape, s.dtype) for s in _dynamic(layout)]
            closed, shapes = jax.make_jaxpr(probe, return_shape=True)(item, examples)
            new_layout = [
                self._join(k, kind, name, layout[i], record["kinds"][i], shapes)
                for i, name in enumerate(names)
            ]
            if new_layout == layout:
                break
            layout = new_layout
        else:
            raise self.error(
                k,
                "the types the loop carries do not settle (each iteration changes a dtype).",
                "give the loop's variables their final dtype before the loop (`x = jnp.float32(0)`).",
            )
        kinds = record["kinds"]
        run = jax.extend.core.jaxpr_as_fun(closed)

        def replay(item_value: Any, arrays: list[Any]) -> list[Any]:
            outs = run(*jax.tree_util.tree_leaves(item_value), *arrays)
            selected = []
            for (_, specs), (_, leaf_kinds) in zip(layout, kinds, strict=True):
                for spec, (index, _) in zip(specs, leaf_kinds, strict=True):
                    if isinstance(spec, _Dynamic):
                        selected.append(lax.convert_element_type(outs[index], spec.dtype))
            return selected

        return layout, replay

    def _join(
        self,
        k: int,
        kind: str,
        name: str,
        before: tuple[Any, list[Any]],
        after: tuple[Any, list[Any]],
        shapes: list[Any],
    ) -> tuple[Any, list[Any]]:
        """One name's carry spec, widened by what one iteration made of it."""
        in_def, in_specs = before
        out_def, out_kinds = after
        outs = [shapes[i] if i is not None else v for i, v in out_kinds]
        numbers = [v for i, v in out_kinds]
        if (
            len(in_specs) == 1
            and isinstance(in_specs[0], _Static)
            and isinstance(in_specs[0].value, Undefined)
        ):
            if len(outs) == 1 and isinstance(outs[0], Undefined):
                return before
            return out_def, [
                _Static(n)
                if (i is not None and n is not None)
                else (_Dynamic(tuple(o.shape), o.dtype) if i is not None else _Static(v))
                for (i, v), o, n in zip(out_kinds, outs, numbers, strict=True)
            ]
        what = "loop" if kind != "while" else "`while` loop"
        if in_def != out_def:
            raise self.error(
                k,
                f"`{name}` changes structure in the {what} body ({in_def} before, {out_def} after "
                "one iteration); a staged loop carries a fixed pytree.",
                f"keep `{name}`'s containers and keys the same in every iteration.",
            )
        specs = []
        for spec, (index, number), out in zip(in_specs, out_kinds, outs, strict=True):
            if isinstance(spec, _Static):
                if index is None or number is not None:  # a Python value after the step
                    value = number if number is not None else out
                    if _same(spec.value, value):
                        specs.append(spec)
                        continue
                    if not (_is_number(spec.value) and _is_number(value)):
                        raise self._changes(k, name, what, spec.value, value)
                    specs.append(_Dynamic((), jnp.result_type(spec.value, value)))
                    continue
                if not _is_number(spec.value):
                    raise self._changes(k, name, what, spec.value, out)
                specs.append(_Dynamic(tuple(out.shape), jnp.result_type(spec.value, out)))
                continue
            if index is None:
                raise self._changes(
                    k, name, what, jax.ShapeDtypeStruct(spec.shape, spec.dtype), out
                )
            if tuple(out.shape) != spec.shape:
                raise self.error(
                    k,
                    f"`{name}` changes shape in the {what} body, from {spec.shape} to "
                    f"{tuple(out.shape)}; a staged loop carries arrays of fixed shape.",
                    f"keep `{name}`'s shape fixed (preallocate and `.at[i].set(...)`), or loop "
                    "over a concrete Python range to unroll it.",
                )
            dtype = jnp.result_type(spec.dtype, number if number is not None else out)
            specs.append(spec if dtype == spec.dtype else _Dynamic(spec.shape, dtype))
        return in_def, specs

    def _changes(self, k: int, name: str, what: str, before: Any, after: Any) -> ControlFlowError:
        return self.error(
            k,
            f"`{name}` is {_describe(before)} before the {what} body and {_describe(after)} "
            "after it; a staged loop carries arrays, and other values must stay the same.",
            f"give `{name}` one kind of value in every iteration (an array from the start: "
            f"`{name} = jnp.asarray(...)`).",
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
