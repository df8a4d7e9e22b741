"""The carry of a staged loop: which names cross iterations as arrays, with which shapes
and dtypes, settled over the body's outputs (``loops.Runtime`` stages the loops on it).

The body is traced to a jaxpr with the carry it would get from the state before the loop;
what one iteration makes of each name widens that carry (a Python number that changes
becomes an array, dtypes promote), until it settles. While a name the body binds is still
unbound, the body's first trace is lenient (a branch that reads it gives types only, as
AutoGraph's dummy iteration does); the trace that settles the carry is not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
from jax import lax

from shardlab._core.trees import is_array
from shardlab.engine.convert.ops import (
    _DISCOVERING,
    CondOps,
    ControlFlowError,
    Undefined,
    _describe,
    _Dynamic,
    _flatten,
    _is_number,
    _same,
    _Static,
)

__all__ = ["CarryOps"]

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


def _is_unbound(specs: list[Any]) -> bool:
    return (
        len(specs) == 1 and isinstance(specs[0], _Static) and isinstance(specs[0].value, Undefined)
    )


def _dynamic(layout: _Layout) -> list[_Dynamic]:
    return [s for _, specs in layout for s in specs if isinstance(s, _Dynamic)]


class CarryOps(CondOps):
    """Conds (``CondOps``) and the loop carry."""

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
        outer = _DISCOVERING.get()
        strict_probe = False
        for _ in range(7):
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

            # While a name the body binds is still unbound, a branch that reads it or
            # binds it on one side gives types only (AutoGraph's first, dummy iteration);
            # the probe that settles the carry runs without that leniency.
            unbound = any(_is_unbound(specs) for _, specs in layout)
            discovering = set() if unbound and not strict_probe else outer
            token = _DISCOVERING.set(discovering)
            examples = [jax.ShapeDtypeStruct(s.shape, s.dtype) for s in _dynamic(layout)]
            try:
                closed, shapes = jax.make_jaxpr(probe, return_shape=True)(item, examples)
            except Exception as error:
                raise self.traced_exception(k, error, f"the `{kind}` loop's body") from error
            finally:
                _DISCOVERING.reset(token)
            new_layout = [
                self._join(k, kind, name, layout[i], record["kinds"][i], shapes)
                for i, name in enumerate(names)
            ]
            if new_layout == layout:
                if discovering and discovering is not outer:  # settled on a lenient probe
                    strict_probe = True
                    continue
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
