"""Graph mode: a whole cell staged into one compiled program.

Names the cell reads that hold arrays (or pytrees with array leaves) become the program's
inputs; names it binds become outputs written back to the namespace after a successful run
(so a failing or interrupted cell changes nothing). Everything else the cell reads is static:
part of the cache key and closed over. The key holds numbers, strings, bytes, ``None`` and
hashable tuples and frozensets by value, any other object by identity.

The cache is keyed by cell source and the static part; JAX's own jit cache then keys on input
shapes, dtypes and shardings, so re-running a cell with same-shaped inputs does not retrace.

A failing, refused or interrupted cell changes nothing: its outputs are written only after
the program ran, and what its Python changed in place while it was traced (a list it
appended to, a global a function bound) is put back by the trace's ``Journal``; a traced
value stored in an object from outside the cell is refused (``refusals.py``). ``del name``
removes a name the cell leaves unbound; ``del key`` then ``key = ...`` rebinds it.

``print`` in a graph cell prints at run time, every run, with concrete values, however it
is reached (``prints.py``): its arguments become extra program outputs printed in program
order after the run (f-strings inside ``print`` are formatted then too). A ``print`` inside
a nested transformation (a ``lax.fori_loop`` body, say) falls back to ``jax.debug.callback``,
which may reorder.
"""

from __future__ import annotations

import builtins
import collections
import linecache
import sys
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from shardlab._core.trees import Parts, is_array, is_jax_array, split
from shardlab.engine.cells import state
from shardlab.engine.cells.errors import GraphStagingError, translate_trace_error
from shardlab.engine.cells.journal import Journal
from shardlab.engine.cells.prints import (
    DeferredFormat,
    PrintRecord,
    Recorder,
    emit,
    real_print,
    recording,
    staged_print,
)
from shardlab.engine.cells.refusals import (
    check_converted,
    check_definitions,
    check_mutations,
    leak_error,
    refuse_traced_leftovers,
)
from shardlab.engine.cells.source import (
    FORMAT_NAME,
    RESULT_NAME,
    CellSource,
    analyse_cell,
    dropped_blank_lines,
)
from shardlab.engine.convert.exprs import raising_failed_asserts
from shardlab.engine.convert.loops import Runtime
from shardlab.engine.convert.ops import Undefined
from shardlab.engine.convert.rewrite import RUNTIME

__all__ = [
    "DeferredFormat",
    "GraphCache",
    "GraphRun",
    "GraphStagingError",
    "run_graph_cell",
]


# A `for` over a concrete `range` this long whose state holds arrays (a training loop
# written as eager code) is staged as lax.scan, one copy of its body instead of one per step.
LONG_RANGE = 100

_TRACE_ERRORS = (
    jax.errors.ConcretizationTypeError,  # includes TracerBoolConversionError
    jax.errors.NonConcreteBooleanIndexError,  # x[x < 0]: a shape that depends on values
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.UnexpectedTracerError,
)


@dataclass(frozen=True)
class _Input:
    name: str
    parts: Parts


@dataclass
class _Structure:
    """What a trace found out about the outputs (recorded per input signature)."""

    names: tuple[str, ...]
    values: Parts  # the values of ``names``, as a tuple
    prints: list[PrintRecord]
    # Names the cell deleted (``del sub``) and did not bind again: removed after a run.
    deleted: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # about its prints, said once per cell
    # Inputs the cell changed in place (an nnx module's RNG counter, a BatchNorm's
    # statistics): their new state, as a tuple of (name, value) after ``values``' arrays.
    mutated: tuple[str, ...] = ()
    mutated_values: Parts | None = None


@dataclass
class _Entry:
    cell: CellSource
    inputs: tuple[_Input, ...]
    statics: dict[str, Any]
    fn: Callable[..., Any] | None = None
    strict: bool = False
    runtime: Runtime | None = None  # the converted control flow's, of the latest trace
    traces: int = 0
    runs: int = 0
    structures: dict[tuple[Any, ...], _Structure] = field(default_factory=dict)
    active: _Call | None = None  # the run in progress


@dataclass
class _Call:
    """One run of a graph cell: the namespace it reads, and the journals of its traces
    (what tracing changed in the objects the cell reached, to undo when the run fails)."""

    namespace: MutableMapping[str, Any]
    journals: list[Journal] = field(default_factory=list)

    def undo(self) -> None:
        for journal in reversed(self.journals):
            journal.restore()


@dataclass(frozen=True)
class GraphRun:
    """The outcome of one graph-cell run."""

    result: Any
    has_result: bool
    traced: bool
    traces: int
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]
    notes: tuple[str, ...] = ()  # said once per cell: retraces, state read by identity
    updated: tuple[str, ...] = ()  # inputs whose state the cell changed in place
    # Converted control flow (Runtime.summary of the trace): statements converted, how many
    # of them staged as which lax construct, how many ran as Python. None: nothing to convert.
    conversions: dict[str, Any] | None = None


class GraphCache:
    """Compiled graph cells, most recently used last, bounded to ``max_entries``."""

    def __init__(self, *, max_entries: int = 64) -> None:
        self.max_entries = max_entries
        self._entries: collections.OrderedDict[Any, _Entry] = collections.OrderedDict()
        self._cells: dict[tuple[str, str, int], CellSource] = {}
        self._last_key: dict[str, Any] = {}  # source -> key_parts of its latest new entry
        self._said: set[tuple[str, str]] = set()  # (source, note kind) already said
        self.total_traces = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> int:
        """Drops every staged cell; returns how many there were."""
        count = len(self._entries)
        self._entries.clear()
        self._cells.clear()
        self._last_key.clear()
        return count

    def traces_of(self, source: str) -> int:
        """Total traces of all entries staged from ``source``."""
        return sum(e.traces for e in self._entries.values() if e.cell.source == source)

    def analysed(self, source: str, filename: str, line_offset: int) -> CellSource:
        """The static analysis of a cell's source (its reads, binds, converted control flow),
        cached by source, file and line offset."""
        key = (source, filename, line_offset)
        cell = self._cells.get(key)
        if cell is None:
            cell = analyse_cell(source, filename=filename, line_offset=line_offset)
            if len(self._cells) >= 4 * self.max_entries:
                self._cells.clear()
            self._cells[key] = cell
        return cell

    def _get(self, key: Any) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def _put(self, key: Any, entry: _Entry) -> None:
        self._entries[key] = entry
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


def _split_inputs(
    cell: CellSource, namespace: MutableMapping[str, Any]
) -> tuple[tuple[_Input, ...], list[Any], dict[str, Any], tuple[Any, ...], list[str]]:
    """The cell's inputs: array leaves (program arguments), the rest (closed over), the
    cache key of the rest's state and the paths whose state is read by identity only."""
    inputs: list[_Input] = []
    arrays: list[Any] = []
    statics: dict[str, Any] = {}
    key_parts: list[Any] = []
    budget = state._Budget()
    for name in cell.reads:
        if name not in namespace:
            continue
        value = namespace[name]
        parts, leaves = split(value, is_array)
        if leaves:
            inputs.append(_Input(name, parts))
            arrays.extend(leaves)
            static_key = tuple(
                state.state_key(s, name=name, budget=budget) for s in parts.static_leaves
            )
            key_parts.append((name, "array", parts.treedef, static_key))
        else:
            statics[name] = value
            key_parts.append((name, "static", state.state_key(value, name=name, budget=budget)))
    return tuple(inputs), arrays, statics, tuple(key_parts), budget.untracked


def _signature(arrays: list[Any]) -> tuple[Any, ...]:
    return tuple((tuple(np.shape(a)), str(getattr(a, "dtype", ""))) for a in arrays)


def _make_staged(entry: _Entry, cache: GraphCache) -> Callable[..., Any]:
    cell = entry.cell

    def staged(arrays: list[Any]) -> tuple[list[Any], list[Any]]:
        __tracebackhide__ = True
        entry.traces += 1
        cache.total_traces += 1
        call = entry.active
        journal = None
        if call is not None:  # before the cell's Python runs: what it may change
            user = call.namespace
            roots = [(n, user[n]) for n in cell.reads if n in user]
            journal = Journal(roots, namespace=user)
            call.journals.append(journal)
        outer_trace = next((getattr(a, "_trace", None) for a in arrays), None)
        recorder = Recorder(filename=cell.filename, outer_trace=outer_trace)
        # The builtins module, as in a notebook: ``print`` (however reached) is the
        # recorder's while the cell is traced.
        namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        namespace.update(entry.statics)
        namespace["__builtins__"] = builtins
        namespace[FORMAT_NAME] = DeferredFormat
        if cell.converted_source is not None:  # converted code calls __sl__, sites or not
            entry.runtime = Runtime(cell.sites, filename=cell.filename, strict=entry.strict)
            entry.runtime.long_range = LONG_RANGE
            namespace[RUNTIME] = entry.runtime
        offset = 0
        rebuilt: list[tuple[_Input, Any, list[Any]]] = []
        for spec in entry.inputs:
            count = len(spec.parts.array_positions)
            value = spec.parts.rebuild(arrays[offset : offset + count])
            namespace[spec.name] = value
            rebuilt.append((spec, value, jax.tree_util.tree_leaves(value)))
            offset += count
        with recording(recorder):
            exec(cell.code, namespace)
        # A name converted control flow left unbound (bound on one path, read nowhere
        # after) is not an output.
        names = tuple(
            n
            for n in (*cell.binds, RESULT_NAME)
            if n in namespace and not isinstance(namespace[n], Undefined)
        )
        for name in names:
            if namespace[name] is staged_print:  # ``p = print``: the real one goes back
                namespace[name] = real_print()
            refuse_traced_leftovers(cell, name, namespace[name])
        if journal is not None:
            leak = journal.find_tracer()
            if leak is not None:
                raise leak_error(cell, leak)
        else:
            for name, value in entry.statics.items():
                refuse_traced_leftovers(cell, name, value, outside=True)
        parts, out_arrays = split(tuple(namespace[n] for n in names), is_jax_array)
        mutated: list[str] = []
        mutated_values: list[Any] = []
        for spec, value, before in rebuilt:
            if spec.name in names:
                continue  # rebinding the name wins
            after, treedef = jax.tree_util.tree_flatten(value)
            if treedef == spec.parts.treedef and all(
                a is b for a, b in zip(after, before, strict=True)
            ):
                continue
            refuse_traced_leftovers(cell, spec.name, value, outside=True, in_place=True)
            mutated.append(spec.name)
            mutated_values.append(value)
        # ``del key`` then ``key = ...`` rebinds it: only a name the cell left unbound goes.
        deleted = tuple(n for n in cell.deletes if n not in namespace)
        structure = _Structure(
            names, parts, recorder.prints, deleted=deleted, notes=tuple(recorder.notes)
        )
        if mutated:
            structure.mutated = tuple(mutated)
            structure.mutated_values, more = split(tuple(mutated_values), is_jax_array)
            out_arrays = [*out_arrays, *more]
        entry.structures[_signature(arrays)] = structure
        return out_arrays, recorder.arrays

    return staged


def run_graph_cell(
    source: str,
    namespace: MutableMapping[str, Any],
    *,
    cache: GraphCache,
    filename: str | None = None,
    line_offset: int = 0,
    cell_text: str | None = None,
    strict: bool = False,
) -> GraphRun:
    """Stages ``source`` as one compiled program, runs it, and writes its outputs back.

    Args:
        source: the cell body.
        namespace: the user namespace; read for inputs, written for outputs (only after
            the program ran successfully).
        cache: where staged cells live between runs.
        filename: the name tracebacks show; registered in ``linecache`` with ``cell_text``.
        line_offset: lines above ``source`` in the cell as shown to the user.
        cell_text: the whole cell as shown to the user (defaults to ``source``).
        strict: converted control flow that would run as Python raises instead.

    Raises:
        GraphStagingError: the cell cannot be staged; the message names the line, the reason
            and what to do instead.
    """
    __tracebackhide__ = True
    if cell_text is not None:  # a blank first line that IPython dropped still counts
        body = "".join(cell_text.splitlines(True)[line_offset:])
        line_offset += dropped_blank_lines(body, source)
    filename = filename or f"<graph-cell-{abs(hash(source)) & 0xFFFFFFFF:08x}>"
    if filename not in linecache.cache:
        text = cell_text if cell_text is not None else "\n" * line_offset + source
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    cell = cache.analysed(source, filename, line_offset)
    check_definitions(cell, line_offset)
    check_mutations(cell, namespace, line_offset)
    if strict:
        check_converted(cell)
    inputs, arrays, statics, key_parts, untracked = _split_inputs(cell, namespace)
    key = (source, strict, key_parts)
    entry = cache._get(key)
    notes: list[str] = []
    if entry is None:
        notes = _staging_notes(cache, source, key_parts, namespace, untracked)
        entry = _Entry(cell=cell, inputs=inputs, statics=statics, strict=strict)
        entry.fn = jax.jit(_make_staged(entry, cache))
        cache._put(key, entry)
    call = _Call(namespace)
    entry.active = call
    try:
        return _run(entry, cache, call, arrays, key, notes, inputs)
    except BaseException:
        call.undo()  # what tracing changed in the objects the cell reached
        raise
    finally:
        entry.active = None


def _run(
    entry: _Entry,
    cache: GraphCache,
    call: _Call,
    arrays: list[Any],
    key: Any,
    notes: list[str],
    inputs: tuple[_Input, ...],
) -> GraphRun:
    """Runs ``entry``'s program (tracing it first when needed) and writes its outputs."""
    __tracebackhide__ = True
    cell, source, namespace = entry.cell, entry.cell.source, call.namespace
    traces_before = entry.traces
    assert entry.fn is not None
    try:
        with raising_failed_asserts():
            out_arrays, print_arrays = entry.fn(arrays)
    except _TRACE_ERRORS as error:
        raise translate_trace_error(error, cell) from None
    structure = entry.structures[_signature(arrays)]
    entry.runs += 1
    traced = entry.traces > traces_before
    if traced:
        said = [*(entry.runtime.notes if entry.runtime is not None else ()), *structure.notes]
        for note in said:
            if (source, note) not in cache._said:
                cache._said.add((source, note))
                notes.append(note)
        # Tracing ran the cell's Python, which may change state it reads (a trace counter
        # in a global): file the program under the state it left too, or the next run
        # would see a new key and stage the cell again.
        after = (source, entry.strict, _split_inputs(cell, namespace)[3])
        if after != key:
            cache._put(after, entry)
    values = structure.values.rebuild(out_arrays[: len(structure.values.array_positions)])
    # Print what the cell printed, in program order, with this run's values.
    jax.block_until_ready(print_arrays)
    offset = 0
    for record in structure.prints:
        count = len(record.args.array_positions)
        emit(record, print_arrays[offset : offset + count])
        offset += count
    jax.effects_barrier()
    result = None
    for name, value in zip(structure.names, values, strict=True):
        if name == RESULT_NAME:
            result = value
        else:
            namespace[name] = value
    if structure.mutated_values is not None:
        count = len(structure.values.array_positions)
        updated = structure.mutated_values.rebuild(out_arrays[count:])
        for name, value in zip(structure.mutated, updated, strict=True):
            _update_in_place(namespace, name, value)
    for name in structure.deleted:
        namespace.pop(name, None)
    return GraphRun(
        result=result,
        has_result=cell.has_result,
        traced=traced,
        traces=entry.traces,
        outputs=tuple(n for n in structure.names if n != RESULT_NAME),
        inputs=tuple(i.name for i in inputs),
        notes=tuple(notes),
        updated=structure.mutated,
        conversions=None if entry.runtime is None else entry.runtime.summary(),
    )


def _update_in_place(namespace: MutableMapping[str, Any], name: str, value: Any) -> None:
    """Gives the user's object the state the cell left in its staged copy.

    An nnx module (a graph node) is updated in place, as running the cell unstaged would
    have done, so other references to it (an optimizer's) see the change; any other pytree
    is rebound under its name.
    """
    original = namespace.get(name)
    nnx = sys.modules.get("flax.nnx")
    if nnx is not None and original is not None and nnx.graph.is_graph_node(original):
        nnx.update(original, nnx.state(value))
    else:
        namespace[name] = value


def _staging_notes(
    cache: GraphCache,
    source: str,
    key_parts: tuple[Any, ...],
    namespace: MutableMapping[str, Any],
    untracked: list[str],
) -> list[str]:
    """What to tell the user, once per cell, when it is staged again or reads state the
    cache key cannot see."""
    notes = []
    previous = cache._last_key.get(source)
    cache._last_key[source] = key_parts
    if previous is not None:
        before = {p[0]: p for p in previous}
        for part in key_parts:
            name = part[0]
            value = namespace.get(name)
            if (
                name in before
                and before[name] != part
                and isinstance(value, (int, float, complex))
                and not isinstance(value, bool)
                and (source, "number:" + name) not in cache._said
            ):
                cache._said.add((source, "number:" + name))
                notes.append(
                    f"`{name}` is a Python {type(value).__name__} ({value!r}) read by this "
                    "graph cell: each new value stages and compiles the cell again. Pass it "
                    f"as an array (`{name} = jnp.asarray({name})`) to reuse one program."
                )
    if untracked and (source, "untracked") not in cache._said:
        cache._said.add((source, "untracked"))
        shown = ", ".join(f"`{p}`" for p in untracked[:3]) + (" …" if len(untracked) > 3 else "")
        notes.append(
            f"{shown}: too large or deep to track, read by identity: changes to its state "
            "after this cell is staged are not seen. Pass its arrays as names, or run the "
            "cell with %%jit."
        )
    return notes
