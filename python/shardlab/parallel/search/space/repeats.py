"""Repeated structure: units that play the same role (the same op in identical layers) are
found by colour refinement, and the search is solved once on the quotient graph.

Colours start from what a unit is (primitive, shapes, parameters, candidate list) and are
refined a few rounds with the colours of its neighbours (Weisfeiler-Lehman), so the k-th op
of layer 3 and of layer 17 end with one colour while boundary layers differ. The quotient has
one unit per colour (own costs and edge matrices summed over members; an edge inside a colour,
from one layer to the next, adds its diagonal) and is small enough for the exact ILP however
many layers there are; its choice, copied to every member, is a starting point that the
full-graph refinement then improves.
"""

from __future__ import annotations

import numpy as np

from shardlab.parallel.search.space.pairs import Pairs
from shardlab.parallel.search.space.scan_ties import roles
from shardlab.parallel.search.space.space import Space


def colours(space: Space, rounds: int = 3) -> list[int]:
    """Per unit, a colour id (equal colours: the same role in repeated structure)."""
    g = space.graph
    base: list[object] = []
    for u in space.units:
        if u.kind == "input":
            v = u.outs[0]
            base.append(("in", g.shapes[v], g.dtypes[v], u.fixed, id(u.cands)))
        else:
            base.append(("node", u.signature, id(u.cands), u.fixed, u.terminal))
    # A neighbour's role: which side of the edge and which operand slot (small ints).
    nbrs: list[list[tuple[int, int]]] = [[] for _ in space.units]
    for e in space.edges:
        nbrs[e.dst].append((e.src, 2 * (e.dst_slot + 1)))
        nbrs[e.src].append((e.dst, 2 * (e.dst_slot + 1) + 1))
    col = _relabel(base)
    for _ in range(rounds):
        new = _relabel(
            [
                (col[u], tuple(sorted([col[v] * 256 + r for v, r in nbrs[u]])))
                for u in range(len(col))
            ]
        )
        if max(new, default=-1) == max(col, default=-1):
            col = new
            break
        col = new
    return col


def periodic(col: list[int], period: int) -> list[int]:
    """Split each colour by occurrence number modulo ``period`` (in program order), so
    that consecutive repeats may differ: the optimum often alternates between layers (a
    column-split matmul feeding a row-split one)."""
    if period <= 1:
        return col
    seen: dict[int, int] = {}
    keys = []
    for c in col:
        k = seen.get(c, 0)
        seen[c] = k + 1
        keys.append((c, k % period))
    return _relabel(keys)


def scan_roles(space: Space, col: list[int]) -> list[int]:
    """One colour per role of an unrolled ``lax.scan``'s body: every iteration of a scan
    runs the same constraints (the plan constrains the body once, ``scan_ties.py``), so its
    units at one body position are one unit of the quotient, whatever refinement said.
    Refinement alone tells the first and last iterations apart from the middle ones (the
    stacked outputs' buffer is a chain through every iteration, and three rounds see three
    links from each end), which doubled a scanned GPT's quotient. A unit whose candidate
    list is not the role's (the first iteration's ``scan_stack`` lacks the buffer operand)
    keeps its colour."""
    keys: list[object] = list(col)
    for group, by_position in roles(space).items():
        for position, members in by_position.items():
            ref = members[max(members) // 2] if max(members) // 2 in members else None
            for unit in members.values():
                if ref is not None and space.units[unit].cands is space.units[ref].cands:
                    keys[unit] = ("scan", group, position)
    return _relabel(keys)


def _relabel(keys: list[object]) -> list[int]:
    ids: dict[object, int] = {}
    return [ids.setdefault(k, len(ids)) for k in keys]


def quotient(own: list[np.ndarray], pairs: Pairs, col: list[int]) -> tuple[list[np.ndarray], Pairs]:
    """Own costs and pair matrices of the quotient by ``col`` (colour classes)."""
    n = max(col, default=-1) + 1
    q_own: list[np.ndarray | None] = [None] * n
    for u, c in enumerate(col):
        q_own[c] = own[u].copy() if q_own[c] is None else q_own[c] + own[u]
    q_pairs: Pairs = {}
    for (a, b), m in pairs.items():
        ca, cb = col[a], col[b]
        if ca == cb:
            if m.shape[0] == m.shape[1]:
                q_own[ca] = q_own[ca] + np.diag(m)  # type: ignore[operator]
            continue
        key, mat = ((ca, cb), m) if ca < cb else ((cb, ca), m.T)
        got = q_pairs.get(key)
        q_pairs[key] = mat if got is None else got + mat
    return [o if o is not None else np.zeros(1) for o in q_own], q_pairs
