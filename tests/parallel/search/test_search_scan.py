"""Scanned layers: ``lax.scan`` bodies are unrolled for the search, solved with one choice
per body equation, and applied to the original scan."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from shardlab import examples
from shardlab._core.equivalence import assert_same_program
from shardlab.parallel.cost.profiles import comm_time, resolve_profile
from shardlab.parallel.graph import opgraph
from shardlab.parallel.graph.opgraph import build_from_jaxpr
from shardlab.parallel.graph.trace import find_ties
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.search.driver import search
from shardlab.parallel.search.solve.recursive import solve_recursive
from shardlab.parallel.search.space.build import build_space
from shardlab.parallel.search.space.scan_ties import roles, tie_scan_choices

METHODS = ("recursive", "ilp", "auto", "propagate")
SCAN_WARNING = "no sharding rule for primitive 'scan'"


@pytest.fixture(scope="module")
def mesh():
    return make_mesh(data=2, model=4)


def _close(got, want, fn, *args) -> bool:
    """The plan computes the plain program (``_core/equivalence.py``)."""
    assert_same_program(got, want, fn=fn, args=args)
    return True


def _mlp_forward(p, x):
    def layer(h, w):
        return h + jax.nn.relu(h @ w["w1"]) @ w["w2"], None

    return jax.lax.scan(layer, x, p)[0]


def _mlp_loop_forward(p, x):
    for i in range(p["w1"].shape[0]):
        x = x + jax.nn.relu(x @ p["w1"][i]) @ p["w2"][i]
    return x


def _mlp_case(forward, layers: int = 4, batch: int = 64, hidden: int = 512):
    """A residual MLP stack, hidden ≫ batch (tensor parallelism pays), as a train step."""
    k = jax.random.split(jax.random.key(0), 4)
    params = {
        "w1": jax.random.normal(k[0], (layers, hidden, hidden)) * 0.05,
        "w2": jax.random.normal(k[1], (layers, hidden, hidden)) * 0.05,
    }
    xy = (jax.random.normal(k[2], (batch, hidden)), jax.random.normal(k[3], (batch, hidden)))

    def loss(p, xy):
        return jnp.mean((forward(p, xy[0]) - xy[1]) ** 2)

    step = examples.train_step(loss)
    return step, (params, jax.tree.map(jnp.zeros_like, params), xy)


@pytest.fixture(scope="module")
def mlp_plans(mesh):
    step, args = _mlp_case(_mlp_forward)
    return step, args, {m: search(step, *args, mesh=mesh, method=m) for m in METHODS}


@pytest.mark.parametrize("method", METHODS)
def test_scanned_mlp_plan_runs_and_shards_the_stacked_weights(mlp_plans, method):
    step, args, plans = mlp_plans
    plan = plans[method]
    assert _close(plan.jit()(*args), jax.jit(step)(*args), step, *args)
    assert not any(SCAN_WARNING in w for w in plan.cost.warnings)
    for path, spec in zip(plan.input_paths, plan.input_specs, strict=True):
        if path.startswith("0/"):  # stacked weights: layer dim whole, another dim split
            assert spec[0] == () and any(spec[1:]), (path, spec)
    report = plan.verify()
    assert report.collectives
    assert any("model" in c.mesh_axes for c in report.collectives)


def test_ilp_plan_applies_one_choice_per_body_equation(mlp_plans):
    _, _, plans = mlp_plans
    plan = plans["ilp"]
    graph = plan.binding.graph
    assert len(graph.scan_groups) == 2  # forward scan and the reverse=True backward scan
    per_role: dict[tuple[int, int], dict[int, object]] = {}
    for node, _, specs in plan.constraints:
        origin = graph.nodes[node].origin
        if origin is not None:
            per_role.setdefault((origin[0], origin[2]), {})[origin[1]] = specs
    assert per_role
    for role, by_iteration in per_role.items():
        assert len(set(by_iteration.values())) == 1, (role, by_iteration)


def test_tie_post_pass_copies_one_iteration_to_all(mesh):
    step, args = _mlp_case(_mlp_forward)
    closed, out_shape = jax.make_jaxpr(step, return_shape=True)(*args)
    graph = build_from_jaxpr(closed, unroll_scans=True)
    sizes = {"data": 2, "model": 4}
    space = build_space(graph, sizes, resolve_profile(None), ties=find_ties(args, out_shape))
    choice = solve_recursive(space)
    # Break one iteration of the forward scan's first matmul on purpose.
    units = roles(space)[0][min(p for p in roles(space)[0] if p >= 0)]
    victim = units[1]
    choice[victim] = (choice[victim] + 1) % len(space.units[victim].cands)
    tied = tie_scan_choices(space, choice)
    for by_role in roles(space).values():
        for by_iteration in by_role.values():
            first = next(iter(by_iteration.values()))
            same = [
                u for u in by_iteration.values() if space.units[u].cands is space.units[first].cands
            ]
            assert len({tied[u] for u in same}) == 1


def test_gpt_scan_train_step_matches_and_costs_what_it_compiles_to(mesh):
    """The scanned step runs as loops: each iteration's gradient all-reduces are launched
    in the loop (XLA's combiner merges none across iterations), so it communicates more
    than the unrolled model, whose all-reduces combine into few; the cost model says so."""
    case, unrolled = examples.gpt_scan(2), examples.gpt(2)
    plan = search(case.fn, *case.args, mesh=mesh, method="recursive")
    assert _close(plan.jit()(*case.args), jax.jit(case.fn)(*case.args), case.fn, *case.args)
    assert not plan.cost.warnings
    assert len(plan.binding.graph.scan_groups) == 2
    compiled = comm_time(plan.verify().collectives, plan.cost.device)
    assert plan.cost.comm_time == pytest.approx(compiled, rel=0.05)
    reference = search(unrolled.fn, *unrolled.args, mesh=mesh, method="recursive")
    assert reference.cost.comm_time < plan.cost.comm_time


def test_gpt_scan_forward_auto(mesh):
    case = examples.gpt_scan(2, train=False)
    plan = search(case.fn, *case.args, mesh=mesh, method="auto")
    assert _close(plan.jit()(*case.args), jax.jit(case.fn)(*case.args), case.fn, *case.args)
    assert not any(SCAN_WARNING in w for w in plan.cost.warnings)


def test_scanned_mlp_costs_like_a_python_loop(mlp_plans, mesh):
    _, _, plans = mlp_plans
    step, args = _mlp_case(_mlp_loop_forward)
    loop = search(step, *args, mesh=mesh, method="ilp")
    assert plans["ilp"].cost.time == pytest.approx(loop.cost.time, rel=0.10)


def _reverse_carry_ys(w, x):
    def body(c, wi):
        h = jnp.tanh(c @ wi)
        return h, (h * 2.0).sum(axis=0)

    return jax.lax.scan(body, x, w, reverse=True, unroll=2)


def _consts_and_carry(w, x):
    scale = jnp.full((x.shape[1],), 0.5)

    def body(carry, wi):
        h, total = carry
        h = jax.nn.relu(h @ wi) * scale + h
        return (h, total + h.mean()), h

    (h, total), ys = jax.lax.scan(body, (x, jnp.zeros(())), w)
    return h, total, ys


@pytest.mark.parametrize("fn", [_reverse_carry_ys, _consts_and_carry])
@pytest.mark.parametrize("length", [1, 3])
def test_scan_forms_are_numerically_equal_under_their_plans(mesh, fn, length):
    k = jax.random.split(jax.random.key(1), 2)
    w = jax.random.normal(k[0], (length, 64, 64)) * 0.1
    x = jax.random.normal(k[1], (32, 64))
    for f in (fn, jax.grad(lambda w, x: sum(jnp.sum(o) for o in jax.tree.leaves(fn(w, x))))):
        plan = search(f, w, x, mesh=mesh, method="ilp")
        assert not any(SCAN_WARNING in w for w in plan.cost.warnings)
        assert _close(plan.jit()(w, x), jax.jit(f)(w, x), f, w, x)
    graph = plan.binding.graph
    assert [g.length for g in graph.scan_groups] == [length, length]
    planned, original = plan.jit().lower(w, x).as_text(), jax.jit(f).lower(w, x).as_text()
    assert planned.count("stablehlo.while") == original.count("stablehlo.while")  # loops kept


def test_scan_over_the_limit_stays_one_node(mesh, monkeypatch):
    monkeypatch.setattr(opgraph, "SCAN_UNROLL_LIMIT", 10)
    w = jax.random.normal(jax.random.key(2), (8, 64, 64)) * 0.1
    x = jax.random.normal(jax.random.key(3), (32, 64))
    plan = search(_reverse_carry_ys, w, x, mesh=mesh, method="ilp")
    graph = plan.binding.graph
    assert not graph.scan_groups and "scan" in graph.primitive_counts()
    assert any(SCAN_WARNING in w for w in plan.cost.warnings)
    assert _close(plan.jit()(w, x), jax.jit(_reverse_carry_ys)(w, x), _reverse_carry_ys, w, x)


def test_a_scans_iterations_fold_into_one_body_in_the_quotient(mesh):
    """Colour refinement alone tells a scan's first and last iterations apart (the stacked
    outputs' buffer is a chain through all of them); the quotient the recursive search solves
    exactly gets one unit per body role instead, so its size does not depend on the number of
    iterations."""
    from shardlab.parallel.search.solve import recursive
    from shardlab.parallel.search.space.pairs import own_costs, pair_matrices
    from shardlab.parallel.search.space.repeats import colours, periodic, scan_roles

    sizes = {"data": 2, "model": 4}
    classes = {}
    for layers in (6, 12):
        case = examples.gpt_scan(layers)
        closed, out_shape = jax.make_jaxpr(case.fn, return_shape=True)(*case.args)
        graph = build_from_jaxpr(closed, unroll_scans=True)
        space = build_space(
            graph, sizes, resolve_profile(None), ties=find_ties(case.args, out_shape)
        )
        refined = periodic(colours(space), 2)
        col = scan_roles(space, refined)
        for by_role in roles(space).values():
            for by_iteration in by_role.values():
                middle = by_iteration[max(by_iteration) // 2]
                same = [
                    u
                    for u in by_iteration.values()
                    if space.units[u].cands is space.units[middle].cands
                ]
                assert len({col[u] for u in same}) == 1
        classes[layers] = max(col) + 1
        assert classes[layers] < max(refined) + 1
        own, pairs = own_costs(space), pair_matrices(space)
        folded = recursive.repeated_start(space, own, pairs)
        assert folded is not None
        assert len({folded[u] for u in same}) == 1  # copied to every iteration
    assert classes[6] == classes[12]  # one body, however many iterations
