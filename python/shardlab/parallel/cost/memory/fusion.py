"""Which operations fuse, and which values XLA writes out all the same: the memory model's
op sets and its per-value predicates (``shardlab.parallel.cost.memory``).

* **Fusion.** An elementwise or indexing value (``add``, ``tanh``, ``broadcast_in_dim``, a
  convert, a slice, a pad …)
  whose consumers can all absorb it (elementwise ops, reductions, slices) is computed inside
  its consumers' loop and never written to memory. A value with several consumers is still
  fused when it is cheap to recompute; a transcendental one (``exp``, ``tanh``, ``log`` …)
  with several consumers is materialised once instead.

The op sets (``SHAPE_ONLY``, ``FUSIBLE``, ``ABSORBS``, ``EXPENSIVE``, ``SAME_ELEMENTS``,
``REGENERATED``), ``_outer`` (the algebraic simplifier) and ``_at_most_unary``
(``InstructionFusion``) are XLA's own rules. XLA:CPU's: the library reductions
(``FUSED_DEPTH``, ``LIBRARY_REDUCTION``, ``REDUCING``, ``LIBRARY_OPERANDS``, ``RESHAPES``,
``_unfusable_broadcasts``) and the convolution's one layout (``_convolution_copies``,
``_computed_in_copies``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from shardlab.parallel.graph.opgraph import Node, OpGraph
from shardlab.parallel.graph.rules import ELEMENTWISE, FREE

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


# Per variable, the values whose full-size copy of it XLA writes out: (value, the reduction
# operand that needs it, or -1 when the copy is always made).
Wide = tuple[tuple[int, int], ...]


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


# Operations whose result has its operands' elements (maybe in another order): fused into an
# elementwise consumer, they let it write over the buffer they read.
SAME_ELEMENTS = ELEMENTWISE | FREE | frozenset("reshape squeeze expand_dims transpose".split())


REGENERATED = frozenset(("broadcast_in_dim", "iota"))


def _regenerated(graph: OpGraph, v: int) -> bool:
    i = graph.producer(v)
    return i >= 0 and graph.nodes[i].primitive in REGENERATED
