"""``shardlab.search``: from a function, example arguments and a mesh to a ``Plan``.

Trace once (``graph/trace.py``), build the strategy space (``build.py``), choose one candidate per unit with the
requested method, and turn the choice into a plan: input/output layouts, the intermediate
constraints that pin it, its predicted ``CostBreakdown`` and a table of decisions. Nothing
is compiled to decide between candidates inside a method; ``auto`` alone compiles its plan
and a few baselines at the end to confirm its choice (``confirm.py``), and a memory budget
may be checked by compiling.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import time
from collections.abc import Callable, Mapping
from typing import Any

from jax.sharding import Mesh

from shardlab.parallel.cost.profiles import DeviceProfile, resolve_profile
from shardlab.parallel.display import human_bytes, search_finish, with_progress
from shardlab.parallel.errors import SearchError
from shardlab.parallel.graph.trace import trace
from shardlab.parallel.plan.binding import Binding
from shardlab.parallel.plan.pipeline import with_pipeline
from shardlab.parallel.plan.plan import Plan
from shardlab.parallel.records import PipelineSpec
from shardlab.parallel.search.annotations import resolve_annotations
from shardlab.parallel.search.auto import (
    baseline_seeds,
    compiled_baseline,
    confirmed,
    in_background,
    portfolio,
)
from shardlab.parallel.search.choice import (
    make_plan,
)
from shardlab.parallel.search.problem import Problem
from shardlab.parallel.search.solve.bounds import check_budget
from shardlab.parallel.search.solve.budget import solve_within_budget
from shardlab.parallel.search.solve.ilp import ilp_size
from shardlab.parallel.search.solve.methods import Best, Solver
from shardlab.parallel.search.space.build import build_space
from shardlab.parallel.search.space.scan_ties import tie_scan_choices
from shardlab.parallel.search.strategies.mix import choose, remat_specs, unreachable
from shardlab.parallel.search.strategies.stages import PipelineChoice, choose_pipeline
from shardlab.parallel.targets.target import target_of

METHODS = ("auto", "propagate", "recursive", "ilp")
ILP_MAX_VARIABLES = 20_000
VERIFY_MAX_EQUATIONS = 3_000


def _without_gc(f: Callable[..., Plan]) -> Callable[..., Plan]:
    """Run ``f`` with Python's cyclic garbage collector paused: the search allocates many
    small records, and a full collection in the middle of it costs a tenth of a second and
    more on a large graph (nothing it builds is cyclic garbage worth collecting early)."""

    @functools.wraps(f)
    def run(*args: Any, **kwargs: Any) -> Plan:
        collecting = gc.isenabled()
        gc.disable()
        try:
            return f(*args, **kwargs)
        finally:
            if collecting:
                gc.enable()

    return run


@_without_gc
@with_progress("search", search_finish)  # a bar after ~1 s when no progress= is given
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
    confirm: bool | str | None = None,
    pipeline: str | bool | int | None = None,
    microbatches: int | None = None,
) -> Plan:
    """Search a sharding strategy for ``fn(*args)`` on ``mesh``.

    Args:
        fn: the function (a forward pass or a whole train step).
        *args: example arguments: arrays placed anywhere (their placement is not read) or
            ``jax.ShapeDtypeStruct``, in any pytree (an equinox module included); non-array
            leaves (functions, strings, bools) are static (``parallel/arguments.py``).
        mesh: the device mesh.
        method: ``"propagate"`` (semi-auto: annotations and ``with_sharding_constraint``
            calls fixed, the rest chosen from a program-order propagation of them, then
            improved), ``"recursive"`` (near-linear: repeated layers solved once on their
            quotient, exact block descent over forests; see ``recursive.py``), ``"ilp"``
            (exact minimum of the cost model, HiGHS) or ``"auto"`` (ILP when the problem is
            small, else recursive, then compared with the standard baselines, compiled when
            ``confirm``; a baseline is returned when it is faster, e.g. method
            ``auto:ilp→data_parallel``; the plan's method and notes say which and why).
        annotations: ``{argument path: PartitionSpec}``, e.g. ``{"params/w1": P(None, "m")}``
            or ``{(0, "w1"): ...}``; fixed, the rest is searched.
        memory_budget: bytes per device the plan must fit (parameters, optimizer state,
            activations and temporaries, as the memory model estimates them; checked by
            compiling when ``verify_budget``). On a mesh over a ``shardlab.target`` it is the
            device's memory (the target profile's HBM) unless given.
        device: a device profile (name or ``DeviceProfile``) for the cost model.
        progress: ``callback(fraction, message)``; raising ``KeyboardInterrupt`` from it (or
            pressing interrupt) returns the best plan so far with ``complete=False``.
        time_limit: seconds the ILP may take before returning its best incumbent.
        verify_budget: compile the chosen plan to check it fits ``memory_budget`` (XLA's
            buffer assignment is finer than the cost model's), searching again with a
            tighter model budget when it does not. ``None``: only for graphs of at most
            ``VERIFY_MAX_EQUATIONS`` equations, whose compile takes about a second; the
            search itself never compiles.
        confirm: for ``method="auto"`` without annotations, compile the search's plan and
            a few baselines before returning, and return the one with the lowest *compiled*
            objective (alpha-beta seconds of the compiled collectives under ``device`` plus
            the roofline of the compiled per-device flops and bytes accessed; a baseline
            must be faster by ``confirm.TIE`` (0.5 %) to replace the search's plan); one
            over ``memory_budget`` once compiled is not eligible. Deterministic: every
            figure is read from the compiled program, none from a clock. Compiled are the search's plan,
            the three baselines the cost model predicts cheapest (where its ranking is most
            likely to be wrong in a way that matters) and data parallel (the reference any
            comparison makes), each layout once: about a second per compile on a small
            graph. The notes give the predicted and the compiled figures. ``None``: only for
            graphs of at most ``VERIFY_MAX_EQUATIONS`` equations (larger ones say in their
            notes how to confirm); ``False``: the predicted ranking alone decides (no
            compile); ``"background"``: return the predicted ranking's choice at once and
            compile in a background thread — ``plan.confirmed()`` waits for the confirmed
            plan. ``shardlab.confirm(plan)`` confirms a plan later, on request.

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
    report(0.0, "tracing")
    problem = Problem(trace(fn, *args), mesh, resolve_profile(device, mesh))
    traced, graph, sizes, profile = problem.traced, problem.graph, problem.sizes, problem.profile
    if memory_budget is None and target_of(mesh) is not None:  # real devices hold so much
        memory_budget = float(profile.memory_bytes)
    fixed = resolve_annotations(annotations, fn, traced.dynamic_args, mesh)
    n_batch = traced.arg_of_leaf.count(len(args) - 1) if len(args) > 1 else 0
    report(0.1, f"{len(graph.nodes)} equations traced")
    if memory_budget is not None:  # refuse an impossible budget before searching
        check_budget(graph, sizes, float(memory_budget))
    if pipeline is None:
        pipeline = "auto" if "stage" in sizes else False
    staging, pipeline_note = None, None
    if pipeline is not False:  # bad stage or microbatch counts fail before searching
        report(0.12, "pricing pipeline stages")
        staging, pipeline_note = _staging(problem, fn, args, pipeline, microbatches, memory_budget)
    space = build_space(graph, sizes, profile, fixed_inputs=fixed, ties=traced.ties)
    report(0.3, f"{len(space.units)} decisions, {len(space.edges)} edges")
    notes: list[str] = []
    used = method
    if method == "auto":
        size = ilp_size(space)
        used = "ilp" if size <= ILP_MAX_VARIABLES else "recursive"
        notes.append(f"auto chose {used} (ILP size {size} variables, limit {ILP_MAX_VARIABLES})")
    if verify_budget is None:
        verify_budget = len(graph.nodes) <= VERIFY_MAX_EQUATIONS
    if confirm not in (None, True, False, "background"):
        raise SearchError(f"confirm={confirm!r}: use True, False, None or 'background'")
    unconfirmed_note = None
    if confirm is None:
        confirm = len(graph.nodes) <= VERIFY_MAX_EQUATIONS
        if not confirm:
            unconfirmed_note = (
                f"not confirmed by compiling ({len(graph.nodes):,} equations, more than "
                f"{VERIFY_MAX_EQUATIONS:,}: each compile takes long): shardlab.confirm(plan) "
                'compiles it and the baselines on request, search(..., confirm="background") '
                "while you work"
            )
    target = None if memory_budget is None else float(memory_budget)
    budget_bytes = float("inf") if memory_budget is None else float(memory_budget)
    failure: SearchError | None = None
    try:
        for attempt in range(3 if verify_budget else 1):
            best = Best(space)
            solver = Solver(space, best, report, notes, n_batch)
            complete, optimal = True, None
            try:
                if target is not None:
                    choice, optimal = solve_within_budget(
                        solver,
                        used,
                        target,
                        time_limit=time_limit,
                        seeds=lambda: baseline_seeds(problem, space),
                    )
                else:
                    choice, optimal = solver.run(used, time_limit=time_limit)
            except KeyboardInterrupt:
                choice, complete, optimal = best.choice, False, False
                notes.append("interrupted: the best plan found so far (not complete)")
            except SearchError as e:
                if attempt == 0:
                    raise
                why = f"{notes[-1]}; with the model's budget tightened to {target:.0f} B: {e}"
                plan = compiled_baseline(problem, budget_bytes, used, notes, why)
                break
            choice = tie_scan_choices(space, choice)  # one choice per scan-body equation
            report(0.95, "building the plan")
            plan = make_plan(
                space,
                choice,
                Binding(traced, mesh),
                method=used if method != "auto" else f"auto:{used}",
                optimal=optimal,
                complete=complete,
                notes=list(notes),
                memory_budget=memory_budget,
                start=start,
            )
            if method == "auto" and complete and not annotations:
                plan = _auto_choice(plan, problem, confirm, memory_budget, target, report)
                if not confirm and unconfirmed_note is not None:
                    plan = dataclasses.replace(plan, notes=(*plan.notes, unconfirmed_note))
            if memory_budget is None or not verify_budget or not complete:
                break
            report(0.97, "compiling to check the memory budget")
            compiled = problem.reports.get(plan).memory.total  # reused when auto confirmed it
            if compiled <= memory_budget:
                plan = dataclasses.replace(
                    plan,
                    notes=(*plan.notes, f"compiled per-device memory {compiled} B fits the budget"),
                )
                break
            assert target is not None
            target *= 0.98 * memory_budget / compiled
            notes.append(
                f"the plan compiles to {compiled} B per device, over the budget "
                f"{memory_budget:.0f} B (the model predicted {plan.cost.memory.peak} B)"
            )
        else:
            why = f"{notes[-1]} after 3 tightened searches"
            plan = compiled_baseline(problem, budget_bytes, used, notes, why)
    except SearchError as e:  # no searched plan or baseline fits: remat or stages may
        if memory_budget is None:
            raise
        plan, failure = None, e
    if memory_budget is not None:
        report(0.98, "pricing remat and ZeRO mixes")
        plan = _mixed(plan, failure, problem, float(memory_budget), verify_budget, staging)
    if staging is not None:
        plan = _with_stages(plan, problem, staging, pipeline, memory_budget, bool(verify_budget))
    elif pipeline_note is not None and plan is not None:  # auto: stages could not be priced
        plan = dataclasses.replace(plan, notes=(*plan.notes, pipeline_note))
    assert plan is not None  # _mixed returns None only when a staging can still fit
    report(1.0, "done")
    plan = dataclasses.replace(plan, search_time=time.perf_counter() - start)
    levels = problem.profile.levels_note(plan.cost.collectives)
    if levels:
        plan = dataclasses.replace(plan, notes=(*plan.notes, levels))
    compiled = problem.reports.known(plan)  # compiled while searching
    return plan if compiled is None else plan.with_compiled(compiled)


def _staging(
    problem: Problem,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    pipeline: str | bool | int,
    microbatches: int | None,
    memory_budget: float | None,
) -> tuple[PipelineChoice | None, str | None]:
    """The pipelines the schedule simulator prices for this problem (``stages.py``), or,
    for ``pipeline="auto"``, none and the note saying why stages were not tried. (``args``
    are the user's, as ``search`` got them: the pipeline's trace is the same memoised one.)"""
    try:
        staged = choose_pipeline(
            fn,
            *args,
            mesh=problem.mesh,
            memory_budget=memory_budget,
            pipeline=pipeline,
            microbatches=microbatches,
            device=problem.profile,
        )
    except SearchError as e:
        if pipeline != "auto":
            raise
        return None, f"pipeline: no stages tried ({e})"
    return staged, None


def _auto_choice(
    plan: Plan,
    problem: Problem,
    confirm: bool | str,
    memory_budget: float | None,
    target: float | None,
    report: Callable[[float, str], None],
) -> Plan:
    """``auto``'s plan against the baselines (``auto.py``): compiled now, in the
    background, or by the cost model's prediction alone."""
    if confirm == "background":
        return in_background(plan, problem, memory_budget, target)
    if confirm:
        return confirmed(plan, problem, memory_budget, target, report)
    return portfolio(plan, problem, target)


def _mixed(
    plan: Plan | None,
    failure: SearchError | None,
    problem: Problem,
    budget: float,
    verify: bool,
    staging: PipelineChoice | None,
) -> Plan | None:
    """Under ``budget``: the fastest of the search's plan and the sharding × ZeRO × remat
    mixes that fits (``mix.py``), compiled to check when ``verify``. ``None`` when none fits
    but a pipeline might (``_with_stages`` decides); a ``SearchError`` naming the smallest
    peak reached per dimension when nothing can."""
    if plan is not None and not remat_specs(plan):
        return plan  # it fits, and without a layer scan there is no remat to trade for time
    compiled = (lambda p: problem.reports.get(p).memory.total) if verify else None
    got = choose(plan, problem.budget_baselines, budget, compiled)
    if got.chosen is None:
        if staging is not None and any(row[5] <= budget for row in staging.tried):
            return None
        if plan is not None:  # the search's plan fits as compiled; the mixes do not
            return plan
        why = unreachable(got.tried, budget)
        raise SearchError(f"{failure}; {why}" if failure is not None else why)
    chosen = got.chosen
    if chosen.name == "search" and plan is not None:
        return dataclasses.replace(plan, notes=(*plan.notes, *got.notes))
    base = plan.notes if plan is not None else (f"sharding alone: {failure}",)
    return dataclasses.replace(
        chosen.plan,
        method=(f"{plan.method}→{chosen.name}" if plan is not None else f"budget→{chosen.name}"),
        optimal=None,
        notes=(*base, *chosen.plan.notes, *got.notes),
        memory_budget=int(budget),
    )


def _with_stages(
    plan: Plan | None,
    problem: Problem,
    choice: PipelineChoice,
    pipeline: str | bool | int,
    memory_budget: float | None,
    verify: bool = False,
) -> Plan:
    """``plan``, or a pipelined baseline when stages pay (``"auto"``) or were asked for (a
    number): the best pipeline the schedule simulator priced (``choice``) within the
    budget, its cost the simulator's, its notes saying what was compared. With ``verify``
    and a budget, each candidate (the 3 fastest at most) is compiled: XLA's buffers decide."""
    budget = float("inf") if memory_budget is None else float(memory_budget)
    fitting = [row for row in choice.tried if row[5] <= budget]
    if not fitting:
        if pipeline == "auto" and plan is not None:
            return dataclasses.replace(plan, notes=(*plan.notes, f"pipeline: {choice.reason}"))
        raise SearchError(
            f"pipeline={pipeline}: no pipelined plan fits memory_budget={budget:.0f} bytes "
            f"per device ({choice.reason}); try more microbatches, remat, or a larger budget"
        )
    fitting.sort(key=lambda row: (row[4], row[0], row[1], row[3]))
    rejected: list[str] = []
    for stages, micro, schedule, layout, seconds, _ in fitting[:3]:
        if plan is not None and pipeline == "auto" and seconds >= plan.cost.time:
            note = (
                f"pipeline: stages do not pay: the best pipeline ({stages} stages × {micro} "
                f"microbatches, {schedule}, {layout} inside) is predicted at "
                f"{seconds * 1e3:.3f} ms, this plan at {plan.cost.time * 1e3:.3f} ms"
            )
            return dataclasses.replace(plan, notes=(*plan.notes, *rejected, note))
        spec = PipelineSpec(stages, micro, schedule=schedule)
        piped = with_pipeline(problem.baselines[layout], spec)
        if verify and memory_budget is not None:
            compiled = problem.reports.get(piped).memory.total
            if compiled > budget:
                rejected.append(
                    f"pipeline: {stages} stages × {micro} microbatches ({layout} inside) is "
                    f"predicted at {human_bytes(piped.cost.memory.peak)} per device but "
                    f"compiles to {human_bytes(compiled)}, over the budget"
                )
                continue
        note = (
            f"pipeline: {stages} stages × {micro} microbatches ({schedule}, {layout} inside "
            f"each stage) predicted at {piped.cost.time * 1e3:.3f} ms against "
            + (
                f"{plan.cost.time * 1e3:.3f} ms for the unpipelined {plan.method}"
                if plan is not None
                else "no unpipelined plan fitting the budget"
            )
        )
        extra = (choice.stages.note,) if choice.stages is not None else ()
        return dataclasses.replace(
            piped,
            method=f"{plan.method if plan is not None else 'budget'}→pipeline+{layout}",
            optimal=None,
            notes=(
                *(plan.notes if plan is not None else ()),
                *piped.notes,
                *rejected,
                note,
                *extra,
            ),
            memory_budget=plan.memory_budget if plan is not None else int(budget),
        )
    if plan is not None and pipeline == "auto":
        return dataclasses.replace(plan, notes=(*plan.notes, *rejected))
    raise SearchError(
        f"pipeline={pipeline}: no pipelined plan fits memory_budget={budget:.0f} bytes per "
        f"device once compiled ({'; '.join(rejected)}); try more microbatches, remat, or a "
        "larger budget"
    )
