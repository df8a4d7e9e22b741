"""The search methods on a built space: ``propagate``, ``recursive`` and ``ilp``.

``propagate`` is the semi-auto method: annotations and ``with_sharding_constraint`` calls are
fixed units of the space, and the rest starts from a greedy program-order pass outward from
them (not ``cost/propagate.py``, which propagates a *given* strategy), then is improved by
block descent. ``recursive`` starts from repeated-layer quotients and batch seeds
(``recursive.py``); ``ilp`` is exact (``ilp.py``) and falls back on ``recursive`` when it finds
no feasible point in time. ``Best`` keeps the best complete assignment so far, which an
interrupt returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from shardlab.parallel.cost import layouts as L
from shardlab.parallel.search.solve.ilp import solve_ilp
from shardlab.parallel.search.solve.recursive import solve_recursive
from shardlab.parallel.search.space.space import Space


class Best:
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


@dataclasses.dataclass
class Solver:
    """A space and what every run of a method on it shares: the best assignment so far,
    the progress callback, the notes the plan will carry, and how many argument leaves are
    the batch (the recursive method's seeds)."""

    space: Space
    best: Best
    report: Callable[[float, str], None]
    notes: list[str]
    n_batch_leaves: int = 0

    def run(
        self,
        method: str,
        *,
        time_limit: float,
        extra: list[np.ndarray] | None = None,
        memory_rows: Sequence[tuple[list[np.ndarray], float]] = (),
        node_limit: int | None = None,
        quiet: bool = False,
    ) -> tuple[list[int], bool | None]:
        """One method's choice and whether it is proven optimal (``None``: not an exact
        method). ``extra``: per-unit costs added (a memory penalty); ``memory_rows``: linear
        memory constraints for the ILP; ``node_limit``: the ILP's deterministic work limit
        (``None``: only ``time_limit``); ``quiet``: add no notes."""
        space, keep = self.space, self.best.keep
        notes = [] if quiet else self.notes
        if method == "propagate":
            choice = solve_recursive(space, extra=extra, keep=keep, starts="greedy", notes=notes)
            return choice, None
        if method == "recursive":
            seeds = batch_seeds(space, self.n_batch_leaves)

            def on_sweep(i: int) -> None:  # the number of steps is not known in advance
                self.report(0.4 + 0.5 * i / (i + 2), f"forest descent step {i}")

            choice = solve_recursive(
                space, extra=extra, on_sweep=on_sweep, keep=keep, seeds=seeds, notes=notes
            )
            return choice, None
        result = solve_ilp(
            space, time_limit=time_limit, memory_rows=list(memory_rows), node_limit=node_limit
        )
        notes.append(
            f"ilp: {result.variables} variables, {result.message.strip()}"
            + ("" if result.optimal else " (not proven optimal)")
        )
        if result.choice is None:
            notes.append("ilp found no feasible point in time: recursive result used instead")
            return solve_recursive(space, extra=extra, keep=keep, notes=notes), False
        return result.choice, result.optimal
