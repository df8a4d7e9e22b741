"""One choice per scan-body equation: the iterations of an unrolled scan made consistent.

A plan applies one set of constraints to a scan's body (``graph/interpret.py`` runs the original
``lax.scan``), so every iteration of an unrolled scan must make the same choices. After a
search, each scan group's units are tied: the choices of one iteration (the first, the
middle and the last are tried; the one with the lowest model total wins) are copied to the
units that play the same role in every other iteration. Units correspond by their first
node's ``(group, body position)`` (``build.py`` merges elementwise followers into their
producer) and must share their candidate list (units are cached by structural signature, so
corresponding units normally do; the first iteration's ``scan_stack`` differs only by its
missing buffer operand); a unit whose candidates differ (e.g. a boundary iteration merged
differently) keeps its own choice.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardlab.parallel.search.space.space import Cand, Space


def _same_candidates(space: Space, a: int, b: int) -> bool:
    """Candidate k of both units makes the same split: same result layouts, and the same
    operand layouts (trailing operands only where the first iteration's ``scan_stack`` has
    no buffer operand)."""
    ca, cb = space.units[a].cands, space.units[b].cands
    if ca is cb:
        return True

    def same(x: Cand, y: Cand) -> bool:
        n = min(len(x.ins), len(y.ins))
        return x.outs == y.outs and x.ins[len(x.ins) - n :] == y.ins[len(y.ins) - n :]

    return len(ca) == len(cb) and all(same(x, y) for x, y in zip(ca, cb, strict=True))


def roles(space: Space) -> dict[int, dict[int, dict[int, int]]]:
    """Per scan group, ``{body position: {iteration: unit}}`` (negative positions: the
    slices and stacks, see ``opgraph.Node.origin``)."""
    g = space.graph
    out: dict[int, dict[int, dict[int, int]]] = {}
    for u in space.units:
        if u.kind != "node" or u.fixed:
            continue
        origin = g.nodes[u.nodes[0]].origin
        if origin is None:
            continue
        group, iteration, position = origin
        out.setdefault(group, {}).setdefault(position, {})[iteration] = u.index
    return out


def tie_scan_choices(space: Space, choice: Sequence[int]) -> list[int]:
    """``choice`` with every unrolled scan's iterations making equal choices (see above)."""
    choice = list(choice)
    groups = space.graph.scan_groups
    for group, by_role in roles(space).items():
        length = groups[group].length
        if length < 2:
            continue
        best: list[int] | None = None
        best_total = float("inf")
        for ref in dict.fromkeys((0, length // 2, length - 1)):
            trial = list(choice)
            for units in by_role.values():
                r = units.get(ref)
                if r is None:
                    continue
                for u in units.values():
                    if u != r and _same_candidates(space, u, r):
                        trial[u] = choice[r]
            total = space.total(trial)
            if total < best_total:
                best, best_total = trial, total
        if best is not None:
            choice = best
    return choice
