"""A space's costs as arrays, the form every solver works on (recursive, ILP, repeats).

``own_costs``: per unit, each candidate's own seconds. ``pair_matrices``: the edges between
two units summed into one matrix, oriented from the smaller unit index to the larger.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardlab.parallel.search.space.space import Space

Pairs = dict[tuple[int, int], np.ndarray]


def own_costs(space: Space, extra: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
    """Per unit, the own cost of each candidate (plus ``extra``, e.g. a memory penalty)."""
    cache: dict[int, np.ndarray] = {}
    out = []
    for u in space.units:
        arr = cache.get(id(u.cands))
        if arr is None:
            arr = np.array([c.cost for c in u.cands])
            cache[id(u.cands)] = arr
        out.append(arr + extra[u.index] if extra is not None else arr)
    return out


def pair_matrices(space: Space) -> Pairs:
    """Edges summed per unordered unit pair, oriented (smaller index, larger index)."""
    pairs: Pairs = {}
    for e in space.edges:
        a, b = e.src, e.dst
        m = e.matrix if a < b else e.matrix.T
        key = (a, b) if a < b else (b, a)
        got = pairs.get(key)
        pairs[key] = m if got is None else got + m
    return pairs
