"""Baseline strategies as plans: replicated, data parallel, Megatron, ZeRO and combinations.

A baseline fixes only the argument (and updated-argument) layouts, as a person writing
``jax.jit(step, in_shardings=...)`` would; the partitioner propagates the rest. Its predicted
cost comes from ``plan.fixed.fixed_plan`` (the same model ``shardlab.predict`` uses).

Conventions (override with the keyword arguments): the *last* positional argument is the
batch (its leaves are split on their leading dimension), the first is the parameters, and
any in between are optimizer state (same structure as the parameters).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from jax.sharding import Mesh

from shardlab.parallel.cost import layouts as L
from shardlab.parallel.cost.profiles import DeviceProfile
from shardlab.parallel.errors import SearchError
from shardlab.parallel.graph.opgraph import OpGraph
from shardlab.parallel.graph.trace import Traced, trace
from shardlab.parallel.mesh import mesh_shape_of
from shardlab.parallel.plan.fixed import fixed_plan
from shardlab.parallel.plan.plan import Plan


class _On:
    """A traced function on a mesh: what building a baseline reads."""

    def __init__(self, traced: Traced, mesh: Mesh):
        self.traced, self.mesh = traced, mesh
        self.graph, self.args = traced.graph, traced.args
        self.ties, self.arg_of_leaf = traced.ties, traced.arg_of_leaf
        self.sizes = mesh_shape_of(mesh)

    def shapes(self) -> list[tuple[int, ...]]:
        return self.traced.input_shapes()


def _split(shape: tuple[int, ...], dim: int, axes: Sequence[str], sizes: dict[str, int]):
    """Axes (a prefix of ``axes``) that divide ``shape[dim]``."""
    keep = list(axes)
    while keep and shape[dim] % math.prod(sizes[a] for a in keep):
        keep.pop()
    return tuple(keep)


def _with(lay: L.DimAxes, dim: int, axes: tuple[str, ...]) -> L.DimAxes:
    used = {a for ax in lay for a in ax}
    add = tuple(a for a in axes if a not in used)
    return tuple((*ax, *add) if d == dim else ax for d, ax in enumerate(lay))


def _batch_layouts(t: _On, layouts: list[L.DimAxes], axes: Sequence[str], batch: set[int]):
    for i, shape in enumerate(t.shapes()):
        if t.arg_of_leaf[i] in batch and shape:
            got = _split(shape, 0, axes, t.sizes)
            if got:
                layouts[i] = _with(layouts[i], 0, got)


def megatron_specs(t: _On, axis: str, params: set[int]) -> dict[int, L.DimAxes]:
    """Tensor-parallel layouts for weights found in the graph: a weight whose matmul output
    reaches another weight's first matmul is split on its output features (column), the
    other on its input features (row), alternating as in Megatron-LM."""
    g = t.graph
    first_use: dict[int, int] = {}
    leaf_of_var = {v: i for i, v in enumerate(g.inputs) if t.arg_of_leaf[i] in params}
    sliced: dict[int, int] = {}  # a stacked (scanned) weight's first scan_slice stands for it
    for node in g.nodes:
        src = node.inputs[0] if node.primitive == "scan_slice" else -1
        if src in leaf_of_var and src not in sliced.values():
            sliced[node.outputs[0]] = src
            leaf_of_var[node.outputs[0]] = leaf_of_var[src]
    for node in g.nodes:
        if node.primitive != "dot_general":
            continue
        for v in node.inputs:
            if v in leaf_of_var and len(g.shapes[v]) >= 2:
                first_use.setdefault(v, node.index)
    dot_of = {n: v for v, n in first_use.items()}
    role: dict[int, str] = {}
    out: dict[int, L.DimAxes] = {}
    size = t.sizes[axis]
    for v in sorted(first_use, key=lambda w: first_use[w]):
        node = g.nodes[first_use[v]]
        (lc, rc), (lb, rb) = node.params["dimension_numbers"]
        pos = node.inputs.index(v)
        contract, batch = (lc, lb) if pos == 0 else (rc, rb)
        rank = len(g.shapes[v])
        free = [d for d in range(rank) if d not in contract and d not in batch]
        if role.get(v) == "row":
            dims = [d for d in contract if g.shapes[v][d] % size == 0]
            if dims:
                out[v] = _with(L.replicated(rank), dims[-1], (axis,))
            continue
        reached = _reached_weights(g, node.index, dot_of, v)
        if not reached or not free or g.shapes[v][free[-1]] % size:
            continue
        out[v] = _with(L.replicated(rank), free[-1], (axis,))
        role[v] = "col"
        for w in reached:
            role.setdefault(w, "row")
    return {
        leaf: ((), *out[v]) if v in sliced else out[v]  # the stacked dim stays whole
        for v, leaf in leaf_of_var.items()
        if v in out
    }


def _reached_weights(g: OpGraph, start: int, dot_of: dict[int, int], own: int) -> list[int]:
    """Weights whose first matmul is reached from node ``start``'s output, not passing
    through another weight's first matmul."""
    seen = {start}
    stack = [start]
    found: list[int] = []
    while stack:
        n = stack.pop()
        for v in g.nodes[n].outputs:
            for c in g.consumers(v):
                if c in seen:
                    continue
                seen.add(c)
                w = dot_of.get(c)
                if w is not None and w != own:
                    found.append(w)
                    continue
                stack.append(c)
    return found


def _roles(t: _On, batch_argnums: Sequence[int] | None) -> tuple[set[int], set[int], set[int]]:
    n = len(t.args)
    batch = set(batch_argnums) if batch_argnums is not None else {n - 1}
    for b in batch:
        if not 0 <= b < n:
            raise SearchError(f"batch_argnums {b} out of range for {n} arguments")
    params = {0} - batch if n > 1 else set()
    state = set(range(1, n)) - batch
    return batch, params, state


def _check_axes(t: _On, axes: Sequence[str], what: str) -> None:
    for a in axes:
        if a not in t.sizes:
            raise SearchError(f"{what}: mesh axis {a!r} not in mesh axes {list(t.sizes)}")


def baseline_layouts(
    traced: Traced,
    mesh: Mesh,
    *,
    data_axes: Sequence[str] = (),
    model_axis: str | None = None,
    zero_axes: Sequence[str] = (),
    batch_argnums: Sequence[int] | None = None,
    zero_stage: int = 1,
    name: str = "",
) -> tuple[list[L.DimAxes], dict[int, L.DimAxes]]:
    """``build``'s argument layouts and (ZeRO-3) per-layer constraints, not priced: for a
    caller that adjusts a layout (a vocabulary split, say) before pricing the plan once
    with ``plan.fixed.fixed_plan``."""
    t = _On(traced, mesh)
    _check_axes(t, [*data_axes, *zero_axes, *([model_axis] if model_axis else [])], name)
    batch, params, state = _roles(t, batch_argnums)
    shapes = t.shapes()
    layouts = [L.replicated(len(s)) for s in shapes]
    _batch_layouts(t, layouts, data_axes, batch)
    if model_axis is not None:
        for leaf, lay in megatron_specs(t, model_axis, params).items():
            layouts[leaf] = lay
        _copy_to_state(t, layouts, params, state)
    if zero_stage not in (1, 2, 3):
        raise SearchError(f"zero_stage={zero_stage!r}: expected 1, 2 or 3")
    gathered = list(layouts)  # the layouts a ZeRO-3 parameter is used in
    if zero_axes:
        targets = (state | params) if zero_stage == 3 else (state or params)
        for i, shape in enumerate(shapes):
            if t.arg_of_leaf[i] not in targets:
                continue
            # The largest dimension that divides (as FSDP implementations shard): never a
            # conv kernel's small spatial one, whose split XLA's CPU partitioner miscompiles
            # for transposed convolutions (docs/design/parallel.md).
            for d in sorted(range(len(shape)), key=lambda d: -shape[d]):
                got = _split(shape, d, zero_axes, t.sizes)
                free = not layouts[i][d] and not {a for ax in layouts[i] for a in ax} & set(got)
                if got and free and shape[d] % (math.prod(t.sizes[a] for a in got)) == 0:
                    layouts[i] = _with(layouts[i], d, got)
                    break
    constraints = _gathered_slices(t, layouts, gathered, params) if zero_stage == 3 else {}
    return layouts, constraints


def build(
    fn: Callable[..., Any],
    *args: Any,
    mesh: Mesh,
    data_axes: Sequence[str] = (),
    model_axis: str | None = None,
    zero_axes: Sequence[str] = (),
    batch_argnums: Sequence[int] | None = None,
    device: str | DeviceProfile | None = None,
    name: str = "",
    traced: Traced | None = None,
    zero_stage: int = 1,
) -> Plan:
    """A baseline from its ingredients: batch split over ``data_axes``, Megatron tensor
    parallelism over ``model_axis``, optimizer state (or, without any, parameters) split over
    ``zero_axes``; with ``zero_stage=3`` the parameters as well as the optimizer state."""
    start = time.perf_counter()
    traced = traced if traced is not None else trace(fn, *args)
    layouts, constraints = baseline_layouts(
        traced,
        mesh,
        data_axes=data_axes,
        model_axis=model_axis,
        zero_axes=zero_axes,
        batch_argnums=batch_argnums,
        zero_stage=zero_stage,
        name=name,
    )
    name = name or "custom"
    note = f"baseline {name}: argument layouts fixed, the partitioner propagates the rest"
    if constraints:
        note += "; each layer's parameters gathered where its scan reads them (FSDP)"
    return fixed_plan(
        traced,
        mesh,
        layouts,
        method=name,
        device=device,
        notes=(note,),
        start=start,
        constraints=constraints or None,
    )


def _gathered_slices(
    t: _On, layouts: list[L.DimAxes], gathered: list[L.DimAxes], params: set[int]
) -> dict[int, L.DimAxes]:
    """ZeRO-3 (FSDP) gathers a layer's parameters where the layer uses them. Stacked
    parameters read by a layer scan are gathered per layer: each ``scan_slice`` of a split
    stacked parameter is constrained to the layout the parameter would have without the
    ZeRO split. Unconstrained, XLA's propagation lets the split parameter's sharding win
    over the batch's inside the scan body when a Megatron axis is also used, and computes
    every data-parallel replica's whole batch (measured: a 4 × 2 mesh's GPT step compiled
    to 2.6× data parallel's memory)."""
    g = t.graph
    split = {
        g.inputs[i]: gathered[i]
        for i, a in enumerate(t.arg_of_leaf)
        if a in params and layouts[i] != gathered[i]
    }
    out: dict[int, L.DimAxes] = {}
    for node in g.nodes:
        if node.primitive == "scan_slice" and node.inputs[0] in split:
            out[node.index] = split[node.inputs[0]][1:]
    return out


def _copy_to_state(t: _On, layouts: list[L.DimAxes], params: set[int], state: set[int]):
    """Optimizer state with the parameters' structure takes the parameters' layouts."""
    shapes = t.shapes()
    param_leaves = [i for i, a in enumerate(t.arg_of_leaf) if a in params]
    for s in state:
        leaves = [i for i, a in enumerate(t.arg_of_leaf) if a == s]
        if len(leaves) == len(param_leaves):
            for i, p in zip(leaves, param_leaves, strict=True):
                if shapes[i] == shapes[p]:
                    layouts[i] = layouts[p]


def replicated(fn, *args, mesh: Mesh, device=None, traced=None) -> Plan:
    """Everything on every device (no communication, no saving)."""
    return build(fn, *args, mesh=mesh, device=device, name="replicated", traced=traced)


def data_parallel(
    fn, *args, mesh: Mesh, axes=None, batch_argnums=None, device=None, traced=None
) -> Plan:
    """The batch split over ``axes`` (default: all mesh axes), parameters replicated."""
    axes = tuple(mesh.axis_names) if axes is None else tuple(axes)
    return build(
        fn,
        *args,
        mesh=mesh,
        data_axes=axes,
        batch_argnums=batch_argnums,
        device=device,
        name="data_parallel",
        traced=traced,
    )


def megatron(
    fn,
    *args,
    mesh: Mesh,
    model_axis=None,
    data_axes=(),
    batch_argnums=None,
    device=None,
    traced=None,
) -> Plan:
    """Megatron tensor parallelism over ``model_axis`` (default: the last mesh axis) for the
    matmul pairs found in the graph (MLP and attention blocks), plus the batch split over
    ``data_axes``."""
    model_axis = model_axis or str(mesh.axis_names[-1])
    name = "megatron" if not data_axes else "data_parallel+megatron"
    return build(
        fn,
        *args,
        mesh=mesh,
        data_axes=tuple(data_axes),
        model_axis=model_axis,
        batch_argnums=batch_argnums,
        device=device,
        name=name,
        traced=traced,
    )


def zero(
    fn,
    *args,
    mesh: Mesh,
    axes=None,
    model_axis=None,
    batch_argnums=None,
    device=None,
    traced=None,
    stage: int = 1,
) -> Plan:
    """ZeRO: data parallel over ``axes`` with the optimizer state split over them too (when
    the function has no optimizer-state argument, the parameters are split: ZeRO-3/FSDP);
    with ``model_axis``, Megatron on that axis as well.

    ``stage``: 1 and 2 split the optimizer state (in one SPMD program the gradients are
    temporaries the partitioner reduces and slices for the split update: a reduce-scatter
    where the backend forms one, so stage 2 is what stage 1 compiles to on GPU and TPU); 3
    splits the parameters too (FSDP: gathered where they are used)."""
    axes = tuple(a for a in mesh.axis_names if a != model_axis) if axes is None else axes
    name = "zero" if model_axis is None else "zero+megatron"
    if stage == 3:
        name = name.replace("zero", "zero3")
    return build(
        fn,
        *args,
        mesh=mesh,
        data_axes=tuple(axes),
        zero_axes=tuple(axes),
        model_axis=model_axis,
        batch_argnums=batch_argnums,
        device=device,
        name=name,
        traced=traced,
        zero_stage=stage,
    )


def baselines(
    fn, *args, mesh: Mesh, batch_argnums=None, device=None, traced=None
) -> dict[str, Plan]:
    """Every baseline for this mesh: 1-D meshes get replicated, data parallel, Megatron and
    ZeRO; 2-D meshes also data parallel × Megatron and ZeRO × Megatron (data on the first
    axis, model on the last). ``traced``: the function already traced (``Traced``), so it is
    not traced again for every baseline."""
    traced = traced if traced is not None else trace(fn, *args)
    names = [str(a) for a in mesh.axis_names]
    kw = {"mesh": mesh, "batch_argnums": batch_argnums, "device": device, "traced": traced}
    out = {
        "replicated": replicated(fn, *args, mesh=mesh, device=device, traced=traced),
        "data_parallel": data_parallel(fn, *args, **kw),
        "megatron": megatron(fn, *args, model_axis=names[-1], **kw),
        "zero": zero(fn, *args, **kw),
    }
    if len(names) > 1:
        data = tuple(names[:-1])
        out["data_parallel+megatron"] = megatron(
            fn, *args, model_axis=names[-1], data_axes=data, **kw
        )
        out["zero+megatron"] = zero(fn, *args, axes=data, model_axis=names[-1], **kw)
    return out
