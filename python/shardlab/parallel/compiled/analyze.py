"""``shardlab.analyze``: compile with the given shardings and read what the compiler did."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding

from shardlab.parallel.arguments import abstract_args, bind, drop_static, eval_shape, split
from shardlab.parallel.compiled.hlo import collectives_from_hlo, matmul_flops, parse_hlo
from shardlab.parallel.mesh import mesh_shape_of
from shardlab.parallel.records import MemoryBreakdown, Report
from shardlab.parallel.specs import resolve_shardings, unflatten_like


def shardings_for(args: tuple[Any, ...], specs: Any, mesh: Mesh, *, what: str) -> tuple[Any, ...]:
    """Validated ``NamedSharding``/None pytree with the structure of ``args``' dynamic tree
    (static leaves ``None``: ``parallel/arguments.py``)."""
    resolved = resolve_shardings(specs, args, mesh, what=what)
    dynamic = split(tuple(args), check=False).dynamic(tuple(args))
    return unflatten_like(dynamic, [s for _, _, s in resolved])


def _out_shardings(fn: Callable[..., Any], args: tuple[Any, ...], specs: Any, mesh: Mesh):
    if specs is None:
        return None
    out_shape = eval_shape(fn, *args)
    resolved = resolve_shardings((specs,), (out_shape,), mesh, what="out_shardings")
    treedef = jax.tree_util.tree_structure(drop_static(out_shape))
    return jax.tree_util.tree_unflatten(treedef, [s for _, _, s in resolved])


def spec_text(sharding: Any) -> str:
    """``P(...)`` text of a sharding, or its repr when it has no spec."""
    spec = getattr(sharding, "spec", None)
    return str(spec) if spec is not None else repr(sharding)


def compile_sharded(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    mesh: Mesh,
    in_shardings: Any = None,
    out_shardings: Any = None,
):
    """Validate the specs, then lower and compile; returns the ``Compiled`` object.

    Lowered on shapes (``arguments.abstract_args``): the arguments may be placed anywhere
    (another mesh or spec, one device) and hold static leaves (functions, strings), which
    are closed over; the compiled program takes the dynamic tree (static leaves ``None``).
    """
    args = tuple(args)
    parts = split(args, fn)
    ins = shardings_for(args, in_shardings, mesh, what="in_shardings")
    outs = _out_shardings(fn, args, out_shardings, mesh)
    kwargs: dict[str, Any] = {"in_shardings": ins}
    if outs is not None:
        kwargs["out_shardings"] = outs
    with jax.set_mesh(mesh):
        lowered = jax.jit(bind(fn, parts), **kwargs).lower(*parts.dynamic(abstract_args(args)))
        return lowered.compile()


def compiled_cost(compiled: Any) -> dict[str, float]:
    """The compiler's cost analysis (flops, bytes accessed) of a compiled program.

    XLA:GPU compiled deviceless has none (``GetCostAnalysis is not supported``): its
    optimized HLO module is then run through XLA's HLO cost analysis on this process's CPU
    client, which counts the same instructions."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # a backend without one
        cost = None
    if isinstance(cost, list):  # older jax returned one dict per program
        cost = cost[0] if cost else {}
    if cost:
        return dict(cost)
    try:
        from jax._src.lib import xla_client

        modules = compiled.runtime_executable().hlo_modules()
        cpu = jax.devices("cpu")[0].client
        return dict(xla_client._xla.hlo_module_cost_analysis(cpu, modules[0]))
    except Exception:  # private API moved, or no CPU client: no figures
        return {}


def analyze(
    fn: Callable[..., Any],
    *args: Any,
    mesh: Mesh,
    in_shardings: Any = None,
    out_shardings: Any = None,
) -> Report:
    """Compile ``fn`` with the given shardings and read the compiled program.

    Args:
        fn: the function; it is traced with ``args`` (arrays or ``jax.ShapeDtypeStruct``).
        *args: example positional arguments. Only their shapes and dtypes are read, not their
            placement; non-array leaves (an activation function, a string, a bool) are
            static, closed over (``parallel/arguments.py``).
        mesh: the device mesh.
        in_shardings: a pytree (or prefix) of ``PartitionSpec``/``NamedSharding``/``None``
            matching ``args``; ``None`` leaves a leaf to the partitioner.
        out_shardings: likewise for the outputs.

    Returns:
        A ``Report``: collectives (kind, bytes, groups, mesh axes, wire bytes, source line),
        per-device memory and flops (the compiler's count, with the matmuls of a loop body
        counted once per trip: ``hlo.matmul_flops``), the shardings the compiler chose, the
        HLO text.

    Raises:
        ShardingSpecError: a spec does not fit (checked before compiling).
    """
    compiled = compile_sharded(
        fn, args, mesh=mesh, in_shardings=in_shardings, out_shardings=out_shardings
    )
    hlo = compiled.as_text() or ""
    shape = mesh_shape_of(mesh)
    mem = compiled.memory_analysis()
    memory = MemoryBreakdown(
        argument=int(getattr(mem, "argument_size_in_bytes", 0)),
        output=int(getattr(mem, "output_size_in_bytes", 0)),
        alias=int(getattr(mem, "alias_size_in_bytes", 0)),
        temp=int(getattr(mem, "temp_size_in_bytes", 0)),
    )
    module = parse_hlo(hlo)  # read once, for the collectives and the loop trips' flops
    cost = compiled_cost(compiled)
    if cost.get("flops"):  # XLA counts a loop body once: add the other trips' matmuls
        runs, once = matmul_flops(module)
        cost["flops"] = float(cost["flops"]) + runs - once
    in_sh = jax.tree_util.tree_leaves(
        compiled.input_shardings[0], is_leaf=lambda x: isinstance(x, NamedSharding)
    )
    out_sh = jax.tree_util.tree_leaves(
        compiled.output_shardings, is_leaf=lambda x: isinstance(x, NamedSharding)
    )
    return Report(
        collectives=collectives_from_hlo(module, shape),
        memory=memory,
        flops=float((cost or {}).get("flops", 0.0)),
        input_shardings=tuple(spec_text(s) for s in in_sh),
        output_shardings=tuple(spec_text(s) for s in out_sh),
        mesh_shape=shape,
        bytes_accessed=float((cost or {}).get("bytes accessed", 0.0)),
        hlo=hlo,
    )
