"""What a graph cell refuses, and the fix each refusal gives.

Before the trace, from the cell's source and the namespace: a definition (it would capture
traced values), an in-place change of a container from outside the cell
(``log.append(x)``, ``metrics["loss"].append(loss)``), and in strict mode a statement the
conversion left as Python. After the trace: a traced value that would outlive the program,
in an output that is not a pytree or in an object from outside the cell (the journal has
put that object back by the time the error is shown).

Each error names the cell line, says why in one sentence and gives a fix that applies to
the value at hand: a dict is already a pytree, so "make it a pytree" is no fix for a dict of
lists; keeping the value as a name of the cell and appending it in an eager cell is.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import jax
import numpy as np

from shardlab._core.trees import is_jax_array
from shardlab.engine.cells import state
from shardlab.engine.cells.errors import GraphStagingError
from shardlab.engine.cells.journal import Leak
from shardlab.engine.cells.source import CellSource
from shardlab.engine.convert.ops import ControlFlowError

__all__ = [
    "check_converted",
    "check_definitions",
    "check_mutations",
    "leak_error",
    "refuse_traced_leftovers",
]


def check_mutations(cell: CellSource, namespace: MutableMapping[str, Any], offset: int) -> None:
    for mutation in cell.mutations:
        if mutation.name not in namespace:
            continue
        value = namespace[mutation.name]
        nested = mutation.how.startswith("method") and mutation.target != mutation.name
        if nested:  # ``metrics["loss"].append(v)``: the list inside, when it can be found
            value = _resolve(mutation.target, namespace)
            if value is _UNKNOWN:
                continue  # the trace's journal still undoes it and refuses a traced value
        if mutation.how.startswith("method"):
            flagged = isinstance(value, (list, dict, set, bytearray, collections.deque))
        elif mutation.how == "item assignment":
            flagged = not isinstance(value, jax.Array)
        else:
            flagged = not isinstance(value, type(sys))
        if flagged:
            kind = type(value).__name__
            target = mutation.target if nested else mutation.name
            method = "." + mutation.how.removeprefix("method .").removesuffix("()")
            fix = (
                _store_later_hint(target, mutation.argument, method, value, cell.binds)
                if nested
                else f"{_rebuild_hint(mutation.name, value)}, or run the cell with %%jit or %%eager."
            )
            raise GraphStagingError(
                lineno=mutation.lineno + offset,
                line=cell.line(mutation.lineno, offset=0),
                reason=(
                    f"{mutation.how} mutates `{target}` (a {kind} from outside the "
                    "cell) in place; a staged cell runs its Python once, at trace time, so "
                    "the mutation would not repeat on later runs and could leak traced values."
                ),
                fix=fix,
            )


_UNKNOWN = object()


def _resolve(expression: str, namespace: MutableMapping[str, Any]) -> Any:
    """The object ``expression`` (``metrics["loss"]``, ``state.history``) names, found
    without running user code: names, constant keys of dicts, lists and tuples, and instance
    attributes. ``_UNKNOWN`` for anything else (``metrics[k]``, a property)."""
    node = ast.parse(expression, mode="eval").body
    steps: list[ast.expr] = []
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        steps.append(node)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in namespace:
        return _UNKNOWN
    value: Any = namespace[node.id]
    for step in reversed(steps):
        if isinstance(step, ast.Attribute):
            attrs = getattr(value, "__dict__", None)
            if not isinstance(attrs, dict) or step.attr not in attrs:
                return _UNKNOWN
            value = attrs[step.attr]
        else:
            assert isinstance(step, ast.Subscript)
            if not isinstance(step.slice, ast.Constant) or type(value) not in (dict, list, tuple):
                return _UNKNOWN
            try:
                value = value[step.slice.value]
            except (KeyError, IndexError, TypeError):
                return _UNKNOWN
    return value


def _store_later_hint(
    target: str, argument: str | None, method: str | None, value: object, binds: tuple[str, ...]
) -> str:
    """The fix for changing a container from outside the cell: keep the new value as a name
    of the cell (written back after every run), and change the container after the cell,
    where Python runs every time."""
    if isinstance(value, (list, collections.deque)):
        verb, method = "append", method or ".append"
    elif isinstance(value, (set, frozenset)):
        verb, method = "add", method or ".add"
    else:
        verb = "store"
    if argument is not None and argument in binds:
        keep, name = f"`{argument}` is a name of this cell, written back after each run", argument
    else:
        keep = f"bind the value to a name in this cell (`value = {argument or '...'}`)"
        name = "value"
    later = f"{target}{method}({name})" if method else f"{target}[key] = {name}"
    return (
        f"{keep}; {verb} it in a %%eager or %%jit cell after this one (`{later}`), where "
        "Python runs every time. Or run this whole cell with %%eager or %%jit."
    )


def _rebuild_hint(name: str, value: object) -> str:
    if isinstance(value, (list, collections.deque)):
        example = f"`{name} = [*{name}, new_item]`"
    elif isinstance(value, dict):
        example = f"`{name} = {{**{name}, key: new_value}}`"
    elif isinstance(value, (set, frozenset)):
        example = f"`{name} = {name} | {{new_item}}`"
    elif isinstance(value, np.ndarray):
        example = f"a JAX array (`{name} = jnp.asarray({name}).at[index].set(new_value)`)"
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        example = f"a new object (`{name} = dataclasses.replace({name}, field=new_value)`)"
    else:
        example = f"a new object (`{name} = {type(value).__name__}(...)`)"
    return f"build a new value and bind it to a name, e.g. {example}"


def check_definitions(cell: CellSource, offset: int) -> None:
    for definition in cell.definitions:
        raise GraphStagingError(
            lineno=definition.lineno + offset,
            line=cell.line(definition.lineno),
            reason=(
                f"the cell defines {definition.kind} `{definition.name}`; a graph cell "
                "stages array computations, and a definition made while tracing would "
                "capture traced values."
            ),
            fix=(
                "define it in a %%jit or %%eager cell and call it from the graph cell, "
                "or run this cell with %%jit."
            ),
        )


def leak_error(cell: CellSource, leak: Leak) -> GraphStagingError:
    """The refusal for a traced value the trace stored in an object from outside the cell
    (the journal puts the object back as it was)."""
    root = re.match(r"[A-Za-z_][A-Za-z_0-9]*", leak.holder_path or leak.path)
    name = root.group(0) if root else ""
    mutation = next((m for m in cell.mutations if m.name == name), None)
    lineno = None if mutation is None else mutation.lineno + cell.line_offset
    line = "" if mutation is None else cell.line(mutation.lineno)
    holder = leak.holder
    kind = type(holder).__name__
    where = f"`{leak.holder_path}`" if leak.holder_path else "the namespace"
    if mutation is not None:  # ``metrics[k].append(v)``: a key known when it runs
        raw = cell.source.splitlines()[mutation.lineno - 1]
        block = " (with the block around it)" if raw[: len(raw) - len(raw.lstrip())] else ""
        fix = (
            f"keep the values as names of this cell (written back after each run) and run "
            f"`{line}`{block} in a %%eager or %%jit cell after this one, where Python runs "
            "every time; or run this whole cell with %%eager or %%jit."
        )
    elif isinstance(holder, (list, collections.deque, set, dict)):
        fix = _store_later_hint(leak.holder_path or "container", None, None, holder, cell.binds)
    elif leak.holder_path:
        fix = (
            f"make {kind} a pytree (`@jax.tree_util.register_dataclass` on a dataclass, "
            "`flax.struct.dataclass`, an `equinox.Module` or an nnx Module) so that the cell "
            "changes a copy that is written back, or change it in a %%eager or %%jit cell "
            "after this one, or run this cell with %%jit."
        )
    else:  # a global bound by a function the cell called (``global n; n = x``)
        fix = (
            "return the value from the function and bind it to a name in the cell, or run "
            "this cell with %%jit."
        )
    holder_text = f"{where} (a {kind} from outside the cell)" if leak.holder_path else where
    return GraphStagingError(
        lineno=lineno,
        line=line,
        reason=(
            f"tracing the cell stored a traced value in `{leak.path}`, in {holder_text}; "
            "a staged cell's Python runs once, at trace time, so it would keep a "
            "placeholder instead of a value, and later runs would not change it. It was put "
            "back as it was before the cell."
        ),
        fix=fix,
    )


def refuse_traced_leftovers(
    cell: CellSource, name: str, value: Any, *, outside: bool = False, in_place: bool = False
) -> None:
    """Raises when a traced value would outlive the program inside ``value``: in an object
    that is not a pytree (its leaves cannot become program outputs)."""
    __tracebackhide__ = True
    if outside and not in_place:
        found = state.find_tracer(value, name)
    else:
        found = None
        for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
            if not is_jax_array(leaf):
                found = state.find_tracer(leaf, name + jax.tree_util.keystr(path))
                if found is not None:
                    break
    if found is None:
        return
    lineno = cell.bind_lines.get(name)
    kind = type(value).__name__
    if outside:
        reason = (
            f"the cell stores a traced value in `{found}`, inside `{name}` (a {kind} from "
            "outside the cell); a staged cell's Python runs once, at trace time, so the "
            "object would keep a placeholder instead of a value."
        )
    else:
        reason = (
            f"`{found}` would hold a traced value after the run: `{name}` is a {kind}, "
            "which JAX cannot take apart into arrays (it is not a pytree), so its arrays "
            "cannot become outputs of the staged program."
        )
    raise GraphStagingError(
        lineno=None if lineno is None else lineno + cell.line_offset,
        line="" if lineno is None else cell.line(lineno),
        reason=reason,
        fix=(
            f"make {kind} a pytree (`@jax.tree_util.register_dataclass` on a dataclass, "
            "`flax.struct.dataclass`, an `equinox.Module` or an nnx Module), or run the cell "
            "with %%jit."
        ),
    )


def check_converted(cell: CellSource) -> None:
    """Strict conversion: a statement the pass left as Python is an error."""
    for site in cell.sites:
        if not site.converted:
            raise ControlFlowError(
                label=None,
                lineno=site.lineno,
                line=cell.line(site.lineno, offset=cell.line_offset),
                reason=f"this `{site.kind}` cannot be converted for staging: {site.reason}.",
                fix="rewrite it as the reason says, or run the cell without --strict "
                "(it then runs as Python while tracing).",
            )
