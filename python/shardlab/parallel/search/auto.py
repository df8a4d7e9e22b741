"""What ``auto`` does after the solver: the search's plan against the standard baselines —
by the cost model's prediction (``portfolio``), or confirmed by compiling them (``confirm.py``),
now or in a background thread (``plan.confirmed()``), or later on request
(``shardlab.confirm``); and, under a memory budget, the baselines as seeds and as the compiled
fallback."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable

from shardlab.parallel.cost.profiles import DeviceProfile, resolve_profile
from shardlab.parallel.cost.propagate import propagate
from shardlab.parallel.errors import SearchError
from shardlab.parallel.plan.fixed import partitioned_cost
from shardlab.parallel.plan.plan import Plan
from shardlab.parallel.search.choice import choice_from_layouts
from shardlab.parallel.search.confirm import confirm as confirm_compiled
from shardlab.parallel.search.problem import Problem
from shardlab.parallel.search.space.space import Space

__all__ = [
    "baseline_seeds",
    "compiled_baseline",
    "confirm_plan",
    "confirmed",
    "in_background",
    "portfolio",
]


def compiled_baseline(
    problem: Problem, budget: float, used: str, notes: list[str], why: str
) -> Plan:
    """The fastest (predicted) baseline whose compiled memory fits ``budget``, when the
    searched plans' compiled memory does not (the model under-predicted XLA's buffers).

    Raises:
        SearchError: no baseline compiles within the budget either (``why``: what the
            search tried).
    """
    options = problem.baselines
    for name, p in sorted(options.items(), key=lambda item: item[1].cost.time):
        compiled = problem.reports.get(p).memory.total
        if compiled <= budget:
            note = (
                f"the searched plans compile over the budget, so the fastest baseline that "
                f"compiles within it is returned: {name} ({compiled} B)"
            )
            return dataclasses.replace(
                p,
                method=f"{used}→{name}",
                optimal=None,
                notes=(*notes, note),
                memory_budget=int(budget),
            )
    raise SearchError(
        f"no plan fits memory_budget={budget:.0f} bytes per device once compiled: {why}; no "
        "baseline compiles within it either. Raise the budget, or use a larger mesh."
    )


def confirmed(
    plan: Plan,
    problem: Problem,
    memory_budget: float | None,
    target: float | None,
    report: Callable[[float, str], None],
) -> Plan:
    """``auto``'s choice confirmed on compiled truth (``confirm.py``): the search's plan or
    a baseline, whichever compiles to the lowest objective within ``memory_budget``. An
    interrupt while compiling falls back to the predicted ranking (``portfolio``)."""
    try:
        chosen, _ = confirm_compiled(
            plan, problem.baselines, problem.profile, memory_budget, problem.reports, report
        )
    except KeyboardInterrupt:
        plan = dataclasses.replace(
            plan,
            notes=(
                *plan.notes,
                "interrupted while compiling to confirm: the predicted ranking decides",
            ),
        )
        return portfolio(plan, problem, target)
    return chosen


_BACKGROUND = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="confirm")


def in_background(
    plan: Plan, problem: Problem, memory_budget: float | None, target: float | None
) -> Plan:
    """The predicted ranking's choice now, the compiled one later (``plan.confirmed()``)."""
    future = _BACKGROUND.submit(
        confirmed, plan, problem, memory_budget, target, lambda fraction, message: None
    )
    chosen = portfolio(plan, problem, target)
    note = "confirming by compiling in the background: plan.confirmed() returns the result"
    return dataclasses.replace(chosen, notes=(*chosen.notes, note), confirmation=future)


def confirm_plan(
    plan: Plan,
    *,
    device: str | DeviceProfile | None = None,
    memory_budget: float | None = None,
    background: bool = False,
) -> Plan | concurrent.futures.Future[Plan]:
    """Confirm ``plan`` on compiled programs, on request (``shardlab.confirm``).

    Compiles the plan, the three baselines the cost model predicts cheapest and data
    parallel, and returns the one with the lowest compiled objective, as
    ``search(..., confirm=True)`` does (see ``confirm.py``); its notes give the predicted
    and compiled figures. ``device`` defaults to the profile the plan was costed with,
    ``memory_budget`` to the plan's own. With ``background=True`` the compiles run in a
    background thread and a ``concurrent.futures.Future`` of the plan is returned.

    Raises:
        SearchError: the plan is not bound to a function (``plan.bind(fn, *args, mesh=m)``).
    """
    binding = plan.binding
    if binding is None:
        raise SearchError(
            "shardlab.confirm(plan) needs a bound plan: plan.bind(fn, *args, mesh=mesh) first"
        )
    problem = Problem(
        binding.traced, binding.mesh, resolve_profile(device or plan.cost.device, binding.mesh)
    )
    budget = plan.memory_budget if memory_budget is None else memory_budget
    target = None if budget is None else float(budget)
    args = (plan, problem, budget, target, lambda fraction, message: None)
    if background:
        return _BACKGROUND.submit(confirmed, *args)
    return confirmed(*args)


def portfolio(plan: Plan, problem: Problem, budget: float | None) -> Plan:
    """``auto`` also costs the standard baselines (argument layouts only, the rest
    propagated as the partitioner would) and keeps the cheapest prediction: the search's
    model reduces partial sums where they arise, propagation may defer them."""
    options = problem.baselines
    fits = {
        name: p for name, p in options.items() if budget is None or p.cost.memory.peak <= budget
    }
    if not fits:
        return plan
    name, best = min(fits.items(), key=lambda item: item[1].cost.time)
    # the baselines are priced as the partitioner propagates their layouts: so is the plan;
    # a tie in time and memory goes to the baseline, as confirming does (confirm._choose)
    as_placed = partitioned_cost(plan, problem.profile)
    placed = as_placed.time
    tie = best.cost.time <= placed * (1 + 1e-6) and (best.cost.memory.peak <= as_placed.memory.peak)
    if best.cost.time >= placed * (1 - 1e-6) and not tie:
        note = (
            f"auto: the cost model predicts the search's plan faster than every baseline "
            f"(best: {name}); not confirmed by compiling"
        )
        return dataclasses.replace(plan, notes=(*plan.notes, note))
    how = "as fast, in no more memory, with no constraints," if tie else "faster"
    note = (
        f"auto: baseline {name} is predicted {how} ({best.cost.time * 1e3:.3f} ms) than the "
        f"{plan.method} plan ({placed * 1e3:.3f} ms as the partitioner propagates its "
        "layouts), so it is returned"
    )
    return dataclasses.replace(
        best, method=f"{plan.method}→{name}", notes=(*plan.notes, note), optimal=None
    )


def baseline_seeds(problem: Problem, space: Space):
    """``(name, choice)`` of the standard baselines mapped into the space (start points
    and fallbacks for a memory budget)."""
    g = space.graph
    plans = problem.baselines
    out = []
    for name, plan in plans.items():
        outs = [
            plan.input_specs[space.ties[p]] if p in space.ties else None
            for p in range(len(g.outputs))
        ]
        prop = propagate(
            g, list(plan.input_specs), space.sizes, problem.profile, output_layouts=outs
        )
        out.append((name, choice_from_layouts(space, prop.mesh_layouts(g.shapes))))
    return out
