"""Under a memory budget, the search's plan against sharding × remat × ZeRO-stage mixes.

The search (``driver.py``) prices data and operator-level splits of every equation; the
memory budget enters its solve as a constraint. Rematerialisation and the ZeRO stages are
decisions of another kind: remat changes what the backward pass holds and how much it
recomputes, ZeRO-3 whether parameters are gathered where they are used. They are chosen
here, after the solve, by pricing whole plans on the cost model:

- the search's plan (when one fitted the budget);
- every baseline of the mesh, with ZeRO-3 (parameters, gradients and optimizer state split)
  beside ZeRO-1/2 (optimizer state split);
- each of those with its layer scans rematerialised: policy ``dots`` or ``nothing``, on
  all forward layer scans or on one layer group (a function with several, e.g. an
  encoder-decoder: which layers to recompute).

The fastest option whose predicted per-device peak fits the budget is taken; when
``verify`` it is compiled (``confirm.Reports``, shared with ``auto``'s confirmation) and
the next is tried if XLA's buffers do not fit. The search's plan is kept when it is the
fastest that fits, so a budget the plain search meets costs only the pricing. Pipeline
stages are compared afterwards (``driver._with_stages``): the simulator prices them.

When nothing fits, ``unreachable`` says, per dimension that helped, the smallest peak
reached: sharding alone, with ZeRO-3, with remat.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence

from shardlab.parallel.cost.remat import layer_scans
from shardlab.parallel.display import human_bytes
from shardlab.parallel.plan.plan import Plan
from shardlab.parallel.plan.remat import remat_variants
from shardlab.parallel.records import RematSpec, _Record

POLICIES = ("dots", "nothing")
MAX_GROUPS = 4  # per-group remat choices are tried for at most this many layer groups
MAX_COMPILES = 4  # options compiled to check the budget before giving up on compiling


@dataclasses.dataclass(frozen=True)
class Option(_Record):
    """One priced mix: its name (``data_parallel+remat(nothing)``), the plan, its predicted
    step time and per-device peak."""

    name: str
    plan: Plan
    time: float
    peak: int


def remat_specs(plan: Plan) -> list[RematSpec]:
    """The remat choices for ``plan``'s function: each policy on all forward layer scans
    and, with 2 to ``MAX_GROUPS`` of them, on each group alone; ``[]`` without a layer
    scan."""
    if plan.binding is None:
        return []
    groups = sorted(layer_scans(plan.binding.graph))
    if not groups:
        return []
    subsets: list[tuple[int, ...]] = [()]
    if 1 < len(groups) <= MAX_GROUPS:
        subsets += [(g,) for g in groups]
    return [RematSpec(p, s) for p, s in itertools.product(POLICIES, subsets)]


def _remat_name(name: str, spec: RematSpec) -> str:
    where = "" if not spec.scans else f" on scan group {spec.scans[0]}"
    return f"{name}+remat({spec.policy}{where})"


def options(searched: Plan | None, baselines: Mapping[str, Plan]) -> list[Option]:
    """Every mix priced: the searched plan and the baselines, plain and rematerialised,
    fastest first (ties: the searched plan, then by name, so the order is the same on
    every run)."""
    plans: list[tuple[str, Plan]] = []
    if searched is not None:
        plans.append(("search", searched))
    plans += sorted(baselines.items())
    out: list[Option] = []
    for name, plan in plans:
        out.append(Option(name, plan, plan.cost.time, plan.cost.memory.peak))
        specs = remat_specs(plan)
        for spec, variant in zip(specs, remat_variants(plan, specs), strict=True):
            out.append(
                Option(
                    _remat_name(name, spec), variant, variant.cost.time, variant.cost.memory.peak
                )
            )
    return sorted(out, key=lambda o: o.time)  # stable: ties keep the order above


@dataclasses.dataclass(frozen=True)
class Mixed(_Record):
    """``choose``'s answer: the chosen option (``None``: nothing fits), what was tried and
    the notes to add to the plan."""

    chosen: Option | None
    tried: tuple[Option, ...]
    notes: tuple[str, ...]


def choose(
    searched: Plan | None,
    baselines: Mapping[str, Plan],
    budget: float,
    compiled_memory: Callable[[Plan], int] | None = None,
) -> Mixed:
    """The fastest mix within ``budget`` bytes per device (predicted; compiled too when
    ``compiled_memory`` is given: ``plan → compiled per-device bytes``)."""
    tried = options(searched, baselines)
    notes: list[str] = []
    compiles = 0
    for option in tried:
        if option.peak > budget:
            continue
        if compiled_memory is not None and compiles < MAX_COMPILES:
            compiles += 1
            compiled = compiled_memory(option.plan)
            if compiled > budget:
                notes.append(
                    f"mix: {option.name} is predicted at {human_bytes(option.peak)} per device "
                    f"but compiles to {human_bytes(compiled)}, over the budget"
                )
                continue
        if option.name != "search":
            notes.append(_why(option, tried, budget))
        return Mixed(option, tuple(tried), tuple(notes))
    return Mixed(None, tuple(tried), tuple(notes))


def _why(option: Option, tried: Sequence[Option], budget: float) -> str:
    plain = next((o for o in tried if o.name == "search"), None)
    against = (
        f"the search's own plan ({plain.time * 1e3:.3f} ms, {human_bytes(plain.peak)})"
        if plain is not None
        else "no plan of the search itself fitting"
    )
    return (
        f"mix: {option.name} is the fastest plan within the budget of "
        f"{human_bytes(budget)} per device: {option.time * 1e3:.3f} ms predicted, "
        f"{human_bytes(option.peak)} peak, against {against}; "
        f"{len(tried)} sharding × ZeRO × remat mixes priced"
    )


def unreachable(tried: Sequence[Option], budget: float) -> str:
    """Why no mix fits: the smallest predicted peak per dimension that helped."""

    def smallest(keep: Callable[[Option], bool]) -> Option | None:
        chosen = [o for o in tried if keep(o)]
        return min(chosen, key=lambda o: (o.peak, o.time)) if chosen else None

    parts = []
    for label, keep in (
        ("sharding alone", lambda o: "remat" not in o.name and "zero3" not in o.name),
        ("with ZeRO-3", lambda o: "remat" not in o.name),
        ("with remat", lambda o: True),
    ):
        best = smallest(keep)
        if best is not None and (not parts or best.peak < parts[-1][1]):
            parts.append((label, best.peak, best.name))
    reached = "; ".join(f"{label}: {human_bytes(peak)} ({name})" for label, peak, name in parts)
    return (
        f"no sharding × ZeRO × remat mix fits {human_bytes(budget)} per device; the smallest "
        f"predicted per device, {reached}"
    )


__all__ = ["Mixed", "Option", "choose", "options", "remat_specs", "unreachable"]
