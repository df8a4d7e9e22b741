"""Loading plans: validated ``Plan.from_json`` and re-binding a plan to a function.

Nothing here unpickles or evaluates anything: the JSON is checked field by field (format,
mesh axes and sizes, spec ranks, axes used once, divisibility) before a ``Plan`` is built.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from shardlab.parallel import layouts as L
from shardlab.parallel.annotations import SearchError, leaf_paths, path_text
from shardlab.parallel.mesh import mesh_shape_of
from shardlab.parallel.opgraph import OpGraph, build_from_jaxpr
from shardlab.parallel.records import Collective, CostBreakdown, DeviceMemoryEstimate


def fingerprint(graph: OpGraph) -> str:
    """A digest of the graph's primitives and shapes, to tell a plan's function apart."""
    h = hashlib.sha1()
    for n in graph.nodes:
        h.update(n.primitive.encode())
        for v in n.outputs:
            h.update(str(graph.shapes[v]).encode())
    for v in graph.inputs:
        h.update(str(graph.shapes[v]).encode())
    return h.hexdigest()[:16]


def _layout(raw: Any, shape: tuple[int, ...], sizes: dict[str, int], where: str) -> L.DimAxes:
    if not isinstance(raw, list) or len(raw) != len(shape):
        raise SearchError(f"{where}: expected {len(shape)} per-dimension axis lists, got {raw!r}")
    seen: set[str] = set()
    out = []
    for d, axes in enumerate(raw):
        if not isinstance(axes, list) or not all(isinstance(a, str) for a in axes):
            raise SearchError(f"{where}: dimension {d} must be a list of axis names, got {axes!r}")
        for a in axes:
            if a not in sizes:
                raise SearchError(
                    f"{where}: dimension {d} names mesh axis {a!r}; the plan's mesh has "
                    f"{sorted(sizes)}"
                )
            if a in seen:
                raise SearchError(f"{where}: mesh axis {a!r} is used twice")
            seen.add(a)
        n = math.prod(sizes[a] for a in axes)
        if shape[d] % n:
            raise SearchError(
                f"{where}: dimension {d} of size {shape[d]} is not divisible by {n} ({axes})"
            )
        out.append(tuple(axes))
    return tuple(out)


def _cost(raw: dict[str, Any]) -> CostBreakdown:
    try:
        colls = []
        for c in raw["collectives"]:
            fields: dict[str, Any] = dict(c)
            fields["mesh_axes"] = tuple(fields.get("mesh_axes", ()))
            colls.append(Collective(**fields))
        return CostBreakdown(
            collectives=tuple(colls),
            comm_bytes_per_axis=dict(raw["comm_bytes_per_axis"]),
            comm_time_per_axis=dict(raw["comm_time_per_axis"]),
            flops=float(raw["flops"]),
            compute_time=float(raw["compute_time"]),
            memory=DeviceMemoryEstimate(**raw["memory"]),
            device=str(raw["device"]),
            warnings=tuple(raw.get("warnings", ())),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise SearchError(f"not a plan: malformed cost ({e})") from e


def plan_from_dict(data: Any) -> Any:
    """A validated, unbound ``Plan`` from ``Plan.to_dict()`` output."""
    from shardlab.parallel.plan import FORMAT, Plan, PlanRow

    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SearchError(f"not a plan: expected a JSON object with format {FORMAT!r}")
    try:
        sizes = {str(k): int(v) for k, v in data["mesh_shape"].items()}
        in_shapes = tuple(tuple(int(d) for d in s) for s in data["input_shapes"])
        out_shapes = tuple(tuple(int(d) for d in s) for s in data["output_shapes"])
        paths = tuple(str(p) for p in data["input_paths"])
        if len(paths) != len(in_shapes) or len(data["input_specs"]) != len(in_shapes):
            raise SearchError("not a plan: input paths, shapes and specs differ in length")
        if len(data["output_specs"]) != len(out_shapes):
            raise SearchError("not a plan: output shapes and specs differ in length")
        ins = tuple(
            _layout(s, shp, sizes, f"input {p}")
            for s, shp, p in zip(data["input_specs"], in_shapes, paths, strict=True)
        )
        outs = tuple(
            _layout(s, shp, sizes, f"output {i}")
            for i, (s, shp) in enumerate(zip(data["output_specs"], out_shapes, strict=True))
        )
        constraints = []
        for node, prim, specs in data["constraints"]:
            lays = tuple(
                None if s is None else tuple(tuple(str(a) for a in ax) for ax in s) for s in specs
            )
            for lay in lays:
                for a in (a for ax in lay or () for a in ax):
                    if a not in sizes:
                        raise SearchError(f"constraint on node {node}: unknown mesh axis {a!r}")
            constraints.append((int(node), str(prim), lays))
        operand = []
        for node, pos, lay in data["operand_constraints"]:
            lay = tuple(tuple(str(a) for a in ax) for ax in lay)
            for a in (a for ax in lay for a in ax):
                if a not in sizes:
                    raise SearchError(f"operand constraint on node {node}: unknown axis {a!r}")
            operand.append((int(node), int(pos), lay))
        rows = tuple(
            PlanRow(str(r["op"]), str(r["where"]), str(r["chosen"]), float(r["cost"]),
                    tuple((str(a), float(c)) for a, c in r["alternatives"]))
            for r in data.get("rows", ())
        )  # fmt: skip
        budget = data.get("memory_budget")
        return Plan(
            method=str(data["method"]),
            mesh_shape=sizes,
            input_paths=paths,
            input_shapes=in_shapes,
            input_specs=ins,
            output_shapes=out_shapes,
            output_specs=outs,
            constraints=tuple(constraints),
            operand_constraints=tuple(operand),
            cost=_cost(data["cost"]),
            optimal=data.get("optimal"),
            complete=bool(data.get("complete", True)),
            search_time=float(data.get("search_time", 0.0)),
            fingerprint=str(data.get("fingerprint", "")),
            rows=rows,
            notes=tuple(str(n) for n in data.get("notes", ())),
            memory_budget=None if budget is None else int(budget),
        )
    except SearchError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SearchError(
            f"not a plan: missing or malformed field ({type(e).__name__}: {e})"
        ) from e


def binding_for(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    mesh: Mesh,
    closed: Any = None,
    graph: OpGraph | None = None,
):
    """Trace ``fn`` (unless ``closed`` = ``(jaxpr, out_shape)`` is given; ``graph``: its
    already-built ``OpGraph``) and bundle what running a plan needs."""
    from shardlab.parallel.plan import _Binding

    if closed is None:
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    else:
        closed, out_shape = closed
    if graph is None:
        graph = build_from_jaxpr(closed, unroll_scans=True)  # as search() builds it
    abstract = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), getattr(x, "dtype", np.float32)), args
    )
    return _Binding(
        fn=fn,
        args=abstract,
        mesh=mesh,
        graph=graph,
        in_tree=jax.tree_util.tree_structure(tuple(args)),
        out_tree=jax.tree_util.tree_structure(out_shape),
    )


def bind_plan(plan: Any, fn: Callable[..., Any], args: tuple[Any, ...], mesh: Mesh) -> Any:
    """``plan`` bound to ``fn``/``args``/``mesh``, after checking they are the plan's."""
    import dataclasses

    sizes = mesh_shape_of(mesh)
    if sizes != plan.mesh_shape:
        raise SearchError(f"the plan is for mesh {plan.mesh_shape}, got mesh {sizes}")
    b = binding_for(fn, args, mesh)
    shapes = tuple(tuple(b.graph.shapes[v]) for v in b.graph.inputs)
    if shapes != plan.input_shapes:
        paths = [path_text(p) for p in leaf_paths(fn, args)]
        bad = next(
            (f"{p}: plan {a}, given {s}" for p, a, s in zip(paths, plan.input_shapes, shapes,
                                                            strict=False) if a != s),
            f"{len(plan.input_shapes)} leaves in the plan, {len(shapes)} given",
        )  # fmt: skip
        raise SearchError(f"the arguments do not match the plan: {bad}")
    if plan.fingerprint and fingerprint(b.graph) != plan.fingerprint:
        raise SearchError(
            "the function traces to a different graph than the plan was made for "
            "(fingerprints differ); run shardlab.search again"
        )
    return dataclasses.replace(plan, binding=b)
