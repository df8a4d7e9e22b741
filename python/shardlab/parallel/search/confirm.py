"""``auto``'s last step: confirm its choice on compiled truth (issue 17).

The cost model ranks the search's plan against the standard baselines; on models it
misprices, the predicted-cheapest plan can compile to several times the communication of
data parallel. So before ``auto`` returns, the search's plan and a few baselines are
compiled and the one with the lowest *compiled objective* is returned:

    objective = alpha-beta seconds of the compiled collectives (``profile.time_of``, each
                counted its trip count)
              + ``profile.program_time(flops, bytes accessed)``: the roofline of the compiled
                program's per-device totals, max(flops / achievable flop rate, bytes /
                achievable memory bandwidth)

Every figure is read from the compiled program (HLO collectives, ``cost_analysis`` flops and
bytes accessed), never from a clock, so the choice does not depend on machine load. The
roofline matters: flops at peak alone call a replicated weight that every device streams
free, and would prefer data parallel to Megatron for a small-batch, wide layer where the
cost model (a roofline per operation) rightly prefers Megatron; a roofline of the totals is
the program-level form of the same model (never above the sum of per-operation rooflines).

A candidate whose compiled per-device memory exceeds the budget is not eligible. Among ties
(within ``TIE``) the least compiled memory wins, and on that a baseline before the search's
own plan (``_choose``). Each plan is compiled once: ``Reports`` memoises by layout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence

from shardlab._core.units import human_bytes
from shardlab.parallel.cost.profiles import DeviceProfile, comm_time
from shardlab.parallel.plan.plan import Plan
from shardlab.parallel.records import Report

BASELINES_COMPILED = 3  # the cheapest predicted baselines compiled, plus data_parallel
REFERENCE = "data_parallel"
TIE = 0.005
"""Relative margin by which a baseline must compile faster to replace the search's plan (and
by which the search's plan must beat every baseline for the notes to say so): plans with the
same collectives differ in compiled flops by a few fusions, which is no reason to switch."""


def plan_key(plan: Plan) -> Hashable:
    """What decides a plan's compiled program within one search (one binding): its
    layouts, constraints, stages and remat."""
    return plan.program_key()


def compile_plan(plan: Plan) -> Report:
    """One compile of ``plan`` (``plan.verify()``)."""
    return plan.verify()


@dataclasses.dataclass
class Reports:
    """Compiled figures by plan layout, so no plan is compiled twice in one search."""

    by_key: dict[Hashable, Report] = dataclasses.field(default_factory=dict)

    def known(self, plan: Plan) -> Report | None:
        """The plan's compiled report if this search compiled it, else None."""
        return self.by_key.get(plan_key(plan))

    def get(self, plan: Plan) -> Report:
        """The plan's compiled report, compiling on the first request."""
        key = plan_key(plan)
        if key not in self.by_key:
            self.by_key[key] = compile_plan(plan)
        return self.by_key[key]


@dataclasses.dataclass(frozen=True)
class Compiled:
    """One candidate's compiled figures under the search's profile."""

    name: str
    plan: Plan
    report: Report
    comm_time: float
    compute_time: float
    eligible: bool

    @property
    def objective(self) -> float:
        return self.comm_time + self.compute_time


def compiled_objective(report: Report, profile: DeviceProfile) -> tuple[float, float]:
    """``(comm seconds, compute seconds)`` of a compiled program (see the module docstring)."""
    comm = comm_time(report.collectives, profile)
    return comm, profile.program_time(report.flops, report.bytes_accessed)


def choose_candidates(
    searched: Plan, baselines: Mapping[str, Plan], budget: float | None
) -> list[tuple[str, Plan]]:
    """The search's plan, then the ``BASELINES_COMPILED`` cheapest predicted baselines that
    fit ``budget`` by prediction, then data parallel (the reference every comparison makes)
    if it fits and is not among them; a baseline with the same layouts as an earlier
    candidate is dropped (it compiles to the same program)."""
    fits = sorted(
        (
            (name, p)
            for name, p in baselines.items()
            if budget is None or p.cost.memory.peak <= budget
        ),
        key=lambda item: item[1].cost.time,
    )
    picked = fits[:BASELINES_COMPILED]
    picked += [(n, p) for n, p in fits[BASELINES_COMPILED:] if n == REFERENCE]
    out: list[tuple[str, Plan]] = [(searched.method, searched)]
    seen = {plan_key(searched)}
    for name, p in picked:
        if plan_key(p) not in seen:
            seen.add(plan_key(p))
            out.append((name, p))
    return out


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def size(nbytes: float) -> str:
    """Bytes in human units, two decimals (budgets are compared at that precision)."""
    return human_bytes(nbytes, digits=2)


def confirm(
    searched: Plan,
    baselines: Mapping[str, Plan],
    profile: DeviceProfile,
    budget: float | None,
    reports: Reports,
    report: Callable[[float, str], None],
    fraction: tuple[float, float] = (0.95, 0.97),
) -> tuple[Plan, Report]:
    """Compile the search's plan and the chosen baselines; return the eligible one with the
    lowest compiled objective (ties: the search's plan) and its report, with notes giving
    the compiled comparison. When none fits ``budget`` once compiled, the search's plan is
    returned (the caller's budget check then tightens the search).

    ``report(fraction, message)`` is called before each compile; a ``KeyboardInterrupt``
    from it propagates (the caller falls back to the predicted ranking).
    """
    candidates = choose_candidates(searched, baselines, budget)
    lo, hi = fraction
    done: list[Compiled] = []
    failed: list[str] = []
    for i, (name, p) in enumerate(candidates):
        report(lo + (hi - lo) * i / len(candidates), f"compiling {name} to confirm")
        try:
            r = reports.get(p)
        except Exception as e:  # a baseline is optional; the search's own plan must compile
            if i == 0:
                raise
            failed.append(f"{name} did not compile ({type(e).__name__}), so is not compared")
            continue
        comm, compute = compiled_objective(r, profile)
        fits = budget is None or r.memory.total <= budget
        done.append(Compiled(name, p, r, comm, compute, fits))
    own = done[0]
    eligible = [c for c in done if c.eligible]
    best = _choose(eligible, own) if eligible else own
    notes = [
        _predicted_line(searched, candidates),
        _compiled_line(done, best, budget, profile),
        _verdict(own, best, done),
        *failed,
    ]
    if best is own:
        return dataclasses.replace(searched, notes=(*searched.notes, *notes)), own.report
    chosen = dataclasses.replace(
        best.plan,
        method=f"{searched.method}→{best.name}",
        optimal=None,
        notes=(*searched.notes, *notes),
        memory_budget=searched.memory_budget,
    )
    return chosen, best.report


def _choose(eligible: Sequence[Compiled], own: Compiled) -> Compiled:
    """The lowest objective; among the candidates within ``TIE`` of it, the least compiled
    memory (within ``TIE``); among those, a baseline before the search's plan. A baseline
    fixes argument layouts only and leaves the rest to XLA; the search's plan pins its
    intermediates with sharding constraints (379 in the GPT step), which cost what the
    objective does not see: on 8 simulated CPU devices the GPT step's searched plan,
    with data parallel's collectives, flops and memory, measured 7% slower than data
    parallel (10.15 and 10.39 ms against 9.46 and 9.50)."""
    fastest = min(c.objective for c in eligible)
    tied = [c for c in eligible if c.objective <= fastest * (1 + TIE)]
    least = min(c.report.memory.total for c in tied)
    lean = [c for c in tied if c.report.memory.total <= least * (1 + TIE)]
    plain = [c for c in lean if c is not own]
    return min(plain or lean, key=lambda c: c.objective)


def _predicted_line(searched: Plan, candidates: Sequence[tuple[str, Plan]]) -> str:
    figures = ", ".join(f"{n} {ms(p.cost.time)}" for n, p in candidates)
    return f"predicted (the cost model's ranking, before compiling): {figures}"


def _compiled_line(
    done: Sequence[Compiled], best: Compiled, budget: float | None, profile: DeviceProfile
) -> str:
    parts = []
    for c in done:
        over = "" if c.eligible else f", over the budget {size(budget or 0)}"
        parts.append(
            f"{c.name} {ms(c.objective)} ({size(c.report.total_comm_bytes)} comm, "
            f"{size(c.report.memory.total)}/device{over})"
        )
    if not best.eligible:
        why = "none fits the budget once compiled"
    elif best is done[0]:
        beaten = all(best.objective < c.objective * (1 - TIE) for c in done[1:])
        why = "compiled fastest" if beaten else f"within {TIE:.1%} of the fastest: kept"
    elif not done[0].eligible:
        why = "compiled fastest within the budget"
    elif best.objective >= done[0].objective * (1 - TIE):
        why = f"within {TIE:.1%} of the search's plan in no more memory, with no constraints"
    else:
        why = "compiled fastest"
    return f"compiled ({profile.name}): {', '.join(parts)} → {best.name} returned ({why})"


def _verdict(own: Compiled, best: Compiled, done: Sequence[Compiled]) -> str:
    others = [c for c in done if c is not own]
    if not others:
        return "auto: no baseline to compare with once compiled"
    if not best.eligible:
        return "auto: no candidate fits the budget once compiled; the search's plan is kept"
    if best is not own:
        if not own.eligible:
            return (
                f"auto: the {own.name} plan compiles over the budget; baseline {best.name} "
                f"({ms(best.objective)}) is the fastest that fits, so it is returned"
            )
        if best.objective >= own.objective * (1 - TIE):
            return (
                f"auto: baseline {best.name} compiles as fast ({ms(best.objective)}) as the "
                f"{own.name} plan ({ms(own.objective)}, within {TIE:.1%}) in no more memory, "
                "and pins no intermediate layouts, so it is returned"
            )
        return (
            f"auto: baseline {best.name} compiles faster ({ms(best.objective)}) than the "
            f"{own.name} plan ({ms(own.objective)}), so it is returned"
        )
    rival = min(others, key=lambda c: c.objective)
    if all(own.objective < c.objective * (1 - TIE) for c in others):
        return (
            f"auto: the search's plan beats every baseline compiled ({len(others)}; best: "
            f"{rival.name} {ms(rival.objective)})"
        )
    tied = [c.name for c in others if c.objective <= own.objective * (1 + TIE)]
    ties = f"ties {', '.join(tied)}" if tied else "is not beaten"
    return f"auto: the search's plan {ties} once compiled, and is kept"
