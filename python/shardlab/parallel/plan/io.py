"""Reading plans: the fields of a ``Plan`` from its JSON form, validated.

Nothing here unpickles or evaluates anything: the JSON is checked field by field (format,
mesh axes and sizes, spec ranks, axes used once, divisibility) before ``Plan.from_json``
builds a plan from the fields.
"""

from __future__ import annotations

import math
from typing import Any

from shardlab.parallel.cost import layouts as L
from shardlab.parallel.errors import SearchError
from shardlab.parallel.records import Collective, CostBreakdown, DeviceMemoryEstimate, PlanRow


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


FORMAT = "shardlab.plan/1"


def plan_fields(data: Any) -> dict[str, Any]:
    """The validated fields of an unbound ``Plan`` from ``Plan.to_dict()`` output."""
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
            PlanRow(
                str(r["op"]),
                str(r["where"]),
                str(r["chosen"]),
                float(r["cost"]),
                tuple((str(a), float(c)) for a, c in r["alternatives"]),
            )
            for r in data.get("rows", ())
        )
        budget = data.get("memory_budget")
        return dict(
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
