"""A hand-specified plan: argument layouts (and intermediate constraints) fixed by a person.

The baselines (``jax.jit(step, in_shardings=...)`` as a person would write it) and the
strategy editor make their plans here: the partitioner's propagation of the fixed layouts is
the cost model's (``cost.predict.layout_cost``), and the plan runs, verifies and exports
like a searched one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from jax.sharding import Mesh

from shardlab.parallel.cost import layouts as L
from shardlab.parallel.cost.predict import layout_cost
from shardlab.parallel.cost.profiles import DeviceProfile, resolve_profile
from shardlab.parallel.graph.trace import Traced
from shardlab.parallel.mesh import mesh_shape_of
from shardlab.parallel.plan.binding import Binding
from shardlab.parallel.plan.plan import Plan
from shardlab.parallel.records import CostBreakdown


def fixed_plan(
    traced: Traced,
    mesh: Mesh,
    input_layouts: Sequence[L.DimAxes],
    *,
    method: str,
    device: str | DeviceProfile | None = None,
    constraints: Mapping[int, L.DimAxes] | None = None,
    tie_outputs: bool = True,
    notes: Sequence[str] = (),
    start: float | None = None,
) -> Plan:
    """The plan of fixed argument layouts on ``traced``'s graph.

    Args:
        traced: the traced function.
        mesh: the mesh.
        input_layouts: per flat argument leaf, its layout.
        method: the plan's name (a baseline's, or ``"hand"``).
        device: the device profile for the cost model.
        constraints: ``{node index: layout of its first output}`` inside the function.
        tie_outputs: updated arguments (``traced.ties``) end in their argument's layout, as
            the baselines' ``out_shardings`` do; otherwise outputs take the propagated
            layouts.
        notes: what made the plan.
        start: ``time.perf_counter()`` when making the plan began (for ``search_time``).
    """
    start = time.perf_counter() if start is None else start
    profile = resolve_profile(device, mesh)
    g = traced.graph
    sizes = mesh_shape_of(mesh)
    ins = list(input_layouts)
    outs: list[L.DimAxes | None] = [None] * len(g.outputs)
    if tie_outputs:
        for o, i in traced.ties.items():
            outs[o] = ins[i]
    var_constraints = {g.nodes[i].outputs[0]: lay for i, lay in (constraints or {}).items()}
    cost, prop = layout_cost(
        g, ins, sizes, profile, constraints=var_constraints or None, output_layouts=outs
    )
    layouts = prop.mesh_layouts(g.shapes)
    out_specs = tuple(
        o if o is not None else (layouts[v] or L.replicated(len(g.shapes[v])))
        for o, v in zip(outs, g.outputs, strict=True)
    )
    return Plan.of_binding(
        Binding(traced, mesh),
        method=method,
        input_specs=ins,
        output_specs=out_specs,
        cost=cost,
        constraints=tuple(
            (i, g.nodes[i].primitive, (lay,)) for i, lay in sorted((constraints or {}).items())
        ),
        search_time=time.perf_counter() - start,
        notes=tuple(notes),
    )


def partitioned_cost(plan: Plan, device: str | DeviceProfile | None = None) -> CostBreakdown:
    """The cost model's prediction of ``plan``'s argument layouts and constraints as the
    partitioner propagates them (``layout_cost``: how the baselines, the editor and
    ``predict`` are priced). A searched plan's own ``cost`` adds up the search's per-op
    choices, which can differ from it; comparing plans by this puts them on one model."""
    assert plan.binding is not None, "partitioned_cost needs a bound plan (plan.bind(fn, *args))"
    g = plan.binding.graph
    constraints: dict[int, L.DimAxes] = {}
    for index, _, outs in plan.constraints:
        for var, lay in zip(g.nodes[index].outputs, outs, strict=False):
            if lay is not None:
                constraints[var] = lay
    cost, _ = layout_cost(
        g,
        list(plan.input_specs),
        mesh_shape_of(plan.binding.mesh),
        resolve_profile(device, plan.binding.mesh),
        constraints=constraints or None,
        output_layouts=list(plan.output_specs),
    )
    return cost
