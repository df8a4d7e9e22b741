"""``print`` in a graph cell: part of the program, so it prints every run, in program order.

A graph cell's Python runs once, when it is traced; a plain ``print`` would print then, with
placeholders (``JitTracer(float32[])``), and never again. While a cell is traced, every
``print`` of the tracing thread is recorded instead, however it was reached: the cell's own
``print(...)``, ``__builtins__.print``, ``builtins.print`` and a ``print`` in a function the
cell calls. Each record's array arguments become extra outputs of the program; after every
run the records are printed with that run's values (:func:`emit`). ``jax.debug.print`` in
the cell is recorded the same way, so the two keep their order.

A ``print`` whose arguments belong to a nested transformation (a ``lax.fori_loop`` body, a
``jax.vmap``) cannot be an output of the cell's program: in the cell's own code it becomes a
``jax.debug.callback`` (printed at run time, possibly out of order); in a function the cell
calls it prints when traced, as JAX does (a callback there would stay in JAX's cache for
that function and print on its later calls outside the cell too).
"""

from __future__ import annotations

import builtins
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from shardlab._core.trees import Parts, is_jax_array, split

__all__ = ["DeferredFormat", "Recorder", "emit", "recording"]


class DeferredFormat:
    """An f-string inside ``print`` (or a ``jax.debug.print`` format) whose formatting waits
    for concrete values."""

    def __init__(self, template: str, *values: object, **named: object) -> None:
        self.template = template
        self.values = values
        self.named = named

    def render(self) -> str:
        def concrete(v: object) -> object:  # a 0-d NumPy array from a runtime callback
            return v[()] if type(v) is np.ndarray and v.ndim == 0 else v

        return self.template.format(
            *map(concrete, self.values), **{k: concrete(v) for k, v in self.named.items()}
        )

    def __str__(self) -> str:  # formatting outside print (trace time)
        return self.render()


jax.tree_util.register_pytree_node(
    DeferredFormat,
    lambda d: ((d.values, d.named), d.template),
    lambda template, children: DeferredFormat(template, *children[0], **children[1]),
)


@dataclass
class PrintRecord:
    """One ``print`` call of a trace: its arguments, taken apart, and its keywords."""

    args: Parts
    kwargs: dict[str, Any]


# What a traced value looks like once formatted into a string (JitTracer(float32[3]),
# GradTracer(primal=…), Traced<ShapedArray(…)> in older JAX).
_TRACER_TEXT = re.compile(r"\w*Tracer\(|Traced<")


class Recorder:
    """The prints of one trace of a graph cell, in program order."""

    def __init__(self, *, filename: str, outer_trace: object) -> None:
        self.filename = filename  # the cell's: its own code, as opposed to what it calls
        self.outer_trace = outer_trace
        self.prints: list[PrintRecord] = []
        self.arrays: list[Any] = []  # the array arguments of ``prints``, in order
        self.notes: list[str] = []

    def _foreign(self, arrays: list[Any]) -> bool:
        """Whether an argument belongs to a nested transformation, not the cell's trace."""
        return any(getattr(a, "_trace", self.outer_trace) is not self.outer_trace for a in arrays)

    def print(self, args: tuple[Any, ...], kwargs: dict[str, Any], *, in_cell: bool) -> None:
        parts, arrays = split(args, is_jax_array)
        if self._foreign(arrays):
            if not in_cell:  # as JAX would: see the module docstring
                real_print()(*args, **kwargs)
                return
            record = PrintRecord(parts, kwargs)
            jax.debug.callback(lambda *values: emit(record, list(values)), *arrays)
            return
        if any(isinstance(a, str) and _TRACER_TEXT.search(a) for a in args):
            self._note_formatted_tracer()
        self.prints.append(PrintRecord(parts, kwargs))
        self.arrays.extend(arrays)

    def debug_print(self, fmt: str, args: tuple[Any, ...], named: dict[str, Any]) -> Any:
        deferred = DeferredFormat(fmt, *args, **named)
        parts, arrays = split((deferred,), is_jax_array)
        if self._foreign(arrays):
            return None  # the caller prints with jax.debug.print itself
        self.prints.append(PrintRecord(parts, {}))
        self.arrays.extend(arrays)
        return True

    def _note_formatted_tracer(self) -> None:
        frame = sys._getframe()
        while frame is not None and frame.f_code.co_filename != self.filename:
            frame = frame.f_back
        where = f"cell line {frame.f_lineno}: " if frame is not None else ""
        note = (
            f"{where}`print` was given a string with a traced value already formatted into "
            "it (`str(x)`, `'%s' % x`, or an f-string in a function the cell calls), so "
            "every run prints the placeholder; pass the array as its own argument (`print('loss', loss)`) or "
            "use `jax.debug.print('loss {}', loss)`."
        )
        if note not in self.notes:
            self.notes.append(note)


def emit(record: PrintRecord, values: list[Any]) -> None:
    """Prints ``record`` with ``values``, this run's values of its array arguments."""
    args = record.args.rebuild(values)  # JAX arrays print as they do outside a graph cell
    rendered = [a.render() if isinstance(a, DeferredFormat) else a for a in args]
    real_print()(*rendered, **record.kwargs)


# -- routing print and jax.debug.print to the recorder of the tracing thread --------------------

_local = threading.local()
_lock = threading.Lock()
_installed = 0
_ORIGINAL_PRINT = builtins.print
_previous: dict[str, Any] = {}
_debug_print = jax.debug.print


def real_print() -> Callable[..., None]:
    """``print`` as it is outside graph cells' traces."""
    found = _previous.get("print") or builtins.print
    return _ORIGINAL_PRINT if found is staged_print else found


def _recorder() -> Recorder | None:
    return getattr(_local, "recorder", None)


def staged_print(*args: Any, **kwargs: Any) -> None:
    """``print`` while a graph cell is traced on this thread; plain ``print`` otherwise."""
    recorder = _recorder()
    if recorder is None:
        real_print()(*args, **kwargs)
        return
    caller = sys._getframe(1).f_code.co_filename
    recorder.print(args, kwargs, in_cell=caller == recorder.filename)


staged_print.__name__ = staged_print.__qualname__ = "print"


def staged_debug_print(fmt: str, *args: Any, ordered: bool = False, **named: Any) -> None:
    """``jax.debug.print`` that keeps program order with ``print`` in a graph cell."""
    recorder = _recorder()
    if recorder is None or recorder.debug_print(fmt, args, named) is None:
        _debug_print(fmt, *args, ordered=ordered, **named)


@contextmanager
def recording(recorder: Recorder) -> Iterator[None]:
    """Routes this thread's ``print`` and ``jax.debug.print`` to ``recorder`` (other threads
    print as usual)."""
    global _installed
    with _lock:
        if _installed == 0:
            _previous["print"] = builtins.print
            builtins.print = staged_print
            jax.debug.print = staged_debug_print  # type: ignore[assignment]
        _installed += 1
    outer = _recorder()
    _local.recorder = recorder
    try:
        yield
    finally:
        _local.recorder = outer
        with _lock:
            _installed -= 1
            if _installed == 0:
                if builtins.print is staged_print:
                    builtins.print = _previous.pop("print")
                else:  # replaced by someone else meanwhile: leave theirs
                    _previous.pop("print", None)
                jax.debug.print = _debug_print  # type: ignore[assignment]
