"""``shardlab.predict``: what the cost model expects for a fully specified strategy.

Nothing is compiled: the function is traced to an ``OpGraph``, the given shardings are
propagated with the per-primitive rules (``propagate.py``), and the collectives that need are
costed with the alpha-beta model (``profiles.py``) in the same units as ``Report``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from shardlab.parallel.arguments import eval_shape
from shardlab.parallel.cost import layouts as L
from shardlab.parallel.cost.combine import combine_all_reduces
from shardlab.parallel.cost.compilers import held_graph
from shardlab.parallel.cost.memory import all_reduce_spans, device_memory
from shardlab.parallel.cost.overlap import run_streams
from shardlab.parallel.cost.profiles import DeviceProfile, resolve_profile
from shardlab.parallel.cost.propagate import Propagation, propagate
from shardlab.parallel.graph.opgraph import Node, OpGraph
from shardlab.parallel.graph.trace import Traced, trace
from shardlab.parallel.mesh import mesh_shape_of
from shardlab.parallel.records import CostBreakdown
from shardlab.parallel.specs import check_spec, resolve_shardings

Constraints = Mapping[int, Any] | Callable[[Node], Any] | None


def _constraint_layouts(
    graph: OpGraph, constraints: Constraints, mesh: Mesh
) -> dict[int, L.DimAxes]:
    if constraints is None:
        return {}
    out: dict[int, L.DimAxes] = {}
    items = (
        ((n, constraints(n)) for n in graph.nodes)
        if callable(constraints)
        else ((graph.nodes[i], s) for i, s in constraints.items())
    )
    for node, spec in items:
        if spec is None:
            continue
        if isinstance(spec, NamedSharding):
            spec = spec.spec
        var = node.outputs[0]
        shape = graph.shapes[var]
        assert isinstance(spec, PartitionSpec)
        check_spec(spec, shape, mesh, where=f"constraints[{node.index}] ({node.primitive})")
        out[var] = L.from_spec(spec, len(shape))
    return out


def _gathered_inside(shape: Sequence[int], was: L.DimAxes, now: L.DimAxes) -> bool:
    """An output moved from layout ``was`` to ``now`` is gathered along a dimension after
    one of size > 1: XLA:CPU gathers along the major dimension and copies the result into
    row-major order, a buffer of the output's size while it moves (measured: gathering an
    f32[8,64,32] output over dimension 1 or 2 takes 64 KiB of temp, over dimension 0
    none)."""
    if len(now) != len(was):
        return False
    for d, (a, b) in enumerate(zip(was, now, strict=True)):
        if set(a) - set(b) and any(n > 1 for n in shape[:d]):
            return True
    return False


def memory_estimate(
    graph: OpGraph,
    prop: Propagation,
    sizes: Mapping[str, int],
    profile: DeviceProfile | None = None,
    overrides: Mapping[int, int] | None = None,
):
    """Per-device arguments, outputs and temp (``memory_model.device_memory``), and peak;
    ``profile`` says which operations the backend expands with scratch buffers;
    ``overrides``: per variable, its per-device bytes instead of its layout's (a remat
    policy's dropped residual stacks take none, ``cost/remat.py``)."""
    overrides = overrides or {}
    sizes = prop.sizes_or(sizes)
    if profile is not None:
        graph = held_graph(graph, profile.compiler)

    def local(v: int) -> int:
        got = overrides.get(v)
        if got is not None:
            return got
        dims = prop.layouts[v] or L.replicated(len(graph.shapes[v]))
        return L.local_bytes(graph.nbytes(v), dims, sizes)

    # Each all-reduced value's unreduced buffer lives to its (combined) all-reduce, the
    # reduced one from there (``memory_model.all_reduce_spans``).
    reductions, reduced = all_reduce_spans(graph, prop.collectives, prop.collective_nodes, local)

    def extra(v: int) -> int:
        """Copies in the other layouts its consumers needed: moved by collectives, so in
        the dtype the compiler computes in (an argument's too)."""
        return sum(
            L.local_bytes(graph.wire_nbytes(v), lay, sizes) for lay in prop.copies.get(v, ())
        )

    expands = profile is not None and profile.compiler.expands_select_and_scatter
    into_dots = profile is not None and profile.compiler.fuses_into_dots
    library = profile is None or profile.compiler.library_reductions

    # Outputs gathered along an inner dimension wait, gathered in the major dimension's
    # order, for the copies into their buffers at the program's end; XLA places about every
    # other one in an output buffer copied later (measured: 1, 2, 4, 8 such outputs of
    # f32[3,3,32,32] take 1, 1, 2, 4 of them in temp), the larger first.
    waiting = sorted(
        (
            local(v)
            for v, was in prop.computed.items()
            if _gathered_inside(graph.shapes[v], was, prop.layouts[v] or ())
        ),
        reverse=True,
    )
    last = max((i for i, on in enumerate(prop.live) if on), default=-1)
    at_end = sum(waiting[::2])

    def transient(i: int) -> tuple[int, ...]:
        return (*reduced.get(i, ()), at_end if i == last else 0)

    return device_memory(
        graph,
        prop.live,
        local,
        extra,
        transient=transient,
        reductions=reductions,
        moved=frozenset(prop.computed),
        selections=expands,
        dot_operands=into_dots,
        library=library,
    )


def layout_cost(
    graph: OpGraph,
    ins: Sequence[L.DimAxes],
    sizes: Mapping[str, int],
    profile: DeviceProfile,
    *,
    constraints: Mapping[int, L.DimAxes] | None = None,
    output_layouts: Sequence[L.DimAxes | None] | None = None,
) -> tuple[CostBreakdown, Propagation]:
    """The cost model's account of a strategy given as layouts (what ``predict``, the
    baselines and hand-specified plans share): propagate through the graph, combine
    independent all-reduces as XLA's combiner does (the bytes add up, the latency is paid
    once), charge the share of communication the compute does not hide (``overlap.py``;
    all of it on a compiler without asynchronous collectives), and assemble the breakdown
    with per-device memory."""
    prop = propagate(
        graph,
        list(ins),
        sizes,
        profile,
        constraints=constraints,
        output_layouts=None if output_layouts is None else list(output_layouts),
    )
    collectives = combine_all_reduces(graph, prop.collectives, prop.collective_nodes)
    share = (
        run_streams(graph, prop, profile, combined=collectives).exposed_share
        if profile.compiler.async_collectives
        else 1.0
    )
    cost = CostBreakdown.from_collectives(
        collectives,
        profile,
        flops=prop.flops,
        compute_time=prop.compute_time,
        memory=memory_estimate(graph, prop, sizes, profile),
        warnings=tuple(dict.fromkeys(prop.warnings)),
        exposed_share=share,
    )
    return cost, prop


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A strategy resolved against a function's graph (what predict and schedule share)."""

    profile: DeviceProfile
    graph: OpGraph
    sizes: dict[str, int]
    resolved: list[Any]
    ins: list[L.DimAxes]
    outs: list[L.DimAxes | None] | None
    constraints: dict[int, L.DimAxes]

    def propagate(self) -> Propagation:
        return propagate(
            self.graph,
            self.ins,
            self.sizes,
            self.profile,
            constraints=self.constraints,
            output_layouts=self.outs,
        )


def prepare_strategy(
    fn: Callable[..., Any],
    *args: Any,
    mesh: Mesh,
    in_shardings: Any,
    constraints: Constraints = None,
    out_shardings: Any = None,
    device: str | DeviceProfile | None = None,
    graph: OpGraph | None = None,
    traced: Traced | None = None,
) -> Prepared:
    """Validates the specs and traces ``fn`` (unless ``graph`` or ``traced`` is given)."""
    profile = resolve_profile(device, mesh)
    sizes = mesh_shape_of(mesh)
    resolved = resolve_shardings(in_shardings, args, mesh, what="in_shardings")
    if graph is None:
        traced = traced if traced is not None else trace(fn, *args, unroll_scans=False)
        graph = traced.graph
    ins = [L.from_spec(s, len(shape)) for _, shape, s in resolved]
    outs = None
    if out_shardings is not None:
        out_shape = traced.out_shape if traced is not None else eval_shape(fn, *args)
        res = resolve_shardings((out_shardings,), (out_shape,), mesh, what="out_shardings")
        outs = [None if s is None else L.from_spec(s, len(shape)) for _, shape, s in res]
    layouts = _constraint_layouts(graph, constraints, mesh)
    return Prepared(profile, graph, dict(sizes), list(resolved), ins, outs, layouts)


def predict(
    fn: Callable[..., Any],
    *args: Any,
    mesh: Mesh,
    in_shardings: Any = None,
    constraints: Constraints = None,
    out_shardings: Any = None,
    device: str | DeviceProfile | None = None,
    graph: OpGraph | None = None,
    traced: Traced | None = None,
) -> CostBreakdown:
    """Cost of a fully specified strategy, without compiling.

    Args:
        fn: the function.
        *args: example arguments (arrays placed anywhere or ``jax.ShapeDtypeStruct``;
            non-array leaves are static: ``parallel/arguments.py``).
        mesh: the device mesh.
        in_shardings: a pytree (prefix) of ``PartitionSpec``/``NamedSharding`` matching
            ``args``; a ``None`` leaf is taken as replicated. Left out: each array's own
            sharding where it is a ``NamedSharding`` over a mesh of ``mesh``'s shape (arrays
            placed with ``jax.device_put``, ``jax.sharding.reshard`` or ``out_sharding=``),
            replicated otherwise.
        constraints: layouts of intermediates: ``{node index: PartitionSpec}`` (the node's
            first output, indices of ``OpGraph.nodes``) or a callable ``Node -> spec | None``.
            ``with_sharding_constraint`` calls inside ``fn`` count as constraints too.
        out_shardings: optional pytree (prefix) of specs for the outputs.
        device: a ``DeviceProfile`` or a name in ``DEVICE_PROFILES`` (default: by backend).
        graph: a prebuilt ``OpGraph`` of ``fn`` (saves tracing again).
        traced: ``fn`` already traced (``graph.trace.trace``); its graph is used.

    Returns:
        A ``CostBreakdown``: collectives and wire bytes per kind and per mesh axis,
        alpha-beta time per axis, per-device flops and compute time, per-device memory.

    Raises:
        ShardingSpecError: a spec does not fit its argument or the mesh.
    """
    if in_shardings is None:
        in_shardings = _own_shardings(args, mesh)
    p = prepare_strategy(
        fn,
        *args,
        mesh=mesh,
        in_shardings=in_shardings,
        constraints=constraints,
        out_shardings=out_shardings,
        device=device,
        graph=graph,
        traced=traced,
    )
    cost, _ = layout_cost(
        p.graph, p.ins, p.sizes, p.profile, constraints=p.constraints, output_layouts=p.outs
    )
    if any(s is None for _, _, s in p.resolved):
        warning = "some in_shardings leaves are None: predicted as replicated"
        cost = dataclasses.replace(cost, warnings=(*cost.warnings, warning))
    return cost


def _own_shardings(args: tuple[Any, ...], mesh: Mesh) -> Any:
    """Per array leaf of ``args``, its ``PartitionSpec`` where it carries a
    ``NamedSharding`` over a mesh of ``mesh``'s shape; ``None`` (replicated) otherwise."""

    def own(x: Any) -> Any:
        s = getattr(x, "sharding", None)
        if isinstance(s, NamedSharding) and dict(s.mesh.shape) == dict(mesh.shape):
            return s.spec
        return None

    return jax.tree.map(own, tuple(args))
