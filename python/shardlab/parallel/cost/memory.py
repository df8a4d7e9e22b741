"""Per-device memory of a strategy, accounted the way XLA allocates it.

XLA's compiled footprint is ``arguments + outputs + temp``: argument and output buffers live
for the whole program, and ``temp`` is one heap that packs every intermediate buffer by its
live range. Two things decide which intermediates get a buffer at all:

* **Fusion.** An elementwise or indexing value (``add``, ``tanh``, ``broadcast_in_dim``, a
  convert, a slice, a pad …)
  whose consumers can all absorb it (elementwise ops, reductions, slices) is computed inside
  its consumers' loop and never written to memory. A value with several consumers is still
  fused when it is cheap to recompute; a transcendental one (``exp``, ``tanh``, ``log`` …)
  with several consumers is materialised once instead.
* **Live ranges.** A buffer lives from its producer to its last *effective* use: a read
  through fused values counts as a read of the buffers they were computed from.

* **Output buffers.** An output's allocation exists for the whole program, so XLA puts
  temporaries in it before the output is computed (first fit, whole buffers), and a value
  read for the last time by the elementwise op (or scatter, dynamic-update-slice) that
  makes an output of the same size is computed in that output's buffer from the start: a
  train step's gradients, combined into the new optimizer state, take no temp.

The model walks the program order once: ``temp`` is the peak of live materialised
intermediates (plus any copy in another layout a consumer needs, e.g. a gathered
parameter; a broadcast or iota is regenerated in each layout instead) that do not fit in
the outputs not yet computed, ``peak = arguments + outputs + temp``.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Callable, Collection, Sequence

import numpy as np

from shardlab.parallel.cost.combine import all_reduce_groups, loop_of
from shardlab.parallel.graph.opgraph import Node, OpGraph
from shardlab.parallel.graph.rules import ELEMENTWISE, FREE
from shardlab.parallel.records import Collective, DeviceMemoryEstimate

SHAPE_ONLY = frozenset(
    "broadcast_in_dim reshape squeeze expand_dims iota transpose rev select_n copy copy_p "
    "pad slice dynamic_slice concatenate".split()
)
FUSIBLE = ELEMENTWISE | FREE | SHAPE_ONLY
ABSORBS = FUSIBLE | frozenset(
    "reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or argmax argmin slice "
    "dynamic_slice concatenate pad cumsum".split()
)
EXPENSIVE = frozenset(
    "exp exp2 expm1 log log1p tanh logistic sin cos tan pow erf erfc erf_inv atan2 lgamma "
    "digamma sinh cosh asin acos atan asinh acosh atanh".split()
)


# Per node, bytes it needs only while it runs: one buffer, or several (the operands of a
# combined all-reduce), each of which may sit in an output buffer not yet written.
Transient = Callable[[int], "int | tuple[int, ...]"]
# Per all-reduced variable: (node after which its all-reduce runs, unreduced bytes, reduced
# bytes).
Reductions = dict[int, tuple[int, int, int]]


# Per variable, the values whose full-size copy of it XLA writes out: (value, the reduction
# operand that needs it, or -1 when the copy is always made).
Wide = tuple[tuple[int, int], ...]


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


FUSED_DEPTH = 1
# Per-device elements from which XLA:CPU emits an f32 reduction as a library (YNNPACK)
# fusion; smaller ones are loop fusions, which take any broadcast inside.
LIBRARY_REDUCTION = 4096
REDUCING = frozenset("reduce_sum reduce_max reduce_min reduce_prod".split())
# Data movement a library reduction fusion cannot take in: the value is written out for it.
LIBRARY_OPERANDS = frozenset(("concatenate", "pad"))
RESHAPES = frozenset(("reshape", "squeeze", "expand_dims"))


def _outer(graph: OpGraph, node: Node) -> bool:
    """A ``dot_general`` that contracts only size-1 dimensions (a cotangent times a
    ``(k, 1)`` weight): XLA's algebraic simplifier rewrites it as a multiply of broadcasts,
    an elementwise loop that fuses like one."""
    if node.primitive != "dot_general" or len(node.inputs) != 2:
        return False
    (lc, _), _ = node.params["dimension_numbers"]
    shape = graph.shapes[node.inputs[0]]
    return all(shape[d] == 1 for d in lc)


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


def _true_rank(shape: Sequence[int]) -> int:
    return sum(1 for d in shape if d != 1)


def _at_most_unary(graph: OpGraph, node: Node) -> bool:
    """XLA's ``InstructionFusion::EffectivelyAtMostUnary``: at most one operand as large as
    the result (true rank at least the result's); broadcasts, iotas and scalar constants
    do not count."""
    rank = _true_rank(graph.shapes[node.outputs[0]])
    large = 0
    for x in node.inputs:
        if graph.literal[x] is not None or _regenerated(graph, x):
            continue
        if _true_rank(graph.shapes[x]) >= rank:
            large += 1
    return large <= 1


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
    graph: OpGraph, order: Sequence[int], fused: set[int], consumers: dict[int, list[int]]
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
        if not all(_all_paths(graph, position, kept, v, c, memo) for c in consumers.get(v, ())):
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
    ok = node.primitive in ABSORBS
    for x in dict.fromkeys(node.inputs) if ok else ():
        if x == v or graph.literal[x] is not None or not _reaches(graph, position, v, x):
            continue
        if x not in fused or not _all_paths(
            graph, position, fused, v, graph.producer(x), memo, depth + 1
        ):
            ok = False
            break
    memo[consumer] = ok
    return ok


def _unfusable_broadcasts(
    graph: OpGraph,
    order: Sequence[int],
    fused: set[int],
    consumers: dict[int, list[int]],
    library: set[int] | None = None,
) -> dict[int, Wide]:
    """Broadcasts a reduction cannot absorb. XLA:CPU emits a reduction (with the
    elementwise operations that feed it) as one library fusion that takes a broadcast
    inside only along the reduced dimensions (a softmax's max, a mean's divisor); a value
    broadcast along a kept dimension (a LayerNorm scale over the batch, a per-row statistic
    summed over rows) is written out in full first. Returns the explicit broadcasts to
    materialise, and per variable an elementwise operation expands (size-1 dimensions), the
    full-shape values whose broadcast copy of it is written out (XLA's CSE keeps one such
    copy for as long as the small variable lives).

    XLA:CPU's library rewriter builds that fusion before instruction fusion runs, from the
    reduction and the elementwise producers only it reads: an elementwise value feeding it
    that other operations read too (``1 - h`` of a tanh's derivative, a gradient summed over
    the batch and also multiplied on) is written out for the reduction to read, although
    its other consumers recompute it fused; the walk stops there (what it is computed from
    is that value's own loop fusion, which takes any broadcast). A concatenation or pad
    is written out whatever reads it; its other consumers read that buffer instead of
    recomputing it (``library`` collects them)."""
    expanded: dict[int, list[tuple[int, int]]] = {}
    for i in order:
        node = graph.nodes[i]
        if node.primitive not in REDUCING or not node.inputs:
            continue
        axes = set(node.params.get("axes", ()))
        # (value, depth, reached through a reshape: the reduced axes no longer apply)
        stack, seen = [(node.inputs[0], 0, False)], set()
        while stack:
            w, depth, reshaped = stack.pop()
            if w in seen or w not in fused:
                continue
            seen.add(w)
            producer = graph.nodes[graph.producer(w)]
            shape = graph.shapes[w]
            if (
                producer.primitive in ELEMENTWISE and len(consumers.get(w, ())) > 1
            ) or producer.primitive in LIBRARY_OPERANDS:
                expanded.setdefault(w, []).append((w, node.inputs[0]))
                if library is not None and producer.primitive in LIBRARY_OPERANDS:
                    library.add(w)
                continue
            if producer.primitive in RESHAPES:  # a bitcast: the fusion reads through it
                stack.append((producer.inputs[0], depth, True))
                continue
            if producer.primitive == "broadcast_in_dim":
                src = graph.shapes[producer.inputs[0]]
                if not reshaped and math.prod(src) > 1 and not _added(producer, src, shape) <= axes:
                    expanded.setdefault(w, []).append((w, node.inputs[0]))
                continue
            if producer.primitive not in ELEMENTWISE and producer.primitive not in FREE:
                continue
            for x in producer.inputs:
                xs = graph.shapes[x]
                if graph.literal[x] is not None or math.prod(xs) <= 1:
                    continue
                if not reshaped and len(xs) == len(shape) and xs != shape:
                    added = {d for d in range(len(shape)) if xs[d] == 1 and shape[d] > 1}
                    if not added <= axes:
                        expanded.setdefault(x, []).append((w, node.inputs[0]))
                if depth < FUSED_DEPTH:
                    stack.append((x, depth + 1, reshaped))
    return {x: tuple(dict.fromkeys(ws)) for x, ws in expanded.items()}


def _convolution_copies(
    graph: OpGraph, order: Sequence[int], reads: set[tuple[int, int]] | None = None
) -> dict[int, Wide]:
    """Operands a convolution reads in a transposed copy. XLA:CPU convolves only in the
    canonical layout (``b01f_01io->b01f``: batch first and features last, the kernel's
    input then output features last); layout assignment transposes any other operand into
    a copy of its own, written as soon as the operand is (a weight gradient's activations
    are copied in the forward pass and held to the backward). ``reads`` collects the
    ``(node, operand)`` pairs read through such a copy."""
    out: dict[int, Wide] = {}
    for i in order:
        node = graph.nodes[i]
        dn = (
            node.params.get("dimension_numbers")
            if node.primitive == "conv_general_dilated"
            else None
        )
        if dn is None or not hasattr(dn, "lhs_spec") or len(node.inputs) < 2:
            continue
        rank = len(dn.lhs_spec)
        spatial = tuple(range(1, rank - 1))
        canonical = (
            (node.inputs[0], tuple(dn.lhs_spec), (0, rank - 1, *spatial)),
            (node.inputs[1], tuple(dn.rhs_spec), (rank - 1, rank - 2, *range(rank - 2))),
            (node.outputs[0], tuple(dn.out_spec), (0, rank - 1, *spatial)),
        )
        for v, spec, want in canonical:
            if spec != want and graph.literal[v] is None:
                out[v] = ((v, -1),)
                if reads is not None and v != node.outputs[0]:
                    reads.add((i, v))
    return out


def _computed_in_copies(
    graph: OpGraph,
    order: Sequence[int],
    consumers: dict[int, list[int]],
    reads: Collection[tuple[int, int]],
) -> frozenset[int]:
    """Values XLA:CPU computes straight into a convolution's transposed copy: the copy is a
    loop fusion (``transpose_copy_fusion``), and an elementwise or data-movement producer
    (a ReLU gradient's ``select``, a kernel's ``rev``) fuses into it like into any other
    loop fusion. When every consumer is a convolution reading the copy, the value has no
    buffer in its own layout: the copy is its buffer, written where the value is computed
    (the operands it reads are freed there)."""
    outputs = set(graph.outputs)
    out: set[int] = set()
    for i in order:
        node = graph.nodes[i]
        if node.primitive not in FUSIBLE or len(node.outputs) != 1:
            continue
        v = node.outputs[0]
        users = consumers.get(v, ())
        if v in outputs or not users or not all((u, v) in reads for u in users):
            continue
        out.add(v)
    return frozenset(out)


def _added(node: Node, src: Sequence[int], shape: Sequence[int]) -> set[int]:
    """The dimensions a ``broadcast_in_dim`` repeats its operand along."""
    dims = tuple(node.params.get("broadcast_dimensions", ()))
    added = {d for d in range(len(shape)) if d not in dims}
    return added | {d for k, d in enumerate(dims) if src[k] == 1 and shape[d] > 1}


def liveness(
    graph: OpGraph,
    live: Sequence[bool],
    materialize: Collection[int] = (),
    copies: bool = False,
    selections: bool = False,
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
        if not all(graph.nodes[u].primitive in ABSORBS or outer(graph.nodes[u]) for u in users):
            continue
        if len(users) > 1 and node.primitive in EXPENSIVE:
            continue
        fused.add(v)
    if copies:
        fused -= _not_duplicated(graph, order, fused, consumers)
    library: set[int] = set()
    expanded = _unfusable_broadcasts(graph, order, fused, consumers, library) if copies else {}
    reads: set[tuple[int, int]] = set()
    for x, extra in (_convolution_copies(graph, order, reads) if copies else {}).items():
        expanded[x] = (*expanded.get(x, ()), *extra)
    in_copies = _computed_in_copies(graph, order, consumers, reads) if reads else frozenset()
    sources: dict[int, frozenset[int]] = {}

    def source_of(v: int) -> frozenset[int]:
        got = sources.get(v)
        if got is None:
            if v in fused:
                node = graph.nodes[graph.producer(v)]
                got = frozenset().union(*(source_of(x) for x in node.inputs))
                if v in library:  # its written-out copy is read for as long
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


def device_memory(
    graph: OpGraph,
    live: Sequence[bool],
    local: Callable[[int], int],
    extra: Callable[[int], int] = lambda v: 0,
    output_local: Callable[[int], int] | None = None,
    lv: Liveness | None = None,
    transient: Transient = lambda i: 0,
    reductions: Reductions | None = None,
    moved: Collection[int] = (),
    selections: bool = False,
) -> DeviceMemoryEstimate:
    """Per-device ``arguments + outputs + temp`` of a strategy.

    Args:
        graph: the op graph.
        live: which nodes run.
        local: per variable, its per-device bytes in the strategy's layout.
        extra: per variable, the per-device bytes of copies in other layouts its consumers
            need (resharded before use); a fused value with copies gets a buffer.
        output_local: per output variable, per-device bytes in its final layout (default
            ``local``).
        lv: a precomputed ``liveness(graph, live)``.
        transient: per node, bytes it needs only while it runs (one buffer or a tuple of
            them): the unreduced operands of an all-reduce next to its results.
        reductions: per all-reduced variable, where its all-reduce runs and the bytes of
            its unreduced and reduced buffers (``all_reduce_spans``): the unreduced buffer
            lives from the producer to the all-reduce, the reduced one from there to the
            last use, in its own buffer (an all-reduce never writes over its operand).
        moved: outputs computed in one layout and moved (resharded) into their final one.
            Computed by fusible ops that only fusible ops read, their computed buffer is
            the move's operand alone: each consumer recomputes the value fused.
        selections: the backend expands max pooling's gradient (XLA:CPU): its operand is
            read where it is computed, its windows' indices wait for the scatter.
    """
    lv = lv or liveness(
        graph, live, materialize=reductions or (), copies=True, selections=selections
    )
    output_local = output_local or local
    used = {v for i in lv.order for v in graph.nodes[i].inputs} | set(graph.outputs)
    inputs = set(graph.inputs)
    params = sum(local(v) for v in dict.fromkeys(graph.inputs) if v in used)
    out_bytes = sum(output_local(v) for v in dict.fromkeys(graph.outputs))

    reduced = frozenset(reductions or ())
    parts = _parts(graph, lv, local, extra, reduced)

    def held(v: int) -> int:
        return sum(parts(v))

    slots = {v: output_local(v) for v in dict.fromkeys(graph.outputs) if graph.producer(v) >= 0}
    start = [v for v in inputs if v in used]

    def own(v: int) -> int:
        return parts(v)[0]

    into = written_over(graph, lv, own, reduced)
    scratch = _selection_scratch(graph, lv, local)
    brief: Collection[int] = ()
    if reductions:
        hosted = in_output_buffers(graph, lv, local, extra, reduced) | set(graph.outputs)
        reductions = {
            v: (at, unreduced, 0 if v in hosted else result)
            for v, (at, unreduced, result) in reductions.items()
        }
        brief = _recomputed(graph, moved)
    peak, _ = _assigned(
        graph,
        lv,
        held,
        start,
        transient,
        slots,
        reductions,
        brief,
        own=own,
        into=into,
        scratch=scratch,
    )
    return DeviceMemoryEstimate(
        parameters=params, outputs=out_bytes, activations=peak, peak=params + out_bytes + peak
    )


def _selection_scratch(
    graph: OpGraph, lv: Liveness, local: Callable[[int], int]
) -> list[tuple[int, int, int]]:
    """Buffers of XLA:CPU's expanded select-and-scatter (a max pool's gradient), as
    ``(bytes, first node, last node)``: where the operand is read, one s32 iota per
    dimension of it and the windows' maxima; from there to the scatter, the windows'
    argmax indices (s32, one per dimension) and the zeros the scatter then writes over
    (scheduled with the iotas)."""
    out = []
    position = {i: k for k, i in enumerate(lv.order)}
    for i, source, operand, at in lv.selections:

        def elements(v: int) -> int:
            whole = graph.nbytes(v)
            return local(v) * math.prod(graph.shapes[v]) // whole if whole else 0

        rank = len(graph.shapes[operand])
        windows = elements(source)
        maxima = windows * (graph.nbytes(operand) // max(1, math.prod(graph.shapes[operand])))
        out.append((4 * rank * elements(operand) + maxima, at, at))
        out.append((4 * rank * windows, at, i))
        before = lv.order[max(position[at], position[i] - 1)]
        out.append((local(graph.nodes[i].outputs[0]), at, before))
    return out


def _recomputed(graph: OpGraph, moved: Collection[int]) -> frozenset[int]:
    """Of the outputs moved into their final layout, those a fusible op computes and only
    fusible ops read (an Adam moment computed split like its gradient, gathered into the
    replicated state, and read split by the parameter update)."""
    out = set()
    for v in moved:
        i = graph.producer(v)
        if i < 0 or graph.nodes[i].primitive not in FUSIBLE or len(graph.nodes[i].outputs) != 1:
            continue
        if all(graph.nodes[c].primitive in ABSORBS for c in graph.consumers(v)):
            out.add(v)
    return frozenset(out)


def all_reduce_spans(
    graph: OpGraph,
    collectives: Sequence[Collective],
    nodes: Sequence[int],
    local: Callable[[int], int],
) -> tuple[Reductions, dict[int, list[int]]]:
    """Where each all-reduced variable's unreduced and reduced buffers live.

    XLA's combiner merges the all-reduces of a group (``combine.all_reduce_groups``) into
    one instruction after the last of them is computed: each member's unreduced buffer
    (its partial sum, the collective's bytes) lives from its producer to there, and the
    all-reduce writes the reduced values to buffers of their own, live to the variable's
    last use. Where the variable's layout is split (a reduce-scatter the CPU backend
    compiles as an all-reduce and a slice), the reduced buffer is still the whole
    all-reduce result: the slice is fused into its consumers. Returns ``(reductions,
    leftovers)``: the spans per variable, and per node the bytes of collectives that name
    no single variable (transients at that node)."""
    groups = all_reduce_groups(graph, collectives, nodes)
    members: dict[tuple[object, ...], list[tuple[int, int]]] = {}
    for c, node, group in zip(collectives, nodes, groups, strict=True):
        if group is not None:
            key = (*group, loop_of(graph, node) if c.count == 1 else (node, c.count))
            members.setdefault(key, []).append((node, c.bytes * c.count))
    out: Reductions = {}
    leftovers: dict[int, list[int]] = {}
    for parts in members.values():
        last = max(node for node, _ in parts)
        for node, nbytes in parts:
            outs = graph.nodes[node].outputs
            if len(outs) != 1 or outs[0] in out:
                leftovers.setdefault(last, []).append(nbytes)
                continue
            out[outs[0]] = (last, nbytes, max(nbytes, local(outs[0])))
    return out, leftovers


def expansion_scratch(graph: OpGraph, local: Callable[[int], int]) -> Callable[[int], int]:
    """Per node, the scratch bytes of an operation the backend expands into several (XLA:CPU's
    ``SelectAndScatterExpander``): max pooling's gradient (``select_and_scatter_add``) becomes
    one ``s32`` iota of the operand's shape per dimension, a reduce-window that picks each
    window's index (``s32[source elements, rank]``) and a scatter into zeros. The iotas and the
    indices are live together while the indices are formed."""

    def scratch(i: int) -> int:
        node = graph.nodes[i]
        if node.primitive != "select_and_scatter_add":
            return 0
        source, operand = node.inputs[0], node.inputs[1]
        rank = len(graph.shapes[operand])
        elements = 0
        for v in (source, operand):
            whole = graph.nbytes(v)
            count = math.prod(graph.shapes[v])
            elements += local(v) * count // whole if whole else 0
        return 4 * rank * elements

    return scratch


def held_at_peak(
    graph: OpGraph,
    live: Sequence[bool],
    local: Callable[[int], int],
    extra: Callable[[int], int] = lambda v: 0,
    lv: Liveness | None = None,
    transient: Transient = lambda i: 0,
) -> frozenset[int]:
    """The buffers (intermediates, and inputs held in another layout) live at the peak of
    ``device_memory``'s walk: a cut for linear memory constraints."""
    lv = lv or liveness(graph, live)
    return _walk(graph, lv, _holder(graph, lv, local, extra), list(graph.inputs), transient)[1]


def _holder(
    graph: OpGraph, lv: Liveness, local: Callable[[int], int], extra: Callable[[int], int]
) -> Callable[[int], int]:
    """Bytes a variable's buffers take in ``temp``: argument and output buffers are counted
    apart, so only their copies in other layouts; fused values only when copied."""
    parts = _parts(graph, lv, local, extra)
    return lambda v: sum(parts(v))


def _parts(
    graph: OpGraph,
    lv: Liveness,
    local: Callable[[int], int],
    extra: Callable[[int], int],
    reduced: Collection[int] = (),
) -> Callable[[int], tuple[int, int]]:
    """Per variable, ``(its own buffer, its copies)`` in ``temp`` (``_holder``'s sum): each
    is a buffer of its own in XLA's assignment, placed apart (a weight gradient fits the
    output buffer its update writes later; its ZeRO slice does not have to)."""
    keep = set(graph.inputs) | set(graph.outputs)
    keep |= in_output_buffers(graph, lv, local, extra, reduced)

    def library(r: int) -> bool:
        """A reduction XLA:CPU emits as a library fusion of what it reads: large enough,
        and not reading a copy in another layout (the loop fusion that computes the value
        before it is resharded takes the elementwise producers and broadcasts then)."""
        if extra(r):
            return False
        whole = graph.nbytes(r)
        elements = math.prod(graph.shapes[r])
        return whole > 0 and local(r) * elements // whole >= LIBRARY_REDUCTION

    def parts(v: int) -> tuple[int, int]:
        copies = extra(v)
        if copies and v not in lv.materialized and _regenerated(graph, v):
            copies = 0  # a broadcast or iota is generated in whatever layout a consumer needs
        wide = [
            local(w)
            for w, r in lv.expanded.get(v, ())
            if (r < 0 and not copies) or (r >= 0 and library(r))
        ]
        # (A convolution reading it in another layout transposes while it reshards: the
        # copy in that layout is the transposed one.)
        if wide:  # a copy of it in full: a broadcast a reduction reads, a transpose
            if v not in keep and (v not in lv.materialized or v in lv.in_copies):
                return max(wide), copies  # the value itself, written out in the copy
            copies += max(wide)
        if v in keep:
            return 0, copies
        return (local(v), copies) if v in lv.materialized or copies else (0, 0)

    return parts


# Operations whose result has its operands' elements (maybe in another order): fused into an
# elementwise consumer, they let it write over the buffer they read.
SAME_ELEMENTS = ELEMENTWISE | FREE | frozenset("reshape squeeze expand_dims transpose".split())


def _in_order(graph: OpGraph, v: int, reduced: Collection[int]) -> bool:
    """Whether ``v``'s buffer holds its elements in the order its reader expects: a partial
    sum reduced before a transpose it passed through (``propagate.PASS_PARTIAL``) is
    all-reduced untransposed, and its readers fuse the transpose."""
    i = graph.producer(v)
    return i < 0 or not _reorders(graph, graph.nodes[i], reduced)


def _reorders(graph: OpGraph, node: Node, reduced: Collection[int]) -> bool:
    """A transpose of an all-reduced value (before or after it) that moves more than size-1
    dimensions: the all-reduce fixes its operand's layout, so the transpose reorders the
    elements and a fusion reading through it cannot write over its operand (a weight
    gradient transposed into the momentum update keeps its own buffer). Unreduced, layout
    assignment gives the producer the transposed layout and the transpose is a bitcast."""
    if node.primitive != "transpose":
        return False
    if node.inputs[0] not in reduced and node.outputs[0] not in reduced:
        return False
    shape = graph.shapes[node.inputs[0]]
    kept = [d for d in node.params.get("permutation", ()) if shape[d] != 1]
    return kept != sorted(kept)


REGENERATED = frozenset(("broadcast_in_dim", "iota"))


def _regenerated(graph: OpGraph, v: int) -> bool:
    i = graph.producer(v)
    return i >= 0 and graph.nodes[i].primitive in REGENERATED


IN_PLACE_OPERAND = {"scatter": 0, "scatter-add": 0, "scatter_add": 0, "dynamic_update_slice": 0}


def in_output_buffers(
    graph: OpGraph,
    lv: Liveness,
    local: Callable[[int], int],
    extra: Callable[[int], int],
    reduced: Collection[int] = (),
) -> set[int]:
    """Intermediates XLA computes in an output's buffer, so they take no ``temp``.

    XLA's buffer assignment lets an elementwise result (and a scatter's or
    dynamic-update-slice's result) reuse the buffer of an operand read there for the last
    time when both have the same size. Following those hand-overs back from each output
    finds the values that live in the output's allocation from the start: a train step's
    gradients, all-reduced and combined into the new optimizer state, are the usual ones.
    """
    outputs = set(graph.outputs)
    inputs = set(graph.inputs)
    reads = _Reads(graph, lv, reduced=reduced)
    out: set[int] = set()
    for v in reversed(graph.outputs):
        while True:
            i = graph.producer(v)
            if i < 0:
                break
            node = graph.nodes[i]
            if node.primitive in IN_PLACE_OPERAND:
                operands = [node.inputs[IN_PLACE_OPERAND[node.primitive]]]
            elif node.primitive in ELEMENTWISE or node.primitive in FREE:
                operands = reads(node.inputs)
            else:
                break
            nxt = next(
                (
                    u
                    for u in operands
                    if u not in inputs
                    and u not in outputs
                    and u not in out
                    and u in lv.materialized
                    and lv.last_use.get(u) == i
                    and local(u) == local(v)
                    and not extra(u)
                    and _in_order(graph, u, reduced)
                ),
                None,
            )
            if nxt is None:
                break
            out.add(nxt)
            v = nxt
    return out


def written_over(
    graph: OpGraph, lv: Liveness, own: Callable[[int], int], skip: Collection[int] = ()
) -> dict[int, int]:
    """Intermediates computed over the buffer of an operand read there for the last time.

    XLA's heap lets an elementwise fusion write its result over an operand buffer of the same
    shape that dies there (``HloDataflowAnalysis::CanShareOperandBufferWithUser``): a dot's
    output, passed through a ReLU into the next dot, is one buffer, not two. Returns, per
    such result, the operand whose buffer it takes (follow the chain for the allocation).
    ``own``: per variable, the bytes of its own buffer in ``temp`` (0: none there — an
    argument, an output, a value placed in an output's buffer); ``skip``: variables that
    keep their own buffers (all-reduced partial sums).
    """
    inputs = set(graph.inputs)
    outputs = set(graph.outputs)
    readers: dict[int, set[int]] = {}
    fusible = _Reads(graph, lv, FUSIBLE, skip)
    for i in lv.order:
        for u in fusible(graph.nodes[i].inputs):
            readers.setdefault(u, set()).add(i)
    same = _Reads(graph, lv, reduced=skip)
    taken: set[int] = set()
    out: dict[int, int] = {}
    for i in lv.order:
        node = graph.nodes[i]
        if len(node.outputs) != 1:
            continue
        w = node.outputs[0]
        if w not in lv.materialized or w in outputs or w in skip or not own(w):
            continue
        if w in lv.in_copies:  # written in another layout: not over its operand
            continue
        if node.primitive in IN_PLACE_OPERAND:
            operands = [node.inputs[IN_PLACE_OPERAND[node.primitive]]]
        elif node.primitive in ELEMENTWISE or node.primitive in FREE:
            operands = same(node.inputs)
        else:
            continue
        for u in operands:
            if (
                u not in inputs
                and u not in outputs
                and u not in taken
                and u not in skip
                and u in lv.materialized
                and readers.get(u) == {i}
                and own(u) == own(w)
                and _in_order(graph, u, skip)
                and graph.shapes[u] == graph.shapes[w]
            ):
                taken.add(u)
                out[w] = u
                break
    return out


class _Reads:
    """The buffers an elementwise operation reads element by element: its materialised
    operands, and those of the elementwise values fused into it (a fusion may write its
    result over any of them, ``HloDataflowAnalysis::CanShareBuffer``), in the order a
    depth-first walk of the fused values meets them.

    Memoised per variable: a fused chain (a residual stream summed through every layer) is
    walked once, not once per reader, so a deep model stays linear in its fused values."""

    def __init__(
        self,
        graph: OpGraph,
        lv: Liveness,
        through: Collection[str] = SAME_ELEMENTS,
        reduced: Collection[int] = (),
    ):
        self.graph, self.lv, self.through, self.reduced = graph, lv, through, reduced
        self.memo: dict[int, tuple[int, ...]] = {}

    def _children(self, u: int) -> Sequence[int] | None:
        """``None``: ``u`` is read as a buffer; otherwise the values fused into it."""
        graph = self.graph
        i = graph.producer(u)
        if u in self.lv.materialized or i < 0:
            return None
        node = graph.nodes[i]
        if (
            node.primitive in self.through
            and len(node.outputs) == 1
            and not _reorders(graph, node, self.reduced)
        ):
            return node.inputs
        return ()

    def of(self, u: int) -> tuple[int, ...]:
        memo = self.memo
        if u in memo:
            return memo[u]
        stack: list[tuple[int, bool]] = [(u, False)]
        while stack:
            v, ready = stack.pop()
            if v in memo:
                continue
            kids = self._children(v)
            if kids is None:
                memo[v] = (v,)
            elif ready or not kids:
                memo[v] = _first_seen(memo[k] for k in kids)
            else:
                stack.append((v, True))
                stack.extend((k, False) for k in kids if k not in memo)
        return memo[u]

    def __call__(self, inputs: Sequence[int]) -> list[int]:
        return list(_first_seen(self.of(u) for u in inputs))


def _first_seen(parts) -> tuple[int, ...]:
    out: dict[int, None] = {}
    for part in parts:
        for v in part:
            out[v] = None
    return tuple(out)


def _walk(
    graph: OpGraph,
    lv: Liveness,
    held: Callable[[int], int],
    start: Sequence[int],
    transient: Transient = lambda i: 0,
    slots: dict[int, int] | None = None,
) -> tuple[int, frozenset[int]]:
    """Walk the program order holding ``held(v)`` bytes per buffer, plus ``transient(i)``
    bytes while node ``i`` runs: (peak, buffers at it). With ``slots`` (output → bytes),
    what XLA places in the outputs' buffers does not count (``_assigned``)."""
    sizes: dict[int, int] = {}

    def size_of(v: int) -> int:
        got = sizes.get(v)
        if got is None:
            got = sizes[v] = held(v)
        return got

    if slots:
        return _assigned(graph, lv, size_of, start, transient, slots)
    raw = [now for now, _ in _steps(graph, lv, size_of, start, transient)]
    if not raw:
        return 0, frozenset()
    best = max(range(len(raw)), key=raw.__getitem__)
    return raw[best], _snapshots(graph, lv, size_of, start, transient, {best})[best][0]


def _assigned(
    graph: OpGraph,
    lv: Liveness,
    size_of: Callable[[int], int],
    start: Sequence[int],
    transient: Transient,
    slots: dict[int, int],
    reductions: Reductions | None = None,
    brief: Collection[int] = (),
    own: Callable[[int], int] | None = None,
    into: dict[int, int] | None = None,
    scratch: Sequence[tuple[int, int, int]] = (),
) -> tuple[int, frozenset[int]]:
    """Peak temp bytes when temporaries are first placed in output buffers, as XLA's buffer
    assignment does before the heap: largest first, each into the smallest output buffer
    that holds it, is written only after the temporary is dead, and holds no other
    temporary at the same time (one at a time, at offset 0). What is left is the heap,
    whose peak over the program points is ``temp``. ``into``: results written over an
    operand's buffer (``written_over``), one span with it; ``scratch``: buffers the
    program does not name, ``(bytes, first node, last node)``.

    A combined all-reduce runs between the node after which it is scheduled and the next
    (program points are doubled, the all-reduce at the odd one between): the buffers that
    node read for the last time are freed before the all-reduce writes its results, so a
    weight gradient's reduced buffer is never live with its convolution's operands."""
    point = {i: 2 * p for p, i in enumerate(lv.order, start=1)}
    end = 2 * len(lv.order)
    outputs = set(graph.outputs)
    # A stacked buffer handed to the next iteration's update ends one point early.
    handed = handed_over(graph, lv, size_of)
    spans: list[tuple[int, int, int, int]] = []  # (bytes, first, last, var; -1: transient)
    mains: dict[int, int] = {}  # var → index of its own buffer's span
    for v in start:
        if size_of(v):
            last = point.get(lv.last_use.get(v, -1))
            spans.append((size_of(v), 0, end if last is None else last, v))
    reductions = reductions or {}
    for i in lv.order:
        p = point[i]
        for v in graph.nodes[i].outputs:
            size = size_of(v)
            red = reductions.get(v)
            if red is not None and red[0] in point:
                at, unreduced, result = red
                last = point.get(lv.last_use.get(v, -1))
                stays = v in outputs or last is None
                if v in outputs:
                    size = result = 0  # reduced into the output's own buffer
                # Read by the all-reduce, which runs just after ``at`` (an odd point).
                spans.append((unreduced, p, point[at] + 1, v))
                size = max(size, result)
                if size:
                    until = end if stays or last is None else max(last, point[at] + 1)
                    spans.append((size, point[at] + 1, until, v))
                continue
            if size:
                last = point.get(lv.last_use.get(v, -1))
                if v in outputs:
                    # An output's own buffer is counted apart; what it holds in temp (the
                    # layout it was computed in before moving into the output's, copies
                    # for its consumers) is freed after its last use.
                    until = p if last is None or v in brief else max(p, last)
                else:
                    until = end if last is None else max(p, last - 2 * (v in handed))
                mine = own(v) if own is not None else size
                if 0 < mine < size:  # its copies are buffers of their own
                    spans.append((size - mine, p, until, v))
                    size = mine
                    if v in lv.direct and v not in outputs:  # read in a convolution's copy
                        until = min(until, max(p, point.get(lv.direct[v], p)))
                host = into.get(v) if into else None
                while into and host is not None and host not in mains:
                    host = into.get(host)
                if host is not None:  # the same buffer as the operand it writes over
                    k = mains.pop(host)
                    a, first, last, b = spans[k]
                    spans[k] = (a, first, max(last, until), b)
                    mains[v] = k
                    continue
                mains[v] = len(spans)
                spans.append((size, 1 if v in lv.early else p, until, v))
        extra = transient(i)
        for piece in (extra,) if isinstance(extra, int) else extra:
            if piece:
                spans.append((piece, p, p, -1))
    for size, first, last in scratch:
        if size and first in point and last in point:
            spans.append((size, point[first], point[last], -1))

    def written(o: int) -> float:  # an all-reduced output is written by its all-reduce
        red = reductions.get(o)
        if red is not None and red[0] in point:
            return point[red[0]] + 1
        return point[graph.producer(o)]

    bins = sorted((size, written(o)) for o, size in slots.items() if graph.producer(o) in point)
    bin_sizes = [b[0] for b in bins]
    hosts = _Bins([b[1] for b in bins], end)
    heap: list[tuple[int, int, int, int]] = []
    for j in sorted(range(len(spans)), key=lambda j: (-spans[j][0], spans[j][1])):
        span = spans[j]
        size, first, last, _ = span
        if not hosts.place(bisect.bisect_left(bin_sizes, size), first, last, last):
            heap.append(span)
    delta = [0] * (end + 3)  # an all-reduce after the last node runs at end + 1
    for size, first, last, _ in heap:
        delta[first] += size
        delta[last + 1] -= size
    peak, now, at = 0, 0, 0
    for p in range(end + 2):
        now += delta[p]
        if now > peak:
            peak, at = now, p
    alive = frozenset(v for _, first, last, v in heap if v >= 0 and first <= at <= last)
    return peak, alive


class _Bins:
    """Output buffers that host temporaries (``_assigned``), first fit in bin order.

    A bin takes a temporary if it is written after the temporary's last read and none of
    the temporaries it hosts overlaps it in time. First fit over thousands of bins is
    quadratic when most bins are taken (a deep train step's activations all span the turn
    from forward to backward), so each bin's occupancy is also kept at up to 256 probe
    points, and per gap between two probes whether one hosted temporary covers it: a
    temporary skips, in a few array operations, every bin holding something at a probe
    inside its own span (or across the gap it lies in), and only the rest are checked
    exactly. The result is the plain first fit's."""

    PROBES = 256
    ROWS = 8  # probes consulted per temporary

    def __init__(self, written: Sequence[float], end: int):
        self.written = np.asarray(written, dtype=float)
        self.probes = np.unique(np.linspace(0, end, min(self.PROBES, end + 1)).round())
        self.at = np.tile(self.written, (len(self.probes), 1))  # -inf: taken at the probe
        self.across = np.tile(self.written, (len(self.probes), 1))  # gap after the probe
        self.starts: list[list[int]] = [[] for _ in written]
        self.ends: list[list[int]] = [[] for _ in written]

    def place(self, lo: int, first: int, last: int, read: float) -> bool:
        a = int(np.searchsorted(self.probes, first, "left"))
        b = int(np.searchsorted(self.probes, last, "right"))
        if a < b:
            rows = np.unique(np.linspace(a, b - 1, min(self.ROWS, b - a)).round().astype(int))
            free = self.at[rows, lo:].min(axis=0)
        else:  # between probes a - 1 and a
            free = self.across[a - 1, lo:]
        for k in np.flatnonzero(free > read):
            k = int(k) + lo
            at = bisect.bisect_right(self.starts[k], last)
            if at == 0 or self.ends[k][at - 1] < first:  # no hosted span overlaps
                self.starts[k].insert(at, first)
                self.ends[k].insert(at, last)
                self.at[a:b, k] = -math.inf
                self.across[a : b - 1, k] = -math.inf
                return True
        return False


def _steps(
    graph: OpGraph,
    lv: Liveness,
    size_of: Callable[[int], int],
    start: Sequence[int],
    transient: Transient,
):
    """Per program point (the start, then each node while it runs): ``(bytes held,
    buffers alive)``; the set is the walk's own, changed as the walk goes on."""
    outputs = set(graph.outputs)
    frees: dict[int, list[int]] = {}
    for v, i in lv.last_use.items():
        frees.setdefault(i, []).append(v)
    alive = {v for v in start if size_of(v)}
    temp = sum(size_of(v) for v in alive)
    yield temp, alive
    handed = handed_over(graph, lv, size_of)
    for i in lv.order:
        for v in graph.nodes[i].inputs:
            if v in handed and lv.last_use.get(v) == i and v in alive:
                alive.discard(v)
                temp -= size_of(v)
        for v in graph.nodes[i].outputs:
            size = size_of(v)
            if size:
                temp += size
                alive.add(v)
        yield temp + _total(transient(i)), alive
        for v in frees.get(i, ()):
            if v in alive and v not in outputs:
                alive.discard(v)
                temp -= size_of(v)


def _snapshots(
    graph: OpGraph,
    lv: Liveness,
    size_of: Callable[[int], int],
    start: Sequence[int],
    transient: Transient,
    points: set[int],
) -> dict[int, tuple[frozenset[int]]]:
    """At the given program points: (buffers alive,)."""
    out: dict[int, tuple[frozenset[int]]] = {}
    for p, (_, alive) in enumerate(_steps(graph, lv, size_of, start, transient)):
        if p in points:
            out[p] = (frozenset(alive),)
            if len(out) == len(points):
                break
    return out


def handed_over(graph: OpGraph, lv: Liveness, size_of: Callable[[int], int]) -> frozenset[int]:
    """Stacked buffers an unrolled scan's next ``scan_stack`` updates in place: the loop's
    ``ys`` buffer is one allocation written slice by slice (a dynamic-update-slice in the
    while loop's state), so a stack's version before an iteration and after it are never
    held together."""
    out: set[int] = set()
    for i in lv.order:
        node = graph.nodes[i]
        if node.primitive != "scan_stack" or len(node.inputs) != 2:
            continue
        u = node.inputs[0]
        if (
            lv.last_use.get(u) == i
            and u in lv.materialized
            and size_of(u) == size_of(node.outputs[0])
        ):
            out.add(u)
    return frozenset(out)


def _total(extra: int | tuple[int, ...]) -> int:
    return extra if isinstance(extra, int) else sum(extra)


def peak_points(
    graph: OpGraph,
    live: Sequence[bool],
    nbytes: Callable[[int], int],
    count: int = 8,
    lv: Liveness | None = None,
) -> list[frozenset[int]]:
    """The intermediates held at the ``count`` program points with the most bytes held
    (by ``nbytes``, e.g. replicated sizes): what linear memory constraints bound."""
    lv = lv or liveness(graph, live)
    keep = set(graph.inputs) | set(graph.outputs)
    frees: dict[int, list[int]] = {}
    for v, i in lv.last_use.items():
        frees.setdefault(i, []).append(v)
    held: set[int] = set()
    points: list[tuple[int, frozenset[int]]] = []
    total = 0
    for i in lv.order:
        for v in graph.nodes[i].outputs:
            if v in lv.materialized and v not in keep:
                held.add(v)
                total += nbytes(v)
        points.append((total, frozenset(held)))
        for v in frees.get(i, ()):
            if v in held:
                held.discard(v)
                total -= nbytes(v)
    points.sort(key=lambda p: -p[0])
    return [p[1] for p in points[:count]]


def moved(lv: Liveness, inputs: frozenset[int] | set[int], var: int, literal: bool) -> bool:
    """Whether an operation reading or writing ``var`` moves it through memory: arguments
    and materialised values do; fused values and literals stay in registers."""
    return not literal and (var in lv.materialized or var in inputs)


SLICING = frozenset("slice dynamic_slice gather".split())
UPDATING = frozenset("dynamic_update_slice scatter scatter-add scatter_add".split())
IN_PLACE = frozenset(("scan_slice", "scan_stack"))  # a scan's own indexing: no copies


def traffic(
    graph: OpGraph,
    lv: Liveness,
    args: frozenset[int],
    node: Node,
    in_bytes: Sequence[int],
    out_bytes: Sequence[int],
) -> int:
    """Bytes an operation moves through memory, given its operands' and results' per-device
    bytes: materialised operands read and results written; a slice reads only what it keeps
    (and usually fuses into its consumer), and an in-place update (``dynamic_update_slice``,
    a scan's stacked output) writes only the update. A scan reads its stacked operands and
    writes its stacked results in place: the unrolled ``scan_slice``/``scan_stack`` nodes
    move nothing themselves."""
    if node.primitive in IN_PLACE:
        return 0
    if node.primitive in SLICING:
        return sum(out_bytes)
    if node.primitive in UPDATING:
        return sum(in_bytes[1:])
    total = sum(
        b
        for v, b in zip(node.inputs, in_bytes, strict=True)
        if moved(lv, args, v, graph.literal[v] is not None)
    )
    total += sum(
        b for v, b in zip(node.outputs, out_bytes, strict=True) if moved(lv, args, v, False)
    )
    return total
