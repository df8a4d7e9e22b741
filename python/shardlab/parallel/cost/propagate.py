"""Propagate a fully specified strategy through an ``OpGraph`` and list the collectives.

Each node's factors take their mesh axes from its operands (larger operands first; an axis is
given to one factor at most); operands that disagree are resharded to the chosen layout; a
sharded reduction factor leaves a partial sum that is all-reduced where it is first needed
(or reduce-scattered, when the backend forms reduce-scatters and the consumer shards the
result over the same axes). ``sharding_constraint`` equations and the ``constraints`` mapping
fix a variable's layout. This mirrors what XLA's SPMD partitioner does with a strategy whose
every intermediate is constrained; it does not search.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from shardlab.parallel.cost import layouts as L
from shardlab.parallel.cost.compilers import held_graph
from shardlab.parallel.cost.memory import Liveness, liveness, traffic
from shardlab.parallel.cost.profiles import DeviceProfile, wire_bytes
from shardlab.parallel.graph.opgraph import Node, OpGraph, live_nodes
from shardlab.parallel.graph.rules import ELEMENTWISE, OpRule, rule_for
from shardlab.parallel.records import Collective

# Linear, size-preserving ops a pending partial sum passes through unreduced.
PASS_PARTIAL = frozenset(
    "transpose reshape convert_element_type copy neg squeeze expand_dims".split()
)


@dataclasses.dataclass
class Propagation:
    """The result of propagating layouts through a graph.

    Attributes:
        layouts: per variable id, its layout (``None`` for dead variables).
        collectives: in program order.
        flops: per-device compute flops.
        warnings: notes (unknown primitives, loops without a known trip count).
        live: per node index, whether it contributes to an output.
        compute_time: per-device seconds of the operations, each ``profile.op_time`` of its
            flops and the bytes it moves through memory (roofline).
    """

    layouts: list[L.DimAxes | None]
    collectives: list[Collective]
    flops: float
    warnings: list[str]
    live: list[bool]
    # Per top-level node in program order: (node index, first collective, end collective,
    # per-device roofline seconds). Collectives a node needed (resharding its inputs, reducing partial
    # sums) fall in its span; those after the last node (output layouts) are not in any.
    spans: list[tuple[int, int, int, float]] = dataclasses.field(default_factory=list)
    # Per collective, the node it was emitted for: the producer of a partial sum being
    # reduced, else the consumer needing a resharded input (-1: an output's final layout).
    collective_nodes: list[int] = dataclasses.field(default_factory=list)
    compute_time: float = 0.0
    # Per variable, the other layouts it was resharded to (each a buffer of its own).
    copies: dict[int, set[L.DimAxes]] = dataclasses.field(default_factory=dict)
    # Per output resharded into its final layout (``layouts``), the layout it was computed in.
    computed: dict[int, L.DimAxes] = dataclasses.field(default_factory=dict)
    # Per reduction of a partial sum that linear operations carried on (a gradient scaled
    # before its update), the node that made the partial sum: the reduction can start once
    # it has computed (``overlap.py``); others start at ``collective_nodes``.
    ready_nodes: dict[int, int] = dataclasses.field(default_factory=dict)
    # The axes the layouts are over, with their sizes, where a mesh axis was split in two
    # for this propagation (``_sub_axes``): each part's name -> the axis. Empty: the mesh's.
    sizes: dict[str, int] = dataclasses.field(default_factory=dict)
    parents: dict[str, str] = dataclasses.field(default_factory=dict)

    def sizes_or(self, sizes: Mapping[str, int]) -> Mapping[str, int]:
        """The sizes of the axes ``layouts`` name: the mesh's ``sizes`` unless split."""
        return self.sizes or sizes

    def mesh_layouts(self, shapes: Sequence[Sequence[int]] | None = None) -> list[L.DimAxes | None]:
        """``layouts`` over the mesh's own axes (what a PartitionSpec can name): an axis
        whose parts split different dimensions is named on the first of them, where it
        divides that dimension (``shapes``: per variable), else on none."""
        if not self.parents:
            return self.layouts
        whole: dict[str, int] = {}
        for part, axis in self.parents.items():
            whole[axis] = whole.get(axis, 1) * self.sizes[part]
        out: list[L.DimAxes | None] = []
        for v, lay in enumerate(self.layouts):
            if lay is None:
                out.append(None)
                continue
            coarse = _coarse(lay, self.parents)
            if shapes is not None:
                dims = []
                for size, axes in zip(shapes[v], coarse, strict=False):
                    n = math.prod(whole.get(a, self.sizes.get(a, 1)) for a in axes)
                    dims.append(axes if n and size % n == 0 else ())
                coarse = tuple(dims)
            out.append(coarse)
        return out


SUMS = frozenset(("add", "add_any"))
"""Adds whose partial-sum operands a reassociating compiler all-reduces once (XLA's pass
matches the op to the all-reduce's reduction: an add for a sum; not a subtract)."""


class _Propagator:
    def __init__(self, graph: OpGraph, sizes: Mapping[str, int], profile: DeviceProfile):
        self.g = graph
        self.sizes = dict(sizes)
        self.profile = profile
        # A mesh axis split in two for this propagation (``_sub_axes``): each part's name ->
        # the axis; collectives are named by the mesh's own axes.
        self.parents: dict[str, str] = {}
        self.lay: list[L.DimAxes | None] = [None] * len(graph.shapes)
        self.partial: dict[int, tuple[str, ...]] = {}
        # var -> the node that made its partial sum (before linear ops carried it on): the
        # reduction can start once that node has computed (``overlap.py``)
        self.origin: dict[int, int] = {}
        self.ready_nodes: dict[int, int] = {}
        self.cache: dict[tuple[int, L.DimAxes], None] = {}
        self.out: list[Collective] = []
        self.flops = 0.0
        self.seconds = 0.0
        self.lv: Liveness | None = None
        self.args = frozenset(graph.inputs)
        self.warnings: list[str] = []
        self.node: Node | None = None
        self.count = 1
        self.spans: list[tuple[int, int, int, float]] = []
        self.collective_nodes: list[int] = []
        self.live: list[bool] = []
        # Layouts fixed on results (output shardings): the partitioner propagates them
        # back into the op computing the result.
        self.targets: dict[int, L.DimAxes] = {}
        self.fixed: Mapping[int, L.DimAxes] = {}  # output layouts fixed for this pass

    # -- emitting --------------------------------------------------------------------------
    def emit(self, kind: str, nbytes: int, group: int, axes: tuple[str, ...]) -> None:
        if group <= 1:
            return
        node = self.node
        self.collective_nodes.append(node.index if node else -1)
        self.out.append(
            Collective(
                kind=kind,
                bytes=int(nbytes),
                group_size=int(group),
                mesh_axes=self.mesh_axes(axes),
                wire_bytes=wire_bytes(kind, nbytes, group),
                op_name=node.primitive if node else "output",
                source=node.source if node else "",
                count=self.count,
            )
        )

    def mesh_axes(self, axes: tuple[str, ...]) -> tuple[str, ...]:
        """The mesh's own axes ``axes`` span (a split axis's parts named by the axis)."""
        names = {self.parents.get(a, a) for a in axes}
        order = dict.fromkeys(self.parents.get(a, a) for a in self.sizes)
        return tuple(a for a in order if a in names)

    def layout(self, var: int) -> L.DimAxes:
        got = self.lay[var]
        return got if got is not None else L.replicated(len(self.g.shapes[var]))

    def resolve_partial(self, var: int, target: L.DimAxes | None = None) -> None:
        axes = self.partial.pop(var, ())
        if not axes:
            return
        consumer, producer = self.node, self.g.producer(var)
        self.node = self.g.nodes[producer] if producer >= 0 else consumer
        first = len(self.collective_nodes)
        try:
            self._reduce_partial(var, axes, target)
        finally:
            self.node = consumer
        origin = self.origin.pop(var, -1)
        if origin >= 0 and origin != producer:
            for i in range(first, len(self.collective_nodes)):
                self.ready_nodes[i] = origin

    def _reduce_partial(self, var: int, axes: tuple[str, ...], target: L.DimAxes | None) -> None:
        dims = self.layout(var)
        nbytes = self.g.wire_nbytes(var)
        group = math.prod(self.sizes[a] for a in axes)
        full = L.local_bytes(nbytes, dims, self.sizes)
        scatter = tuple(a for a in axes if target and any(a in t for t in target))
        if scatter and self._slices_other_axes(dims, axes, target):
            # All-reduce then a dynamic slice that also splits over axes the sum was not
            # taken over (a ZeRO split over data × model of a gradient summed over data):
            # XLA's ReduceScatterCreator needs the slice's offsets to come from the reduced
            # group alone, so the all-reduce stays whole and each device slices.
            scatter = ()
        if scatter and self.profile.compiler.forms_reduce_scatter:
            rest = tuple(a for a in axes if a not in scatter)
            if rest:
                self.emit("all-reduce", full, math.prod(self.sizes[a] for a in rest), rest)
            n = math.prod(self.sizes[a] for a in scatter)
            self.emit("reduce-scatter", full // n, n, scatter)
            self.lay[var] = target
        elif scatter and self._split_elsewhere(var, axes, scatter, target):
            # No reduce-scatter (XLA:CPU): the consumer's split over reduced axes is
            # computed on the devices the value is replicated over instead (their slices
            # of it are free), the partial sums are all-reduced in those pieces, and a
            # collective-permute moves each piece to its device in the target layout.
            n = math.prod(self.sizes[a] for a in scatter)
            used = {a for d in dims for a in d}
            self.emit("all-reduce", full // n, group, axes)
            # the devices the pieces were computed on: the reduced and the replica axes
            moved = tuple(a for a in self.sizes if a in axes or a in scatter or a not in used)
            self.emit("collective-permute", full // n, 2, moved)
            assert target is not None
            self.lay[var] = target
        else:
            self.emit("all-reduce", full, group, axes)

    @staticmethod
    def _slices_other_axes(
        dims: L.DimAxes, axes: tuple[str, ...], target: L.DimAxes | None
    ) -> bool:
        """Whether ``target`` splits a dimension over a reduced axis and, beside it, over an
        axis the value was neither reduced over nor split over there already."""
        for d, t in zip(dims, target or (), strict=False):
            if any(a in axes for a in t) and any(a not in axes and a not in d for a in t):
                return True
        return False

    def _split_elsewhere(
        self,
        var: int,
        axes: tuple[str, ...],
        scatter: tuple[str, ...],
        target: L.DimAxes | None,
    ) -> bool:
        """Whether the partitioner computes a matmul's or convolution's partial sum that
        its consumer wants split over reduced axes (``scatter``) split as much over the
        value's replica axes (the dot handler's choice; a reduction is reduced whole):
        the target adds only the reduced axes to the value's layout, and the mesh axes the
        value is neither split nor reduced over hold a multiple of that many devices."""
        if target is None:
            return False
        origin = var  # the op that made the partial sum, through the ops it passed
        while (p := self.g.producer(origin)) >= 0 and self.g.nodes[p].primitive in PASS_PARTIAL:
            origin = self.g.nodes[p].inputs[0]
        p = self.g.producer(origin)
        if p < 0 or self.g.nodes[p].primitive not in ("dot_general", "conv_general_dilated"):
            return False  # a reduction: all-reduced whole, then sliced
        dims = self.layout(var)
        if len(target) != len(dims):
            return False
        for d, t in zip(dims, target, strict=True):
            if tuple(t[: len(d)]) != tuple(d) or any(a not in scatter for a in t[len(d) :]):
                return False
        used = {a for d in dims for a in d} | set(axes)
        free = math.prod(n for a, n in self.sizes.items() if a not in used)
        n = math.prod(self.sizes[a] for a in scatter)
        return n > 1 and free % n == 0

    def _source(self, var: int) -> int:
        """The value ``var`` is computed from by cheap unary elementwise ops (a scalar
        factor, a square, a cast) in the same layout: the partitioner reshards that value
        once and computes the cheap ops in the new layout, so two such values of one source
        (a gradient scaled, and squared, for Adam's moments) share one reshard."""
        while True:
            p = self.g.producer(var)
            if p < 0 or var in self.partial:
                return var
            node = self.g.nodes[p]
            if node.primitive not in ELEMENTWISE and node.primitive != "convert_element_type":
                return var
            big = [u for u in node.inputs if self.g.shapes[u]]
            if len(big) != 1 or len(node.outputs) != 1:
                return var
            (u,) = big
            if (
                self.g.shapes[u] != self.g.shapes[var]
                or self.layout(u) != self.layout(var)
                or self.partial.get(u)
                or self.g.nbytes(u) != self.g.nbytes(var)
            ):
                return var
            var = u

    def _broadcast_operand(self, var: int) -> int | None:
        """The operand of the ``broadcast_in_dim`` that computed ``var``, when smaller."""
        p = self.g.producer(var)
        if p < 0 or self.g.nodes[p].primitive != "broadcast_in_dim":
            return None
        (operand,) = self.g.nodes[p].inputs[:1]
        if not self.g.shapes[operand] or self.g.nbytes(operand) >= self.g.nbytes(var):
            return None
        return operand

    def reshard(self, var: int, target: L.DimAxes, *, shared: bool = True) -> None:
        """Make ``var`` available in layout ``target`` (a cached copy, like XLA's CSE).

        ``shared=False``: a copy for this consumer alone, as the partitioner makes for an
        operand an elementwise op broadcasts implicitly (size-1 dimensions expanded: each
        such op lowers to a broadcast of its own, resharded apart)."""
        self.resolve_partial(var, target)
        src = self.layout(var)
        if src != target and any(target) and any(src):
            root = self._source(var)
            if root != var:
                self.cache.setdefault((var, target), None)
                var = root
        if src == target or (shared and (var, target) in self.cache):
            return
        self.cache[(var, target)] = None
        if any(target) and (operand := self._broadcast_operand(var)) is not None:
            # A broadcast is computed in whatever split layout its consumer needs: the
            # partitioner reshards its (smaller) operand, as Shardy gives a conflicting axis
            # to the larger tensor (a BatchNorm backward's per-channel sums, not the
            # activations). One an op needs whole (a masked scatter's updates) is gathered.
            node = self.g.nodes[self.g.producer(var)]
            shape, out = self.g.shapes[operand], self.g.shapes[var]
            need = tuple(
                target[d] if shape[i] == out[d] else ()
                for i, d in enumerate(node.params["broadcast_dimensions"])
            )
            self.reshard(operand, need)
            return
        for kind, nbytes, group, axes in L.reshard(
            src, target, self.g.wire_nbytes(var), self.sizes
        ):
            self.emit(kind, nbytes, group, axes)

    # -- nodes -----------------------------------------------------------------------------
    def run(self, constraints: Mapping[int, L.DimAxes]) -> list[bool]:
        live = live_nodes(self.g)
        self.lv = liveness(self.g, live)
        self.fixed = constraints
        for node in self.g.nodes:
            if not live[node.index]:
                continue
            self.node = node
            first, seconds = len(self.out), self.seconds
            if node.primitive in ("sharding_constraint", "reshard"):
                self.constraint(node)
            elif node.primitive in ("scan", "while", "cond"):
                self.control_flow(node)
            else:
                self.generic(node)
            for v in node.outputs:
                if v in constraints:
                    target = constraints[v]
                    self.reshard(v, target)
                    self.lay[v] = target
            self.spans.append((node.index, first, len(self.out), self.seconds - seconds))
        return live

    def constraint(self, node: Node) -> None:
        (src,), (dst,) = node.inputs, node.outputs
        sharding = node.params.get("sharding", node.params.get("dst_sharding"))
        target = L.from_spec(sharding, len(self.g.shapes[dst]))
        self.reshard(src, target)
        self.lay[dst] = target

    def generic(self, node: Node) -> None:
        if node.primitive in ("split", "slice") and self.windowed(node):
            return
        if node.primitive == "concatenate" and self.concatenated(node):
            return
        rule = rule_for(node, self.g)
        if not rule.known:
            self.warnings.append(
                f"no sharding rule for primitive {node.primitive!r} ({node.source or 'unknown'})"
                ": treated as replicated in, replicated out"
            )
        passing = node.primitive in PASS_PARTIAL or (
            node.primitive in ("mul", "div")
            and sum(1 for v in node.inputs if self.partial.get(v)) == 1
            and all(self.partial.get(v) or not self.g.shapes[v] for v in node.inputs)
        )
        carried: tuple[str, ...] = ()
        origin = node.index
        if passing:
            source = next((v for v in node.inputs if self.partial.get(v)), -1)
            if source >= 0:
                carried = self.partial.pop(source)
                origin = self.origin.pop(source, self.g.producer(source))
        else:
            carried = self._summed_partials(node)
        self._fold_into_scatter(node)
        if not self.profile.compiler.forms_reduce_scatter:
            for v in node.inputs:
                self.resolve_partial(v)
        # Else each partial sum is reduced where it is resharded into this op's layout
        # below: one read split over its reduced axes is reduce-scattered (XLA's
        # ReduceScatterCreator turns the all-reduce and the dynamic slice into one).
        factor_axes = self.choose(node, rule)
        in_bytes, out_bytes = [], []
        in_lays, out_lays = [], []
        # the result shape an elementwise op broadcasts size-1 operand dimensions to
        expands = self.g.shapes[node.outputs[0]] if node.primitive in ELEMENTWISE else None
        for v, dims in zip(node.inputs, rule.operands, strict=True):
            need = L.from_factors(dims, factor_axes, rule.factor_sizes, self.sizes)
            in_lays.append(need)
            in_bytes.append(L.local_bytes(self.g.nbytes(v), need, self.sizes))
            if self.g.literal[v] is not None and not self.g.shapes[v]:
                continue
            self.reshard(v, need, shared=not (expands and self.g.shapes[v] != expands))
        for v, dims in zip(node.outputs, rule.results, strict=True):
            lay = L.from_factors(dims, factor_axes, rule.factor_sizes, self.sizes)
            self.lay[v] = lay
            out_lays.append(lay)
            out_bytes.append(L.local_bytes(self.g.nbytes(v), lay, self.sizes))
            part = tuple(a for f in sorted(rule.reduction) for a in factor_axes.get(f, ()))
            part = part + carried
            if part:
                self.partial[v] = part
                self.origin[v] = node.index if rule.reduction else origin
        used = math.prod(self.sizes[a] for axes in factor_axes.values() for a in axes)
        self.flops += rule.flops / used * self.count
        features = L.convolution_features(node, self.g.shapes, in_lays, out_lays, self.sizes)
        matmul = L.matmul_dims(node, self.g.shapes, in_lays, self.sizes)
        self.timed(node, rule.flops / used, in_bytes, out_bytes, features=features, matmul=matmul)

    def _summed_partials(self, node: Node) -> tuple[str, ...]:
        """XLA's ``AllReduceReassociate`` (GPU and TPU; ``Compiler.reassociates_partial_sums``):
        an add whose operands are all partial sums over the same axes, in one layout and of
        the result's shape, each read by this add alone, adds the partial sums and its
        result is all-reduced once where needed. Returns those axes (taken off the operands),
        or ``()``."""
        if node.primitive not in SUMS or not self.profile.compiler.reassociates_partial_sums:
            return ()
        ins = list(dict.fromkeys(node.inputs))
        parts = [self.partial.get(v) for v in ins]
        if len(ins) < 2 or not all(parts) or len({frozenset(p or ()) for p in parts}) != 1:
            return ()
        shape = self.g.shapes[node.outputs[0]]
        if any(self.g.shapes[v] != shape for v in ins) or len({self.layout(v) for v in ins}) != 1:
            return ()
        if any(len(self.g.consumers(v)) != 1 or v in self.g.outputs for v in ins):
            return ()
        for v in ins:
            self.partial.pop(v)
            self.origin.pop(v, None)
        return parts[0] or ()

    def _fold_into_scatter(self, node: Node) -> None:
        """``add(scatter-add(0, i, u), x)`` is ``scatter-add(x, i, u)`` to a compiler that
        folds it (XLA:GPU's and XLA:TPU's algebraic simplifier, before partitioning). Where
        the scatter's result is a partial sum (each device scattered its own updates), the
        partitioner needs the new operand ``x`` whole over the partial axes: it gathers
        ``x`` and keeps one copy's values (a select on the partition id), then reduces as
        before. An embedding's gradient added into momentum split ZeRO-style: one more
        gather of the table's size (``%loop_multiply_fusion.2 = f32[128,256]
        fusion(%param.44)`` all-gathered to ``f32[1024,256]`` before the scatter)."""
        if (
            node.primitive not in SUMS
            or len(node.inputs) != 2
            or not self.profile.compiler.folds_add_into_scatter
        ):
            return
        for p, x in (node.inputs, node.inputs[::-1]):
            i = self.g.producer(p)
            if i < 0 or self.g.nodes[i].primitive not in PULLED_DIRECTLY:
                continue
            scatter = self.g.nodes[i]
            if not self._zeros(scatter.inputs[0]) or self.partial.get(x):
                continue
            if self.g.shapes[x] != self.g.shapes[p]:
                continue
            # The scatter's partial sums: pending here, or reduced into its result already
            # (a result pulled to a split layout with the updates left split).
            axes = set(self.partial.get(p, ()))
            if not _masked_scatter_chosen(self.g, self, scatter, self.layout(p), self.sizes):
                axes |= {a for d in self.layout(scatter.inputs[2]) for a in d}
            lay = self.layout(x)
            whole = tuple(tuple(a for a in d if a not in axes) for d in lay)
            if whole != lay:
                self.reshard(x, whole)
            return

    def _zeros(self, v: int) -> bool:
        """A literal zero, or a broadcast of one."""
        i = self.g.producer(v)
        if i >= 0 and self.g.nodes[i].primitive == "broadcast_in_dim":
            v = self.g.nodes[i].inputs[0]
        value = self.g.literal[v]
        return value is not None and not np.any(np.asarray(value))

    def timed(
        self,
        node: Node,
        flops: float,
        in_bytes: list[int],
        out_bytes: list[int],
        *,
        features: tuple[int, int] | None = None,
        matmul: tuple[int, int, int, int] | None = None,
    ) -> None:
        """Add the node's roofline seconds (per-device flops, bytes it moves through memory;
        ``features``: a convolution's per-device input and output features; ``matmul``: a
        matrix multiply's per-device ``(batch, m, n, k)``)."""
        assert self.lv is not None
        nbytes = traffic(self.g, self.lv, self.args, node, in_bytes, out_bytes)
        seconds = self.profile.op_time(flops, nbytes, features=features, matmul=matmul)
        self.seconds += seconds * self.count

    def _pieces(self, node: Node) -> tuple[int, list[tuple[int, int, int]]] | None:
        """A split's or unit-stride slice's sliced dimension and its pieces ``(result,
        start, length)``, when the operand is split along that dimension (and no other
        sliced one)."""
        shape = self.g.shapes[node.inputs[0]]
        dims = self.layout(node.inputs[0])
        if node.primitive == "split":
            axis = node.params["axis"] % len(shape)
            starts = [0]
            for n in node.params["sizes"][:-1]:
                starts.append(starts[-1] + n)
            pieces = list(zip(node.outputs, starts, node.params["sizes"], strict=True))
            return (axis, pieces) if dims[axis] else None
        if any(s != 1 for s in node.params.get("strides") or ()):
            return None
        cut = [
            d
            for d, (a, b) in enumerate(
                zip(node.params["start_indices"], node.params["limit_indices"], strict=True)
            )
            if a != 0 or b != shape[d]
        ]
        split = [d for d in cut if dims[d]]
        if len(split) != 1:
            return None
        (axis,) = split
        start = node.params["start_indices"][axis]
        return axis, [(node.outputs[0], start, node.params["limit_indices"][axis] - start)]

    def windowed(self, node: Node) -> bool:
        """A split or slice along a dimension its operand is split over: the result stays
        split that way, each shard's piece fetched by the partitioner's halo exchange
        (collective-permutes, ``layouts.slice_halos``), not by gathering the operand: a
        fused qkv projection split into q, k and v, RoPE's halves. ``False`` where the
        partitioner gathers instead (the op's rule does that)."""
        v = node.inputs[0]
        self.resolve_partial(v)
        found = self._pieces(node)
        if found is None:
            return False
        axis, pieces = found
        dims = self.layout(v)
        size = self.g.shapes[v][axis]
        shards = math.prod(self.sizes[a] for a in dims[axis])
        halos = [L.slice_halos(size, shards, start, length) for _, start, length in pieces]
        if any(h is None for h in halos):
            return False
        local = L.local_bytes(self.g.nbytes(v), dims, self.sizes)
        per_column = local // (size // shards)
        for widths in halos:
            for width in widths or ():
                self.emit("collective-permute", width * per_column, 2, dims[axis])
        out_bytes = []
        for out, _, _ in pieces:
            self.lay[out] = dims
            out_bytes.append(L.local_bytes(self.g.nbytes(out), dims, self.sizes))
        self.timed(node, 0.0, [local], out_bytes)
        return True

    def concatenated(self, node: Node) -> bool:
        """A concatenation along a dimension its operands are split over: the partitioner
        moves that split to the first other dimension it divides (all-to-alls), joins the
        pieces locally and moves the result's split back (one more all-to-all): the
        backward of a fused qkv split. ``False`` where no dimension takes it (the op's
        rule gathers)."""
        axis = node.params["dimension"]
        for v in node.inputs:
            self.resolve_partial(v)
        split = [v for v in node.inputs if self.layout(v)[axis]]
        if not split:
            return False
        base = self.layout(max(split, key=self.g.nbytes))
        moved = base[axis]
        shards = math.prod(self.sizes[a] for a in moved)
        (out,) = node.outputs
        shape = self.g.shapes[out]
        target = None
        for d, n in enumerate(shape):
            held = math.prod(self.sizes[a] for a in base[d])
            if d != axis and n % held == 0 and (n // held) % shards == 0:
                target = tuple(
                    () if k == axis else (*axes, *moved) if k == d else axes
                    for k, axes in enumerate(base)
                )
                break
        if target is None:
            return False
        for v in node.inputs:
            self.reshard(v, target)
        self.lay[out] = target
        in_bytes = [L.local_bytes(self.g.nbytes(v), target, self.sizes) for v in node.inputs]
        out_bytes = [L.local_bytes(self.g.nbytes(out), target, self.sizes)]
        self.timed(node, 0.0, in_bytes, out_bytes)
        # The result takes its operands' split again (the concatenation's own sharding).
        for kind, nbytes, group, axes in L.reshard(
            target, base, self.g.wire_nbytes(out), self.sizes
        ):
            self.emit(kind, nbytes, group, axes)
        self.lay[out] = base
        return True

    def choose(self, node: Node, rule: OpRule) -> dict[int, tuple[str, ...]]:
        def rank(i: int) -> tuple[int, int, int, int]:
            v = node.inputs[i]
            # Of equal-sized operands of an elementwise op, one already in the layout fixed
            # on the result (an output sharding, propagated back) leads; then the most
            # finely split (as XLA's propagation takes the most specific operand sharding):
            # slicing the others is free, gathering it is not.
            split = L.shard_count(self.layout(v), self.sizes) if elementwise else 1
            fits = 0 if wanted is not None and self.layout(v) == wanted else 1
            return (-self.g.nbytes(v), fits, -split, i)

        elementwise = node.primitive in ELEMENTWISE
        wanted = None
        if elementwise and len(node.outputs) == 1:
            wanted = self.targets.get(node.outputs[0])
        order = sorted(range(len(node.inputs)), key=rank)
        chosen: dict[int, tuple[str, ...]] = {}
        used: set[str] = set()
        proposals = [
            L.to_factors(
                self.layout(node.inputs[i]), rule.operands[i], rule.factor_sizes, self.sizes
            )
            for i in order
        ]
        # As XLA's sharding propagation: a result takes the axes of operand dimensions that
        # reach it first; a contracted (reduced) dimension keeps an axis only when no
        # result dimension took it (else that operand is resharded, e.g. a ZeRO weight
        # sharded on its contracted dim is gathered, not contracted into partial sums).
        for reduced in (False, True):
            for proposal in proposals:
                for factor, axes in proposal.items():
                    if (factor in rule.reduction) != reduced:
                        continue
                    if factor in chosen or factor in rule.replicated or used & set(axes):
                        continue
                    chosen[factor] = axes
                    used.update(axes)
        # A result fixed to a layout (a pulled-back or planned constraint) that splits a
        # dimension no operand split: XLA computes only the slice, slicing the replicated
        # operands for free (an expert's share of a dot with a replicated weight), where
        # computing it whole and slicing the result would do the work of every device.
        # Cheap ops (``PULLED``) are split by pulling the layout back into their inputs; a
        # broadcast or an iota makes the dimensions its operand lacks, so it is computed
        # in the fixed split directly (a scatter's zeros, made where each shard lives).
        fixed = self.fixed.get(node.outputs[0]) if len(node.outputs) == 1 else None
        if fixed is not None and (node.primitive not in PULLED or node.primitive in CREATED):
            wanted_factors = L.to_factors(fixed, rule.results[0], rule.factor_sizes, self.sizes)
            for factor, axes in wanted_factors.items():
                taken = factor in chosen or used & set(axes)
                if taken or factor in rule.replicated or factor in rule.reduction:
                    continue
                chosen[factor] = axes
                used.update(axes)
        return chosen

    def control_flow(self, node: Node) -> None:
        for v in node.inputs:
            self.resolve_partial(v)
        if node.primitive == "scan":
            body = node.subgraphs[0]
            n_consts, n_carry = node.params["num_consts"], node.params["num_carry"]
            length = int(node.params["length"])
            ins = []
            for k, v in enumerate(node.inputs):
                dims = self.layout(v)
                if k >= n_consts + n_carry:  # xs: the scanned leading dim is not split
                    if dims and dims[0]:
                        self.reshard(v, ((), *dims[1:]))
                    dims = dims[1:]
                ins.append(dims)
            sub = self._scan_body(node, body, ins, n_consts, n_carry, length)
            for k, v in enumerate(node.outputs):
                dims = sub.layout(body.outputs[k])
                self.lay[v] = dims if k < n_carry else ((), *dims)
            return
        if node.primitive == "while":
            self.warnings.append(
                f"while loop at {node.source or 'unknown'}: trip count unknown, body costed once"
            )
            body = node.subgraphs[-1]
            nc = node.params.get("body_nconsts", 0)
            cc = node.params.get("cond_nconsts", 0)
            ins = [self.layout(v) for v in node.inputs[cc:]]
            sub = self.nested(body, ins[: nc + len(body.outputs)], 1)
            for k, v in enumerate(node.outputs):
                self.lay[v] = sub.layout(body.outputs[k])
            return
        branches = node.subgraphs  # cond: cost the most communicating branch
        ins = [self.layout(v) for v in node.inputs[1:]]
        subs = [self.nested(b, ins, 1, record=False) for b in branches]
        best = max(range(len(subs)), key=lambda k: sum(c.wire_bytes for c in subs[k].out))
        self.collective_nodes.extend([node.index] * len(subs[best].out))
        self.out.extend(subs[best].out)
        self.flops += max(s.flops for s in subs)
        self.seconds += max(s.seconds for s in subs)
        for k, v in enumerate(node.outputs):
            self.lay[v] = subs[best].layout(branches[best].outputs[k])

    def _scan_body(
        self,
        node: Node,
        body: OpGraph,
        ins: list[L.DimAxes],
        n_consts: int,
        n_carry: int,
        length: int,
    ) -> _Propagator:
        """A scan's body, its carry in one layout on every trip, as XLA's loop has one
        sharding per carried value. Where the body returns a carry in another layout than
        it came in, the carry is kept either as it came (each trip ends resharding it back:
        free where that is a slice, as a row-parallel weight's summed result sliced back to
        the split it came in) or, where a trip started in the returned layout returns it
        unchanged, as the body returns it (the initial value resharded once before the
        loop, each trip resharding what it needs inside: an RNN's hidden state split by a
        column-parallel weight, gathered every trip) — whichever communicates less."""
        carry = slice(n_consts, n_consts + n_carry)
        first = self._run_body(body, ins, length)
        outs = [first.layout(body.outputs[k]) for k in range(n_carry)]
        if outs == ins[carry]:
            self._record(first)
            return first
        # Kept as it came: each trip reshards its carry back (free where that slices).
        back = {k: d for k, d in enumerate(ins[carry]) if outs[k] != d}
        sub = self._run_body(body, ins, length, carry_back=back)
        moved = [*ins[:n_consts], *outs, *ins[n_consts + n_carry :]]
        second = self._run_body(body, moved, length)
        if [second.layout(body.outputs[k]) for k in range(n_carry)] == outs:
            # Kept as the body returns it: the initial value is resharded once.
            entry = sum(
                self.profile.collective_time(
                    kind, wire_bytes(kind, nbytes, group), group, self.mesh_axes(axes)
                )
                for v, dims in zip(node.inputs[carry], outs, strict=True)
                for kind, nbytes, group, axes in L.reshard(
                    self.layout(v), dims, self.g.wire_nbytes(v), self.sizes
                )
                if group > 1
            )
            if entry + _comm_seconds(second) < _comm_seconds(sub):
                for v, dims in zip(node.inputs[carry], outs, strict=True):
                    self.reshard(v, dims)
                sub = second
        self._record(sub)
        return sub

    def nested(
        self, body: OpGraph, ins: list[L.DimAxes], count: int, *, record: bool = True
    ) -> _Propagator:
        sub = self._run_body(body, ins, count)
        if record:
            self._record(sub)
        else:
            self.warnings.extend(sub.warnings)
        return sub

    def _run_body(
        self,
        body: OpGraph,
        ins: list[L.DimAxes],
        count: int,
        carry_back: Mapping[int, L.DimAxes] | None = None,
    ) -> _Propagator:
        """A nested body propagated from ``ins``, run ``count`` times per run of this one;
        ``carry_back``: results resharded at its end (by output position)."""
        held = held_graph(body, self.profile.compiler, entry=False)
        sub = _Propagator(held, self.sizes, self.profile)
        sub.parents = self.parents
        sub.count = self.count * count
        for v, dims in zip(body.inputs, ins, strict=False):
            sub.lay[v] = dims
        sub.run({})
        for v in body.outputs:
            sub.node = None
            sub.resolve_partial(v)
        for k, dims in (carry_back or {}).items():
            sub.node = None
            v = body.outputs[k]
            sub.reshard(v, dims)
            sub.lay[v] = dims
        return sub

    def _record(self, sub: _Propagator) -> None:
        """Adds a nested body's collectives, flops and seconds to this propagation."""
        self.collective_nodes.extend([self.node.index if self.node else -1] * len(sub.out))
        self.out.extend(sub.out)
        self.flops += sub.flops
        self.seconds += sub.seconds
        self.warnings.extend(sub.warnings)


def _comm_seconds(p: _Propagator) -> float:
    return sum(p.profile.time_of(c) for c in p.out)


def _forward(
    graph: OpGraph,
    input_layouts: list[L.DimAxes],
    sizes: Mapping[str, int],
    profile: DeviceProfile,
    constraints: Mapping[int, L.DimAxes],
    output_layouts: list[L.DimAxes | None] | None = None,
    parents: Mapping[str, str] | None = None,
) -> _Propagator:
    p = _Propagator(graph, sizes, profile)
    p.parents = dict(parents or {})
    for v, target in zip(graph.outputs, output_layouts or (), strict=False):
        if target is not None and graph.producer(v) >= 0:
            p.targets.setdefault(v, target)
    for v, dims in zip(graph.inputs, input_layouts, strict=True):
        p.lay[v] = dims
    for v, value in enumerate(graph.literal):
        if value is not None and p.lay[v] is None:
            p.lay[v] = L.replicated(len(np.shape(value)))
    p.live = p.run(constraints)
    return p


# Ops that make dimensions out of nothing: computed in whatever split is fixed on them.
CREATED = frozenset(("broadcast_in_dim", "iota"))
# Cheap ops a consumer's layout is pulled back through (they are computed wherever needed).
PULLED = ELEMENTWISE | frozenset(
    "broadcast_in_dim reshape squeeze expand_dims transpose convert_element_type iota "
    "reduce_sum reduce_max reduce_min select_n scan_stack".split()
)
# Pulled only when their own result is resharded: a scatter-add (an embedding's gradient)
# sliced straight into its ZeRO update is scattered masked into the slice, the updates
# gathered, where XLA's partitioner finds that cheaper (``_masked_scatter_chosen``); one
# summed with another partial sum first (a tied embedding's two gradients) is all-reduced
# whole with it.
PULLED_DIRECTLY = frozenset(("scatter-add", "scatter_add"))


def _masked_scatter_chosen(
    graph: OpGraph, p: _Propagator, node: Node, lay: L.DimAxes, sizes: Mapping[str, int]
) -> bool:
    """Whether XLA's SPMD partitioner scatters masked into ``lay``'s slices (updates and
    indices gathered whole) rather than into a whole operand per device (updates kept split,
    the result a partial sum then reduced).

    The partitioner dry-runs each scatter method and takes the one of least (peak memory,
    communication), memory first (``ScatterPartitionMethodsOrderedByCost`` over
    ``EvaluatePartitionCost`` in XLA's ``spmd/gather_scatter_handler.cc``): a scatter's
    memory is its operand, indices, updates and result as each device holds them. Masked:
    ``2·O/n + U + I``; partial: ``2·O + U/u + I/i`` (``n``: the result's shards; ``u``,
    ``i``: the updates' and indices' shards now). An embedding's gradient with few looked-up
    rows is scattered masked; one with more rows' updates than table (a GPT's 4,096 tokens
    into 1,024 words) is reduced whole."""
    operand, indices, updates = node.inputs[0], node.inputs[1], node.inputs[2]

    o, i, u = graph.nbytes(operand), graph.nbytes(indices), graph.nbytes(updates)
    masked = (2 * o / L.shard_count(lay, sizes) + u + i, u + i)
    partial = (
        2 * o
        + u / L.shard_count(p.layout(updates), sizes)
        + i / L.shard_count(p.layout(indices), sizes),
        o,
    )
    return masked <= partial


def _pull_back(
    graph: OpGraph, p: _Propagator, sizes: Mapping[str, int], fixed: Mapping[int, L.DimAxes]
) -> dict[int, L.DimAxes]:
    """Layouts XLA's propagation gives values computed from replicated data only (after a
    gather for an op that needs whole dimensions, e.g. ``top_k``): a consumer that slices
    such a value to a split layout makes XLA compute it split, and its replicated inputs
    too, back through cheap ops (a replicated sharding is the least specific, so the
    users' wins). A reduction over a dimension split that way then leaves partial sums:
    a load-balancing count over routed tokens is all-reduced, as compiled.

    A scan's stacked result read in a more split layout (a layer scan's stacked weight
    gradients, taken by an optimizer update split ZeRO-style) is held that way: XLA writes
    each iteration's slice split, and the partial sums it stacks are reduce-scattered."""

    def refined(v: int, target: L.DimAxes) -> bool:
        """``target`` splits ``v`` further than its layout, and ``v`` is free to take it."""
        if graph.producer(v) < 0 or v in fixed:
            return False
        now = p.layout(v)
        return now != target and all(
            tuple(t[: len(n)]) == tuple(n) for n, t in zip(now, target, strict=True)
        )

    def replicated(v: int) -> bool:
        return not any(p.layout(v)) and graph.producer(v) >= 0 and v not in fixed

    want: dict[int, L.DimAxes] = {}
    for var, target in p.cache:
        if var in want or not any(target):
            continue
        i = graph.producer(var)
        stacked = i >= 0 and graph.nodes[i].primitive == "scan_stack"
        if replicated(var) or (stacked and refined(var, target)):
            want[var] = target
    if not want:
        return {}
    out: dict[int, L.DimAxes] = {}
    stack = list(want.items())
    while stack:
        v, lay = stack.pop()
        if v in out:
            continue
        out[v] = lay
        node = graph.nodes[graph.producer(v)]
        direct = (
            node.primitive in PULLED_DIRECTLY
            and want.get(v) == lay
            and _masked_scatter_chosen(graph, p, node, lay, sizes)
        )
        if (node.primitive not in PULLED and not direct) or len(node.outputs) != 1:
            continue
        rule = rule_for(node, graph)
        if not rule.known:
            continue
        factor_axes = L.to_factors(lay, rule.results[0], rule.factor_sizes, sizes)
        factor_axes = {f: a for f, a in factor_axes.items() if f not in rule.replicated}
        for u, dims in zip(node.inputs, rule.operands, strict=True):
            if not graph.shapes[u] or u in out:
                continue
            need = L.from_factors(dims, factor_axes, rule.factor_sizes, sizes)
            if any(need) and refined(u, need):
                stack.append((u, need))
    return out


def propagate(
    graph: OpGraph,
    input_layouts: list[L.DimAxes],
    sizes: Mapping[str, int],
    profile: DeviceProfile,
    *,
    constraints: Mapping[int, L.DimAxes] | None = None,
    output_layouts: list[L.DimAxes | None] | None = None,
) -> Propagation:
    """Propagate ``input_layouts`` (one per graph input) through ``graph``.

    Args:
        graph: the op graph.
        input_layouts: per graph input, its layout.
        sizes: ``{axis: size}`` of the mesh.
        profile: the device profile; its compiler (``compilers.py``) decides the bytes each
            value is computed and moved in, and reduce-scatter vs all-reduce + slice.
        constraints: ``{variable id: layout}`` for intermediates.
        output_layouts: per graph output, the layout it must end in (``None``: as computed).
    """
    graph = held_graph(graph, profile.compiler)
    split = _sub_axes(graph, sizes)
    if split:
        parts = {a: (f"{a}#0", f"{a}#1") for a in split}
        parents = {x: a for a, pair in parts.items() for x in pair}
        sizes = {
            n: k
            for a, size in sizes.items()
            for n, k in (zip(parts[a], split[a], strict=True) if a in split else [(a, size)])
        }

        def fine(lay: L.DimAxes) -> L.DimAxes:
            return tuple(tuple(x for a in axes for x in parts.get(a, (a,))) for axes in lay)

        input_layouts = [fine(lay) for lay in input_layouts]
        constraints = {v: fine(lay) for v, lay in (constraints or {}).items()}
        if output_layouts is not None:
            output_layouts = [None if lay is None else fine(lay) for lay in output_layouts]
    else:
        parents = {}
    fixed = dict(constraints or {})
    p = _forward(graph, input_layouts, sizes, profile, fixed, output_layouts, parents)
    pulled = _pull_back(graph, p, sizes, fixed)
    if pulled:
        p = _forward(
            graph, input_layouts, sizes, profile, {**pulled, **fixed}, output_layouts, parents
        )
    live = p.live
    p.node = None
    targets = output_layouts or [None] * len(graph.outputs)
    computed: dict[int, L.DimAxes] = {}  # output -> the layout it was computed in
    for v, target in zip(graph.outputs, targets, strict=True):
        if target is not None:
            if v not in computed and p.layout(v) != target:
                computed[v] = p.layout(v)
            p.reshard(v, target)
            p.lay[v] = target
        else:
            p.resolve_partial(v)
    copies: dict[int, set[L.DimAxes]] = {}
    for var, target in p.cache:
        # An output resharded into its final layout: that copy is the output buffer, and the
        # buffer it was computed in is the one held in temp.
        lay = computed.get(var, target) if target == p.lay[var] else target
        copies.setdefault(var, set()).add(lay)
    return Propagation(
        p.lay,
        p.out,
        p.flops,
        p.warnings,
        live,
        p.spans,
        p.collective_nodes,
        p.seconds,
        copies,
        computed,
        p.ready_nodes,
        dict(sizes) if parents else {},
        parents,
    )


def _sub_axes(graph: OpGraph, sizes: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """Mesh axes the partitioner splits across a reshape's output dimensions: a dimension
    split ``n`` ways and reshaped into ``(a, b, …)`` with ``n`` not dividing ``a`` but
    ``g = gcd(n, a) > 1`` doing, and ``n / g`` dividing the rest, keeps its tiles where they
    are, ``a`` split ``g`` ways and ``b`` the other ``n / g`` (GSPMD's tile assignment of
    ``[…, g, n/g]``). Megatron attention with fewer heads than tensor-parallel devices
    (4 heads on 8): each head split over 2 devices' halves of its width, the scores
    partial sums all-reduced in pairs (``replica_groups=[4,2]<=[8]``), not the
    projections gathered. Per such axis, its ``(major, minor)`` part sizes; the
    propagation runs over the parts (a layout's axis becomes both, major first)."""
    out: dict[str, tuple[int, int]] = {}
    for node in graph.nodes:
        if node.primitive != "reshape" or not node.inputs:
            continue
        rule = rule_for(node, graph)
        if not rule.known:
            continue
        for factors in rule.operands[0]:
            if len(factors) < 2:
                continue
            major = rule.factor_sizes[factors[0]]
            rest = math.prod(rule.factor_sizes[f] for f in factors[1:])
            for a, n in sizes.items():
                g = math.gcd(n, major)
                if a not in out and 1 < g < n and rest % (n // g) == 0:
                    out[a] = (g, n // g)
    return out


def _coarse(lay: L.DimAxes, parents: Mapping[str, str]) -> L.DimAxes:
    """A layout over split axes' parts as the mesh's own axes: both parts of an axis on one
    dimension, major then minor, are the axis there; a part alone (a head split on one
    dimension, its width on another) is named as the axis on the first dimension it
    splits (a PartitionSpec cannot name a part)."""
    placed: set[str] = set()
    out = []
    for axes in lay:
        dim: list[str] = []
        for a in axes:
            name = parents.get(a, a)
            if name not in placed:
                placed.add(name)
                dim.append(name)
        out.append(tuple(dim))
    return tuple(out)
