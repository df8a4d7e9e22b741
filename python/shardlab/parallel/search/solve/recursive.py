"""A fast, near-linear strategy search: good start points, then exact block descent.

Start points:

1. Repeated structure (``repeats.py``): when colour refinement finds far fewer classes than
   units (identical layers), the quotient graph — one unit per role, split by layer parity —
   is solved exactly by the ILP (on a multi-axis mesh one mesh axis at a time when the joint
   quotient is large) and copied to every repeat. Its size depends on one layer, not on the
   number of layers, so this stays linear in depth.
2. For graphs up to ``AXIS_ILP_MAX_UNITS`` units: one exact ILP per mesh axis (where axis 0
   goes with the other axes unused, then axis 1 given that, ...), recursive bisection of the
   mesh.
3. Otherwise: exact DP on a maximum spanning tree of the unit graph (edges weighted by how
   much the choice matters) and greedy program-order propagations from seeds (the batch
   split over the mesh axes).

Each start is improved by exact block-coordinate descent over induced forests (a block of
units whose mutual edges form a forest is re-solved exactly by tree DP with every other unit
fixed; orders: program, reverse, by weight) and then single-unit refinement. Every step is
linear in units and edges times candidates² (bounded). Candidate lists and edge matrices are
shared by identical layers (cached by signature in ``candidates.py``).

Determinism: the exact sub-solves (the quotient ILP, the per-axis ILPs) are bounded by a
branch-and-bound node limit sized by the problem (``sub_node_limit``), a work limit that is
the same on an idle and a busy machine, so the same inputs give the same plan whatever the
load. Their wall-clock limit is only a safety net far above normal solve times; a solve that
any limit cut short is reported in ``notes``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from shardlab.parallel.search.solve.ilp import arrays_size, solve_arrays
from shardlab.parallel.search.space.pairs import Pairs, own_costs, pair_matrices
from shardlab.parallel.search.space.repeats import colours, periodic, quotient, scan_roles
from shardlab.parallel.search.space.space import Space


def _find(parent: list[int], x: int) -> int:
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


def tree_dp(
    n: int, own: list[np.ndarray], pairs: Pairs, only: Sequence[bool] | None = None
) -> list[int]:
    """Exact minimum over a maximum spanning forest of ``pairs`` (of the units in ``only``)."""
    weights = sorted(pairs, key=lambda k: -float(pairs[k].max() - pairs[k].min()))
    uf = list(range(n))
    adj: list[list[int]] = [[] for _ in range(n)]
    for a, b in weights:
        ra, rb = _find(uf, a), _find(uf, b)
        if ra != rb:
            uf[ra] = rb
            adj[a].append(b)
            adj[b].append(a)
    parent = [-1] * n
    order: list[int] = []
    seen = [False] * n
    for root in range(n):
        if seen[root] or (only is not None and not only[root]):
            continue
        seen[root] = True
        stack = [root]
        while stack:
            u = stack.pop()
            order.append(u)
            for v in adj[u]:
                if not seen[v]:
                    seen[v] = True
                    parent[v] = u
                    stack.append(v)

    def oriented(p: int, c: int) -> np.ndarray:  # rows: parent's candidates
        return pairs[(p, c)] if p < c else pairs[(c, p)].T

    best = [o.copy() for o in own]
    for u in reversed(order):
        p = parent[u]
        if p >= 0:
            best[p] = best[p] + (oriented(p, u) + best[u][None, :]).min(axis=1)
    choice = [0] * n
    for u in order:
        p = parent[u]
        if p < 0:
            choice[u] = int(np.argmin(best[u]))
        else:
            choice[u] = int(np.argmin(oriented(p, u)[choice[p]] + best[u]))
    return choice


def refine(
    choice: list[int],
    own: list[np.ndarray],
    pairs: Pairs,
    *,
    sweeps: int = 6,
    on_sweep: Callable[[int], None] | None = None,
) -> list[int]:
    """Iterated conditional modes: each unit takes its best candidate given its neighbours."""
    n = len(own)
    nbrs: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(n)]
    for (a, b), m in pairs.items():
        nbrs[a].append((b, m))  # rows: a's candidates
        nbrs[b].append((a, m.T))
    choice = list(choice)
    active = [len(o) > 1 for o in own]
    for sweep in range(sweeps):
        changed = 0
        for u in range(n):
            if not active[u]:
                continue
            local = own[u].copy()
            for v, m in nbrs[u]:
                local += m[:, choice[v]]
            new = int(np.argmin(local))
            if local[new] < local[choice[u]] - 1e-15:
                choice[u] = new
                changed += 1
        if on_sweep is not None:
            on_sweep(sweep)
        if not changed:
            break
    return choice


def forest_descent(
    choice: list[int],
    own: list[np.ndarray],
    pairs: Pairs,
    orders: Sequence[Sequence[int]],
    *,
    max_steps: int = 12,
    on_step: Callable[[int, list[int]], None] | None = None,
) -> list[int]:
    """Exact block-coordinate descent over induced forests.

    For each visiting order, units join the block while the edges among block members stay
    a forest (union-find); the block is then re-solved exactly by tree DP with every other
    unit fixed (its edges to the block become unary costs). Each step can only lower the
    total, and a block spans most of the graph, so whole chains switch strategy together
    (which single-unit moves cannot do).
    """
    n = len(own)
    nbrs: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(n)]
    for (a, b), m in pairs.items():
        nbrs[a].append((b, m))
        nbrs[b].append((a, m.T))
    choice = list(choice)
    total = _total(choice, own, pairs)
    stale = 0
    for step in range(max_steps):
        order = orders[step % len(orders)]
        uf = list(range(n))
        in_block = [False] * n
        for u in order:
            if len(own[u]) < 2:
                continue
            roots = [_find(uf, v) for v, _ in nbrs[u] if in_block[v]]
            if len(roots) != len(set(roots)):
                continue  # would close a cycle
            in_block[u] = True
            for r in roots:
                uf[r] = u
        unary = []
        block_pairs: Pairs = {}
        for u in range(n):
            local = own[u]
            if in_block[u]:
                local = local.copy()
                for v, m in nbrs[u]:
                    if not in_block[v]:
                        local += m[:, choice[v]]
                    elif u < v:
                        block_pairs[(u, v)] = m
            unary.append(local)
        sub = tree_dp(n, unary, block_pairs, only=in_block)
        trial = [sub[u] if in_block[u] else choice[u] for u in range(n)]
        new_total = _total(trial, own, pairs)
        if new_total < total - 1e-12 * max(1.0, abs(total)):
            choice, total, stale = trial, new_total, 0
        else:
            stale += 1
        if on_step is not None:
            on_step(step, choice)
        if stale >= len(orders):
            break
    return choice


def _total(choice: Sequence[int], own: list[np.ndarray], pairs: Pairs) -> float:
    return sum(float(own[u][k]) for u, k in enumerate(choice)) + sum(
        float(m[choice[a], choice[b]]) for (a, b), m in pairs.items()
    )


def greedy(space: Space, own: list[np.ndarray], seed: dict[int, int] | None = None) -> list[int]:
    """In program order each unit takes its cheapest candidate given the units already
    decided (fixed units and ``seed`` first); free inputs then take what their consumers
    want. This is how layouts propagate from a few fixed ones."""
    incoming: list[list[tuple[int, np.ndarray]]] = [[] for _ in space.units]
    outgoing: list[list[tuple[int, np.ndarray]]] = [[] for _ in space.units]
    for e in space.edges:
        if e.dst_slot >= 0:
            incoming[e.dst].append((e.src, e.matrix))
            outgoing[e.src].append((e.dst, e.matrix))
    choice = [-1] * len(space.units)
    for u, k in (seed or {}).items():
        choice[u] = k
    for u in space.units:
        if choice[u.index] >= 0 or (u.kind == "input" and not u.fixed):
            continue
        local = own[u.index].copy()
        for src, m in incoming[u.index]:
            if choice[src] >= 0:
                local += m[choice[src]]
        choice[u.index] = int(np.argmin(local))
    for u in space.units:
        if choice[u.index] < 0:
            local = own[u.index].copy()
            for dst, m in outgoing[u.index]:
                local += m[:, choice[dst]]
            choice[u.index] = int(np.argmin(local))
    return choice


QUOTIENT_MAX_VARIABLES = 30_000
AXIS_ILP_MAX_UNITS = 1_500  # one exact ILP per mesh axis as a start point below this size
# Sub-solve work limits: about SUB_NODE_WORK variable-nodes (nodes × variables), clamped.
# The start-point ILPs of the bench and examples prove optimality at the root node.
SUB_NODE_WORK = 2_000_000
SUB_NODE_MIN, SUB_NODE_MAX = 50, 2_000
SAFETY_TIME = 120.0  # seconds: a last resort, far above normal sub-solve times (< 1 s)


def sub_node_limit(variables: int) -> int:
    """The deterministic branch-and-bound node limit of a sub-solve with ``variables``
    variables: larger problems get fewer (costlier) nodes."""
    return int(min(SUB_NODE_MAX, max(SUB_NODE_MIN, SUB_NODE_WORK // max(1, variables))))


def _sub_solve(
    own: list[np.ndarray],
    pairs: Pairs,
    *,
    time_limit: float,
    what: str,
    notes: list[str] | None,
) -> list[int] | None:
    """An exact sub-solve under the deterministic node limit (and the wall-clock safety
    net); appends a note to ``notes`` when a limit stopped it or it found nothing."""
    size = arrays_size(own, pairs)
    nodes = sub_node_limit(size)
    result = solve_arrays(own, pairs, time_limit=time_limit, node_limit=nodes)
    if notes is not None:
        if result.limit == "time":
            notes.append(
                f"recursive: the {what} ILP ({size} variables) hit its {time_limit:g} s "
                "safety time limit; its start point may depend on the machine's load"
            )
        elif result.limit == "node":
            notes.append(
                f"recursive: the {what} ILP ({size} variables) stopped at its node limit "
                f"({nodes} nodes, deterministic): its best incumbent is a start point, "
                "not proven optimal"
            )
        if result.choice is None and result.limit is None:
            notes.append(f"recursive: the {what} ILP found no feasible point: {result.message}")
    return result.choice


def repeated_start(
    space: Space,
    own: list[np.ndarray],
    pairs: Pairs,
    *,
    time_limit: float = SAFETY_TIME,
    period: int = 2,
    notes: list[str] | None = None,
) -> list[int] | None:
    """Solve the quotient of repeated structure exactly and copy the choice to every member;
    ``None`` when there is little repetition or the quotient is too large. Repeats are
    split by parity (``period``) so alternating layer strategies stay reachable.
    ``time_limit`` is the wall-clock safety net of each sub-solve (the node limit is what
    bounds them); ``notes`` receives a line when a limit cut one short."""

    n = len(space.units)
    base = colours(space)
    if n < 100 or max(base, default=-1) + 1 > 0.6 * n:
        return None
    col = scan_roles(space, periodic(base, period))
    classes = max(col, default=-1) + 1
    q_own, q_pairs = quotient(own, pairs, col)
    reps: dict[int, int] = {}
    for u, c in enumerate(col):
        reps.setdefault(c, u)
    axis_of = [[k.axis_of for k in space.units[reps[c]].cands] for c in range(classes)]
    size = arrays_size(q_own, q_pairs)
    if size <= QUOTIENT_MAX_VARIABLES or len(space.sizes) == 1:
        if size > 2 * QUOTIENT_MAX_VARIABLES:
            return None
        q_choice = _sub_solve(q_own, q_pairs, time_limit=time_limit, what="quotient", notes=notes)
    else:
        q_choice = solve_by_axis(
            q_own,
            q_pairs,
            axis_of,
            len(space.sizes),
            time_limit=time_limit,
            notes=notes,
            what="quotient",
        )
    if q_choice is None:
        return None
    return [q_choice[c] for c in col]


def solve_by_axis(
    own: list[np.ndarray],
    pairs: Pairs,
    axis_of: list[list[tuple[int, ...]]],
    n_axes: int,
    *,
    time_limit: float = SAFETY_TIME,
    notes: list[str] | None = None,
    what: str = "per-axis",
) -> list[int] | None:
    """One mesh axis at a time (recursive bisection of the mesh): first every unit chooses
    where mesh axis 0 goes with the other axes unused, then, with those fixed, axis 1, and
    so on; each step is an exact ILP over a few candidates per unit, bounded by the
    deterministic node limit (``time_limit``: each step's wall-clock safety net)."""

    n = len(own)
    fixed: list[dict[int, int]] = [{} for _ in range(n)]
    choice: list[int] | None = None
    for axis in range(n_axes):
        keep = []
        for u in range(n):
            ok = [
                k
                for k, ax in enumerate(axis_of[u])
                if all(ax[a] == fixed[u][a] for a in range(axis))
                and all(ax[a] == -1 for a in range(axis + 1, n_axes))
            ]
            keep.append(np.asarray(ok or [0]))
        sub_own = [own[u][keep[u]] for u in range(n)]
        sub_pairs = {(a, b): m[np.ix_(keep[a], keep[b])] for (a, b), m in pairs.items()}
        sub = _sub_solve(
            sub_own,
            sub_pairs,
            time_limit=time_limit,
            what=f"{what} (mesh axis {axis})",
            notes=notes,
        )
        if sub is None:
            return choice
        choice = [int(keep[u][k]) for u, k in enumerate(sub)]
        for u in range(n):
            ax = axis_of[u][choice[u]] if axis_of[u] else ()
            fixed[u][axis] = ax[axis] if ax else -1
    return choice


def solve_recursive(
    space: Space,
    *,
    extra: Sequence[np.ndarray] | None = None,
    on_sweep: Callable[[int], None] | None = None,
    keep: Callable[[list[int]], None] | None = None,
    seeds: Sequence[dict[int, int]] = (),
    starts: str = "tree",
    quotient_time: float = SAFETY_TIME,
    notes: list[str] | None = None,
) -> list[int]:
    """A near-linear assignment: start points, forest block descent, local refinement.

    Args:
        space: the strategy space.
        extra: per unit, added to each candidate's own cost (a memory penalty).
        on_sweep: called after each descent step (progress).
        keep: receives each complete assignment as it is found (best so far, for interrupts).
        seeds: extra start points: ``{unit: candidate}`` for some inputs, completed greedily.
        starts: ``"tree"``: start points are the repeated-structure quotient solved
            exactly (when there is repetition), else one exact ILP per mesh axis (graphs up
            to ``AXIS_ILP_MAX_UNITS`` units), the spanning-tree DP and ``seeds``;
            ``"greedy"`` adds program-order propagation from the fixed units (semi-auto).
        quotient_time: the wall-clock safety net of each exact sub-solve (the quotient
            ILP, each per-axis ILP), far above normal solve times. What bounds them is a
            deterministic node limit (``sub_node_limit``), so the result does not depend
            on the machine's load.
        notes: receives a line for every sub-solve a limit cut short (node limit:
            deterministic; time limit: load-dependent) or that found no feasible point;
            the plan's notes, typically.
    """
    own = own_costs(space, extra)
    pairs = pair_matrices(space)
    n = len(space.units)
    folded = repeated_start(space, own, pairs, time_limit=quotient_time, notes=notes)
    points = [] if folded is None else [folded]
    if n <= AXIS_ILP_MAX_UNITS:
        axis_of = [[k.axis_of for k in u.cands] for u in space.units]
        by_axis = solve_by_axis(
            own, pairs, axis_of, len(space.sizes), time_limit=quotient_time, notes=notes
        )
        if by_axis is not None:
            points.append(by_axis)
    if folded is None:  # large graphs with repetition refine only the folded solution
        points += [tree_dp(n, own, pairs)] + [greedy(space, own, s) for s in seeds]
    if starts == "greedy":
        points.insert(0, greedy(space, own))
    forward = list(range(n))
    if folded is not None and n > AXIS_ILP_MAX_UNITS:
        orders = [forward]  # one exact block step around the folded solution
    else:
        weight = np.array([float(np.ptp(o)) for o in own])
        for (a, b), m in pairs.items():
            spread = float(m.max() - m.min())
            weight[a] += spread
            weight[b] += spread
        heavy = [int(i) for i in np.argsort(-weight, kind="stable")]
        orders = [forward, forward[::-1], heavy]
    best: list[int] | None = None
    best_total = float("inf")
    steps = 0

    def step(i: int, current: list[int]) -> None:
        nonlocal steps
        steps += 1
        if keep is not None:
            keep(current)
        if on_sweep is not None:
            on_sweep(steps)

    for point in points:
        if keep is not None:
            keep(point)
        choice = forest_descent(point, own, pairs, orders, on_step=step, max_steps=len(orders) * 4)
        choice = refine(choice, own, pairs)
        total = _total(choice, own, pairs)
        if total < best_total:
            best, best_total = choice, total
    assert best is not None
    return best
