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

from shardlab.parallel.cost import layouts as L
from shardlab.parallel.cost.memory import peak_points
from shardlab.parallel.cost.profiles import DeviceProfile, resolve_profile
from shardlab.parallel.cost.propagate import propagate
from shardlab.parallel.errors import SearchError
from shardlab.parallel.graph.trace import Traced, trace
from shardlab.parallel.mesh import mesh_shape_of
from shardlab.parallel.plan.binding import Binding
from shardlab.parallel.plan.plan import Plan
from shardlab.parallel.search.annotations import resolve_annotations
from shardlab.parallel.search.baselines import baselines
from shardlab.parallel.search.build import build_space
from shardlab.parallel.search.choice import (
    choice_from_layouts,
    make_plan,
    memory_of,
    peak_buffers,
    space_liveness,
)
from shardlab.parallel.search.ilp import ilp_size, solve_ilp
from shardlab.parallel.search.recursive import solve_recursive
from shardlab.parallel.search.scan_ties import tie_scan_choices
from shardlab.parallel.search.space import Space

METHODS = ("auto", "propagate", "recursive", "ilp")
ILP_MAX_VARIABLES = 20_000
VERIFY_MAX_EQUATIONS = 3_000


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
    """Linear per-device memory rows (``memory_model``): arguments, outputs and the
    intermediates held at the program points with the most bytes held (replicated sizes)."""
    g = space.graph
    points = peak_points(g, space.live, g.nbytes, checkpoints, lv=space_liveness(space))
    return [_memory_row(space, held, budget) for held in points or [frozenset()]]


def _memory_row(space: Space, held: frozenset[int], budget: float):
    """One row: arguments + outputs + the buffers ``held`` in each candidate's layout."""
    g = space.graph
    coeffs = [np.zeros(len(u.cands)) for u in space.units]
    for v in set(g.inputs) | set(g.outputs) | held:
        owner = space.unit_of_var.get(v)
        if owner is None:
            continue
        u, pos = owner
        coeffs[u] += [L.local_bytes(g.nbytes(v), c.outs[pos], space.sizes)
                      for c in space.units[u].cands]  # fmt: skip
    return coeffs, budget


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
    verify_budget: bool | None = None,
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
            activations and temporaries, as the memory model estimates them; checked by
            compiling when ``verify_budget``).
        device: a device profile (name or ``DeviceProfile``) for the cost model.
        progress: ``callback(fraction, message)``; raising ``KeyboardInterrupt`` from it (or
            pressing interrupt) returns the best plan so far with ``complete=False``.
        time_limit: seconds the ILP may take before returning its best incumbent.
        verify_budget: compile the chosen plan to check it fits ``memory_budget`` (XLA's
            buffer assignment is finer than the cost model's), searching again with a
            tighter model budget when it does not. ``None``: only for graphs of at most
            ``VERIFY_MAX_EQUATIONS`` equations, whose compile takes about a second; the
            search itself never compiles.

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
    traced = trace(fn, *args)
    fixed = resolve_annotations(annotations, fn, args, mesh)
    graph, ties = traced.graph, traced.ties
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
    problem = _Problem(traced, mesh, profile)
    if verify_budget is None:
        verify_budget = len(graph.nodes) <= VERIFY_MAX_EQUATIONS
    target = None if memory_budget is None else float(memory_budget)
    budget_bytes = float("inf") if memory_budget is None else float(memory_budget)
    for attempt in range(3 if verify_budget else 1):
        best = _Best(space)
        complete, optimal = True, None
        try:
            if target is not None:
                solve = _budget_solver(
                    space, target, notes, n_batch,
                    lambda: _baseline_seeds(problem, space),
                )  # fmt: skip
                choice, optimal = solve(used, best, time_limit, report)
            else:
                choice, optimal = _solve(space, used, best, time_limit=time_limit, extra=None,
                                         memory_rows=[], report=report, notes=notes,
                                         n_batch_leaves=n_batch)  # fmt: skip
        except KeyboardInterrupt:
            choice, complete, optimal = best.choice, False, False
            notes.append("interrupted: the best plan found so far (not complete)")
        except SearchError as e:
            if attempt == 0:
                raise
            why = f"{notes[-1]}; with the model's budget tightened to {target:.0f} B: {e}"
            plan = _compiled_baseline(problem, budget_bytes, used, notes, why)
            break
        choice = tie_scan_choices(space, choice)  # one choice per scan-body equation
        report(0.95, "building the plan")
        plan = make_plan(
            space,
            choice,
            Binding(traced, mesh),
            method=used if method != "auto" else f"auto:{used}",
            paths=list(traced.paths),
            optimal=optimal,
            complete=complete,
            notes=list(notes),
            memory_budget=memory_budget,
            fingerprint=traced.fingerprint,
            start=start,
        )
        if method == "auto" and complete and not annotations:
            plan = _portfolio(plan, problem, target)
        if memory_budget is None or not verify_budget or not complete:
            break
        report(0.97, "compiling to check the memory budget")
        compiled = plan.verify().memory.total
        if compiled <= memory_budget:
            plan = dataclasses.replace(plan, notes=(*plan.notes, f"compiled per-device memory "
                                       f"{compiled} B fits the budget"))  # fmt: skip
            break
        assert target is not None
        target *= 0.98 * memory_budget / compiled
        notes.append(
            f"the plan compiles to {compiled} B per device, over the budget "
            f"{memory_budget:.0f} B (the model predicted {plan.cost.memory.peak} B)"
        )
    else:
        why = f"{notes[-1]} after 3 tightened searches"
        plan = _compiled_baseline(problem, budget_bytes, used, notes, why)
    report(1.0, "done")
    return dataclasses.replace(plan, search_time=time.perf_counter() - start)


@dataclasses.dataclass(frozen=True)
class _Problem:
    """What the search works on: the traced function, the mesh and the device profile."""

    traced: Traced
    mesh: Mesh
    profile: DeviceProfile

    def baselines(self) -> dict[str, Plan]:
        """The standard baselines on the same trace; ``{}`` for an argument structure they
        do not fit."""
        try:
            return baselines(
                self.traced.fn,
                *self.traced.args,
                mesh=self.mesh,
                device=self.profile,
                traced=self.traced,
            )
        except SearchError:  # unusual argument structure: no baselines
            return {}


def _compiled_baseline(
    problem: _Problem, budget: float, used: str, notes: list[str], why: str
) -> Plan:
    """The fastest (predicted) baseline whose compiled memory fits ``budget``, when the
    searched plans' compiled memory does not (the model under-predicted XLA's buffers).

    Raises:
        SearchError: no baseline compiles within the budget either (``why``: what the
            search tried).
    """
    options = problem.baselines()
    for name, p in sorted(options.items(), key=lambda item: item[1].cost.time):
        compiled = p.verify().memory.total
        if compiled <= budget:
            note = (f"the searched plans compile over the budget, so the fastest baseline that "
                    f"compiles within it is returned: {name} ({compiled} B)")  # fmt: skip
            return dataclasses.replace(p, method=f"{used}→{name}", optimal=None,
                                       notes=(*notes, note), memory_budget=int(budget))  # fmt: skip
    raise SearchError(
        f"no plan fits memory_budget={budget:.0f} bytes per device once compiled: {why}; no "
        "baseline compiles within it either. Raise the budget, or use a larger mesh."
    )


def _portfolio(plan: Plan, problem: _Problem, budget: float | None) -> Plan:
    """``auto`` also costs the standard baselines (argument layouts only, the rest
    propagated as the partitioner would) and keeps the cheapest prediction: the search's
    model reduces partial sums where they arise, propagation may defer them."""
    options = problem.baselines()
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


def _baseline_seeds(problem: _Problem, space: Space):
    """``(name, choice)`` of the standard baselines mapped into the space (start points
    and fallbacks for a memory budget)."""
    g = space.graph
    plans = problem.baselines()
    out = []
    for name, plan in plans.items():
        outs = [plan.input_specs[space.ties[p]] if p in space.ties else None
                for p in range(len(g.outputs))]  # fmt: skip
        prop = propagate(
            g, list(plan.input_specs), space.sizes, problem.profile, output_layouts=outs
        )
        out.append((name, choice_from_layouts(space, prop.layouts)))
    return out


def _budget_solver(space: Space, budget: float, notes: list[str], n_batch: int, seeds):
    """A solver that meets ``budget``: the plain optimum if it fits, else the cheapest of
    what fits among ILP memory rows (with cuts), a Lagrangian memory penalty and the
    baselines mapped into the space (``seeds()``)."""

    def solve(method: str, best: _Best, time_limit: float, report) -> tuple[list[int], Any]:
        def fits(choice: list[int]) -> float:
            return memory_of(space, choice)

        choice, optimal = _solve(space, method, best, time_limit=time_limit, extra=None,
                                 memory_rows=[], report=report, notes=notes,
                                 n_batch_leaves=n_batch)  # fmt: skip
        if fits(choice) <= budget:
            return choice, optimal
        smallest = fits(choice)
        found: list[tuple[float, list[int], Any, str]] = []
        if method == "ilp":
            # Rows at the replicated profile's peaks, then a cut at each solution's own peak
            # until the solution fits (the peak moves with the layouts).
            # One time limit for all the cuts together.
            rows = _memory_rows(space, budget)
            deadline = time.perf_counter() + time_limit
            for _ in range(8):
                left = deadline - time.perf_counter()
                if left < 0.5:
                    break
                choice, optimal = _solve(space, method, best, time_limit=left,
                                         extra=None, memory_rows=rows, report=report,
                                         notes=notes)  # fmt: skip
                mem = fits(choice)
                smallest = min(smallest, mem)
                if mem <= budget:
                    found.append((space.total(choice), choice, optimal,
                                  f"{len(rows)} ILP memory rows"))  # fmt: skip
                    break
                rows.append(_memory_row(space, peak_buffers(space, choice), budget))
        # Lagrangian: trade seconds for bytes until the plan fits.
        lam = 1e-3 * max(1e-12, space.total(choice)) / max(1.0, fits(choice))
        for _ in range(40 if not found else 0):
            extra = _memory_penalty(space, lam)
            trial, _ = _solve(space, "recursive" if method == "ilp" else method, best,
                              time_limit=time_limit, extra=extra, memory_rows=[],
                              report=report, notes=[], n_batch_leaves=n_batch)  # fmt: skip
            mem = fits(trial)
            smallest = min(smallest, mem)
            if mem <= budget:
                found.append((space.total(trial), trial, False,
                              f"a memory penalty (λ={lam:.3g} s/B)"))  # fmt: skip
                break
            lam *= 3.0
        for name, seed in seeds():
            mem = fits(seed)
            smallest = min(smallest, mem)
            if mem <= budget:
                found.append((space.total(seed), seed, False, f"the {name} baseline's layouts"))
        if found:
            _, choice, optimal, how = min(found, key=lambda f: f[0])
            notes.append(
                f"memory budget {budget:.0f} B met with {how}"
                + ("" if optimal else "; not proven optimal under the budget")
            )
            return choice, optimal
        raise SearchError(
            f"no plan fits memory_budget={budget:.0f} bytes per device; the smallest "
            f"per-device memory the search reached is {smallest:.0f} bytes "
            f"({smallest / 2**20:.2f} MiB). Raise the budget to at least that, or use a "
            "larger mesh."
        )

    return solve
