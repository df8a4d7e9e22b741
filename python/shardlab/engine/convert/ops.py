"""The run-time half of converted control flow: what ``__sl__.if_stmt(...)`` and friends do.

Each converted statement decides when it runs, as AutoGraph's operators do: a condition or
iterable that is a concrete Python value runs as plain Python (unrolled, exactly as without
conversion); a traced one becomes ``lax.cond``, ``lax.while_loop`` or ``lax.scan``. The state
a statement binds crosses the staged construct as pytrees: array leaves (and Python numbers
that differ between paths or iterations) become operands or the loop carry, other leaves
(``None``, strings, objects) must agree on every path and are kept as they are.

Each branch or loop body is traced once, to a jaxpr, before the construct is staged: its
output types decide the carry (dtypes promoted as ``jnp.result_type`` does; shapes and
structures must agree), and the jaxpr is replayed inside the construct, so nested
conversions do not trace their bodies again and again.
"""

from __future__ import annotations

import contextlib
import contextvars
import linecache
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import source_info_util, traceback_util
from jax.core import Tracer

from shardlab._core.trees import is_array
from shardlab.engine.cells.errors import GraphStagingError
from shardlab.engine.convert.exprs import ExprOps
from shardlab.engine.convert.rewrite import RETURN_VALUE, Site
from shardlab.engine.convert.undefined import (
    UNDEFINED_RETURN,
    UnboundRead,
    Undefined,
    is_internal,
    unbound_name,
)

__all__ = [
    "UNDEFINED_RETURN",
    "CondOps",
    "ControlFlowError",
    "ConversionNote",
    "UnboundRead",
    "Undefined",
    "reverse_ad",
]

# Equations staged here belong to the user's line that called us (the converted statement),
# for tracebacks, jaxpr source info and the compiled program's metadata; and a traceback
# through a jitted converted function shows the user's frames, not these operators'.
_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep
source_info_util.register_exclusion(_HERE)
traceback_util.register_exclusion(_HERE)

# Set while a loop's body is first traced with names it binds later still unbound (the set
# collects them): a branch that reads one, or binds it on one side only, gives types only.
_DISCOVERING: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar(
    "shardlab_discovering", default=None
)

_REVERSE_AD: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "shardlab_reverse_ad", default=False
)


@contextlib.contextmanager
def reverse_ad(active: bool) -> Iterator[None]:
    """While tracing under ``jax.grad``/``vjp`` (``to_static`` knows from its arguments)."""
    token = _REVERSE_AD.set(active)
    try:
        yield
    finally:
        _REVERSE_AD.reset(token)


class ControlFlowError(GraphStagingError):
    """Converted control flow that cannot be staged: the message names the user's line."""

    def __init__(self, *, label: str | None, **kwargs: Any) -> None:
        self.label = label
        super().__init__(**kwargs)

    def _message(self) -> str:
        if self.label is None:
            return super()._message()
        text = f"{self.label}: `{self.line}`" if self.line else self.label
        return f"{text}\n  why: {self.reason}\n  fix: {self.fix}"


class ConversionNote(UserWarning):
    """A converted statement ran as Python instead (said once, naming the line)."""


def _is_traced(value: object) -> bool:
    return isinstance(value, Tracer)


def _is_number(value: object) -> bool:
    return isinstance(value, (bool, int, float, complex, np.generic))


def _same(a: object, b: object) -> bool:
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:
        return False


def _flatten(value: Any) -> tuple[list[Any], Any]:
    return jax.tree_util.tree_flatten(value, is_leaf=lambda v: isinstance(v, Undefined))


@dataclass(frozen=True)
class _Static:
    value: Any


@dataclass(frozen=True)
class _Dynamic:
    shape: tuple[int, ...]
    dtype: Any


def _paths(jump: str) -> tuple[str, str, str]:
    """How a message names the two sides of a cond: a user's ``if``, or the guard the pass
    put after a ``break``/``continue`` (a ``return``'s guard never compares them)."""
    if jump == "return":
        return ("at this `return`", "at an earlier `return`", "at two `return`s")
    if jump:
        return (
            "when the iteration goes on",
            "after a `break`/`continue`",
            "with and without a `break`/`continue`",
        )
    return ("when the condition is true", "when it is false", "on the two paths")


def _describe(value: object) -> str:
    if is_array(value) or isinstance(value, jax.ShapeDtypeStruct):
        return f"an array {jnp.dtype(value.dtype).name}{list(value.shape)}"  # type: ignore[attr-defined]
    if isinstance(value, Undefined):
        return "unbound"
    return f"{type(value).__name__} {value!r}"[:60]


class CondOps(ExprOps):
    """``__sl__`` in converted code (the loops are added in ``loops.Runtime``, the
    expression operators come from ``exprs.ExprOps``): conds, the sites' table and what
    happened.

    Args:
        sites: the pass's sites, indexed by the number each call passes.
        filename: the compiled code's filename (the user's cell or file).
        label: how to name a line for a person (``In [3], line 4``); None: "cell line k".
        strict: a converted statement that would fall back to Python raises instead.
    """

    UNDEFINED_RETURN = UNDEFINED_RETURN

    def __init__(
        self,
        sites: Sequence[Site],
        *,
        filename: str,
        label: Callable[[int], str] | None = None,
        strict: bool = False,
    ) -> None:
        self.sites = {s.index: s for s in sites}
        self.filename = filename
        self.label = label
        self.strict = strict
        self.warn = False  # notes as warnings too (to_static; graph cells print them)
        # A concrete `range` at least this long over array state is staged as lax.scan
        # instead of unrolled (graph cells: code written as eager; None keeps Python's loop).
        self.long_range: int | None = None
        self.staged: Counter[str] = Counter()  # "cond", "while_loop", "scan", ...
        self.python: Counter[str] = Counter()  # statements that ran as Python
        self.notes: list[str] = []

    # -- helpers for generated code ----------------------------------------------------------
    @staticmethod
    def state(scope: dict[str, Any], *names: str) -> tuple[Any, ...]:
        return tuple(scope[n] if n in scope else Undefined(n) for n in names)

    @staticmethod
    def retval(value: Any) -> Any:
        return None if isinstance(value, Undefined) else value

    def range_(self, range_type: Any, *args: Any) -> Any:
        if range_type is range and any(_is_traced(a) for a in args):
            return _TracedRange(*args)
        return range_type(*args)

    # -- errors and notes ---------------------------------------------------------------------
    def error(self, k: int, reason: str, fix: str) -> ControlFlowError:
        site = self.sites.get(k)
        lineno = site.lineno if site else None
        line = linecache.getline(self.filename, lineno).strip() if lineno else ""
        label = self.label(lineno) if (self.label is not None and lineno) else None
        return ControlFlowError(label=label, lineno=lineno, line=line, reason=reason, fix=fix)

    def _where(self, k: int) -> str:
        site = self.sites.get(k)
        lineno = site.lineno if site else 0
        return self.label(lineno) if self.label is not None else f"cell line {lineno}"

    def note(self, k: int, text: str) -> None:
        message = f"{self._where(k)}: {text}"
        if message not in self.notes:
            self.notes.append(message)

    def summary(self) -> dict[str, Any]:
        """What the last trace did: converted statements staged and run as Python."""
        return {
            "converted": len([s for s in self.sites.values() if s.converted]),
            "staged": dict(self.staged),
            "python": sum(self.python.values()),
            "left_as_python": [
                f"line {s.lineno}: {s.kind} ({s.reason})"
                for s in self.sites.values()
                if not s.converted
            ],
        }

    # -- a if c else b ------------------------------------------------------------------------
    def ifexp(self, k: int, test: Any, body: Callable[[], Any], orelse: Callable[[], Any]) -> Any:
        __tracebackhide__ = True
        if not _is_traced(test):
            self.python["ifexp"] += 1
            return body() if test else orelse()
        (value,) = self._cond(
            k, test, lambda: (body(),), lambda: (orelse(),), (), ("value",), ("value",)
        )
        return value

    # -- if -----------------------------------------------------------------------------------
    def if_stmt(
        self,
        k: int,
        test: Any,
        body: Callable[..., tuple[Any, ...]],
        orelse: Callable[..., tuple[Any, ...]],
        state: tuple[Any, ...],
        names: tuple[str, ...],
        live: tuple[str, ...],
    ) -> tuple[Any, ...]:
        __tracebackhide__ = True
        if not _is_traced(test):
            self.python["if"] += 1
            return body(*state) if test else orelse(*state)
        return self._cond(k, test, body, orelse, state, names, live)

    def _predicate(self, k: int, test: Any) -> Any:
        shape = np.shape(test)
        if int(np.prod(shape)) != 1:
            raise self.error(
                k,
                f"the condition is an array of shape {tuple(shape)}, which has no single "
                "truth value.",
                "reduce it to one value (`.any()`, `.all()`, `x.sum() > 0`), or select "
                "elementwise with `jnp.where(cond, a, b)`.",
            )
        test = jnp.reshape(test, ())
        return test if test.dtype == jnp.bool_ else test != 0

    def traced_exception(self, k: int, error: Exception, what: str) -> Exception:
        """An exception raised while tracing a staged branch or loop body, inside the user's
        own ``try``: the ``try`` must not take it for one the program raised (both branches
        are traced, whichever would run), so it becomes a ControlFlowError."""
        site = self.sites.get(k)
        if (
            site is None
            or not site.in_try
            or isinstance(error, (GraphStagingError, UnboundRead, jax.errors.JAXTypeError))
            or unbound_name(error) is not None
        ):
            return error
        return self.error(
            k,
            f"tracing {what} raised {type(error).__name__}: {error}. A staged branch or loop "
            "body is traced while the program is built, whichever path would run, so the "
            "`try` around it cannot tell this from an exception of the path taken.",
            "move the `raise` (or the code that raises) out of the traced `if`/loop, check "
            "the value at run time instead (`assert`, `jnp.where`), or make the condition a "
            "concrete Python value.",
        )

    def _cond(
        self,
        k: int,
        test: Any,
        body: Callable[..., tuple[Any, ...]],
        orelse: Callable[..., tuple[Any, ...]],
        state: tuple[Any, ...],
        names: tuple[str, ...],
        live: tuple[str, ...],
    ) -> tuple[Any, ...]:
        __tracebackhide__ = True
        predicate = self._predicate(k, test)
        flat_in = [_flatten(v) for v in state]
        operands = [leaf for leaves, _ in flat_in for leaf in leaves if is_array(leaf)]

        def rebuild(arrays: Sequence[Any]) -> tuple[Any, ...]:
            values = iter(arrays)
            return tuple(
                jax.tree_util.tree_unflatten(
                    t, [next(values) if is_array(x) else x for x in leaves]
                )
                for leaves, t in flat_in
            )

        discovering = _DISCOVERING.get()
        traced: list[Any] = []
        failed: list[tuple[int, Exception]] = []
        for which, branch in enumerate((body, orelse)):
            record: dict[str, Any] = {}

            def probe(
                arrays: list[Any], branch: Callable[..., Any] = branch, record: dict = record
            ) -> list[Any]:
                __tracebackhide__ = True
                result = branch(*rebuild(arrays))
                flat = [_flatten(v) for v in result]
                kinds = []
                outs = []
                for leaves, t in flat:
                    leaf_kinds = []
                    for leaf in leaves:
                        if is_array(leaf):
                            leaf_kinds.append(("array", len(outs)))
                            outs.append(leaf)
                        elif _is_number(leaf):
                            leaf_kinds.append(("number", len(outs), leaf))
                            outs.append(jnp.asarray(leaf))
                        else:
                            leaf_kinds.append(("static", leaf))
                    kinds.append((t, leaf_kinds))
                record["kinds"] = kinds
                return outs

            try:
                closed, shapes = jax.make_jaxpr(probe, return_shape=True)(operands)
            except Exception as error:
                name = unbound_name(error)
                if discovering is None or name is None:
                    side = "the true branch" if which == 0 else "the false branch"
                    raise self.traced_exception(k, error, side) from error
                # A loop's first probe: this side reads a name the loop binds later (on
                # another path, in an earlier iteration). Only types are wanted here.
                discovering.add(name)
                failed.append((which, error))
                traced.append(None)
                continue
            traced.append((closed, shapes, record["kinds"]))
        if len(failed) == 2:
            raise failed[0][1]
        if failed:
            traced[failed[0][0]] = traced[1 - failed[0][0]]

        plans = [self._merge_var(k, i, name, traced, live) for i, name in enumerate(names)]

        def final(which: int) -> Callable[[list[Any]], list[Any]]:
            closed, _, kinds = traced[which]
            run = jax.extend.core.jaxpr_as_fun(closed)

            def branch(arrays: list[Any]) -> list[Any]:
                outs = run(*arrays)
                selected = []
                for plan, (_, leaf_kinds) in zip(plans, kinds, strict=True):
                    if plan[0] != "merge":
                        continue
                    specs = plan[2]
                    if plan[3] is not None and plan[3] != which:  # no value on this side
                        selected.extend(
                            jnp.zeros(s.shape, s.dtype) for s in specs if isinstance(s, _Dynamic)
                        )
                        continue
                    for spec, kind in zip(specs, leaf_kinds, strict=True):
                        if isinstance(spec, _Dynamic):
                            selected.append(lax.convert_element_type(outs[kind[1]], spec.dtype))
                return selected

            return branch

        results = iter(lax.cond(predicate, final(0), final(1), operands))
        self.staged["cond"] += 1
        out = []
        for plan in plans:
            if plan[0] == "drop":
                out.append(Undefined(plan[1]))
                continue
            _, treedef, specs, _ = plan
            leaves = [next(results) if isinstance(s, _Dynamic) else s.value for s in specs]
            out.append(jax.tree_util.tree_unflatten(treedef, leaves))
        return tuple(out)

    def _merge_var(
        self, k: int, i: int, name: str, traced: list[Any], live: tuple[str, ...]
    ) -> tuple:
        """How one name leaves a cond: ("merge", treedef, leaf specs, the side whose value
        it takes or None for both) or ("drop", name) when nothing reads it after the ``if``."""
        if name not in live:
            return ("drop", name)
        sides = []
        for _closed, shapes, kinds in traced:
            treedef, leaf_kinds = kinds[i]
            values = []
            for kind in leaf_kinds:
                if kind[0] == "static":
                    values.append(kind[1])
                elif kind[0] == "number":
                    values.append(kind[2])
                else:
                    values.append(shapes[kind[1]])
            sides.append((treedef, values))
        site = self.sites.get(k)
        jump = site.jump if site is not None else ""
        unbound = [len(v) == 1 and isinstance(v[0], Undefined) for _, v in sides]
        if unbound[0] and unbound[1]:
            return ("merge", sides[0][0], [_Static(sides[0][1][0])], None)
        # The guard after a `return` (`if not returned: rest`): when it is false the function
        # has returned, and no statement reads the other names again.
        only_true = jump == "return" and not is_internal(name)
        if only_true or unbound[0] or unbound[1]:
            bound_side = 0 if only_true else (1 if unbound[0] else 0)
            discovering = _DISCOVERING.get()
            if (
                only_true
                or name == RETURN_VALUE  # guarded by the returned flag
                or (jump == "loop" and bound_side == 0)  # bound unless it broke/continued
                or discovering is not None  # a loop's first probe: types only
            ):
                if discovering is not None and not only_true:
                    discovering.add(name)
                treedef, values = sides[bound_side]
                return ("merge", treedef, [self._spec(v) for v in values], bound_side)
            which = "true" if bound_side == 0 else "false"
            other = "false" if bound_side == 0 else "true"
            raise self.error(
                k,
                f"`{name}` is bound only when the condition is {which}; the condition is a "
                f"traced value, so both paths run as one program, and after it `{name}` "
                f"would have no value when the condition is {other}.",
                f"bind `{name}` on both paths (an `else:` branch, or `{name} = ...` before the "
                f"`if`; `{name} = jnp.where(cond, new, old)` selects without branching), or make "
                "the condition a concrete Python value.",
            )
        shown = "the return value" if name == RETURN_VALUE else f"`{name}`"
        paths = _paths(jump)
        (t_def, t_values), (f_def, f_values) = sides
        if t_def != f_def:
            raise self.error(
                k,
                f"{shown} has a different structure {paths[2]} ({t_def} {paths[0]}, "
                f"{f_def} {paths[1]}); a staged `if` needs the same pytree on both.",
                f"give {shown} the same containers and keys on every path.",
            )
        specs = []
        for a, b in zip(t_values, f_values, strict=True):
            a_static = not isinstance(a, jax.ShapeDtypeStruct)
            b_static = not isinstance(b, jax.ShapeDtypeStruct)
            if a_static and b_static and _same(a, b):
                specs.append(_Static(a))
            elif (isinstance(a, jax.ShapeDtypeStruct) or _is_number(a)) and (
                isinstance(b, jax.ShapeDtypeStruct) or _is_number(b)
            ):
                shape_a, shape_b = (
                    np.shape(a) if a_static else a.shape,
                    np.shape(b) if b_static else b.shape,
                )
                if tuple(shape_a) != tuple(shape_b):
                    raise self.error(
                        k,
                        f"{shown} has shape {tuple(shape_a)} {paths[0]} and "
                        f"{tuple(shape_b)} {paths[1]}; a staged `if` needs one shape.",
                        "make both paths produce the same shape (pad, or select with "
                        "`jnp.where`), or make the condition a concrete Python value.",
                    )
                specs.append(_Dynamic(tuple(shape_a), jnp.result_type(a, b)))
            else:
                raise self.error(
                    k,
                    f"{shown} is {_describe(a)} {paths[0]} and {_describe(b)} {paths[1]}; "
                    "a staged `if` can only choose between arrays (or equal Python values).",
                    f"give {shown} the same kind of value on every path.",
                )
        return ("merge", t_def, specs, None)

    @staticmethod
    def _spec(value: Any) -> _Static | _Dynamic:
        if isinstance(value, jax.ShapeDtypeStruct):
            return _Dynamic(tuple(value.shape), value.dtype)
        return _Static(value)


@dataclass(frozen=True)
class _TracedRange:
    """``range(...)`` with a traced bound: a staged loop with a run-time trip count."""

    start: Any
    stop: Any = None
    step: Any = 1

    def __post_init__(self) -> None:
        if self.stop is None:
            object.__setattr__(self, "stop", self.start)
            object.__setattr__(self, "start", 0)

    def trip_count(self) -> Any:
        start, stop, step = (jnp.asarray(v, jnp.int32) for v in (self.start, self.stop, self.step))
        up = (stop - start + step - 1) // step
        down = (stop - start + step + 1) // step
        return jnp.maximum(jnp.where(step > 0, up, down), 0)
