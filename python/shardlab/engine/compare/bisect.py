"""``shardlab.bisect``: the first jaxpr equation whose compiled value leaves the eager one.

The function is traced once and its nested calls inlined (``jaxpr_eval.flatten``), so an
equation index is a position in one flat list. Eager runs that list op by op, keeping every
intermediate. The whole program is compiled once; the earliest output that diverges names
an equation ``hi``. Bisection then runs over ``hi``'s dependency cone, in program order: for
a candidate it compiles the prefix that returns that equation's outputs (only its cone is
evaluated) and compares them with eager's at the dtype's tolerance. That is
``ceil(log2 m)`` prefix compiles for a cone of ``m`` equations, plus the whole program and
one replay: ``ceil(log2 n) + 2`` at most.

The equation found is then replayed alone on eager's inputs, compiled and in float64, and
eager's arithmetic is rerun on the compiled prefix's inputs where those were materialised:

- *operation*: compiled alone on the same inputs, it differs from eager;
- *drift*: alone it agrees, but its inputs differ slightly in the compiled program and this
  operation amplifies that (eager's arithmetic on the compiled inputs gives compiled's value);
- *rewrite*: alone it agrees and its inputs agree, yet inside the prefix program it
  differs: XLA compiled it together with earlier equations (fusion, algebraic
  simplification such as ``(a + c) - c`` → ``a``). Materialising an intermediate can change
  what XLA does, so this is reported, not guessed away.

Only divergence within the traced program is searched: a program whose Python computes
something else when traced (a side effect) is said to be so. Loops and conditionals are one
equation each (their bodies are not bisected).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core

from shardlab._core.source import equation_source
from shardlab._core.trees import dynamic_part
from shardlab._core.views import view_for
from shardlab._core.wording import plural
from shardlab.engine.compare import evaluate as jaxpr_eval
from shardlab.engine.compare.numerics import Difference, Tolerance, difference, fmt
from shardlab.engine.compare.run import TraceFailure, trace_failure

__all__ = ["BisectReport", "BisectStep", "bisect"]


@dataclass(frozen=True)
class BisectStep:
    """One prefix compiled: the equation it ends at and whether it diverged."""

    index: int
    primitive: str
    diverged: bool
    max_abs: float


@dataclass(frozen=True)
class BisectReport:
    """What ``shardlab.bisect`` found. ``index`` is None when nothing diverges (or the
    function does not trace: ``failure``)."""

    name: str
    equations: int
    compiles: int
    index: int | None = None
    primitive: str = ""
    equation: str = ""
    source: str = ""  # "In [5], line 3" or "model.py, line 12"
    line: str = ""
    input_shapes: tuple[str, ...] = ()
    output_shapes: tuple[str, ...] = ()
    difference: Difference | None = None  # compiled prefix vs eager, at the equation
    replay_f32: float | None = None  # max |compiled alone - eager|, on eager's inputs
    replay_f64: float | None = None  # max |eager - float64 alone|, on eager's inputs
    eager_vs_f64: float | None = None  # max |eager - f64|, f64 run from the start
    compiled_vs_f64: float | None = None  # max |compiled prefix - f64|, f64 from the start
    inputs_max_abs: float | None = None  # max |compiled input - eager input|, if known
    cause: str = ""  # "operation", "drift", "rewrite", "rewrite or drift"
    explanation: str = ""
    steps: tuple[BisectStep, ...] = ()
    cone: int = 0
    python_differs: bool = False
    failure: TraceFailure | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def found(self) -> bool:
        return self.index is not None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "found": self.found}

    @property
    def fine(self) -> bool:
        """Nothing to fix: no equation diverges and the Python computes what was traced."""
        return self.failure is None and not self.found and not self.python_differs

    @property
    def title(self) -> str:
        """The heading of its views: what was found (not "first diverging equation" when
        none diverges)."""
        if self.failure is not None:
            return "bisect: the function does not trace"
        if self.found:
            return "first diverging equation"
        if self.python_differs:
            return "no diverging equation: the Python differs from its trace"
        return "no diverging equation"

    def summary(self) -> str:
        if self.failure is not None:
            return f"bisect {self.name}: the function does not trace, so nothing compiles"
        counted = f"{plural(self.equations, 'equation')}, {plural(self.compiles, 'compile')}"
        if not self.found and self.python_differs:
            return (
                f"bisect {self.name}: no equation diverges: compiled and eager agree on the "
                f"traced program, but not with the Python that was traced ({counted})"
            )
        if not self.found:
            return (
                f"bisect {self.name}: no equation diverges: compiled and eager agree on every "
                f"output within tolerance ({counted})"
            )
        where = f" at {self.source}" if self.source else ""
        return (
            f"bisect {self.name}: first divergence at equation #{self.index} of "
            f"{self.equations}, `{self.primitive}`{where} ({plural(self.compiles, 'compile')})"
        )

    def findings(self) -> tuple[str, ...]:
        """What the summary means, in sentences: the text form and the HTML view both show
        these, so neither reads as "all fine" where the other warns."""
        if self.failure is None and not self.found and self.python_differs:
            return (PYTHON_DIFFERS,)
        return ()

    def text(self) -> str:
        lines = [self.summary()]
        if self.failure is not None:
            lines.append(self.failure.text())
        if self.found:
            if self.line:
                lines.append(f"  line:      {self.line}")
            lines.append(f"  equation:  {self.equation}")
            lines.append(
                f"  shapes:    in {', '.join(self.input_shapes) or '—'}; "
                f"out {', '.join(self.output_shapes)}"
            )
            d = self.difference
            if d is not None:
                lines.append(
                    f"  compiled vs eager: max |c−e| {fmt(d.max_abs)} (max rel {fmt(d.max_rel)})"
                    f", values up to {fmt(d.magnitude)}"
                )
            lines.append(
                f"  against float64 run from the start: eager {fmt(self.eager_vs_f64)}, "
                f"compiled {fmt(self.compiled_vs_f64)}"
            )
            lines.append(
                f"  replayed alone on eager's inputs: compiled vs eager {fmt(self.replay_f32)}"
                f", float64 vs eager {fmt(self.replay_f64)}"
            )
            if self.inputs_max_abs is not None:
                lines.append(f"  inputs, compiled vs eager: max |c−e| {fmt(self.inputs_max_abs)}")
            lines.append(f"  cause: {self.cause} — {self.explanation}")
        lines.extend(f"  {finding}" for finding in self.findings())
        lines.extend(f"note: {n}" for n in self.notes)
        if self.steps:
            tried = ", ".join(f"#{s.index} {'≠' if s.diverged else '='}" for s in self.steps)
            lines.append(f"prefixes compiled: {tried}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str | None:
        viewer = view_for("bisect")
        return viewer(self) if viewer is not None else None


PYTHON_DIFFERS = (
    "The eager Python computes something else than the traced program: Python that "
    "runs once at trace time (a side effect, global state, np.random, time) made the "
    "difference, not an operation. Pass such values in as arguments (a PRNG key, a step "
    "counter) or compute them with jax.numpy."
)


def _shape(aval: Any) -> str:
    dims = "×".join(map(str, getattr(aval, "shape", ()))) or "scalar"
    return f"{getattr(aval, 'dtype', '?')}[{dims}]"


def _diverges(
    eager: list[Any], compiled: list[Any], tolerances: dict[str, Tolerance] | None
) -> tuple[bool, float, Difference | None]:
    worst: Difference | None = None
    diverged = False
    for e, c in zip(eager, compiled, strict=True):
        d = difference(e, c, overrides=tolerances)
        if not d.agree:
            diverged = True
        if worst is None or d.max_abs > worst.max_abs or (not d.agree and worst.agree):
            worst = d
    return diverged, (worst.max_abs if worst else 0.0), worst


def bisect(
    fn: Callable[..., Any],
    *args: Any,
    tolerances: dict[str, Tolerance] | None = None,
    **kwargs: Any,
) -> BisectReport:
    """Finds the first equation of ``fn``'s jaxpr whose compiled output diverges from eager.

    Args:
        fn: the function, called as ``fn(*args, **kwargs)``; non-array leaves of the
            arguments are closed over.
        tolerances: per-dtype overrides, as for :func:`shardlab.compare`.

    Returns:
        A :class:`BisectReport`: the equation, its primitive, shapes and source line, the
        differences there and what replaying it alone says (``cause``), and ``compiles``,
        the number of programs compiled. A function with no divergence says so; one that
        does not trace has ``failure`` explaining why.
    """
    name = getattr(fn, "__name__", "fn")
    dynamic, arrays = dynamic_part(fn, args, kwargs)
    try:
        traced = jax.jit(dynamic).trace(*arrays)
    except Exception as error:  # the tracing failure is the finding
        return BisectReport(name, 0, 0, failure=trace_failure(error))
    flat = jaxpr_eval.flatten(traced.jaxpr)
    jaxpr, consts = flat.jaxpr, flat.consts
    count = len(jaxpr.eqns)
    with jax.disable_jit():
        python = jax.tree_util.tree_leaves(dynamic(*arrays))
    eager = jaxpr_eval.evaluate(jaxpr, consts, arrays, record=True)
    python_differs = len(python) != len(eager.outputs) or any(
        not difference(p, e, overrides=tolerances).agree
        for p, e in zip(python, eager.outputs, strict=False)
    )
    compiles = 1
    whole = jax.jit(lambda *a: jaxpr_eval.evaluate(jaxpr, consts, a).outputs)(*arrays)
    producer = jaxpr_eval.producers(jaxpr)
    hi_index = None
    for var, e, c in zip(jaxpr.outvars, eager.outputs, whole, strict=True):
        if isinstance(var, jex_core.Literal) or var not in producer:
            continue
        if not difference(e, c, overrides=tolerances).agree:
            index = producer[var]
            hi_index = index if hi_index is None else min(hi_index, index)
    if hi_index is None:
        return BisectReport(name, count, compiles, python_differs=python_differs)
    # compiled outputs of the equations whose prefix was compiled (for the replay)
    compiled_of: dict[int, list[Any]] = {hi_index: _outputs_of(jaxpr, hi_index, whole)}
    chain = sorted(jaxpr_eval.ancestors(jaxpr, hi_index))
    lo, hi = -1, len(chain) - 1
    steps: list[BisectStep] = []
    while hi - lo > 1:
        mid = (lo + hi) // 2
        index = chain[mid]
        outs = jax.jit(jaxpr_eval.prefix_program(flat, index))(*arrays)
        compiles += 1
        compiled_of[index] = list(outs)
        diverged, max_abs, _ = _diverges(eager.outputs_of[index], list(outs), tolerances)
        steps.append(BisectStep(index, jaxpr.eqns[index].primitive.name, diverged, max_abs))
        if diverged:
            hi = mid
        else:
            lo = mid
    found = chain[hi]
    with jaxpr_eval.float64():
        reference = jaxpr_eval.evaluate(
            jaxpr, consts, arrays, wide=True, only=frozenset(chain), stop=found
        )
        reference_out = [np.asarray(v) for v in reference.outputs]
    report, replay_compiles = _replay(
        jaxpr, found, eager, compiled_of, producer, reference_out, tolerances
    )
    notes = []
    if found == hi_index and not any(s.index == found for s in steps):
        notes.append(
            f"equation #{found} makes an output of the program: its divergence was measured "
            "in the whole compiled program"
        )
    if python_differs:
        notes.append(PYTHON_DIFFERS)
    label, line = equation_source(jaxpr.eqns[found])
    eqn = jaxpr.eqns[found]
    text = str(eqn)
    return BisectReport(
        name,
        count,
        compiles + replay_compiles,
        index=found,
        primitive=eqn.primitive.name,
        equation=text if len(text) <= 240 else text[:237] + "...",
        source=label,
        line=line,
        input_shapes=tuple(_shape(v.aval) for v in eqn.invars),
        output_shapes=tuple(_shape(v.aval) for v in eqn.outvars),
        steps=tuple(steps),
        cone=len(chain),
        python_differs=python_differs,
        notes=tuple(notes),
        **report,
    )


def _outputs_of(jaxpr: Any, index: int, whole: list[Any]) -> list[Any]:
    """Equation ``index``'s outputs as the whole program returned them."""
    where = {v: i for i, v in enumerate(jaxpr.outvars) if not isinstance(v, jex_core.Literal)}
    return [whole[where[v]] if v in where else None for v in jaxpr.eqns[index].outvars]


def _replay(
    jaxpr: Any,
    index: int,
    eager: jaxpr_eval.Evaluation,
    compiled_of: dict[int, list[Any]],
    producer: dict[Any, int],
    reference: list[Any],
    tolerances: dict[str, Tolerance] | None,
) -> tuple[dict[str, Any], int]:
    """Equation ``index`` alone: compiled and float64 on eager's inputs, and eager's
    arithmetic on the compiled inputs where known; the cause it points to."""
    eqn = jaxpr.eqns[index]
    eager_in, eager_out = eager.inputs_of[index], eager.outputs_of[index]
    compiled_out = compiled_of[index]
    alone = jax.jit(lambda *v: jaxpr_eval.apply_equation(eqn, v))(*eager_in)
    with jaxpr_eval.float64():
        wide = jaxpr_eval.apply_equation(eqn, [jaxpr_eval.upcast(v) for v in eager_in], wide=True)
        wide = [np.asarray(w) for w in wide]
    pairs = [(e, c) for e, c in zip(eager_out, compiled_out, strict=True) if c is not None]
    _, _, prefix_d = _diverges([p[0] for p in pairs], [p[1] for p in pairs], tolerances)
    alone_diverged, alone_abs, _ = _diverges(eager_out, list(alone), tolerances)
    local_f64 = max(difference(e, w).max_abs for e, w in zip(eager_out, wide, strict=True))
    eager_vs_f64 = max(difference(e, r).max_abs for e, r in zip(eager_out, reference, strict=True))
    compiled_vs_f64 = max(
        (
            difference(c, r).max_abs
            for c, r in zip(compiled_out, reference, strict=True)
            if c is not None
        ),
        default=None,
    )
    compiled_in = _compiled_inputs(jaxpr, eqn, compiled_of, producer, eager_in)
    inputs_abs = None
    cause, why = (
        "rewrite or drift",
        (
            "alone on eager's inputs the operation agrees; its compiled inputs were not all "
            "materialised, so drift from earlier equations cannot be told from a rewrite"
        ),
    )
    if alone_diverged:
        cause, why = (
            "operation",
            (
                f"compiled alone on eager's inputs it already differs from eager (max "
                f"{fmt(alone_abs)}): this operation compiles to other numbers"
            ),
        )
    elif compiled_in is not None:
        inputs_abs = max(
            (difference(e, c).max_abs for e, c in zip(eager_in, compiled_in, strict=True)),
            default=0.0,
        )
        on_compiled = jaxpr_eval.apply_equation(eqn, compiled_in)
        redo, _, _ = _diverges(eager_out, on_compiled, tolerances)
        if redo:
            cause, why = (
                "drift",
                (
                    f"alone it agrees, but its inputs already differ slightly in the compiled "
                    f"program (max {fmt(inputs_abs)}, within tolerance) and this operation "
                    "amplifies that: eager's own arithmetic on the compiled inputs gives the "
                    "compiled value. Look upstream, or make this step better conditioned"
                ),
            )
        else:
            cause, why = (
                "rewrite",
                (
                    "alone on the same inputs it agrees, and its inputs agree "
                    f"(max {fmt(inputs_abs)}), yet inside the compiled program it differs: XLA "
                    "compiled it together with earlier equations (fusion or an algebraic "
                    "simplification such as (a + c) − c → a)"
                ),
            )
    closer = ""
    if compiled_vs_f64 is not None and eager_vs_f64 != compiled_vs_f64:
        side = "compiled" if compiled_vs_f64 < eager_vs_f64 else "eager"
        closer = f"; {side} is closer to float64 here"
    return {
        "difference": prefix_d,
        "replay_f32": alone_abs,
        "replay_f64": local_f64,
        "eager_vs_f64": eager_vs_f64,
        "compiled_vs_f64": compiled_vs_f64,
        "inputs_max_abs": inputs_abs,
        "cause": cause,
        "explanation": why + closer,
    }, 1


def _compiled_inputs(
    jaxpr: Any,
    eqn: Any,
    compiled_of: dict[int, list[Any]],
    producer: dict[Any, int],
    eager_in: list[Any],
) -> list[Any] | None:
    """The equation's inputs as the compiled prefixes computed them, or None when one of
    them was never materialised."""
    position = {v: i for i, v in enumerate(jaxpr.invars)}
    values = []
    for var, eager_value in zip(eqn.invars, eager_in, strict=True):
        if isinstance(var, jex_core.Literal) or var in position or var not in producer:
            values.append(eager_value)  # literals, arguments, constants: the same
            continue
        source = producer[var]
        outs = compiled_of.get(source)
        if outs is None:
            return None
        values.append(outs[jaxpr.eqns[source].outvars.index(var)])
    return values


def compile_bound(equations: int) -> int:
    """The most programs :func:`bisect` compiles for a jaxpr of ``equations`` equations."""
    return math.ceil(math.log2(max(equations, 1))) + 2
