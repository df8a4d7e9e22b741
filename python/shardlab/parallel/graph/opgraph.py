"""An op graph from ``jax.make_jaxpr``: nodes are equations, edges are variables.

Nested ``jit``, ``custom_jvp_call``, ``custom_vjp_call``, ``remat``/``checkpoint`` and
``closed_call`` are inlined, so a node is always a primitive the rules know (or fall back on).
``scan``, ``while`` and ``cond`` stay single nodes that carry their bodies as sub-graphs; the
cost model costs a scan as its body × length.

For the strategy search and the editor (``graph/trace.py``: ``trace(..., unroll_scans=True)``),
``build_from_jaxpr(closed, unroll_scans=True)`` unrolls scans (up to
``SCAN_UNROLL_LIMIT`` iterations × body equations): per iteration, a ``scan_slice`` node takes
slice i of each stacked operand, the body's equations follow (consts: the same outer
variables every iteration; carry: the previous iteration's carry-out), and a ``scan_stack``
node per stacked result writes the iteration's output into slice i of a buffer (the
previous iteration's; the last buffer is the scan's result). Every node of an
unrolled scan has an ``origin`` and the graph a ``ScanGroup`` record, so a plan found on the
unrolled graph can be applied to the original scan (``graph/interpret.py``). Scans nested in a
body, ``while`` and ``cond`` stay single nodes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core

from shardlab._core.jaxprs import CONTROL_FLOW, inlined_body, split_closed

try:  # the user's frame of an equation; private, so guarded
    from jax._src import source_info_util as _siu
except ImportError:  # pragma: no cover - depends on the jax version
    _siu = None

# Largest length × body equations a scan may have to be unrolled for the search; larger scans
# stay one (replicated) node.
SCAN_UNROLL_LIMIT = 200_000


def graph_dtype(dtype: Any) -> Any:
    """The dtype a graph records: a numpy dtype, or JAX's own object for an extended dtype
    (a typed PRNG key, ``key<fry>``), which numpy cannot interpret."""
    if dtype is None:
        return np.dtype(np.float32)
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        return dtype
    return np.dtype(dtype)


def itemsize_of(dtype: Any) -> int:
    """Bytes per element; an extended dtype (a typed PRNG key) counts its key data: the
    key impl's ``key_shape`` elements of its base dtype (uint32 for every built-in impl)."""
    if isinstance(dtype, np.dtype):
        return dtype.itemsize
    impl = getattr(dtype, "_impl", None)
    key_shape = getattr(impl, "key_shape", None)
    if key_shape is not None:
        return math.prod(int(d) for d in key_shape) * np.dtype(np.uint32).itemsize
    size = getattr(dtype, "itemsize", None)
    return int(size) if size is not None else np.dtype(dtype).itemsize


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
        eqn: the original equation, for re-binding (the body equation for nodes of an
            unrolled scan; ``None`` for its ``scan_slice``/``scan_stack`` nodes).
        origin: for nodes of an unrolled scan, ``(scan group, iteration, body position)``:
            the index in ``OpGraph.scan_groups``, the iteration in execution order, and the
            node's position in ``ScanGroup.body.nodes`` (``-1 - j`` for the ``scan_slice`` of
            stacked operand j, ``-1 - len(xs) - j`` for the ``scan_stack`` of result j).
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
    origin: tuple[int, int, int] | None = None


@dataclasses.dataclass(frozen=True)
class ScanGroup:
    """A ``scan`` unrolled into the graph (``build_from_jaxpr(..., unroll_scans=True)``).

    Attributes:
        eqn: the original scan equation.
        inputs: outer variable ids of its operands (consts, carry init, stacked xs).
        outputs: outer variable ids of its results (final carry, stacked ys).
        length: iterations.
        reverse: iterations run from the last slice to the first.
        num_consts: leading operands passed unchanged to every iteration.
        num_carry: operands (and results) carried from one iteration to the next.
        body: the body as its own graph, built as each iteration is walked, so node k of
            iteration i is graph node ``iteration_starts[i] + k``.
        start: index of the group's first node; its nodes are ``start .. end - 1``.
        end: one past the group's last node.
        iteration_starts: per iteration (execution order), the index of its body node 0.
        slices: per iteration, per stacked operand, its ``scan_slice`` node.
        stacks: per iteration, per stacked result, its ``scan_stack`` node (the last
            iteration's give the scan's stacked results).
    """

    eqn: Any = dataclasses.field(repr=False, compare=False)
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    length: int
    reverse: bool
    num_consts: int
    num_carry: int
    body: OpGraph = dataclasses.field(repr=False)
    start: int
    end: int
    iteration_starts: tuple[int, ...]
    slices: tuple[tuple[int, ...], ...]
    stacks: tuple[tuple[int, ...], ...]


@dataclasses.dataclass
class OpGraph:
    """A flat, topologically ordered graph of equations.

    Attributes:
        nodes: the equations.
        shapes: per variable id, its shape.
        dtypes: per variable id, its numpy dtype (JAX's dtype object for extended dtypes
            such as typed PRNG keys; ``itemsize_of`` gives the bytes of either).
        literal: per variable id, the constant value for literals and closed-over constants
            (``None`` for ordinary variables).
        inputs: variable ids of the function's flat inputs.
        outputs: variable ids of the function's flat outputs.
        scan_groups: the scans unrolled into ``nodes`` (see ``ScanGroup``).
    """

    nodes: list[Node]
    shapes: list[tuple[int, ...]]
    dtypes: list[Any]
    literal: list[Any]
    inputs: list[int]
    outputs: list[int]
    scan_groups: list[ScanGroup] = dataclasses.field(default_factory=list)
    _producer: list[int] | None = dataclasses.field(default=None, repr=False)
    _consumers: list[list[int]] | None = dataclasses.field(default=None, repr=False)
    _nbytes: list[int] | None = dataclasses.field(default=None, repr=False)
    _wire: list[int] | None = dataclasses.field(default=None, repr=False)
    _views: dict[Any, OpGraph] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def nbytes(self, var: int) -> int:
        """Global bytes of a variable's buffer (as held by the compiled program: see
        ``held_as``)."""
        sizes = self._nbytes
        if sizes is None:
            sizes = self._nbytes = [
                math.prod(shape) * itemsize_of(dtype)
                for shape, dtype in zip(self.shapes, self.dtypes, strict=True)
            ]
        return sizes[var]

    def wire_nbytes(self, var: int) -> int:
        """Global bytes of a variable as a collective moves it: its buffer's bytes, except in
        a view (``held_as``) where the program's own inputs and outputs keep their dtype in
        memory but are moved in the dtype the compiler computes in."""
        return self.nbytes(var) if self._wire is None else self._wire[var]

    def held_as(self, itemsize: Callable[[Any], int], *, entry: bool = True) -> OpGraph:
        """This graph as a compiler holds its values: every value computed or moved takes
        ``itemsize(dtype)`` bytes per element (a compiler that computes bfloat16 in float32
        gives 4). With ``entry`` (a program's top level), its inputs and outputs keep their
        dtype's bytes in memory: the caller's buffers (``wire_nbytes`` is the computed
        size). Returns this graph itself when no dtype changes size; views are cached per
        ``itemsize`` and share the nodes and every list."""
        key = (itemsize, entry)
        if key in self._views:
            return self._views[key]
        held = [
            math.prod(shape) * itemsize(dtype)
            for shape, dtype in zip(self.shapes, self.dtypes, strict=True)
        ]
        stored = [self.nbytes(v) for v in range(len(self.shapes))]
        if held == stored:
            self._views[key] = self
            return self
        buffers = list(held)
        if entry:
            for v in (*self.inputs, *self.outputs):
                buffers[v] = stored[v]
        view = dataclasses.replace(self, _nbytes=buffers, _wire=held, _views={})
        view._producer, view._consumers = self._producer, self._consumers
        view._views[key] = view
        self._views[key] = view
        return view

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
    def __init__(self, unroll_limit: int = 0) -> None:
        self.nodes: list[Node] = []
        self.shapes: list[tuple[int, ...]] = []
        self.dtypes: list[Any] = []
        self.literal: list[Any] = []
        self.unroll_limit = unroll_limit
        self.scan_groups: list[ScanGroup] = []
        self.origin: tuple[int, int, int] | None = None  # (group, iteration, body start)
        self.subgraph_cache: dict[int, tuple[Any, OpGraph]] = {}

    def new_var(self, aval: Any, value: Any = None) -> int:
        self.shapes.append(tuple(int(d) for d in getattr(aval, "shape", ())))
        self.dtypes.append(graph_dtype(getattr(aval, "dtype", None)))
        self.literal.append(value)
        return len(self.shapes) - 1

    def atom(self, atom: Any, env: dict[Any, int]) -> int:
        if isinstance(atom, jex_core.Literal):
            return self.new_var(atom.aval, atom.val)
        return env[atom]

    def subgraph(self, jaxpr: Any) -> OpGraph:
        # A body walked once per unrolled iteration is built once (the jaxpr stays alive).
        got = self.subgraph_cache.get(id(jaxpr))
        if got is None:
            got = self.subgraph_cache[id(jaxpr)] = (jaxpr, build_from_jaxpr(jaxpr))
        return got[1]

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
            inner = inlined_body(name, eqn.params)
            if inner is not None:
                sub, sub_consts = inner
                if len(sub.invars) == len(ins):
                    outs = self.walk(sub, ins, sub_consts, source)
                    for var, vid in zip(eqn.outvars, outs, strict=True):
                        env[var] = vid
                    continue
            if name == "scan" and self.origin is None and self.unrollable(eqn.params):
                outs = self.unroll_scan(eqn, ins, source)
                for var, vid in zip(eqn.outvars, outs, strict=True):
                    env[var] = vid
                continue
            subgraphs = tuple(self.subgraph(j) for j in _control_jaxprs(name, eqn.params))
            outs = [self.new_var(v.aval) for v in eqn.outvars]
            for var, vid in zip(eqn.outvars, outs, strict=True):
                env[var] = vid
            origin = None
            if self.origin is not None:
                group, iteration, body_start = self.origin
                origin = (group, iteration, len(self.nodes) - body_start)
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
                    origin=origin,
                )
            )
        return [self.atom(a, env) for a in jaxpr.outvars]

    def unrollable(self, params: dict[str, Any]) -> bool:
        length = int(params.get("length", 0))
        body, _ = split_closed(params["jaxpr"])
        return 0 < length and length * max(1, len(body.eqns)) <= self.unroll_limit

    def synthetic(
        self,
        primitive: str,
        params: dict[str, Any],
        ins: Sequence[int],
        out: int,
        where: tuple[str, str],
        origin: tuple[int, int, int],
    ) -> int:
        """Append a ``scan_slice``/``scan_stack`` node (no equation); ``where``: its source
        line and name stack (the scan's)."""
        index = len(self.nodes)
        self.nodes.append(Node(index, primitive, params, tuple(ins), (out,), *where, origin=origin))
        return index

    def unroll_scan(self, eqn: Any, ins: Sequence[int], source: str) -> list[int]:
        """Walk the body once per iteration (see the module docstring); returns the ids of
        the scan's results (the last carry-out, then the stacked outputs)."""
        p = eqn.params
        body, body_consts = split_closed(p["jaxpr"])
        n_consts, n_carry = int(p["num_consts"]), int(p["num_carry"])
        length, reverse = int(p["length"]), bool(p["reverse"])
        consts, carry = list(ins[:n_consts]), list(ins[n_consts : n_consts + n_carry])
        xs = list(ins[n_consts + n_carry :])
        x_avals = [v.aval for v in body.invars[n_consts + n_carry :]]
        group, start = len(self.scan_groups), len(self.nodes)
        where = (source, str(eqn.source_info.name_stack))
        body_graph = build_from_jaxpr(p["jaxpr"])
        starts: list[int] = []
        slices: list[tuple[int, ...]] = []
        stacks: list[tuple[int, ...]] = []
        buffers: list[int] = []
        for i in range(length):
            index = length - 1 - i if reverse else i
            x_ids, row = [], []
            for j, (v, aval) in enumerate(zip(xs, x_avals, strict=True)):
                out = self.new_var(aval)
                row.append(
                    self.synthetic(
                        "scan_slice", {"index": index}, (v,), out, where, (group, i, -1 - j)
                    )
                )
                x_ids.append(out)
            slices.append(tuple(row))
            starts.append(len(self.nodes))
            self.origin = (group, i, len(self.nodes))
            try:
                outs = self.walk(body, [*consts, *carry, *x_ids], body_consts, source)
            finally:
                self.origin = None
            if len(self.nodes) - starts[-1] != len(body_graph.nodes):
                raise RuntimeError("an unrolled scan iteration differs from its body graph")
            carry = outs[:n_carry]
            # Stacked outputs are written into a buffer, one slice per iteration (as XLA
            # does): every iteration has the same structure, so repeats stay recognisable.
            row = []
            for j, (y, var) in enumerate(zip(outs[n_carry:], eqn.outvars[n_carry:], strict=True)):
                out = self.new_var(var.aval)
                operands = (y,) if i == 0 else (buffers[j], y)
                row.append(
                    self.synthetic(
                        "scan_stack",
                        {"index": index},
                        operands,
                        out,
                        where,
                        (group, i, -1 - len(xs) - j),
                    )
                )
                if i == 0:
                    buffers.append(out)
                else:
                    buffers[j] = out
            stacks.append(tuple(row))
        self.scan_groups.append(
            ScanGroup(
                eqn=eqn,
                inputs=tuple(ins),
                outputs=(*carry, *buffers),
                length=length,
                reverse=reverse,
                num_consts=n_consts,
                num_carry=n_carry,
                body=body_graph,
                start=start,
                end=len(self.nodes),
                iteration_starts=tuple(starts),
                slices=tuple(slices),
                stacks=tuple(stacks),
            )
        )
        return [*carry, *buffers]


def _control_jaxprs(name: str, params: dict[str, Any]) -> list[Any]:
    out = []
    for key in CONTROL_FLOW.get(name, ()):
        value = params.get(key)
        for j in value if isinstance(value, (list, tuple)) else [value]:
            if j is not None:
                out.append(j)
    return out


def live_nodes(graph: OpGraph) -> list[bool]:
    """Dead-code elimination: which nodes feed an output (as XLA would keep them)."""
    needed = set(graph.outputs)
    live = [False] * len(graph.nodes)
    for node in reversed(graph.nodes):
        if any(v in needed for v in node.outputs):
            live[node.index] = True
            needed.update(node.inputs)
    return live


def build_from_jaxpr(
    closed: Any, unroll_scans: bool = False, *, unroll_limit: int | None = None
) -> OpGraph:
    """An ``OpGraph`` from a (closed) jaxpr.

    Args:
        closed: the (closed) jaxpr.
        unroll_scans: unroll top-level ``scan`` equations (see the module docstring); the
            strategy search, its plans and the editor do, ``predict`` does not.
        unroll_limit: largest ``length × body equations`` unrolled (default
            ``SCAN_UNROLL_LIMIT``); larger scans stay one node.
    """
    jaxpr, consts = split_closed(closed)
    limit = SCAN_UNROLL_LIMIT if unroll_limit is None else unroll_limit
    b = _Builder(limit if unroll_scans else 0)
    ins = [b.new_var(v.aval) for v in jaxpr.invars]
    outs = b.walk(jaxpr, ins, consts)
    return OpGraph(b.nodes, b.shapes, b.dtypes, b.literal, ins, outs, b.scan_groups)
