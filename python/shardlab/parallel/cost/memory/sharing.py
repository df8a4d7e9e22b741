"""Buffers that share one allocation: XLA's in-place rules
(``HloDataflowAnalysis::CanShareOperandBufferWithUser``), common to its backends.

* **In an output's buffer.** A value read for the last time by the elementwise op (or
  scatter, dynamic-update-slice) that makes an output of the same size is computed in that
  output's buffer from the start: a train step's gradients, combined into the new optimizer
  state, take no temp (``in_output_buffers``).
* **Over an operand's buffer.** An elementwise result is written over an operand buffer of
  the same shape that dies there (``written_over``).

``_Reads`` finds the buffers an elementwise fusion reads through its fused values.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from shardlab.parallel.cost.memory.fusion import FUSIBLE, SAME_ELEMENTS
from shardlab.parallel.cost.memory.live_ranges import Liveness
from shardlab.parallel.graph.opgraph import Node, OpGraph
from shardlab.parallel.graph.rules import ELEMENTWISE, FREE


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
