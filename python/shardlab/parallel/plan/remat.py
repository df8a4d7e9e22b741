"""Rematerialisation of a plan's layer scans: keep less for the backward scan, recompute it.

A train step of a model whose layers are one ``lax.scan`` over stacked parameters has two
scans in its jaxpr: the forward one, whose stacked outputs (``ys``) are the residuals the
backward needs, and the reverse one that reads them as its stacked inputs. With a policy
other than ``none`` the forward runner keeps only what the policy saves, stacked per layer:

* ``nothing`` (``jax.checkpoint_policies.nothing_saveable``): each layer's input carry;
* ``dots`` (``dots_saveable``): that, and the residuals that are ``dot_general`` outputs
  (through reshapes, transposes and converts) in the scan's body.

The dropped residuals leave the forward scan as cheap placeholders (a broadcast zero nothing
reads, so the compiler removes it). The backward runner takes the saved stacks as extra
stacked inputs and, inside its step, re-evaluates the forward body's equations that the
dropped residuals need — only those, starting from the layer's saved input, its parameters
and the kept matmul outputs — then runs the original backward step on the full residuals.
The equations are the original ones, so the numbers are the original program's.

Both runners call the scan's base runner (``plan/pipeline.py``) where the plan has one, so
remat composes with pipelining. The pairing of the two scans comes from the graph's
dataflow; a residual read outside the backward scan is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

# ``bind`` in ``equation_context``: every jaxpr walk's one way to re-bind an equation (in its
# source context, so the recomputed operations name the user's line in the compiled program).
from shardlab._core.jaxprs import bind, equation_context
from shardlab.parallel.cost.pipeline import predict_pipeline
from shardlab.parallel.cost.predict import memory_estimate
from shardlab.parallel.cost.profiles import resolve_profile
from shardlab.parallel.cost.propagate import propagate
from shardlab.parallel.cost.remat import (
    POLICIES,
    LayerScan,
    RematCost,
    check_policy,
    recomputed_nodes,
    remat_cost,
    selected_scans,
)
from shardlab.parallel.display import human_bytes
from shardlab.parallel.errors import SearchError
from shardlab.parallel.graph.interpret import ScanRunner
from shardlab.parallel.graph.opgraph import OpGraph, ScanGroup
from shardlab.parallel.mesh import mesh_shape_of
from shardlab.parallel.records import RematSpec

__all__ = ["POLICIES", "plan_remat_cost", "remat_runners", "remat_variants", "with_remat"]


def remat_runners(
    graph: OpGraph, spec: RematSpec, base: Mapping[int, ScanRunner]
) -> dict[int, ScanRunner]:
    """Runners for the forward and backward scans of each layer scan ``spec`` names, wrapping
    ``base``'s runner of the group (``jax.lax.scan`` where it has none); ``base``'s other
    runners are kept."""
    runners = dict(base)
    if spec.policy == "none":
        check_policy(spec.policy)
        return runners
    for pair in selected_scans(graph, spec).values():
        state: dict[str, Any] = {}
        f, b = pair.forward, pair.backward
        fwd_base = base.get(f, jax.lax.scan)
        bwd_base = base.get(b, jax.lax.scan)
        runners[f] = _forward_runner(graph.scan_groups[f], pair, spec.policy, state, fwd_base)
        runners[b] = _backward_runner(graph, pair, spec.policy, state, bwd_base)
    return runners


def _forward_runner(
    group: ScanGroup, pair: LayerScan, policy: str, state: dict[str, Any], run: ScanRunner
) -> ScanRunner:
    dropped = pair.dropped(policy)

    def runner(step: Any, init: Any, xs: Any, *, length: int, reverse: bool, unroll: Any):
        state["consts"] = _consts_of(step)
        state["xs"] = list(xs)

        def saving(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
            new, ys = step(carry, x)
            out = [y for k, y in enumerate(ys) if k not in dropped]
            return new, [*out, *carry]  # the layer's input carry, stacked

        carry, saved = run(saving, init, xs, length=length, reverse=reverse, unroll=unroll)
        n_ys = len(group.outputs) - group.num_carry
        kept_ys = iter(saved[: n_ys - len(dropped)])
        state["inputs"] = list(saved[n_ys - len(dropped) :])
        ys = []
        for k in range(len(group.outputs) - group.num_carry):
            if k in dropped:  # nothing reads it: the backward runner recomputes it
                u = group.body.outputs[group.num_carry + k]
                ys.append(jnp.zeros((length, *group.body.shapes[u]), group.body.dtypes[u]))
            else:
                ys.append(next(kept_ys))
        return carry, ys

    return runner


def _consts_of(step: Any) -> list[Any]:
    """The forward step's closed-over constants (the interpreter's ``_scan`` step reads them
    from its ``consts`` cell): what the recomputation needs besides the saved stacks."""
    names = step.__code__.co_freevars
    if "consts" not in names or step.__closure__ is None:
        raise SearchError(
            "remat: the forward scan's step does not close over its constants; the "
            "interpreter's ScanRunner protocol changed (graph/interpret.py _scan)"
        )
    return list(step.__closure__[names.index("consts")].cell_contents)


def _backward_runner(
    graph: OpGraph, pair: LayerScan, policy: str, state: dict[str, Any], run: ScanRunner
) -> ScanRunner:
    fwd = graph.scan_groups[pair.forward]
    bwd = graph.scan_groups[pair.backward]
    body = fwd.body
    kept = pair.kept(policy)
    dropped = set(pair.dropped(policy))
    ys_f = body.outputs[fwd.num_carry :]
    # backward xs position -> forward ys position (dropped residuals only)
    slot = {j: k for k, js in pair.residuals.items() if k in dropped for j in js}
    # forward xs also read by the backward scan (the stacked parameters, usually)
    xs_f = fwd.inputs[fwd.num_consts + fwd.num_carry :]
    xs_b = list(bwd.inputs[bwd.num_consts + bwd.num_carry :])
    shared = {i: xs_b.index(u) for i, u in enumerate(xs_f) if u in xs_b}
    # kept residuals: forward body var -> backward xs position (to start recomputing from)
    known = {ys_f[k]: js[0] for k, js in pair.residuals.items() if k in kept and js}
    order = recomputed_nodes(fwd, pair, policy)
    synthetic = [body.nodes[i].primitive for i in order if body.nodes[i].eqn is None]
    if synthetic:
        raise SearchError(
            f"remat: the layer scan {pair.forward}'s body has operations made by the graph "
            f"builder ({', '.join(sorted(set(synthetic)))}), which cannot be re-evaluated; "
            "use remat policy 'none', or jax.checkpoint inside the layer"
        )

    def runner(step: Any, init: Any, xs: Any, *, length: int, reverse: bool, unroll: Any):
        if "inputs" not in state:
            raise SearchError(
                f"remat: the backward scan {pair.backward} ran before its forward scan "
                f"{pair.forward}"
            )
        xs = list(xs)
        own = [j for j in range(len(xs)) if j not in slot]
        extra_f = [i for i in range(len(xs_f)) if i not in shared]
        stacked = [xs[j] for j in own] + state["inputs"] + [state["xs"][i] for i in extra_f]
        consts = state["consts"]
        n_own, n_in = len(own), len(state["inputs"])

        def recomputing(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
            full: list[Any] = [None] * len(xs)
            for j, v in zip(own, x[:n_own], strict=True):
                full[j] = v
            inputs = x[n_own : n_own + n_in]
            extras = dict(zip(extra_f, x[n_own + n_in :], strict=True))
            layer_x = [full[shared[i]] if i in shared else extras[i] for i in range(len(xs_f))]
            env = dict(zip(body.inputs, [*consts, *inputs, *layer_x], strict=True))
            env.update({v: full[j] for v, j in known.items()})
            for i in order:
                node = body.nodes[i]
                with equation_context(node.eqn):
                    outs = bind(
                        node.eqn, [env[v] if v in env else body.literal[v] for v in node.inputs]
                    )
                env.update(zip(node.outputs, outs, strict=True))
            for j, k in slot.items():
                v = ys_f[k]
                full[j] = env[v] if v in env else body.literal[v]
            return step(carry, full)

        return run(recomputing, init, stacked, length=length, reverse=reverse, unroll=unroll)

    return runner


def _priced(plan: Any) -> tuple[OpGraph, Any, dict[str, int], Any, Any]:
    """The plan's graph, its propagation re-run from its layouts, the mesh sizes, the
    memory estimate without remat and the memory model to re-run with some variables'
    bytes replaced: what every remat spec on ``plan`` is priced against."""
    b = plan.binding
    if b is None:
        raise SearchError(
            "this plan is not bound to a function (it was loaded from JSON): call "
            "plan.bind(fn, *args, mesh=mesh) before with_remat"
        )
    g = b.graph
    sizes = mesh_shape_of(b.mesh)
    profile = resolve_profile(plan.cost.device, b.mesh)
    constraints = {g.nodes[i].outputs[0]: lays[0] for i, _, lays in plan.constraints if lays[0]}
    prop = propagate(
        g,
        list(plan.input_specs),
        sizes,
        profile,
        constraints=constraints or None,
        output_layouts=list(plan.output_specs),
    )

    def estimate(overrides: Any) -> Any:
        return memory_estimate(g, prop, sizes, profile, overrides=overrides)

    return g, prop, sizes, estimate({}), estimate


def plan_remat_cost(plan: Any, spec: RematSpec) -> RematCost:
    """The cost model's account of ``spec`` on ``plan`` (``cost/remat.py``): the plan's
    propagation re-run from its layouts, then the residual stacks dropped and kept."""
    g, prop, sizes, base, estimate = _priced(plan)
    return remat_cost(g, prop, sizes, base, spec, estimate)


def _applied(plan: Any, spec: RematSpec, got: RematCost) -> Any:
    cost = dataclasses.replace(
        plan.cost,
        memory=got.memory,
        flops=plan.cost.flops + got.recompute_flops,
        compute_time=plan.cost.compute_time + got.recompute_time,
    )
    note = (
        f"remat {spec.policy} on scan groups {list(got.scans)}: "
        f"{human_bytes(got.dropped_bytes)} of residuals dropped, "
        f"{human_bytes(got.saved_bytes)} of layer inputs kept, "
        f"{got.recompute_flops:.3g} flops recomputed per device"
    )
    return dataclasses.replace(plan, remat=spec, cost=cost, notes=(*plan.notes, note))


def with_remat(plan: Any, spec: RematSpec | str) -> Any:
    """``plan`` with its layer scans rematerialised by ``spec`` and its cost updated.

    Args:
        plan: a plan bound to its function (searched, a baseline or hand-made).
        spec: a ``RematSpec`` or a policy name (``"none"``, ``"dots"``, ``"nothing"``).

    Returns:
        The plan with ``remat`` set; its ``cost.memory`` is the remat prediction, its flops
        and compute time include the recompute, and a note says what was dropped.

    Raises:
        SearchError: an unknown policy (the valid ones named), a function without a layer
            scan (what counts as one, and ``jax.checkpoint`` as the alternative), a scan
            index that is not a forward layer scan, a residual read elsewhere.
    """
    if isinstance(spec, str):
        spec = RematSpec(spec)
    check_policy(spec.policy)
    new = _applied(plan, spec, plan_remat_cost(plan, spec))
    if getattr(plan, "pipeline", None) is not None:  # the stages priced with the policy
        priced = predict_pipeline(new, plan.pipeline, device=plan.cost.device)
        new = dataclasses.replace(new, cost=priced.cost)
    return new


def remat_variants(plan: Any, specs: list[RematSpec]) -> list[Any]:
    """``with_remat(plan, spec)`` for each of ``specs``, the plan's propagation run once
    (the search prices every policy and layer group this way)."""
    if not specs:
        return []
    g, prop, sizes, base, estimate = _priced(plan)
    return [_applied(plan, s, remat_cost(g, prop, sizes, base, s, estimate)) for s in specs]
