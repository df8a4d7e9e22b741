"""The shared liveness walk: which variables get a buffer, and when each buffer can be freed.

* **Live ranges.** A buffer lives from its producer to its last *effective* use: a read
  through fused values counts as a read of the buffers they were computed from.

``liveness`` fuses by ``fusion``'s op sets, keeps a scan's carries in buffers
(``scan_carries``) and, with ``copies``, drops the fused values XLA will not duplicate
(``_not_duplicated``: ``InstructionFusion``'s ``CanFuseOnAllPaths``, probed by
``_reaches`` and ``_all_paths``) and adds XLA:CPU's copies (``fusion``). Its
``selections`` are XLA:CPU's expansion of a max pool's gradient (``Liveness.selections``);
``Liveness.in_copies``, ``direct`` and ``early`` are XLA:CPU's convolution copies.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Sequence

from shardlab.parallel.cost.memory.fusion import (
    ABSORBS,
    EXPENSIVE,
    FUSIBLE,
    Wide,
    _at_most_unary,
    _computed_in_copies,
    _convolution_copies,
    _outer,
    _unfusable_broadcasts,
)
from shardlab.parallel.graph.opgraph import Node, OpGraph


@dataclasses.dataclass(frozen=True)
class Liveness:
    """Which variables get a buffer and when each buffer can be freed.

    Attributes:
        order: live node indices in program order.
        materialized: variables that get a buffer (fused values are left out).
        last_use: per variable with a buffer, the node after which nothing reads it
            (directly or through fused values).
    """

    order: tuple[int, ...]
    materialized: frozenset[int]
    last_use: dict[int, int]
    expanded: dict[int, Wide] = dataclasses.field(default_factory=dict)
    # Per select-and-scatter node: (node, source, operand, node after which XLA:CPU
    # finds the windows' argmax in the operand).
    selections: tuple[tuple[int, int, int, int], ...] = ()
    # Values written only in a convolution's layout (``_computed_in_copies``).
    in_copies: frozenset[int] = frozenset()
    # Per value with a buffer that convolutions also read through a transposed copy: the
    # node after which nothing reads its own buffer (the copy, written with the value,
    # lives to ``last_use``).
    direct: dict[int, int] = dataclasses.field(default_factory=dict)
    # Values in ``in_copies`` computed from the program's arguments alone (a kernel's
    # ``rev`` for an input gradient): the copy is written at the program's start.
    early: frozenset[int] = frozenset()


def scan_carries(graph: OpGraph) -> frozenset[int]:
    """The carry each iteration of an unrolled scan hands to the next: the compiled loop
    keeps it in the while loop's state, a buffer, however cheap the value is to recompute
    (a residual stream ``x + attention(x) + mlp(x)`` is written out once per layer, not
    fused across layers)."""
    out: set[int] = set()
    for group in graph.scan_groups:
        body = group.body
        for var in body.outputs[: group.num_carry]:
            k = body.producer(var)
            if k < 0:
                continue
            position = body.nodes[k].outputs.index(var)
            for start in group.iteration_starts:
                out.add(graph.nodes[start + k].outputs[position])
    return frozenset(out)


REACH_BUDGET = 256  # nodes a reachability probe visits before it gives up (``_reaches``)


def _reaches(graph: OpGraph, position: dict[int, int], source: int, target: int) -> bool:
    """Whether variable ``target`` is computed from ``source`` (a backward walk from
    ``target`` over nodes after ``source``'s producer, at most ``REACH_BUDGET`` of them: a
    path longer than that is taken as none)."""
    start = position.get(graph.producer(source), -1)
    if position.get(graph.producer(target), -1) <= start:
        return False
    stack, seen = [target], {target}
    while stack and len(seen) <= REACH_BUDGET:
        v = stack.pop()
        i = graph.producer(v)
        if position.get(i, -1) <= start:
            continue
        for x in graph.nodes[i].inputs:
            if x == source:
                return True
            if x not in seen:
                seen.add(x)
                stack.append(x)
    return False


def _not_duplicated(
    graph: OpGraph,
    order: Sequence[int],
    fused: set[int],
    consumers: dict[int, list[int]],
    absorbs: frozenset[str] = ABSORBS,
) -> set[int]:
    """Fused values XLA writes out because it will not duplicate them
    (``InstructionFusion::ComputeGloballyUnfusible``). A value that reads more than one
    operand as large as itself (not ``EffectivelyAtMostUnary``), and more elements in all
    than it has, is fused only if it can be fused into every consumer along every path
    (``CanFuseOnAllPaths``): a consumer that also reads, through a dot or any other value
    with a buffer, something computed from it (a gradient ``g * (1 - h)`` multiplied later
    by a dot of itself) cannot take it, so it gets a buffer that all its consumers read.
    Consumers are decided before their producers (reverse program order), as XLA's
    reverse post order does."""
    position = {i: k for k, i in enumerate(order)}
    out: set[int] = set()
    for i in reversed(order):
        node = graph.nodes[i]
        if len(node.outputs) != 1 or node.outputs[0] not in fused:
            continue
        v = node.outputs[0]
        if _at_most_unary(graph, node):
            continue
        operands = sum(math.prod(graph.shapes[x]) for x in dict.fromkeys(node.inputs))
        if operands <= math.prod(graph.shapes[v]):
            continue
        memo: dict[int, bool] = {}
        kept = _Kept(fused, out)
        if not all(
            _all_paths(graph, position, kept, v, c, memo, absorbs=absorbs)
            for c in consumers.get(v, ())
        ):
            out.add(v)
    return out


class _Kept:
    """Membership in ``fused`` less ``dropped``, without copying ``fused``."""

    def __init__(self, fused: Collection[int], dropped: Collection[int]):
        self.fused, self.dropped = fused, dropped

    def __contains__(self, v: int) -> bool:
        return v in self.fused and v not in self.dropped


def _all_paths(
    graph: OpGraph,
    position: dict[int, int],
    fused: _Kept,
    v: int,
    consumer: int,
    memo: dict[int, bool],
    depth: int = 0,
    absorbs: frozenset[str] = ABSORBS,
) -> bool:
    """``CanFuseOnAllPaths(v, consumer)``: ``consumer`` absorbs fused values, and each of
    its other operands computed from ``v`` is fused too, recursively (``memo``: per
    consumer node, for this ``v``; past ``REACH_BUDGET`` levels the paths are taken as
    fusible)."""
    got = memo.get(consumer)
    if got is not None:
        return got
    if depth > REACH_BUDGET:
        return True
    memo[consumer] = True  # guards re-entry (the graph has no cycles)
    node = graph.nodes[consumer]
    ok = node.primitive in absorbs
    for x in dict.fromkeys(node.inputs) if ok else ():
        if x == v or graph.literal[x] is not None or not _reaches(graph, position, v, x):
            continue
        if x not in fused or not _all_paths(
            graph, position, fused, v, graph.producer(x), memo, depth + 1, absorbs=absorbs
        ):
            ok = False
            break
    memo[consumer] = ok
    return ok


# Contractions a compiler that fuses into dots (``Compiler.fuses_into_dots``: XLA:TPU's
# convolution fusions) reads an elementwise producer inside, recomputed per tile.
DOTS = frozenset(("dot_general", "conv_general_dilated"))


def liveness(
    graph: OpGraph,
    live: Sequence[bool],
    materialize: Collection[int] = (),
    copies: bool = False,
    selections: bool = False,
    dot_operands: bool = False,
    library: bool = True,
) -> Liveness:
    """Fusion and live ranges of ``graph`` (only ``live`` nodes run); ``materialize``:
    variables that get a buffer whatever their consumers (all-reduced partial sums: the
    all-reduce reads a buffer); ``copies``: also the buffers XLA:CPU writes out that the
    program does not name (broadcasts and multi-reader inputs a library reduction cannot
    fuse, convolution operands transposed to its one layout, the window indices of a max
    pool's gradient), with the fusion decisions XLA makes when it does (a ``dot_general``
    contracting only size-1 dimensions is a multiply).
    The plan's memory estimate uses them; the search's own memory rows do not yet (their
    budgets were tuned without them); ``selections``: the backend expands max pooling's
    gradient (``select_and_scatter_add``) into a reduce-window and a scatter
    (``Liveness.selections``)."""
    order = tuple(n.index for n in graph.nodes if live[n.index])
    carried = scan_carries(graph)
    consumers: dict[int, list[int]] = {}
    for i in order:
        for v in dict.fromkeys(graph.nodes[i].inputs):
            consumers.setdefault(v, []).append(i)
    outputs = set(graph.outputs)
    fused: set[int] = set()

    def outer(n: Node) -> bool:
        return copies and _outer(graph, n)

    for i in order:
        node = graph.nodes[i]
        if (node.primitive not in FUSIBLE and not outer(node)) or len(node.outputs) != 1:
            continue
        v = node.outputs[0]
        users = consumers.get(v, [])
        if v in outputs or not users or v in materialize or v in carried:
            continue
        if not all(
            graph.nodes[u].primitive in ABSORBS
            or outer(graph.nodes[u])
            or (dot_operands and graph.nodes[u].primitive in DOTS)
            for u in users
        ):
            continue
        if len(users) > 1 and node.primitive in EXPENSIVE:
            continue
        fused.add(v)
    if dot_operands:
        # A dot read only by a fused elementwise op that only dots read (a weight
        # gradient's ``(d_o · w2ᵀ) ⊙ relu'(a)``): XLA:TPU computes it per tile inside
        # the consuming dot's fusion (``%convolution_select_fusion`` nested in it).
        for i in order:
            node = graph.nodes[i]
            if node.primitive != "dot_general" or len(node.outputs) != 1:
                continue
            v = node.outputs[0]
            users = consumers.get(v, [])
            if v in outputs or v in materialize or v in carried or len(users) != 1:
                continue
            (u,) = users
            w = graph.nodes[u].outputs[0] if len(graph.nodes[u].outputs) == 1 else -1
            if w in fused and all(graph.nodes[c].primitive in DOTS for c in consumers.get(w, [])):
                fused.add(v)
    if copies:
        absorbs = ABSORBS | DOTS if dot_operands else ABSORBS
        fused -= _not_duplicated(graph, order, fused, consumers, absorbs)
    cpu = copies and library  # XLA:CPU's library reductions and its one convolution layout
    library_read: set[int] = set()
    expanded = _unfusable_broadcasts(graph, order, fused, consumers, library_read) if cpu else {}
    reads: set[tuple[int, int]] = set()
    for x, extra in (_convolution_copies(graph, order, reads) if cpu else {}).items():
        expanded[x] = (*expanded.get(x, ()), *extra)
    in_copies = _computed_in_copies(graph, order, consumers, reads) if reads else frozenset()
    sources: dict[int, frozenset[int]] = {}

    def source_of(v: int) -> frozenset[int]:
        got = sources.get(v)
        if got is None:
            if v in fused:
                node = graph.nodes[graph.producer(v)]
                got = frozenset().union(*(source_of(x) for x in node.inputs))
                if v in library_read:  # its written-out copy is read for as long
                    got |= {v}
            else:
                got = frozenset((v,))
            sources[v] = got
        return got

    selecting = {
        i: graph.nodes[i].inputs[1]
        for i in order
        if selections and graph.nodes[i].primitive == "select_and_scatter_add"
    }
    last_use: dict[int, int] = {}
    copied = {v for _, v in reads}
    direct: dict[int, int] = {}
    for i in order:
        for v in graph.nodes[i].inputs:
            if selecting.get(i) == v:
                continue  # read where it is computed (``selections``)
            for s in source_of(v) | {v}:  # program order: the latest read wins
                last_use[s] = i
                if s in copied and (i, s) not in reads:
                    direct[s] = i
    found: list[tuple[int, int, int, int]] = []
    position = {i: k for k, i in enumerate(order)}
    for i, operand in selecting.items():
        # XLA:CPU expands select-and-scatter (SelectAndScatterExpander): a variadic
        # reduce-window over the operand and one iota per dimension finds each window's
        # argmax as soon as the operand exists, and its indices (s32, one per dimension
        # and window) wait for the scatter; the operand is not kept for it.
        roots = [s for s in source_of(operand) if graph.producer(s) in position]
        at = max(
            (last_use.get(s, graph.producer(s)) for s in roots),
            key=lambda k: position.get(k, -1),
            default=i,
        )
        if position.get(at, -1) > position[i]:
            at = i
        for s in roots:
            if position.get(last_use.get(s, -1), -1) < position[at]:
                last_use[s] = at
        found.append((i, graph.nodes[i].inputs[0], operand, at))
    materialized = frozenset(v for i in order for v in graph.nodes[i].outputs if v not in fused)
    # XLA:CPU frees a value's own buffer after its last reader in that layout; its
    # transposed copy for a convolution (a weight gradient's activations) is held apart.
    direct = {
        v: direct.get(v, graph.producer(v))
        for v in copied
        if v in materialized and v not in in_copies and graph.producer(v) >= 0
    }
    inputs = set(graph.inputs)
    early = frozenset(
        v
        for v in in_copies
        if all(source_of(x) <= inputs for x in graph.nodes[graph.producer(v)].inputs)
    )
    return Liveness(order, materialized, last_use, expanded, tuple(found), in_copies, direct, early)
