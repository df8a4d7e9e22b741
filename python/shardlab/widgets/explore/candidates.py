"""The strategies the plan explorer shows: every plan the public search API prices.

``shardlab.search`` returns one plan per call and keeps its inner candidates to itself, so
the explorer collects what the public calls give: ``search(method=m)`` for each method
(``confirm=False``: predicted figures only, as every other point), every baseline of
``shardlab.strategies.baselines``, and ``search(memory_budget=b)`` over a sweep of budgets
between the smallest and the largest per-device memory seen. Plans that come out the same
(one fingerprint of input/output specs and constraints) are one point with every name that
found it. Nothing is compiled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from shardlab.parallel.errors import SearchError
from shardlab.parallel.plan.plan import Plan

METHODS = ("propagate", "recursive", "ilp")
BUDGETS = 5
ILP_TIME_LIMIT_S = 10.0


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One priced strategy: a point of the explorer."""

    name: str  # how it was found: "search: ilp", "baseline: megatron", "budget 1.5 MiB"
    origin: str  # "method" | "baseline" | "budget" | "plan"
    time: float  # predicted step seconds (compute + communication, ``cost.time``)
    memory: int  # predicted per-device peak bytes
    comm_bytes: float  # wire bytes per device per step
    plan: Plan | None = dataclasses.field(default=None, compare=False, repr=False)
    also: tuple[str, ...] = ()  # other names that found the same plan

    @classmethod
    def of(cls, name: str, origin: str, plan: Plan) -> Candidate:
        return cls(
            name,
            origin,
            float(plan.cost.time),
            int(plan.cost.memory.peak),
            float(plan.cost.total_comm_bytes),
            plan,
        )


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats in both coordinates (lower is better),
    by the first coordinate then the second; of equal points, the first."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1], i))
    front: list[int] = []
    best = float("inf")
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def _key(plan: Plan) -> Any:
    return (plan.input_specs, plan.output_specs, plan.constraints, plan.operand_constraints)


def merge(candidates: Sequence[Candidate]) -> list[Candidate]:
    """One candidate per distinct plan, keeping the first name and listing the others."""
    out: list[Candidate] = []
    index: dict[Any, int] = {}
    for c in candidates:
        key = _key(c.plan) if c.plan is not None else c.name
        if key in index:
            first = out[index[key]]
            out[index[key]] = dataclasses.replace(first, also=(*first.also, c.name))
        else:
            index[key] = len(out)
            out.append(c)
    return out


def budgets_between(low: float, high: float, count: int) -> list[float]:
    """``count`` budgets spread geometrically from just above ``low`` to below ``high``."""
    if count <= 0 or high <= low * 1.01:
        return []
    ratio = high / low
    return [low * ratio ** ((k + 0.5) / count) for k in range(count)]


@dataclasses.dataclass
class Collected:
    candidates: list[Candidate]
    notes: list[str]
    interrupted: bool = False


def collect(
    fn: Callable[..., Any],
    *args: Any,
    mesh: Any,
    methods: Sequence[str] = METHODS,
    budgets: int = BUDGETS,
    device: Any = None,
    plan: Plan | None = None,
    progress: Callable[[float, str], None] | None = None,
) -> Collected:
    """Every candidate, priced; an interrupt (KeyboardInterrupt) stops with those so far."""
    from shardlab.parallel.search.driver import search
    from shardlab.strategies import baselines

    report = progress or (lambda fraction, message: None)
    found: list[Candidate] = []
    notes: list[str] = []
    steps = len(methods) + 1 + budgets
    done = 0

    def step(message: str) -> None:
        report(done / steps, message)

    def within(message: str) -> Callable[[float, str], None]:
        """The progress of one search as a part of the whole (and no bar of its own)."""
        return lambda fraction, inner: report((done + fraction) / steps, f"{message}: {inner}")

    def priced(
        label: str, kind: str, message: str, inner: str, failed: Callable[[str], str], **kw: Any
    ) -> None:
        """One search of the sweep, its plan added (or why it found none noted)."""
        step(message)
        try:
            result = search(
                fn,
                *args,
                mesh=mesh,
                device=device,
                progress=within(inner),
                confirm=False,
                verify_budget=False,
                time_limit=ILP_TIME_LIMIT_S,
                **kw,
            )
        except SearchError as error:
            notes.append(failed(str(error)))
        else:
            found.append(Candidate.of(label, kind, result))
            if not result.complete:
                raise KeyboardInterrupt

    if plan is not None:
        found.append(Candidate.of(f"this plan ({plan.method})", "plan", plan))
    try:
        for method in methods:
            priced(
                f"search: {method}",
                "method",
                f"search: {method}",
                f"search: {method}",
                lambda error, method=method: f"search {method}: {error}",
                method=method,
            )
            done += 1
        step("baselines")
        for name, result in baselines(fn, *args, mesh=mesh, device=device).items():
            found.append(Candidate.of(f"baseline: {name}", "baseline", result))
        done += 1
        memories = [c.memory for c in found]
        from shardlab.widgets._base.html import fmt_bytes

        for budget in budgets_between(min(memories), max(memories), budgets):
            text = fmt_bytes(budget)
            priced(
                f"budget {text}",
                "budget",
                f"search within {text} per device",
                f"search within {text}",
                lambda error, text=text: f"budget {text}: no plan ({error[:120]})",
                memory_budget=budget,
            )
            done += 1
    except KeyboardInterrupt:
        notes.append(
            f"interrupted after {done} of {steps} searches: the candidates so far (not complete)"
        )
        return Collected(merge(found), notes, interrupted=True)
    report(1.0, "done")
    return Collected(merge(found), notes)
