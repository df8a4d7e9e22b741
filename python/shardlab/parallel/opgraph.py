"""An op graph from ``jax.make_jaxpr``: nodes are equations, edges are variables.

Nested ``jit``, ``custom_jvp_call``, ``custom_vjp_call``, ``remat``/``checkpoint`` and
``closed_call`` are inlined, so a node is always a primitive the rules know (or fall back on).
``scan``, ``while`` and ``cond`` stay single nodes that carry their bodies as sub-graphs; the
cost model costs a scan as its body × length.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core

try:  # the user's frame of an equation; private, so guarded
    from jax._src import source_info_util as _siu
except ImportError:  # pragma: no cover - depends on the jax version
    _siu = None

INLINED = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "remat": "jaxpr",
    "remat2": "jaxpr",
    "checkpoint": "jaxpr",
    "custom_lin": None,
}
CONTROL_FLOW = {"scan": ("jaxpr",), "while": ("cond_jaxpr", "body_jaxpr"), "cond": ("branches",)}


@dataclasses.dataclass(frozen=True)
class Node:
    """One equation.

    Attributes:
        index: position in ``OpGraph.nodes`` (topological order).
        primitive: the primitive name.
        params: the equation's params (the raw jax objects).
        inputs: variable ids of the operands (literals get ids too, see ``OpGraph.literal``).
        outputs: variable ids of the results.
        source: the user's ``file:line`` ("" when unknown).
        name_stack: JAX's name stack (``jvp()``, ``transpose(jvp())`` ...).
        subgraphs: bodies of scan/while/cond (empty otherwise).
        eqn: the original equation, for re-binding.
    """

    index: int
    primitive: str
    params: dict[str, Any]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    source: str
    name_stack: str
    subgraphs: tuple[OpGraph, ...] = ()
    eqn: Any = dataclasses.field(default=None, repr=False, compare=False)


@dataclasses.dataclass
class OpGraph:
    """A flat, topologically ordered graph of equations.

    Attributes:
        nodes: the equations.
        shapes: per variable id, its shape.
        dtypes: per variable id, its numpy dtype.
        literal: per variable id, the constant value for literals and closed-over constants
            (``None`` for ordinary variables).
        inputs: variable ids of the function's flat inputs.
        outputs: variable ids of the function's flat outputs.
    """

    nodes: list[Node]
    shapes: list[tuple[int, ...]]
    dtypes: list[np.dtype]
    literal: list[Any]
    inputs: list[int]
    outputs: list[int]
    _producer: list[int] | None = dataclasses.field(default=None, repr=False)
    _consumers: list[list[int]] | None = dataclasses.field(default=None, repr=False)

    def nbytes(self, var: int) -> int:
        """Global bytes of a variable."""
        return int(np.prod(self.shapes[var], dtype=np.int64)) * self.dtypes[var].itemsize

    def producer(self, var: int) -> int:
        """Index of the node producing ``var``, or -1 for inputs and literals."""
        if self._producer is None:
            prod = [-1] * len(self.shapes)
            for node in self.nodes:
                for v in node.outputs:
                    prod[v] = node.index
            self._producer = prod
        return self._producer[var]

    def consumers(self, var: int) -> list[int]:
        """Indices of the nodes that read ``var``."""
        if self._consumers is None:
            cons: list[list[int]] = [[] for _ in self.shapes]
            for node in self.nodes:
                for v in node.inputs:
                    if not cons[v] or cons[v][-1] != node.index:
                        cons[v].append(node.index)
            self._consumers = cons
        return self._consumers[var]

    def primitive_counts(self) -> dict[str, int]:
        """How many nodes each primitive has."""
        out: dict[str, int] = {}
        for node in self.nodes:
            out[node.primitive] = out.get(node.primitive, 0) + 1
        return out


def _source(eqn: Any) -> str:
    if _siu is None:
        return ""
    try:
        frame = _siu.user_frame(eqn.source_info.traceback)
    except Exception:  # source info is best-effort
        return ""
    return f"{frame.file_name}:{frame.start_line}" if frame is not None else ""


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.shapes: list[tuple[int, ...]] = []
        self.dtypes: list[np.dtype] = []
        self.literal: list[Any] = []

    def new_var(self, aval: Any, value: Any = None) -> int:
        self.shapes.append(tuple(int(d) for d in getattr(aval, "shape", ())))
        self.dtypes.append(np.dtype(getattr(aval, "dtype", np.float32)))
        self.literal.append(value)
        return len(self.shapes) - 1

    def atom(self, atom: Any, env: dict[Any, int]) -> int:
        if isinstance(atom, jex_core.Literal):
            return self.new_var(atom.aval, atom.val)
        return env[atom]

    def walk(
        self, jaxpr: Any, in_ids: Sequence[int], consts: Sequence[Any], outer_source: str = ""
    ) -> list[int]:
        env: dict[Any, int] = {}
        for var, value in zip(jaxpr.constvars, consts, strict=True):
            env[var] = self.new_var(var.aval, value)
        for var, vid in zip(jaxpr.invars, in_ids, strict=True):
            env[var] = vid
        for eqn in jaxpr.eqns:
            ins = [self.atom(a, env) for a in eqn.invars]
            name = eqn.primitive.name
            # Equations inside library code (jax.nn.relu's custom_jvp) take the caller's line.
            source = _source(eqn) or outer_source
            inner = _inline_jaxpr(name, eqn.params)
            if inner is not None:
                sub, sub_consts = inner
                if len(sub.invars) == len(ins):
                    outs = self.walk(sub, ins, sub_consts, source)
                    for var, vid in zip(eqn.outvars, outs, strict=True):
                        env[var] = vid
                    continue
            subgraphs = tuple(build_from_jaxpr(j) for j in _control_jaxprs(name, eqn.params))
            outs = [self.new_var(v.aval) for v in eqn.outvars]
            for var, vid in zip(eqn.outvars, outs, strict=True):
                env[var] = vid
            self.nodes.append(
                Node(
                    index=len(self.nodes),
                    primitive=name,
                    params=dict(eqn.params),
                    inputs=tuple(ins),
                    outputs=tuple(outs),
                    source=source,
                    name_stack=str(eqn.source_info.name_stack),
                    subgraphs=subgraphs,
                    eqn=eqn,
                )
            )
        return [self.atom(a, env) for a in jaxpr.outvars]


def _split_closed(j: Any) -> tuple[Any, list[Any]]:
    if hasattr(j, "jaxpr") and hasattr(j, "consts"):
        return j.jaxpr, list(j.consts)
    return j, []


def _inline_jaxpr(name: str, params: dict[str, Any]) -> tuple[Any, list[Any]] | None:
    if name not in INLINED:
        return None
    key = INLINED[name]
    if key is None or key not in params:
        found = list(jex_core.jaxprs_in_params(params))
        if len(found) != 1:
            return None
        return found[0], []
    return _split_closed(params[key])


def _control_jaxprs(name: str, params: dict[str, Any]) -> list[Any]:
    out = []
    for key in CONTROL_FLOW.get(name, ()):
        value = params.get(key)
        for j in value if isinstance(value, (list, tuple)) else [value]:
            if j is not None:
                out.append(j)
    return out


def build_from_jaxpr(closed: Any) -> OpGraph:
    """An ``OpGraph`` from a (closed) jaxpr."""
    jaxpr, consts = _split_closed(closed)
    b = _Builder()
    ins = [b.new_var(v.aval) for v in jaxpr.invars]
    outs = b.walk(jaxpr, ins, consts)
    return OpGraph(b.nodes, b.shapes, b.dtypes, b.literal, ins, outs)


def build(fn: Callable[..., Any], *args: Any) -> OpGraph:
    """Trace ``fn`` with ``jax.make_jaxpr`` and build its ``OpGraph``.

    Args:
        fn: the function.
        *args: example arguments (arrays or ``jax.ShapeDtypeStruct``); the graph's inputs are
            their flattened leaves in ``jax.tree_util`` order.
    """
    return build_from_jaxpr(jax.make_jaxpr(fn)(*args))
