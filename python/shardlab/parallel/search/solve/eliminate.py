"""Exact variable elimination before an ILP: units of degree 0, 1 and 2 leave the problem.

A strategy space is a pairwise cost problem (own cost per candidate, a matrix per edge).
A unit with one candidate, a leaf and a chain link can be taken out without losing
optimality, by the usual min-sum elimination:

- one candidate, or no neighbour: its choice is fixed (its argmin); each edge's row folds
  into the neighbour's own costs;
- one neighbour ``p``: ``own[p][i] += min_k own[u][k] + M[i, k]`` (a leaf, as in a tree DP);
- two neighbours ``p``, ``q``: the edge ``M'[i, j] = min_k own[u][k] + M_pu[i, k] +
  M_uq[k, j]`` joins them (a chain link: the elementwise chains between contractions),
  done only when the new edge is no larger for the ILP than what it replaces.

Each elimination records how to recover the unit's choice from its neighbours', so the ILP
sees only the units that matter (the contractions and where layouts meet), and a tree is
solved without it. Deterministic: the order is by degree, then unit index.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Collection, Sequence

import numpy as np

from shardlab.parallel.search.space.pairs import Pairs

MAX_JOIN = 4096  # entries of a chain link's joined edge (|p|·|q|) considered at most


@dataclasses.dataclass
class Reduced:
    """The problem left after elimination.

    Attributes:
        units: the original indices of the units left, in order.
        own: their own costs.
        pairs: their edges, keyed by positions in ``units`` (smaller first).
        constant: the cost of the eliminated part that no longer depends on any choice.
        steps: how to recover each eliminated unit, in elimination order.
    """

    units: list[int]
    own: list[np.ndarray]
    pairs: Pairs
    constant: float
    steps: list[tuple[int, tuple[int, ...], np.ndarray]]

    def expand(self, choice: Sequence[int], n: int) -> list[int]:
        """The full assignment of ``n`` units from a choice for ``units``."""
        full = [-1] * n
        for pos, u in enumerate(self.units):
            full[u] = int(choice[pos])
        for u, by, table in reversed(self.steps):
            full[u] = int(table[tuple(full[v] for v in by)])
        return full


def distinct(m: np.ndarray) -> tuple[list[int], np.ndarray]:
    """First index of each distinct row, and each row's group (faster than ``np.unique``
    for the small matrices here)."""
    seen: dict[bytes, int] = {}
    firsts: list[int] = []
    inverse = np.empty(len(m), dtype=np.int64)
    for i, row in enumerate(m):
        key = row.tobytes()
        g = seen.get(key)
        if g is None:
            g = seen[key] = len(firsts)
            firsts.append(i)
        inverse[i] = g
    return firsts, inverse


def edge_variables(m: np.ndarray) -> int:
    """Continuous variables an edge costs the ILP (distinct rows × distinct columns)."""
    if np.ptp(m) <= 0:
        return 0
    return len(distinct(m)[0]) * len(distinct(np.ascontiguousarray(m.T))[0])


def eliminate(own: Sequence[np.ndarray], pairs: Pairs, keep: Collection[int] = ()) -> Reduced:
    """Eliminate every unit of degree ≤ 1 and chain links of degree 2 (exactly).

    Args:
        own: own costs per unit.
        pairs: edge matrices keyed ``(a, b)``, rows ``a``'s candidates.
        keep: units never eliminated (those a side constraint, such as a memory row,
            mentions).

    Returns:
        The reduced problem and how to expand its solution.
    """
    n = len(own)
    cost = [np.asarray(o, dtype=float).copy() for o in own]
    adj: list[dict[int, np.ndarray]] = [{} for _ in range(n)]
    constant = 0.0
    for (a, b), m in pairs.items():
        if a == b:
            continue
        got = adj[a].get(b)
        adj[a][b] = m if got is None else got + m
        adj[b][a] = adj[a][b].T
    keep = set(keep)
    alive = [True] * n
    steps: list[tuple[int, tuple[int, ...], np.ndarray]] = []
    heap = [(len(adj[u]), u) for u in range(n) if u not in keep]
    heapq.heapify(heap)
    while heap:
        deg, u = heapq.heappop(heap)
        if not alive[u] or deg != len(adj[u]):
            continue
        nbrs = sorted(adj[u])
        if len(cost[u]) == 1 or deg == 0:
            k = int(np.argmin(cost[u]))
            constant += float(cost[u][k])
            for v in nbrs:
                cost[v] = cost[v] + adj[v][u][:, k]
            steps.append((u, (), np.asarray(k)))
        elif deg == 1:
            (p,) = nbrs
            table = adj[p][u] + cost[u][None, :]
            cost[p] = cost[p] + table.min(axis=1)
            steps.append((u, (p,), table.argmin(axis=1)))
        elif deg == 2:
            p, q = nbrs
            if len(cost[p]) * len(cost[q]) > MAX_JOIN:
                continue
            table = adj[p][u][:, None, :] + adj[u][q].T[None, :, :] + cost[u][None, None, :]
            joined = table.min(axis=2)
            old = adj[p].get(q)
            merged = joined if old is None else old + joined
            before = len(cost[u]) + edge_variables(adj[p][u]) + edge_variables(adj[u][q])
            before += 0 if old is None else edge_variables(old)
            if edge_variables(merged) > before:
                continue
            adj[p][q] = merged
            adj[q][p] = merged.T
            steps.append((u, (p, q), table.argmin(axis=2)))
        else:
            continue
        alive[u] = False
        for v in nbrs:
            del adj[v][u]
            if v not in keep and alive[v]:
                heapq.heappush(heap, (len(adj[v]), v))
        adj[u] = {}
    units = [u for u in range(n) if alive[u]]
    pos = {u: i for i, u in enumerate(units)}
    left: Pairs = {}
    for a in units:
        for b, m in adj[a].items():
            if a < b:
                left[(pos[a], pos[b])] = m
    return Reduced(units, [cost[u] for u in units], left, constant, steps)
