"""Meeting a per-device memory budget: when the unconstrained optimum does not fit, the
cheapest of what fits among ILP memory rows (with cuts at each solution's own peak), a
Lagrangian memory penalty, and the baselines' layouts mapped into the space.

Memory is the memory model's (``cost/memory/``) through ``choice.memory_of``; the driver
checks the final plan on the compiled program when the graph is small.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from shardlab.parallel.cost import layouts as L
from shardlab.parallel.cost.memory import peak_points
from shardlab.parallel.errors import SearchError
from shardlab.parallel.search.choice import memory_of, peak_buffers, space_liveness
from shardlab.parallel.search.solve.methods import Solver
from shardlab.parallel.search.solve.recursive import SAFETY_TIME, sub_node_limit
from shardlab.parallel.search.space.space import Space

STALL = 4  # Lagrangian rounds without a smaller peak before the penalty search stops


def _memory_penalty(space: Space, lam: float) -> list[np.ndarray]:
    """Per unit, ``lam`` × per-device bytes of what each candidate holds (a memory proxy)."""
    g = space.graph
    out = []
    for u in space.units:
        nbytes = [g.nbytes(v) for v in u.outs]
        arr = np.array(
            [
                sum(
                    L.local_bytes(b, lay, space.sizes)
                    for b, lay in zip(nbytes, c.outs, strict=True)
                )
                for c in u.cands
            ]
        )
        out.append(lam * arr)
    return out


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
        coeffs[u] += [
            L.local_bytes(g.nbytes(v), c.outs[pos], space.sizes) for c in space.units[u].cands
        ]
    return coeffs, budget


def solve_within_budget(
    solver: Solver,
    method: str,
    budget: float,
    *,
    time_limit: float,
    seeds: Callable[[], list[tuple[str, list[int]]]],
) -> tuple[list[int], bool | None]:
    """A choice that meets ``budget``: the plain optimum if it fits, else the cheapest of
    what fits among ILP memory rows (with cuts), a Lagrangian memory penalty and the
    baselines mapped into the space (``seeds()``).

    Raises:
        SearchError: nothing fits (the message gives the smallest memory reached).
    """
    space, notes = solver.space, solver.notes

    def fits(choice: list[int]) -> float:
        return memory_of(space, choice)

    choice, optimal = solver.run(method, time_limit=time_limit)
    if fits(choice) <= budget:
        return choice, optimal
    smallest = fits(choice)
    found: list[tuple[float, list[int], bool | None, str]] = []
    if method == "ilp":
        # Rows at the replicated profile's peaks, then a cut at each solution's own peak
        # until the solution fits (the peak moves with the layouts). At most 8 cuts, each
        # solve bounded by a deterministic node limit (the wall clock only as a safety net),
        # so the plan does not depend on how busy the machine is.
        rows = _memory_rows(space, budget)
        for _ in range(8):
            variables = sum(len(u.cands) for u in space.units)
            choice, optimal = solver.run(
                method,
                time_limit=max(time_limit, SAFETY_TIME),
                memory_rows=rows,
                node_limit=sub_node_limit(variables),
            )
            mem = fits(choice)
            smallest = min(smallest, mem)
            if mem <= budget:
                found.append((space.total(choice), choice, optimal, f"{len(rows)} ILP memory rows"))
                break
            rows.append(_memory_row(space, peak_buffers(space, choice), budget))
    # Lagrangian: trade seconds for bytes until the plan fits. Once the penalty dominates,
    # a larger one finds no smaller plan: after STALL rounds without a smaller peak the
    # memory-lightest layouts are reached and the budget is out of the search's reach
    # (counted from the first round whose penalty changed the plan).
    lam = 1e-3 * max(1e-12, space.total(choice)) / max(1.0, fits(choice))
    stalled, moved, unconstrained = 0, False, fits(choice)
    for _ in range(40 if not found else 0):
        extra = _memory_penalty(space, lam)
        trial, _ = solver.run(
            "recursive" if method == "ilp" else method,
            time_limit=time_limit,
            extra=extra,
            quiet=True,
        )
        mem = fits(trial)
        if mem <= budget:
            found.append((space.total(trial), trial, False, f"a memory penalty (λ={lam:.3g} s/B)"))
            break
        moved = moved or mem != unconstrained  # rounds before the penalty bites do not count
        stalled = stalled + 1 if moved and mem >= smallest else 0
        smallest = min(smallest, mem)
        if stalled >= STALL:
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
