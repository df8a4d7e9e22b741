"""``%%compare`` without IPython: a cell run eager, in graph mode and as a float64 reference.

The cell runs on copies: every name it reads is deep-copied (arrays are immutable and
shared, so only their containers are copied) into a fresh copy of the namespace for each
run, and the outputs are the names the cell binds (and its last expression). Afterwards
the user's namespace is checked name by name; a binding that changed anyway (a function the
cell called assigned a global) is put back and said so. ``print`` output of the eager run is
shown; the compiled run and the traces are silent.

- eager: the cell under ``jax.disable_jit()``;
- compiled: :func:`shardlab.engine.cells.staging.run_graph_cell` with a private cache (graph mode);
- traced and float64: the cell as a function of the arrays it reads, traced once
  (``compare.run_three_ways``), with its control flow converted as graph mode converts it.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import copy
import io
from collections.abc import Callable, MutableMapping
from typing import Any

import jax

from shardlab._core.trees import dynamic_part, is_array
from shardlab.engine.cells.source import FORMAT_NAME, RESULT_NAME, analyse_cell
from shardlab.engine.cells.staging import (
    DeferredFormat,
    GraphCache,
    GraphStagingError,
    run_graph_cell,
)
from shardlab.engine.compare.bisect import BisectReport, bisect
from shardlab.engine.compare.numerics import Tolerance
from shardlab.engine.compare.run import CompareReport, TraceFailure, run_three_ways
from shardlab.engine.convert.loops import Runtime
from shardlab.engine.convert.ops import Undefined
from shardlab.engine.convert.rewrite import RUNTIME

__all__ = ["bisect_cell", "compare_cell"]

_RESULT = "__shardlab_compare_result__"


def _copy(value: Any) -> Any:
    """A deep copy of ``value`` that shares its JAX arrays (they are immutable)."""
    try:
        leaves = jax.tree_util.tree_leaves(value)
    except Exception:  # not a pytree: copy as a whole
        leaves = []
    memo = {id(leaf): leaf for leaf in leaves if isinstance(leaf, jax.Array)}
    try:
        return copy.deepcopy(value, memo)
    except Exception:  # modules, locks...: not copyable, read-only in practice
        return value


class _Cell:
    """The cell's code (last expression bound to a hidden name) and what it reads."""

    def __init__(self, source: str, filename: str, line_offset: int) -> None:
        tree = ast.parse("\n" * line_offset + source, filename=filename)
        self.has_result = bool(tree.body) and isinstance(tree.body[-1], ast.Expr)
        if self.has_result:
            last = tree.body[-1]
            assert isinstance(last, ast.Expr)
            target = ast.Name(id=_RESULT, ctx=ast.Store())
            tree.body[-1] = ast.copy_location(ast.Assign(targets=[target], value=last.value), last)
            ast.fix_missing_locations(tree)
        self.code = compile(tree, filename, "exec")
        analysed = analyse_cell(source, filename=filename, line_offset=line_offset)
        self.reads = analysed.reads
        self.binds = analysed.binds
        # What graph mode traces: control flow on traced values converted (convert_pass)
        self.staged = analysed

    def namespace(self, namespace: MutableMapping[str, Any]) -> dict[str, Any]:
        copied = dict(namespace)
        for name in self.reads:
            if name in copied:
                copied[name] = _copy(copied[name])
        return copied

    def outputs(
        self, ns: MutableMapping[str, Any], result_label: str, result: str = _RESULT
    ) -> dict[str, Any]:
        out = {}
        for name in (*self.binds, result):
            if name in ns and not isinstance(ns[name], Undefined):
                label = result_label if name == result else name
                out[label] = ns[name]
        return out

    def staged_namespace(self, namespace: MutableMapping[str, Any]) -> dict[str, Any]:
        """A copy to trace the converted code in, with the names that code calls."""
        ns = self.namespace(namespace)
        ns["__builtins__"] = _silent_builtins()
        ns[FORMAT_NAME] = DeferredFormat
        if self.staged.converted_source is not None:
            ns[RUNTIME] = Runtime(self.staged.sites, filename=self.staged.filename, strict=False)
        return ns


def _labels(tree: dict[str, Any]) -> list[tuple[str, Any]]:
    found = []
    for name, value in tree.items():
        for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
            if is_array(leaf):
                found.append((name + jax.tree_util.keystr(tuple(path)), leaf))
    return found


def _arrays_only(value: Any) -> Any:
    return jax.tree_util.tree_map(lambda leaf: leaf if is_array(leaf) else None, value)


def _silent_builtins() -> dict[str, Any]:
    return {**vars(builtins), "print": lambda *args, **kwargs: None}


def _cell_function(
    cell: _Cell, namespace: MutableMapping[str, Any], names: list[str], result_label: str
) -> tuple[Callable[[dict[str, Any]], dict[str, Any]], dict[str, Any]]:
    """The cell as ``fn(inputs) -> {output: arrays}`` and its inputs (the names it reads
    that hold arrays)."""
    inputs = {
        n: namespace[n]
        for n in cell.reads
        if n in namespace and any(is_array(x) for x in _leaves(namespace[n]))
    }

    def cell_function(values: dict[str, Any]) -> dict[str, Any]:
        ns = cell.staged_namespace(namespace)
        ns.update(values)
        exec(cell.staged.code, ns)
        outs = cell.outputs(ns, result_label, RESULT_NAME)
        return {n: _arrays_only(outs[n]) for n in names if n in outs}

    return cell_function, inputs


def _leaves(value: Any) -> list[Any]:
    try:
        return jax.tree_util.tree_leaves(value)
    except Exception:
        return []


class _Guard:
    """Puts back any binding of the user's namespace that changed while comparing."""

    def __init__(self, namespace: MutableMapping[str, Any]) -> None:
        self.namespace = namespace
        self.before = dict(namespace)

    def restore(self) -> list[str]:
        changed = [n for n in self.namespace if n not in self.before]
        changed += [n for n, v in self.before.items() if self.namespace.get(n, _RESULT) is not v]
        for name in changed:
            if name in self.before:
                self.namespace[name] = self.before[name]
            else:
                del self.namespace[name]
        return sorted(set(changed))


def compare_cell(
    source: str,
    namespace: MutableMapping[str, Any],
    *,
    filename: str,
    line_offset: int = 0,
    cell_text: str | None = None,
    name: str = "this cell",
    result_label: str = "result",
    tolerances: dict[str, Tolerance] | None = None,
) -> CompareReport:
    """Runs the cell ``source`` eager, in graph mode and as a float64 reference on copies
    of what it reads in ``namespace``, which it leaves as it was; compares every array the
    cell binds (labelled ``loss``, ``grads['w1']``)."""
    guard = _Guard(namespace)
    try:
        report = _compare(
            source, namespace, filename, line_offset, cell_text, name, result_label, tolerances
        )
    finally:
        restored = guard.restore()
    if restored:
        note = (
            f"the cell's code changed {', '.join(f'`{n}`' for n in restored)} in the namespace "
            "(a function assigning a global); put back as it was before %%compare"
        )
        report = CompareReport(
            report.name,
            report.leaves,
            report.seconds,
            (*report.notes, note),
            report.bisect_call,
            report.failure,
        )
    return report


def _compare(
    source: str,
    namespace: MutableMapping[str, Any],
    filename: str,
    line_offset: int,
    cell_text: str | None,
    name: str,
    result_label: str,
    tolerances: dict[str, Tolerance] | None,
) -> CompareReport:
    cell = _Cell(source, filename, line_offset)

    def eager() -> dict[str, Any]:
        ns = cell.namespace(namespace)
        exec(cell.code, ns)
        return cell.outputs(ns, result_label)

    eager_values: dict[str, Any] = {}

    def eager_once() -> dict[str, Any]:
        eager_values.update(eager())
        return eager_values

    def compiled() -> dict[str, Any]:
        ns = cell.namespace(namespace)
        with contextlib.redirect_stdout(io.StringIO()):
            run = run_graph_cell(
                source,
                ns,
                cache=GraphCache(max_entries=1),
                filename=filename,
                line_offset=line_offset,
                cell_text=cell_text,
            )
        outs = cell.outputs(ns, result_label)
        if run.has_result:
            outs[result_label] = run.result
        return outs

    # The outputs are known once eager ran; the traced function returns those names.
    names: list[str] = []

    def traced(values: dict[str, Any]) -> dict[str, Any]:
        fn, _ = _cell_function(cell, namespace, names, result_label)
        with contextlib.redirect_stdout(io.StringIO()):
            return fn(values)

    _, inputs = _cell_function(cell, namespace, names, result_label)

    def eager_first() -> dict[str, Any]:
        values = eager_once()
        names.extend(n for n, v in values.items() if any(is_array(x) for x in _leaves(v)))
        return values

    dynamic, arrays = dynamic_part(traced, (inputs,), {})
    try:
        leaves, seconds, notes, failure = run_three_ways(
            name,
            dynamic,
            arrays,
            eager_first,
            tolerances,
            compiled_values=compiled,
            labels_of=_labels,
        )
    except GraphStagingError as error:
        failure = TraceFailure(
            "graph",
            "" if error.lineno is None else f"cell line {error.lineno}",
            error.line,
            error.reason,
            error.fix,
            "GraphStagingError",
        )
        leaves, seconds, notes = (), {}, ()
    call = None
    report = CompareReport(name, leaves, seconds, notes, None, failure)
    if failure is None and (not report.passed or report.differs):
        call = "%%compare --bisect (this cell again, with --bisect on its first line)"
    return CompareReport(name, leaves, seconds, notes, call, failure)


def bisect_cell(
    source: str,
    namespace: MutableMapping[str, Any],
    *,
    filename: str,
    line_offset: int = 0,
    name: str = "this cell",
    result_label: str = "result",
    tolerances: dict[str, Tolerance] | None = None,
) -> BisectReport:
    """:func:`shardlab.bisect` of the cell as a function of the arrays it reads."""
    guard = _Guard(namespace)
    try:
        cell = _Cell(source, filename, line_offset)
        with jax.disable_jit(), contextlib.redirect_stdout(io.StringIO()):
            ns = cell.namespace(namespace)
            exec(cell.code, ns)
        outs = cell.outputs(ns, result_label)
        names = [n for n, v in outs.items() if any(is_array(x) for x in _leaves(v))]
        fn, inputs = _cell_function(cell, namespace, names, result_label)

        def quiet(values: dict[str, Any]) -> dict[str, Any]:
            with contextlib.redirect_stdout(io.StringIO()):
                return fn(values)

        quiet.__name__ = name
        return bisect(quiet, inputs, tolerances=tolerances)
    finally:
        guard.restore()
