"""Per-device memory of a strategy, assembled: ``device_memory`` and its figures.

The model walks the program order once: ``temp`` is the peak of live materialised
intermediates (plus any copy in another layout a consumer needs, e.g. a gathered
parameter; a broadcast or iota is regenerated in each layout instead) that do not fit in
the outputs not yet computed, ``peak = arguments + outputs + temp``.

``all_reduce_spans`` follows XLA's all-reduce combiner (``combine``); ``held_at_peak`` is
the cut linear memory constraints take. XLA:CPU's: the scratch of an expanded max pool's
gradient (``_selection_scratch``, ``expansion_scratch``), the library reductions in
``_parts``, and a reduce-scatter compiled as an all-reduce and a slice
(``all_reduce_spans``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence

from shardlab.parallel.cost.combine import all_reduce_groups, loop_of
from shardlab.parallel.cost.memory.assign import Reductions, Transient, _assigned, _walk
from shardlab.parallel.cost.memory.fusion import (
    ABSORBS,
    FUSIBLE,
    LIBRARY_REDUCTION,
    _regenerated,
)
from shardlab.parallel.cost.memory.live_ranges import Liveness, liveness
from shardlab.parallel.cost.memory.sharing import in_output_buffers, written_over
from shardlab.parallel.graph.opgraph import OpGraph
from shardlab.parallel.records import Collective, DeviceMemoryEstimate


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
    dot_operands: bool = False,
    library: bool = True,
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
        dot_operands: the backend computes elementwise producers (and a dot read only
            through them) inside the dots that read them (XLA:TPU).
        library: XLA:CPU's library reductions and one convolution layout, with the
            buffers they need written out (``fusion``); not on GPU or TPU.
        selections: the backend expands max pooling's gradient (XLA:CPU): its operand is
            read where it is computed, its windows' indices wait for the scatter.
    """
    lv = lv or liveness(
        graph,
        live,
        materialize=reductions or (),
        copies=True,
        selections=selections,
        dot_operands=dot_operands,
        library=library,
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
