"""``shardlab.compare``: one program run eager, compiled and as a float64 reference.

Four evaluations of the same inputs (the same arrays, so the same PRNG keys):

- *eager*: the Python, op by op (``jax.disable_jit()``);
- *compiled*: ``jax.jit`` of the function (a cell: graph mode, ``compare_cell.py``);
- *traced*: the compiled program's own jaxpr evaluated op by op. It equals eager unless the
  Python computes something else when traced (a side effect, global state, ``np.random``):
  that is reported as its own verdict, since no compiler setting is at fault then;
- *float64*: that jaxpr with floating values upcast (``jaxpr_eval.py`` says why not x64
  Python), the referee that says which of eager and compiled is closer to the math.

The verdict per output leaf follows :mod:`.numerics`. Nothing is written anywhere: the
function is called on the arguments given, and a record comes back.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import jax
import numpy as np

from shardlab._core.source import user_frame_of_exception
from shardlab._core.trees import dynamic_part, is_array
from shardlab._core.views import view_for
from shardlab._core.wording import plural
from shardlab.engine.compare import evaluate as jaxpr_eval
from shardlab.engine.compare.numerics import Difference, Tolerance, difference, fmt

__all__ = ["CompareReport", "LeafComparison", "TraceFailure", "compare"]

AGREE = "agree"
COMPILED_CLOSER = "differ, compiled closer to float64"
WITHIN = "differ, within tolerance"
COMPILED_OFF = "compiled further from float64"
TRACE_DIFFERS = "Python differs when traced"


@dataclass(frozen=True)
class LeafComparison:
    """One output leaf: its label as the user wrote it, the numbers and the verdict."""

    label: str
    difference: Difference
    verdict: str
    traced_agrees: bool = True  # eager Python == the traced program run op by op

    @property
    def passed(self) -> bool:
        return self.verdict in (AGREE, COMPILED_CLOSER, WITHIN)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


@dataclass(frozen=True)
class TraceFailure:
    """Why the program could not be traced (so not compiled): the user line and the fix."""

    kind: str
    where: str
    line: str
    reason: str
    fix: str
    message: str

    def text(self) -> str:
        at = f"{self.where}: `{self.line}`" if self.where else "while tracing"
        return f"{at}\n  why: {self.reason}\n  fix: {self.fix}\n  ({self.message})"


@dataclass(frozen=True)
class CompareReport:
    """What ``shardlab.compare`` and ``%%compare`` found.

    ``leaves`` has one row per output array; ``passed`` is False when a leaf's compiled
    value is further from float64 than eager's by more than the margin, when the Python
    computes something else under tracing, or when the program does not trace.
    """

    name: str
    leaves: tuple[LeafComparison, ...]
    seconds: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    bisect_call: str | None = None
    failure: TraceFailure | None = None

    @property
    def passed(self) -> bool:
        return self.failure is None and all(leaf.passed for leaf in self.leaves)

    @property
    def differs(self) -> bool:
        """Some leaf's compiled value differs from eager beyond tolerance."""
        return self.failure is not None or any(not leaf.difference.agree for leaf in self.leaves)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "leaves": [leaf.to_dict() for leaf in self.leaves],
            "seconds": dict(self.seconds),
            "notes": list(self.notes),
            "bisect_call": self.bisect_call,
            "failure": None if self.failure is None else asdict(self.failure),
        }

    def summary(self) -> str:
        if self.failure is not None and self.failure.kind == "graph":
            return f"compare {self.name}: graph mode cannot stage this cell, so it cannot compile"
        if self.failure is not None:
            return f"compare {self.name}: the program does not trace, so it cannot compile"
        named = [("the output" if leaf.label == "output" else leaf.label) for leaf in self.leaves]
        failing = [n for n, leaf in zip(named, self.leaves, strict=True) if not leaf.passed]
        differing = [
            n for n, leaf in zip(named, self.leaves, strict=True) if not leaf.difference.agree
        ]
        count = plural(len(self.leaves), "output")
        if failing:
            if len(self.leaves) == 1:
                return f"compare {self.name}: FAIL: {failing[0]} differs"
            return f"compare {self.name}: FAIL on {', '.join(failing)} of {count}"
        if differing:
            verb = "differs" if len(differing) == 1 else "differ"
            return f"compare {self.name}: pass; {', '.join(differing)} {verb} within the rule"
        if len(self.leaves) == 1:
            return f"compare {self.name}: pass; eager and compiled agree on the output"
        return f"compare {self.name}: pass; eager and compiled agree on all {count}"

    def text(self) -> str:
        lines = [self.summary()]
        if self.failure is not None:
            lines.append(self.failure.text())
        if self.leaves:
            header = ("output", "dtype", "shape", "max |c−e|", "max rel", "|e−f64|", "|c−f64|")
            rows = [header] + [_row(leaf) for leaf in self.leaves]
            widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
            for row in rows:
                lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
                if row is not header:
                    leaf = self.leaves[rows.index(row) - 1]
                    lines.append(f"      → {leaf.verdict}{_closer(leaf)}")
        lines.extend(f"note: {n}" for n in self.notes)
        if self.seconds:
            lines.append(
                "time: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.seconds.items())
            )
        if self.bisect_call:
            lines.append(f"to find the first diverging operation: {self.bisect_call}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str | None:
        viewer = view_for("compare")
        return viewer(self) if viewer is not None else None


def _row(leaf: LeafComparison) -> tuple[str, ...]:
    d = leaf.difference
    shape = "×".join(map(str, d.shape)) or "scalar"
    return (
        leaf.label,
        d.dtype,
        shape,
        fmt(d.max_abs),
        fmt(d.max_rel),
        fmt(d.eager_error),
        fmt(d.compiled_error),
    )


def _closer(leaf: LeafComparison) -> str:
    d = leaf.difference
    if d.agree or d.closer == "same" or leaf.verdict in (TRACE_DIFFERS, COMPILED_CLOSER):
        return ""
    return f" ({d.closer} is closer to float64)"


def verdict(d: Difference, traced_agrees: bool) -> str:
    """The verdict of one leaf from its numbers (see :mod:`.numerics`)."""
    if not traced_agrees:
        return TRACE_DIFFERS
    if d.agree:
        return AGREE
    if not d.passed:
        return COMPILED_OFF
    return COMPILED_CLOSER if d.closer == "compiled" else WITHIN


# -- running ------------------------------------------------------------------------------
_TRACE_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.UnexpectedTracerError,
)


def trace_failure(error: BaseException) -> TraceFailure:
    """A tracer error explained: the user's line, why, and what to do."""
    from shardlab.engine.cells.errors import _FIXES, _kind

    kind = _kind(error) if isinstance(error, _TRACE_ERRORS) else "other"
    reason, fix = _FIXES.get(
        kind,
        (
            f"tracing raised {type(error).__name__}; the compiled program could not be built.",
            "make the function traceable (jnp operations on arrays), or compare a smaller part.",
        ),
    )
    found = user_frame_of_exception(error)
    where, line = found if found else ("", "")
    fix = fix.replace("or run the cell with %%jit or %%eager.", "or keep this part eager.")
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return TraceFailure(kind, where, line, reason, fix, f"{type(error).__name__}: {first}")


def output_labels(fn: Callable[..., Any], tree: Any) -> list[tuple[str, Any]]:
    """(label, leaf) of every array leaf of ``fn``'s output, labelled by the names of its
    ``return`` statement where they are plain names (``return loss, grads`` gives ``loss``
    and ``grads['w1']``), else by the path (``[0]``, ``['w1']``)."""
    names = _return_names(fn)
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not is_array(leaf):
            continue
        if names and isinstance(tree, tuple) and path and len(names) == len(tree):
            head = names[getattr(path[0], "idx", 0)]
            label = head + jax.tree_util.keystr(tuple(path[1:]))
        elif names and len(names) == 1 and not isinstance(tree, tuple):
            label = names[0] + jax.tree_util.keystr(tuple(path))
        else:
            label = jax.tree_util.keystr(tuple(path)) or "output"
        out.append((label, leaf))
    return out


def _return_names(fn: Callable[..., Any]) -> list[str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return []
    returns = [n for n in ast.walk(tree) if isinstance(n, ast.Return) and n.value is not None]
    if len(returns) != 1:
        return []
    value = returns[0].value
    items = value.elts if isinstance(value, ast.Tuple) else [value]
    names = [i.id for i in items if isinstance(i, ast.Name)]
    return names if len(names) == len(items) else []


def compare(
    fn: Callable[..., Any],
    *args: Any,
    tolerances: dict[str, Tolerance] | None = None,
    **kwargs: Any,
) -> CompareReport:
    """Runs ``fn(*args, **kwargs)`` eager, compiled and as a float64 reference, and compares.

    Args:
        fn: the function; non-array leaves of its arguments are closed over (static).
        tolerances: per-dtype overrides of :data:`shardlab.engine.compare.numerics.TOLERANCES`,
            e.g. ``{"float32": Tolerance(1e-4, 1e-5)}``.

    Returns:
        A :class:`CompareReport`: per output leaf the max absolute and relative difference
        of compiled from eager, both errors against float64, a verdict and which side is
        closer to float64. When it fails, ``bisect_call`` is the ``shardlab.bisect`` call
        that narrows it down.
    """
    name = getattr(fn, "__name__", "fn")
    dynamic, arrays = dynamic_part(fn, args, kwargs)
    runs = run_three_ways(
        name,
        dynamic,
        arrays,
        lambda: fn(*args, **kwargs),
        tolerances,
        labels_of=lambda tree: output_labels(fn, tree),
    )
    leaves, seconds, notes, failure = runs
    report = CompareReport(name, leaves, seconds, notes, None, failure)
    if failure is None and (not report.passed or report.differs):
        call = _call_text(fn, args, kwargs)
        report = CompareReport(name, leaves, seconds, notes, call, failure)
    return report


def run_three_ways(
    name: str,
    dynamic: Callable[..., Any],
    arrays: list[Any],
    eager_call: Callable[[], Any] | None,
    tolerances: dict[str, Tolerance] | None,
    *,
    compiled_values: Callable[[], dict[str, Any]] | None = None,
    labels_of: Callable[[Any], list[tuple[str, Any]]] | None = None,
) -> tuple[tuple[LeafComparison, ...], dict[str, float], tuple[str, ...], TraceFailure | None]:
    """The comparison behind :func:`compare` and ``%%compare``: eager (``eager_call`` under
    ``disable_jit``), compiled (``compiled_values`` when given, else the compiled trace of
    ``dynamic``), the trace run op by op and in float64; leaves paired by label."""
    labels_of = labels_of or (lambda tree: output_labels(dynamic, tree))
    seconds: dict[str, float] = {}
    notes: list[str] = []
    start = time.perf_counter()
    with jax.disable_jit():
        eager = eager_call() if eager_call is not None else dynamic(*arrays)
        jax.block_until_ready(eager)
    seconds["eager"] = time.perf_counter() - start
    try:
        traced = jax.jit(dynamic).trace(*arrays)
    except Exception as error:  # any tracing failure is the finding
        return (), seconds, (), trace_failure(error)
    start = time.perf_counter()
    if compiled_values is None:
        compiled = traced.lower().compile()(*arrays)
    else:
        compiled = compiled_values()
    jax.block_until_ready(compiled)
    seconds["compiled (incl. compile)"] = time.perf_counter() - start
    closed = traced.jaxpr
    start = time.perf_counter()
    op_by_op = jaxpr_eval.evaluate(closed.jaxpr, closed.consts, arrays).outputs
    with jaxpr_eval.float64():
        wide = jaxpr_eval.evaluate(closed.jaxpr, closed.consts, arrays, wide=True)
        reference = [np.asarray(v) for v in wide.outputs]
    seconds["float64 reference"] = time.perf_counter() - start
    if wide.at_user_precision:
        notes.append(
            f"{len(wide.at_user_precision)} equation(s) ran at the program's own precision in "
            "the reference (they take no float64)"
        )
    tree = traced.out_tree
    op_by_op_tree = jax.tree_util.tree_unflatten(tree, op_by_op)
    reference_tree = jax.tree_util.tree_unflatten(tree, reference)
    eager_leaves = dict(labels_of(eager))
    compiled_leaves = dict(labels_of(compiled))
    traced_leaves = dict(labels_of(op_by_op_tree))
    reference_leaves = dict(labels_of(reference_tree))
    rows = []
    for label, e in eager_leaves.items():
        if label not in compiled_leaves or label not in reference_leaves:
            notes.append(f"{label}: not an output of the compiled program; not compared")
            continue
        d = difference(e, compiled_leaves[label], reference_leaves[label], overrides=tolerances)
        traced_agrees = difference(e, traced_leaves[label], overrides=tolerances).agree
        rows.append(LeafComparison(label, d, verdict(d, traced_agrees), traced_agrees))
    if any(not r.traced_agrees for r in rows):
        notes.append(
            "the traced program, run op by op, differs from the eager Python: the Python "
            "computes something else when traced (a side effect, global state, np.random or "
            "time read at trace time); no compiler setting is at fault there"
        )
    return tuple(rows), seconds, tuple(notes), None


def _call_text(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """The ``shardlab.bisect(...)`` call with the user's own argument expressions when the
    calling line can be read (``shardlab.compare(loss, params, batch)``), else with
    placeholders."""
    from shardlab.engine.compare.callsite import caller_arguments

    found = caller_arguments("compare")
    if found is not None:
        return f"shardlab.bisect({', '.join(found)})"
    name = getattr(fn, "__name__", "fn")
    parts = [name, *(f"<argument {i + 1}>" for i in range(len(args)))]
    parts += [f"{k}=<{k}>" for k in kwargs]
    return f"shardlab.bisect({', '.join(parts)})"
