"""What a graph cell's Python state looks like, for its cache key and its safety checks.

A graph cell closes over everything it reads that is not an array: numbers, configuration
dicts, objects, the functions it calls and the globals those read. Its Python runs once, at
trace time, so a staged program is only valid while that state is unchanged. Two walks over
the state live here:

- :func:`state_key` is a hashable fingerprint of a value's state: numbers and strings by
  value, containers item by item, plain objects attribute by attribute, functions by the
  globals, closure cells and defaults they read, arrays by identity. ``hp["lr"] = 100`` or
  ``setattr(config, "lr", 100.)`` in another cell changes the key, so the next run retraces
  with the new value instead of reusing a stale program.
- :func:`find_tracer` looks for a traced value reachable from a value (``model.w``), so a
  graph cell never writes a tracer back into the namespace.

Both walks are bounded (depth and item count); what a walk cannot look into is reported as
untracked (by identity), and the caller says so to the user.
"""

from __future__ import annotations

import dataclasses
import functools
import sysconfig
import types
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.core import Tracer

MAX_DEPTH = 6
MAX_ITEMS = 4096

_SCALARS = (int, float, complex, str, bytes, bool, type(None), np.generic)
_OPAQUE = (types.ModuleType, type, types.BuiltinFunctionType, types.MethodWrapperType)


class _Budget:
    def __init__(self) -> None:
        self.items = 0
        self.untracked: list[str] = []

    def spend(self) -> bool:
        self.items += 1
        return self.items <= MAX_ITEMS


def _is_tracer(value: object) -> bool:
    return isinstance(value, Tracer)


def _attributes(value: object) -> dict[str, Any] | None:
    """The instance attributes of a plain object (``__dict__`` and ``__slots__``)."""
    out: dict[str, Any] = {}
    found = False
    try:
        attrs = vars(value)
    except TypeError:
        attrs = None
    if isinstance(attrs, dict):
        out.update(attrs)
        found = True
    for klass in type(value).__mro__:
        for slot in getattr(klass, "__slots__", ()):
            if isinstance(slot, str) and slot not in ("__dict__", "__weakref__"):
                found = True
                if hasattr(value, slot):
                    out[slot] = getattr(value, slot)
    return out if found else None


def _function_parts(fn: types.FunctionType) -> Iterator[tuple[str, Any]]:
    """What a function reads besides its arguments: globals, closure cells and defaults."""
    code = fn.__code__
    names = set(code.co_names)
    for const in code.co_consts:  # nested functions and comprehensions read globals too
        if isinstance(const, types.CodeType):
            names.update(const.co_names)
    module_globals = fn.__globals__
    for name in sorted(names):
        if name in module_globals:
            yield name, module_globals[name]
    for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
        try:
            yield name, cell.cell_contents
        except ValueError:  # an empty cell
            continue
    if fn.__defaults__:
        yield "<defaults>", fn.__defaults__
    if fn.__kwdefaults__:
        yield "<kwdefaults>", fn.__kwdefaults__


_LIBRARY_ROOTS = tuple(
    {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
)


def _is_library(fn: types.FunctionType) -> bool:
    """Whether ``fn`` is installed code (the standard library, site-packages)."""
    filename = fn.__code__.co_filename
    return filename.startswith(_LIBRARY_ROOTS) or filename.startswith("<frozen")


def state_key(value: object, *, name: str = "value", budget: _Budget | None = None) -> Any:
    """A hashable fingerprint of ``value``'s state (see the module docstring).

    ``budget`` collects, in ``untracked``, the paths of objects fingerprinted by identity
    only because the walk could not look into them (too deep, too many items).
    """
    budget = budget or _Budget()
    return _key(value, name, 0, budget, set())


def _key(value: object, path: str, depth: int, budget: _Budget, seen: set[int]) -> Any:
    if isinstance(value, _SCALARS):
        return (type(value).__name__, value)
    if isinstance(value, (jax.Array, np.ndarray)):
        return ("array", id(value), np.shape(value), str(getattr(value, "dtype", "")))
    if isinstance(value, _OPAQUE) or type(value).__module__.startswith("shardlab.engine."):
        # the engine's own objects (converted code's ``__sl__`` runtime) are not user state
        return ("id", id(value))
    if id(value) in seen:
        return ("cycle", id(value))
    if depth >= MAX_DEPTH or not budget.spend():
        budget.untracked.append(path)
        return ("id", id(value))
    seen = seen | {id(value)}
    deeper = depth + 1
    if isinstance(value, (list, tuple)):
        items = tuple(_key(v, f"{path}[{i}]", deeper, budget, seen) for i, v in enumerate(value))
        return (type(value).__name__, items)
    if isinstance(value, dict):
        items = tuple(
            (_key(k, path, deeper, budget, seen), _key(v, f"{path}[{k!r}]", deeper, budget, seen))
            for k, v in value.items()
        )
        return ("dict", id(type(value)), items)
    if isinstance(value, (set, frozenset)):
        return (type(value).__name__, frozenset(_key(v, path, deeper, budget, seen) for v in value))
    if isinstance(value, functools.partial):
        return (
            "partial",
            id(value),
            _key(value.func, f"{path}.func", deeper, budget, seen),
            _key(value.args, f"{path}.args", deeper, budget, seen),
            _key(value.keywords, f"{path}.keywords", deeper, budget, seen),
        )
    if isinstance(value, types.MethodType):
        return ("method", _key(value.__self__, path, deeper, budget, seen), id(value.__func__))
    if isinstance(value, types.FunctionType):
        if _is_library(value):  # installed code: its globals are not the user's state
            return ("function", id(value))
        parts = tuple(
            (n, _key(v, f"{value.__name__}.{n}", deeper, budget, seen))
            for n, v in _function_parts(value)
        )
        return ("function", id(value), parts)
    wrapped = getattr(value, "__wrapped__", None)
    if wrapped is not None and callable(value):  # jax.jit, functools.wraps
        return ("wrapped", id(value), _key(wrapped, path, deeper, budget, seen))
    leaves, treedef = jax.tree_util.tree_flatten(value)
    if not (len(leaves) == 1 and leaves[0] is value):  # a registered pytree: leaves and aux
        items = tuple(
            _key(v, f"{path}.<leaf {i}>", deeper, budget, seen) for i, v in enumerate(leaves)
        )
        try:
            hash(treedef)
            return ("pytree", treedef, items)
        except TypeError:
            return ("pytree", id(value), items)
    attrs = _attributes(value)
    if attrs is None:
        try:
            hash(value)
        except TypeError:
            budget.untracked.append(path)
        return ("id", id(value))
    items = tuple(
        (k, _key(v, f"{path}.{k}", deeper, budget, seen)) for k, v in sorted(attrs.items())
    )
    return ("object", id(type(value)), id(value), items)


def find_tracer(value: object, path: str) -> str | None:
    """The path of a traced value reachable from ``value`` (``model.w``), or None."""
    return _find(value, path, 0, _Budget(), set())


def _children(value: object, path: str) -> Iterator[tuple[Any, str]]:
    if isinstance(value, (list, tuple)):
        yield from ((v, f"{path}[{i}]") for i, v in enumerate(value))
    elif isinstance(value, dict):
        yield from ((v, f"{path}[{k!r}]") for k, v in value.items())
    elif isinstance(value, (set, frozenset)):
        yield from ((v, path) for v in value)
    elif isinstance(value, functools.partial):
        yield from ((v, f"{path}.args[{i}]") for i, v in enumerate(value.args))
        yield from ((v, f"{path}.keywords[{k!r}]") for k, v in value.keywords.items())
    elif isinstance(value, types.FunctionType):
        yield from ((v, f"{path}.{n}") for n, v in _function_parts(value) if n.startswith("<"))
        for name, cell in zip(value.__code__.co_freevars, value.__closure__ or (), strict=False):
            try:
                yield cell.cell_contents, f"{path}.<closure {name}>"
            except ValueError:
                continue
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        yield from (
            (getattr(value, f.name, None), f"{path}.{f.name}") for f in dataclasses.fields(value)
        )
    else:
        attrs = _attributes(value)
        if attrs is not None:
            yield from ((v, f"{path}.{k}") for k, v in attrs.items())


def _find(value: object, path: str, depth: int, budget: _Budget, seen: set[int]) -> str | None:
    if _is_tracer(value):
        return path
    if isinstance(value, (*_SCALARS, jax.Array, np.ndarray, *_OPAQUE)):
        return None
    if id(value) in seen or depth >= MAX_DEPTH or not budget.spend():
        return None
    seen.add(id(value))
    for child, child_path in _children(value, path):
        found = _find(child, child_path, depth + 1, budget, seen)
        if found is not None:
            return found
    return None
