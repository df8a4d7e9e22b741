"""The exact search: the cost model's minimum as a mixed-integer program (scipy's HiGHS).

Variables: one-hot ``x[u, k]`` per unit ``u`` and candidate ``k``. An edge between units ``p``
and ``u`` with cost matrix ``M`` is linearised with the transportation (marginal) form: a
continuous ``y[a, b] ≥ 0`` per distinct row ``a`` and distinct column ``b`` of ``M``, with
``Σ_b y[a, b] = Σ_{j in a} x[p, j]`` and ``Σ_a y[a, b] = Σ_{k in b} x[u, k]``. With one-hot
``x`` the only feasible ``y`` is their product, and its LP relaxation is much tighter than the
``y ≥ x_p + x_u − 1`` form. Separable matrices (``M = a + b``) fold into the units' own costs
and constant ones vanish. Memory budgets are linear rows over ``x``.

The LP relaxation is solved first (HiGHS's dual simplex): on these problems it is usually
integral already, and an integral LP optimum is the ILP's proven optimum, found in about a
third of the time the MIP solver takes to reach and certify the same root (the quotient of a
24-layer GPT: 0.10 s against 0.29 s). Only a fractional relaxation goes on to branch and bound,
with what is left of ``time_limit``.

Limits: ``node_limit`` (branch-and-bound nodes) is a deterministic work limit, the same on
an idle and a busy machine; ``time_limit`` is wall-clock, so a solve it cuts short may end
at a different incumbent under load. ``IlpResult.limit`` says which one stopped a solve,
and the message says so too.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp
from scipy.sparse import coo_matrix

from shardlab.parallel.search.solve.eliminate import distinct, edge_variables, eliminate
from shardlab.parallel.search.space.pairs import Pairs, own_costs, pair_matrices
from shardlab.parallel.search.space.space import Space

SCALE = 1e6  # seconds -> microseconds: keeps HiGHS's absolute tolerances meaningful


@dataclasses.dataclass(frozen=True)
class IlpResult:
    """The ILP's answer.

    Attributes:
        choice: candidate index per unit (``None`` when no feasible point was found).
        optimal: proven optimal (within HiGHS's default relative gap of 1e-4).
        objective: the model seconds of ``choice``.
        message: HiGHS's status text (and, when a limit stopped the solve, which one).
        variables: number of variables.
        limit: ``"node"`` or ``"time"`` when that limit stopped HiGHS before it proved
            optimality (``"time"``: the result may depend on the machine's load), else
            ``None``.
        nodes: branch-and-bound nodes HiGHS explored (``None`` when it did not say).
    """

    choice: list[int] | None
    optimal: bool
    objective: float
    message: str
    variables: int
    limit: str | None = None
    nodes: int | None = None


def ilp_size(space: Space) -> int:
    """Variables the ILP would have (the ``auto`` threshold looks at this)."""
    return arrays_size(own_costs(space), pair_matrices(space))


def arrays_size(own: Sequence[np.ndarray], pairs: Pairs) -> int:
    """Variables ``solve_arrays`` would create."""
    n = sum(len(o) for o in own)
    for m in pairs.values():
        if np.ptp(m) > 0 and _separable(m) is None:
            n += edge_variables(m)
    return n


def _separable(m: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    a = m[:, 0]
    b = m[0, :] - m[0, 0]
    if np.abs(m - a[:, None] - b[None, :]).max() <= 1e-9 * max(1.0, float(np.abs(m).max())):
        return a, b
    return None


def solve_ilp(
    space: Space,
    *,
    time_limit: float = 30.0,
    node_limit: int | None = None,
    memory_rows: Sequence[tuple[list[np.ndarray], float]] = (),
) -> IlpResult:
    """Minimise the cost model exactly.

    Args:
        space: the strategy space.
        time_limit: seconds for HiGHS; after it, the best incumbent (not proven optimal,
            and, being wall-clock, load-dependent: ``IlpResult.limit`` is ``"time"``).
        node_limit: branch-and-bound nodes for HiGHS (deterministic); ``None``: no limit.
        memory_rows: ``(per unit coefficient arrays, budget)``: ``Σ coeff·x ≤ budget``.
    """
    result = solve_arrays(
        own_costs(space),
        pair_matrices(space),
        time_limit=time_limit,
        node_limit=node_limit,
        memory_rows=memory_rows,
    )
    if result.choice is None:
        return result
    return dataclasses.replace(result, objective=space.total(result.choice))


def solve_arrays(
    own_seconds: Sequence[np.ndarray],
    pair_seconds: Pairs,
    *,
    time_limit: float = 30.0,
    node_limit: int | None = None,
    memory_rows: Sequence[tuple[list[np.ndarray], float]] = (),
) -> IlpResult:
    """``solve_ilp`` on plain arrays: own costs per unit and summed pair matrices.

    Units of degree ≤ 2 are first eliminated exactly (``eliminate.py``); HiGHS sees the
    rest, and a tree-shaped problem is solved without it."""
    n_units = len(own_seconds)
    keep: set[int] = set()
    spent = [0.0] * len(memory_rows)
    for coeffs, _budget in memory_rows:
        keep.update(u for u, arr in enumerate(coeffs) if len(arr) and np.ptp(arr) > 0)
    reduced = eliminate(own_seconds, pair_seconds, keep)
    left = set(reduced.units)
    for r, (coeffs, _budget) in enumerate(memory_rows):
        spent[r] = sum(float(arr[0]) for u, arr in enumerate(coeffs) if u not in left and len(arr))
    rows_left = [
        ([coeffs[u] for u in reduced.units], budget - spent[r])
        for r, (coeffs, budget) in enumerate(memory_rows)
    ]
    if not reduced.units:
        if any(budget < 0 for _, budget in rows_left):
            return IlpResult(None, False, float("inf"), "infeasible: over the budget", 0)
        choice = reduced.expand([], n_units)
        return IlpResult(choice, True, reduced.constant, "solved exactly by elimination", 0)
    result = _solve_highs(
        reduced.own,
        reduced.pairs,
        time_limit=time_limit,
        node_limit=node_limit,
        memory_rows=rows_left,
    )
    if result.choice is None:
        return result
    return dataclasses.replace(
        result,
        choice=reduced.expand(result.choice, n_units),
        objective=result.objective + reduced.constant,
    )


def _solve_highs(
    own_seconds: Sequence[np.ndarray],
    pair_seconds: Pairs,
    *,
    time_limit: float,
    node_limit: int | None,
    memory_rows: Sequence[tuple[list[np.ndarray], float]],
) -> IlpResult:
    """The mixed-integer program itself, on HiGHS."""
    own = [o * SCALE for o in own_seconds]
    pairs: Pairs = {k: m * SCALE for k, m in pair_seconds.items()}
    offset = [0]
    for o in own:
        offset.append(offset[-1] + len(o))
    n_x = offset[-1]
    # COO pieces (scipy's conversion to CSR sorts each row: the order here is free)
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    lb: list[float] = []
    ub: list[float] = []

    def block(r: np.ndarray, c: np.ndarray, v: float | np.ndarray) -> None:
        rows.append(r)
        cols.append(c)
        vals.append(np.broadcast_to(np.asarray(v, dtype=float), r.shape))

    sizes = np.asarray([len(o) for o in own])
    block(np.repeat(np.arange(len(own)), sizes), np.arange(n_x), 1.0)  # one-hot rows
    lb.extend([1.0] * len(own))
    ub.extend([1.0] * len(own))
    y_cost: list[np.ndarray] = []
    n_y = 0
    for (p, u), m in pairs.items():
        if np.ptp(m) <= 0:
            continue
        split = _separable(m)
        if split is not None:
            own[p] = own[p] + split[0]
            own[u] = own[u] + split[1]
            continue
        row_first, row_of = distinct(m)
        col_first, col_of = distinct(m.T)
        reduced = m[np.ix_(row_first, col_first)]
        base = n_x + n_y
        n_r, n_c = reduced.shape
        y_cost.append(reduced.ravel())
        n_y += n_r * n_c
        r0 = len(lb)
        ys = base + np.arange(n_r * n_c)
        a_of, b_of = np.divmod(np.arange(n_r * n_c), n_c)
        # Σ_b y[a, b] = Σ_{j in a} x[p, j], then Σ_a y[a, b] = Σ_{k in b} x[u, k]
        block(r0 + a_of, ys, 1.0)
        block(r0 + np.asarray(row_of), offset[p] + np.arange(len(row_of)), -1.0)
        block(r0 + n_r + b_of, ys, 1.0)
        block(r0 + n_r + np.asarray(col_of), offset[u] + np.arange(len(col_of)), -1.0)
        lb.extend([0.0] * (n_r + n_c))
        ub.extend([0.0] * (n_r + n_c))
    for coeffs, budget in memory_rows:
        ent = [
            (offset[u] + k, float(c))
            for u, arr in enumerate(coeffs)
            for k, c in enumerate(arr)
            if c
        ]
        block(
            np.full(len(ent), len(lb)),
            np.asarray([c for c, _ in ent], dtype=int),
            np.asarray([v for _, v in ent], dtype=float),
        )
        lb.append(-np.inf)
        ub.append(float(budget))
    cost = np.concatenate([*own, *y_cost]).tolist()
    n = len(cost)
    a = coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(len(lb), n),
    ).tocsr()
    integrality = np.zeros(n)
    integrality[:n_x] = 1
    upper = np.concatenate([np.ones(n_x), np.full(n - n_x, np.inf)])
    started = time.perf_counter()
    relaxed = _integral_relaxation(
        np.asarray(cost), a, np.asarray(lb), np.asarray(ub), upper, n_x, time_limit
    )
    left = max(1e-3, time_limit - (time.perf_counter() - started))
    if relaxed is not None:
        x, fun = relaxed
        choice = [int(np.argmax(x[offset[u] : offset[u + 1]])) for u in range(len(own))]
        message = "Optimal: the LP relaxation is integral (HiGHS dual simplex)"
        return IlpResult(choice, True, fun / SCALE, message, n, None, 0)
    # scipy's stubs type Bounds/LinearConstraint bounds as float; arrays are documented.
    bounds = Bounds(np.zeros(n), upper)  # pyright: ignore[reportArgumentType]
    rows_ok = LinearConstraint(a, np.asarray(lb), np.asarray(ub))  # pyright: ignore[reportArgumentType]
    options: dict[str, float | int | bool] = {"time_limit": float(left)}
    options["disp"] = False
    if node_limit is not None:
        options["node_limit"] = int(node_limit)
    res = milp(
        c=np.asarray(cost),
        integrality=integrality,
        bounds=bounds,
        constraints=rows_ok,
        options=options,
    )
    limit = _limit_of(res.status, str(res.message))
    message = str(res.message).strip()
    if limit == "time":
        message += (
            f" [stopped by the {time_limit:g} s wall-clock time limit: on a busier machine "
            "the result may differ; raise time_limit for a reproducible plan]"
        )
    elif limit == "node":
        message = message.replace("The HiGHS status code was not recognized. ", "")
        message += f" [stopped by the deterministic node limit of {node_limit} nodes]"
    raw_nodes = getattr(res, "mip_node_count", None)
    nodes = None if raw_nodes is None else int(raw_nodes)
    x = getattr(res, "x", None)
    if x is None:
        return IlpResult(None, False, float("inf"), message, n, limit, nodes)
    choice = [int(np.argmax(x[offset[u] : offset[u + 1]])) for u in range(len(own))]
    return IlpResult(choice, res.status == 0, float(res.fun) / SCALE, message, n, limit, nodes)


def _integral_relaxation(
    cost: np.ndarray,
    a,
    lb: np.ndarray,
    ub: np.ndarray,
    upper: np.ndarray,
    n_x: int,
    time_limit: float,
) -> tuple[np.ndarray, float] | None:
    """The LP relaxation's optimum when it is integral on the one-hot variables (then it is
    the ILP's optimum: no integer point is cheaper than the relaxation's bound), else
    ``None``. Equality rows stay equalities; budget rows (``-inf ≤ row ≤ budget``) are
    upper-bound rows."""
    eq = lb == ub
    kwargs = {}
    if eq.any():
        kwargs.update(A_eq=a[np.flatnonzero(eq)], b_eq=ub[eq])
    if (~eq).any():
        if np.isfinite(lb[~eq]).any():
            return None  # no such rows are built; leave anything else to the MIP
        kwargs.update(A_ub=a[np.flatnonzero(~eq)], b_ub=ub[~eq])
    bounds = np.stack([np.zeros(len(cost)), upper], axis=1)
    res = linprog(
        cost,
        bounds=bounds,
        method="highs-ds",
        # presolve finds nothing to remove in the transportation form and costs a third
        # of the solve (24-layer GPT quotient: 0.16 -> 0.10 s)
        options={"time_limit": float(time_limit), "disp": False, "presolve": False},
        **kwargs,
    )
    if res.status != 0 or res.x is None:
        return None
    x = np.asarray(res.x)
    if np.abs(x[:n_x] - np.round(x[:n_x])).max(initial=0.0) > INTEGRAL_TOL:
        return None
    return x, float(res.fun)


INTEGRAL_TOL = 1e-7


def _limit_of(status: int, message: str) -> str | None:
    """Which limit stopped HiGHS: scipy's status 1 is a time (or iteration) limit, and a
    node limit comes back as HiGHS's "solution limit" (status 4 in scipy 1.x)."""
    text = message.lower()
    if status == 1 or "time limit" in text:
        return "time"
    if "solution limit" in text or "node limit" in text:
        return "node"
    return None
