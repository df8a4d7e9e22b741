"""``shardlab.search``: from a function, example arguments and a mesh to a ``Plan``.

Trace once, build the strategy space (``space.py``), choose one candidate per unit with the
requested method, and turn the choice into a plan: input/output layouts, the intermediate
constraints that pin it, its predicted ``CostBreakdown`` and a table of decisions. Nothing
is compiled to decide.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from shardlab.parallel import layouts as L
from shardlab.parallel.annotations import SearchError, leaf_paths, path_text, resolve_annotations
from shardlab.parallel.cost import DeviceProfile, resolve_profile
from shardlab.parallel.ilp import ilp_size, solve_ilp
from shardlab.parallel.mesh import mesh_shape_of
from shardlab.parallel.opgraph import build_from_jaxpr
from shardlab.parallel.plan import Plan
from shardlab.parallel.plan_io import binding_for, fingerprint
from shardlab.parallel.planning import make_plan, memory_of
from shardlab.parallel.recursive import solve_recursive
from shardlab.parallel.scan_ties import tie_scan_choices
from shardlab.parallel.space import Space, build_space

METHODS = ("auto", "propagate", "recursive", "ilp")
ILP_MAX_VARIABLES = 20_000


def find_ties(args: tuple[Any, ...], out_shape: Any) -> dict[int, int]:
    """``{flat output position: flat input position}`` for outputs that are updated inputs.

    An output subtree (the output itself or a top-level element of an output tuple) with the
    same structure, shapes and dtypes as an argument is taken to be its new value (updated
    parameters, optimizer state), so it keeps the argument's layout across steps.
    """

    def spans(tree: Any, children: list[Any]) -> list[tuple[Any, int, int]]:
        out, start = [], 0
        for c in children:
            n = len(jax.tree_util.tree_leaves(c))
            out.append((c, start, n))
            start += n
        return out

    def sig(x: Any) -> Any:
        leaves, tree = jax.tree_util.tree_flatten(x)
        return tree, tuple((tuple(np.shape(v)), str(getattr(v, "dtype", ""))) for v in leaves)

    arg_spans = spans(args, list(args))
    outs = list(out_shape) if isinstance(out_shape, (tuple, list)) else [out_shape]
    ties: dict[int, int] = {}
    taken: set[int] = set()
    for o, o_start, n in spans(out_shape, outs):
        if n == 0:
            continue
        for k, (a, a_start, m) in enumerate(arg_spans):
            if k not in taken and m == n and sig(a) == sig(o):
                taken.add(k)
                ties.update({o_start + i: a_start + i for i in range(n)})
                break
    return ties


class _Best:
    """The best complete assignment so far (what an interrupt returns)."""

    def __init__(self, space: Space):
        self.space = space
        self.choice = [int(np.argmin([c.cost for c in u.cands])) for u in space.units]
        self.total = space.total(self.choice)

    def keep(self, choice: list[int]) -> None:
        total = self.space.total(choice)
        if total <= self.total:
            self.choice, self.total = list(choice), total


def batch_seeds(space: Space, n_batch_leaves: int) -> list[dict[int, int]]:
    """Start points for the recursive search: the last argument's leaves (by convention the
    batch) split on their leading dimension over all mesh axes, and over the first axis only.
    The search still moves every unit freely from there."""
    g = space.graph
    axes = list(space.sizes)
    options = [tuple(axes)] + ([tuple(axes[:1])] if len(axes) > 1 else [])
    seeds = []
    for split in options:
        seed: dict[int, int] = {}
        for var in g.inputs[len(g.inputs) - n_batch_leaves :]:
            owner = space.unit_of_var.get(var)
            shape = g.shapes[var]
            if owner is None or not shape or shape[0] % L.shard_count((split,), space.sizes):
                continue
            unit = space.units[owner[0]]
            want = (split, *L.replicated(len(shape) - 1))
            ks = [k for k, c in enumerate(unit.cands) if c.outs[0] == want]
            if ks and not unit.fixed:
                seed[unit.index] = ks[0]
        if seed:
            seeds.append(seed)
    return seeds


def _memory_penalty(space: Space, lam: float) -> list[np.ndarray]:
    """Per unit, ``lam`` × per-device bytes of what each candidate holds (a memory proxy)."""
    g = space.graph
    out = []
    for u in space.units:
        nbytes = [g.nbytes(v) for v in u.outs]
        arr = np.array(
            [
                sum(L.local_bytes(b, lay, space.sizes) for b, lay in zip(nbytes, c.outs,
                                                                         strict=True))
                for c in u.cands
            ]
        )  # fmt: skip
        out.append(lam * arr)
    return out


def _solve(
    space: Space,
    method: str,
    best: _Best,
    *,
    time_limit: float,
    extra: list[np.ndarray] | None,
    memory_rows: list[tuple[list[np.ndarray], float]],
    report: Callable[[float, str], None],
    notes: list[str],
    n_batch_leaves: int = 0,
) -> tuple[list[int], bool | None]:
    if method == "propagate":
        return solve_recursive(space, extra=extra, keep=best.keep, starts="greedy"), None
    if method == "recursive":
        seeds = batch_seeds(space, n_batch_leaves)

        def on_sweep(i: int) -> None:  # the number of steps is not known in advance
            report(0.4 + 0.5 * i / (i + 2), f"forest descent step {i}")

        return solve_recursive(space, extra=extra, on_sweep=on_sweep, keep=best.keep,
                               seeds=seeds), None  # fmt: skip
    result = solve_ilp(space, time_limit=time_limit, memory_rows=memory_rows)
    notes.append(
        f"ilp: {result.variables} variables, {result.message.strip()}"
        + ("" if result.optimal else " (not proven optimal)")
    )
    if result.choice is None:
        notes.append("ilp found no feasible point in time: recursive result used instead")
        return solve_recursive(space, extra=extra, keep=best.keep), False
    return result.choice, result.optimal


def _memory_rows(space: Space, budget: float, checkpoints: int = 8):
    """Linear per-device memory rows: inputs plus the variables live at peak points."""
    g = space.graph
    last: dict[int, int] = {}
    for n in g.nodes:
        if space.live[n.index]:
            for v in n.inputs:
                last[v] = n.index
    profile, live_vars = [], set()
    order = [n for n in g.nodes if space.live[n.index]]
    alive: list[set[int]] = []
    for n in order:
        live_vars.update(v for v in n.outputs if v in space.unit_of_var)
        alive.append(set(live_vars))
        profile.append(sum(g.nbytes(v) for v in live_vars))
        live_vars -= {v for v in n.inputs if last.get(v) == n.index and v not in g.outputs}
    picks = sorted(range(len(profile)), key=lambda i: -profile[i])[:checkpoints] or [None]
    rows = []
    for t in picks:
        coeffs = [np.zeros(len(u.cands)) for u in space.units]
        members = set(g.inputs) | (alive[t] if t is not None else set())
        for v in members:
            owner = space.unit_of_var.get(v)
            if owner is None:
                continue
            u, pos = owner
            coeffs[u] += [L.local_bytes(g.nbytes(v), c.outs[pos], space.sizes)
                          for c in space.units[u].cands]  # fmt: skip
        rows.append((coeffs, budget))
    return rows


def search(
    fn: Callable[..., Any],
    *args: Any,
    mesh: Mesh,
    method: str = "auto",
    annotations: Mapping[Any, Any] | None = None,
    memory_budget: float | None = None,
    device: str | DeviceProfile | None = None,
    progress: Callable[[float, str], None] | None = None,
    time_limit: float = 30.0,
) -> Plan:
    """Search a sharding strategy for ``fn(*args)`` on ``mesh``.

    Args:
        fn: the function (a forward pass or a whole train step).
        *args: example arguments (arrays or ``jax.ShapeDtypeStruct``).
        mesh: the device mesh.
        method: ``"propagate"`` (semi-auto: annotations and ``with_sharding_constraint``
            calls fixed, the rest chosen from a program-order propagation of them, then
            improved), ``"recursive"`` (near-linear: repeated layers solved once on their
            quotient, exact block descent over forests; see ``recursive.py``), ``"ilp"``
            (exact minimum of the cost model, HiGHS) or ``"auto"`` (ILP when the problem is
            small, else recursive, and a baseline when one is predicted faster; the plan's
            method and notes say which).
        annotations: ``{argument path: PartitionSpec}``, e.g. ``{"params/w1": P(None, "m")}``
            or ``{(0, "w1"): ...}``; fixed, the rest is searched.
        memory_budget: bytes per device the plan must fit (parameters, optimizer state,
            activations, as the cost model estimates them).
        device: a device profile (name or ``DeviceProfile``) for the cost model.
        progress: ``callback(fraction, message)``; raising ``KeyboardInterrupt`` from it (or
            pressing interrupt) returns the best plan so far with ``complete=False``.
        time_limit: seconds the ILP may take before returning its best incumbent.

    Raises:
        SearchError: the function does not trace, an unknown method, unknown or
            contradictory annotation paths, or no plan fits ``memory_budget`` (the message
            gives the smallest per-device memory the search reached).
        ShardingSpecError: an annotation names an unknown mesh axis or does not divide.
    """
    start = time.perf_counter()
    report = progress or (lambda fraction, message: None)
    if method not in METHODS:
        raise SearchError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if not isinstance(mesh, Mesh):
        raise SearchError(f"mesh must be a jax.sharding.Mesh (shardlab.mesh(...)), got {mesh!r}")
    profile = resolve_profile(device)
    sizes = mesh_shape_of(mesh)
    report(0.0, "tracing")
    try:
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    except Exception as e:  # any tracing failure is the user's function's
        raise SearchError(
            f"{getattr(fn, '__name__', fn)!r} does not trace with the given arguments: "
            f"{type(e).__name__}: {e}"
        ) from e
    fixed = resolve_annotations(annotations, fn, args, mesh)
    graph = build_from_jaxpr(closed, unroll_scans=True)
    ties = find_ties(tuple(args), out_shape)
    n_batch = len(jax.tree_util.tree_leaves(args[-1])) if len(args) > 1 else 0
    report(0.1, f"{len(graph.nodes)} equations traced")
    space = build_space(graph, sizes, profile, fixed_inputs=fixed, ties=ties)
    report(0.3, f"{len(space.units)} decisions, {len(space.edges)} edges")
    notes: list[str] = []
    used = method
    if method == "auto":
        size = ilp_size(space)
        used = "ilp" if size <= ILP_MAX_VARIABLES else "recursive"
        notes.append(f"auto chose {used} (ILP size {size} variables, limit {ILP_MAX_VARIABLES})")
    best = _Best(space)
    complete, optimal = True, None
    budget_fn = None
    if memory_budget is not None:
        budget_fn = _budget_solver(space, float(memory_budget), notes, n_batch)
    try:
        if budget_fn is not None:
            choice, optimal = budget_fn(used, best, time_limit, report)
        else:
            choice, optimal = _solve(space, used, best, time_limit=time_limit, extra=None,
                                     memory_rows=[], report=report, notes=notes,
                                     n_batch_leaves=n_batch)  # fmt: skip
    except KeyboardInterrupt:
        choice, complete, optimal = best.choice, False, False
        notes.append("interrupted: the best plan found so far (not complete)")
    choice = tie_scan_choices(space, choice)  # one choice per scan-body equation
    report(0.95, "building the plan")
    binding = binding_for(fn, tuple(args), mesh, (closed, out_shape), graph)
    plan = make_plan(
        space, choice, binding,
        method=used if method != "auto" else f"auto:{used}",
        paths=[path_text(p) for p in leaf_paths(fn, args)],
        optimal=optimal, complete=complete, notes=notes, memory_budget=memory_budget,
        fingerprint=fingerprint(graph), start=start,
    )  # fmt: skip
    if method == "auto" and complete and not annotations:
        plan = _portfolio(plan, fn, tuple(args), mesh, profile, (closed, out_shape, graph),
                          memory_budget)  # fmt: skip
    report(1.0, "done")
    return dataclasses.replace(plan, search_time=time.perf_counter() - start)


def _portfolio(plan: Plan, fn, args, mesh, profile, traced, budget) -> Plan:
    """``auto`` also costs the standard baselines (argument layouts only, the rest
    propagated as the partitioner would) and keeps the cheapest prediction: the search's
    model reduces partial sums where they arise, propagation may defer them."""
    from shardlab.parallel.strategies import baselines

    try:
        options = baselines(fn, *args, mesh=mesh, device=profile, traced=traced)
    except SearchError:  # unusual argument structure: the search's plan stands
        return plan
    fits = {
        name: p for name, p in options.items()
        if budget is None or p.cost.memory.peak <= budget
    }  # fmt: skip
    if not fits:
        return plan
    name, best = min(fits.items(), key=lambda item: item[1].cost.time)
    if best.cost.time >= plan.cost.time * (1 - 1e-6):
        return dataclasses.replace(plan, notes=(*plan.notes, f"auto: the search's plan "
                                   f"beats every baseline (best: {name})"))  # fmt: skip
    note = (
        f"auto: baseline {name} is predicted faster ({best.cost.time * 1e3:.3f} ms) than the "
        f"{plan.method} plan ({plan.cost.time * 1e3:.3f} ms), so it is returned"
    )
    return dataclasses.replace(best, method=f"{plan.method}→{name}",
                               notes=(*plan.notes, note), optimal=None)  # fmt: skip


def _budget_solver(space: Space, budget: float, notes: list[str], n_batch: int):
    """A solver that meets ``budget``: ILP memory rows, or a Lagrangian memory penalty."""

    def solve(method: str, best: _Best, time_limit: float, report) -> tuple[list[int], Any]:
        def fits(choice: list[int]) -> float:
            return memory_of(space, choice)

        choice, optimal = _solve(space, method, best, time_limit=time_limit, extra=None,
                                 memory_rows=[], report=report, notes=notes,
                                 n_batch_leaves=n_batch)  # fmt: skip
        if fits(choice) <= budget:
            return choice, optimal
        if method == "ilp":
            rows = _memory_rows(space, budget)
            choice, optimal = _solve(space, method, best, time_limit=time_limit, extra=None,
                                     memory_rows=rows, report=report, notes=notes)  # fmt: skip
            if fits(choice) <= budget:
                notes.append(f"memory budget {budget:.0f} B met with ILP memory rows")
                return choice, optimal
        # Lagrangian: trade seconds for bytes until the plan fits.
        lam = 1e-3 * max(1e-12, space.total(choice)) / max(1.0, fits(choice))
        smallest = fits(choice)
        for _ in range(40):
            extra = _memory_penalty(space, lam)
            trial, _ = _solve(space, "recursive" if method == "ilp" else method, best,
                              time_limit=time_limit, extra=extra, memory_rows=[],
                              report=report, notes=[], n_batch_leaves=n_batch)  # fmt: skip
            mem = fits(trial)
            smallest = min(smallest, mem)
            if mem <= budget:
                notes.append(
                    f"memory budget {budget:.0f} B met with a memory penalty "
                    f"(λ={lam:.3g} s/B); not proven optimal under the budget"
                )
                return trial, False
            lam *= 3.0
        raise SearchError(
            f"no plan fits memory_budget={budget:.0f} bytes per device; the smallest "
            f"per-device memory the search reached is {smallest:.0f} bytes "
            f"({smallest / 2**20:.2f} MiB). Raise the budget to at least that, or use a "
            "larger mesh."
        )

    return solve
