"""Exact elimination before the ILP: the optimum of random pairwise problems (trees, chains,
cycles, dense graphs, memory rows) is unchanged, checked against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from shardlab.parallel.search.solve.eliminate import eliminate
from shardlab.parallel.search.solve.ilp import solve_arrays


def _problem(rng: np.random.Generator, n: int, edges: list[tuple[int, int]]):
    own = [rng.uniform(0, 1, size=int(rng.integers(1, 4))) for _ in range(n)]
    pairs = {}
    for a, b in edges:
        m = rng.uniform(0, 1, size=(len(own[a]), len(own[b])))
        if rng.random() < 0.3:
            m = np.round(m * 2) / 2  # repeated rows and columns, as real reshard tables have
        pairs[(a, b)] = m
    return own, pairs


def _total(own, pairs, choice) -> float:
    return sum(float(o[k]) for o, k in zip(own, choice, strict=True)) + sum(
        float(m[choice[a], choice[b]]) for (a, b), m in pairs.items()
    )


def _brute(own, pairs, rows=()):
    best = (np.inf, None)
    for choice in itertools.product(*(range(len(o)) for o in own)):
        if any(sum(c[u][k] for u, k in enumerate(choice)) > budget + 1e-12 for c, budget in rows):
            continue
        best = min(best, (_total(own, pairs, choice), choice), key=lambda t: t[0])
    return best


def _shapes(rng: np.random.Generator, n: int):
    chain = [(i, i + 1) for i in range(n - 1)]
    tree = [(int(rng.integers(0, i)), i) for i in range(1, n)]
    cycle = [*chain, (0, n - 1)]
    dense = [(a, b) for a in range(n) for b in range(a + 1, n) if rng.random() < 0.5]
    return {"chain": chain, "tree": tree, "cycle": cycle, "dense": dense}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("shape", ["chain", "tree", "cycle", "dense"])
def test_elimination_keeps_the_optimum(seed: int, shape: str) -> None:
    rng = np.random.default_rng(seed)
    n = 7
    own, pairs = _problem(rng, n, _shapes(rng, n)[shape])
    reduced = eliminate(own, pairs)
    if shape in ("chain", "tree"):
        assert reduced.units == []  # a tree is solved by elimination alone
    result = solve_arrays(own, pairs)
    want, _ = _brute(own, pairs)
    assert result.choice is not None
    assert _total(own, pairs, result.choice) == pytest.approx(want, rel=1e-6, abs=1e-9)
    assert result.objective == pytest.approx(want, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_memory_rows_are_respected_after_elimination(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    n = 6
    own, pairs = _problem(rng, n, _shapes(rng, n)["tree"])
    coeffs = [rng.uniform(0, 1, size=len(o)) for o in own]
    coeffs[2] = np.full(len(own[2]), 0.25)  # a constant coefficient: eliminated, budget shrinks
    budget = float(np.mean([sum(c.min() for c in coeffs), sum(c.max() for c in coeffs)]))
    rows = [(coeffs, budget)]
    want, choice = _brute(own, pairs, rows)
    result = solve_arrays(own, pairs, memory_rows=rows)
    assert choice is not None and result.choice is not None
    assert sum(coeffs[u][k] for u, k in enumerate(result.choice)) <= budget + 1e-9
    assert _total(own, pairs, result.choice) == pytest.approx(want, rel=1e-6, abs=1e-9)


def test_an_unreachable_budget_has_no_choice() -> None:
    own = [np.array([1.0, 2.0]), np.array([0.5])]
    pairs = {(0, 1): np.array([[0.0], [1.0]])}
    rows = [([np.array([0.3, 0.3]), np.array([0.5])], 0.5)]  # needs 0.8 whatever the choice
    assert solve_arrays(own, pairs, memory_rows=rows).choice is None
