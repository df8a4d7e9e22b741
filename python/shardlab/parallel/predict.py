"""``shardlab.predict``: what the cost model expects for a fully specified strategy.

Nothing is compiled: the function is traced to an ``OpGraph``, the given shardings are
propagated with the per-primitive rules (``propagate.py``), and the collectives that need are
costed with the alpha-beta model (``cost.py``) in the same units as ``Report``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from shardlab.parallel import layouts as L
from shardlab.parallel.cost import DeviceProfile, resolve_profile
from shardlab.parallel.edges import combine_all_reduces
from shardlab.parallel.memory_model import device_memory
from shardlab.parallel.mesh import mesh_shape_of
from shardlab.parallel.opgraph import Node, OpGraph, build
from shardlab.parallel.propagate import Propagation, propagate
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


def memory_estimate(graph: OpGraph, prop: Propagation, sizes: Mapping[str, int]):
    """Per-device arguments, outputs and temp (``memory_model.device_memory``), and peak."""

    def local(v: int) -> int:
        dims = prop.layouts[v] or L.replicated(len(graph.shapes[v]))
        return L.local_bytes(graph.nbytes(v), dims, sizes)

    reduced: dict[int, int] = {}  # node -> bytes of partial sums it all-reduces
    for c, node in zip(prop.collectives, prop.collective_nodes, strict=True):
        if c.kind == "all-reduce" and node >= 0:
            reduced[node] = reduced.get(node, 0) + c.bytes * c.count

    return device_memory(graph, prop.live, local, transient=lambda i: reduced.get(i, 0))


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A strategy propagated through a function's graph (what predict and schedule share)."""

    profile: DeviceProfile
    graph: OpGraph
    prop: Propagation
    sizes: dict[str, int]
    resolved: list[Any]


def propagate_strategy(
    fn: Callable[..., Any],
    *args: Any,
    mesh: Mesh,
    in_shardings: Any,
    constraints: Constraints = None,
    out_shardings: Any = None,
    device: str | DeviceProfile | None = None,
    graph: OpGraph | None = None,
) -> Prepared:
    """Validates the specs, traces ``fn`` (unless ``graph`` is given) and propagates."""
    profile = resolve_profile(device)
    sizes = mesh_shape_of(mesh)
    resolved = resolve_shardings(in_shardings, args, mesh, what="in_shardings")
    graph = graph if graph is not None else build(fn, *args)
    ins = [L.from_spec(s, len(shape)) for _, shape, s in resolved]
    outs = None
    if out_shardings is not None:
        out_shape = jax.eval_shape(fn, *args)
        res = resolve_shardings((out_shardings,), (out_shape,), mesh, what="out_shardings")
        outs = [None if s is None else L.from_spec(s, len(shape)) for _, shape, s in res]
    prop = propagate(
        graph,
        ins,
        sizes,
        profile,
        constraints=_constraint_layouts(graph, constraints, mesh),
        output_layouts=outs,
    )
    return Prepared(profile, graph, prop, dict(sizes), list(resolved))


def predict(
    fn: Callable[..., Any],
    *args: Any,
    mesh: Mesh,
    in_shardings: Any,
    constraints: Constraints = None,
    out_shardings: Any = None,
    device: str | DeviceProfile | None = None,
    graph: OpGraph | None = None,
) -> CostBreakdown:
    """Cost of a fully specified strategy, without compiling.

    Args:
        fn: the function.
        *args: example arguments (arrays or ``jax.ShapeDtypeStruct``).
        mesh: the device mesh.
        in_shardings: a pytree (prefix) of ``PartitionSpec``/``NamedSharding`` matching
            ``args``; a ``None`` leaf is taken as replicated.
        constraints: layouts of intermediates: ``{node index: PartitionSpec}`` (the node's
            first output, indices of ``OpGraph.nodes``) or a callable ``Node -> spec | None``.
            ``with_sharding_constraint`` calls inside ``fn`` count as constraints too.
        out_shardings: optional pytree (prefix) of specs for the outputs.
        device: a ``DeviceProfile`` or a name in ``DEVICE_PROFILES`` (default: by backend).
        graph: a prebuilt ``OpGraph`` of ``fn`` (saves tracing again).

    Returns:
        A ``CostBreakdown``: collectives and wire bytes per kind and per mesh axis,
        alpha-beta time per axis, per-device flops and compute time, per-device memory.

    Raises:
        ShardingSpecError: a spec does not fit its argument or the mesh.
    """
    prepared = propagate_strategy(
        fn, *args, mesh=mesh, in_shardings=in_shardings, constraints=constraints,
        out_shardings=out_shardings, device=device, graph=graph,
    )  # fmt: skip
    profile, graph, prop, sizes = prepared.profile, prepared.graph, prepared.prop, prepared.sizes
    resolved = prepared.resolved
    # XLA combines independent all-reduces into one (the bytes add up; the latency is paid
    # once): so does the prediction, as the search's costing does.
    collectives = combine_all_reduces(graph, prop.collectives, prop.collective_nodes)
    per_axis: dict[str, float] = {}
    time_axis: dict[str, float] = {}
    for c in collectives:
        key = "+".join(c.mesh_axes) or "-"
        per_axis[key] = per_axis.get(key, 0.0) + c.wire_bytes * c.count
        t = profile.collective_time(c.kind, c.wire_bytes, c.group_size, c.mesh_axes)
        time_axis[key] = time_axis.get(key, 0.0) + t * c.count
    warnings = list(dict.fromkeys(prop.warnings))
    if any(s is None for _, _, s in resolved):
        warnings.append("some in_shardings leaves are None: predicted as replicated")
    return CostBreakdown(
        collectives=tuple(collectives),
        comm_bytes_per_axis=per_axis,
        comm_time_per_axis=time_axis,
        flops=prop.flops,
        compute_time=prop.compute_time,
        memory=memory_estimate(graph, prop, sizes),
        device=profile.name,
        warnings=tuple(warnings),
    )
