"""Undoing what tracing a graph cell did to the objects it reached.

A graph cell's Python runs while it is traced, on the user's own objects: the lists, dicts
and objects it reads, and those the functions it calls read, are the real ones. A statement
that changes one in place (``history["loss"].append(loss)``, a function that appends to a
global list or sets ``self.w``) does so at trace time, with traced values.

Before the trace, a :class:`Journal` takes a shallow copy of every mutable container
reachable from the cell's state, with the reach of the cache key's walk (``state.py``):
items, attributes, the globals, closure cells and defaults of functions, and the namespace
itself. After it, :meth:`Journal.find_tracer` says whether a traced value was stored in one
of them, and :meth:`Journal.restore` puts back the contents of every container that changed,
so that a refused or failing cell changes nothing and leaves no traced value behind. A cell
that succeeds keeps its trace-time side effects (a trace counter), as Python would.

The walk is bounded like the key's (``state.MAX_DEPTH``, ``state.MAX_ITEMS``); NumPy arrays
are not copied (item assignment of a traced value into one fails anyway).
"""

from __future__ import annotations

import collections
import functools
import types
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from shardlab.engine.cells import state

__all__ = ["Journal", "Leak"]

_MISSING = object()
_SCALARS = (int, float, complex, str, bytes, bool, type(None), np.generic, range, slice)
_OPAQUE = (
    types.ModuleType,
    type,
    types.BuiltinFunctionType,
    types.MethodWrapperType,
    types.CodeType,
    jax.Array,
    np.ndarray,
)


@dataclass
class _Saved:
    holder: Any
    path: str  # how the user names it: ``metrics_history['loss']``, ``model``
    kind: str  # list, deque, dict, set, bytearray, attributes, cell, namespace
    contents: Any  # the shallow copy


@dataclass(frozen=True)
class Leak:
    """A traced value stored in an object from outside the cell."""

    path: str  # where the traced value is: ``metrics_history['loss'][0]``
    holder_path: str  # the container it was put into: ``metrics_history['loss']``
    holder: Any


class Journal:
    """Shallow copies of the containers a trace may change (see the module docstring)."""

    def __init__(
        self,
        roots: list[tuple[str, Any]],
        *,
        namespace: MutableMapping[str, Any] | None = None,
    ) -> None:
        self._saved: list[_Saved] = []
        self._seen: set[int] = set()
        self._budget = state._Budget()
        if namespace is not None:
            self._seen.add(id(namespace))
            self._saved.append(_Saved(namespace, "", "namespace", dict(namespace.items())))
        for name, value in roots:
            self._walk(value, name, 0)

    # -- before the trace ---------------------------------------------------------------------
    def _walk(self, value: Any, path: str, depth: int) -> None:
        if isinstance(value, (*_SCALARS, *_OPAQUE)) or state._is_tracer(value):
            return
        if type(value).__module__.startswith("shardlab.engine."):
            return  # the engine's own objects are not user state
        if id(value) in self._seen or depth >= state.MAX_DEPTH or not self._budget.spend():
            return
        self._seen.add(id(value))
        for child, child_path in self._save(value, path):
            self._walk(child, child_path, depth + 1)

    def _save(self, value: Any, path: str) -> Iterator[tuple[Any, str]]:
        """Records ``value``'s contents when it is mutable; yields what to walk into."""
        if isinstance(value, list):
            self._saved.append(_Saved(value, path, "list", list(value)))
            yield from ((v, f"{path}[{i}]") for i, v in enumerate(value))
        elif isinstance(value, collections.deque):
            self._saved.append(_Saved(value, path, "deque", list(value)))
            yield from ((v, f"{path}[{i}]") for i, v in enumerate(value))
        elif isinstance(value, dict):
            self._saved.append(_Saved(value, path, "dict", dict(value)))
            yield from ((v, f"{path}[{k!r}]") for k, v in value.items())
        elif isinstance(value, set):
            self._saved.append(_Saved(value, path, "set", set(value)))
            yield from ((v, path) for v in value)
        elif isinstance(value, bytearray):
            self._saved.append(_Saved(value, path, "bytearray", bytes(value)))
        elif isinstance(value, (tuple, frozenset)):
            yield from ((v, f"{path}[{i}]") for i, v in enumerate(value))
        elif isinstance(value, functools.partial):
            yield from ((v, f"{path}.args[{i}]") for i, v in enumerate(value.args))
            yield value.keywords, f"{path}.keywords"
            yield value.func, path
        elif isinstance(value, types.MethodType):
            yield value.__self__, path
            yield value.__func__, path
        elif isinstance(value, types.FunctionType):
            yield from self._function(value, path)
        else:
            wrapped = getattr(value, "__wrapped__", None)
            if wrapped is not None and callable(value):  # jax.jit, functools.wraps
                yield wrapped, path
            attrs = _instance_dict(value)
            if attrs is not None:
                self._saved.append(_Saved(value, path, "attributes", dict(attrs)))
                yield from ((v, f"{path}.{k}") for k, v in attrs.items())

    def _function(self, fn: types.FunctionType, path: str) -> Iterator[tuple[Any, str]]:
        if state._is_library(fn):  # installed code: its globals are not the user's state
            return
        module_globals = fn.__globals__
        if id(module_globals) not in self._seen:  # a user module's globals (`global n`)
            self._seen.add(id(module_globals))
            self._saved.append(_Saved(module_globals, "", "namespace", dict(module_globals)))
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False):
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                contents = _MISSING
            self._saved.append(_Saved(cell, name, "cell", contents))
            if contents is not _MISSING:
                yield contents, name
        for name, value in state._function_parts(fn):
            if not name.startswith("<"):
                yield value, name  # a global: the user calls it by this name
            else:
                yield value, f"{fn.__name__}.{name}"

    # -- after the trace ----------------------------------------------------------------------
    def find_tracer(self) -> Leak | None:
        """A traced value that the trace stored in a container recorded here, or None."""
        for saved in self._saved:
            for child, child_path in _new_children(saved):
                found = state.find_tracer(child, child_path)
                if found is not None:
                    return Leak(found, saved.path, saved.holder)
        return None

    def restore(self) -> None:
        """Gives every recorded container that changed its contents from before the trace."""
        for saved in reversed(self._saved):
            if _changed(saved):
                _put_back(saved)


def _instance_dict(value: object) -> dict[str, Any] | None:
    try:
        attrs = vars(value)
    except TypeError:
        return None
    return attrs if type(attrs) is dict else None


def _current(saved: _Saved) -> Any:
    holder = saved.holder
    if saved.kind == "attributes":
        return vars(holder)
    if saved.kind == "cell":
        try:
            return holder.cell_contents
        except ValueError:
            return _MISSING
    return holder


def _changed(saved: _Saved) -> bool:
    now, before = _current(saved), saved.contents
    if saved.kind in ("list", "deque"):
        return len(now) != len(before) or any(a is not b for a, b in zip(now, before, strict=True))
    if saved.kind in ("dict", "attributes", "namespace"):
        return len(now) != len(before) or any(
            before.get(k, _MISSING) is not v for k, v in now.items()
        )
    if saved.kind == "set":
        return now != before
    if saved.kind == "bytearray":
        return bytes(now) != before
    return now is not before  # a closure cell


def _new_children(saved: _Saved) -> Iterator[tuple[Any, str]]:
    """What the container holds now that it did not hold before the trace."""
    if not _changed(saved):
        return
    now, before, path = _current(saved), saved.contents, saved.path
    if saved.kind in ("list", "deque"):
        old = {id(v) for v in before}
        yield from ((v, f"{path}[{i}]") for i, v in enumerate(now) if id(v) not in old)
    elif saved.kind in ("dict", "attributes", "namespace"):
        for k, v in list(now.items()):
            if before.get(k, _MISSING) is not v:
                if saved.kind == "namespace":
                    yield v, str(k)
                elif saved.kind == "attributes":
                    yield v, f"{path}.{k}"
                else:
                    yield v, f"{path}[{k!r}]"
    elif saved.kind == "set":
        yield from ((v, path) for v in now - before)
    elif saved.kind == "cell" and now is not _MISSING:
        yield now, path


def _put_back(saved: _Saved) -> None:
    holder, before = saved.holder, saved.contents
    if saved.kind == "list":
        holder[:] = before
    elif saved.kind == "deque":
        holder.clear()
        holder.extend(before)
    elif saved.kind in ("dict", "set"):
        holder.clear()
        holder.update(before)
    elif saved.kind == "bytearray":
        holder[:] = before
    elif saved.kind == "attributes":
        attrs = vars(holder)
        attrs.clear()
        attrs.update(before)
    elif saved.kind == "namespace":
        for k in [k for k in holder if k not in before]:
            del holder[k]
        for k, v in before.items():
            if holder.get(k, _MISSING) is not v:
                holder[k] = v
    elif before is _MISSING:  # a closure cell that was empty
        del holder.cell_contents
    else:
        holder.cell_contents = before
