"""The search methods: ILP exactness, recursive quality and speed, auto, budgets, progress."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from shardlab import examples, strategies
from shardlab._core.equivalence import assert_same_program
from shardlab.parallel.cost.profiles import resolve_profile
from shardlab.parallel.graph.trace import trace
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.search.driver import search
from shardlab.parallel.search.solve.ilp import solve_ilp
from shardlab.parallel.search.solve.recursive import solve_recursive
from shardlab.parallel.search.space.build import build_space
from shardlab.parallel.search.space.repeats import colours


@pytest.fixture(scope="module")
def m8():
    return make_mesh(data=8)


def test_mlp_regimes_pick_data_and_tensor_parallel(m8):
    """Batch 1024 × hidden 128 is data parallel (the train step may also shard the optimizer
    state, ZeRO-style); batch 128 × hidden 1024 is tensor parallel, forward too: streaming
    replicated 1024² weights costs more than Megatron's one activation all-reduce."""
    for train in (False, True):
        dp_case = examples.mlp(1024, 128, train=train)
        plan = search(dp_case.fn, *dp_case.args, mesh=m8)
        # the ILP's plan, or the data-parallel baseline it ties (a tie goes to the baseline)
        assert plan.method == "auto:ilp→data_parallel" or (
            plan.method == "auto:ilp" and plan.optimal
        ), plan.notes
        weight_bytes = sum(int(np.prod(s)) * 4 for s in plan.input_shapes[:2])
        # only parameter-sized collectives (and the loss scalar), no activations
        assert all(c.bytes <= weight_bytes + 64 for c in plan.cost.collectives)
        if not train:
            params, _ = plan.in_shardings
            assert params["w1"].spec == P() and params["w2"].spec == P()
            assert not plan.cost.collectives
    for train in (False, True):
        tp_case = examples.mlp(128, 1024, train=train)
        plan = search(tp_case.fn, *tp_case.args, mesh=m8)
        params = plan.in_shardings[0]
        assert params["w1"].spec == P(None, "data") and params["w2"].spec == P("data")  # Megatron


def test_ilp_is_exact_and_others_are_not_better(m8):
    case = examples.mlp(256, 256, train=True)
    graph = trace(case.fn, *case.args, unroll_scans=False).graph
    from shardlab.parallel.graph.trace import find_ties

    ties = find_ties(case.args, jax.eval_shape(case.fn, *case.args))
    for sizes in ({"data": 8}, {"data": 2, "model": 4}):
        space = build_space(graph, sizes, resolve_profile("cpu-sim"), ties=ties)
        exact = solve_ilp(space)
        assert exact.optimal and exact.choice is not None
        fast = space.total(solve_recursive(space))
        assert exact.objective <= fast + 1e-12
        # brute force over one unit's alternatives cannot improve the optimum
        for u in space.units[:10]:
            for k in range(len(u.cands)):
                trial = list(exact.choice)
                trial[u.index] = k
                assert space.total(trial) >= exact.objective - 1e-12


def test_ilp_time_limit_returns_incumbent_marked_not_optimal():
    case = examples.gpt(1, batch=8, seq=8, d=32, heads=4, vocab=64)
    plan = search(case.fn, *case.args, mesh=make_mesh(data=2, model=4), method="ilp",
                  time_limit=0.05)  # fmt: skip
    assert plan.optimal is False
    assert any("not proven optimal" in n or "recursive result" in n for n in plan.notes)


def _deep_mlp(layers: int, width: int = 64, batch: int = 64):
    keys = jax.random.split(jax.random.key(1), layers + 2)
    params = [jax.random.normal(k, (width, width)) * 0.1 for k in keys[:layers]]
    x = jax.random.normal(keys[-1], (batch, width))

    def loss(ps, x):
        for w in ps:
            x = jnp.tanh(x @ w)
        return jnp.mean(x**2)

    def step(ps, x):
        value, grads = jax.value_and_grad(loss)(ps, x)
        return [p - 0.1 * g for p, g in zip(ps, grads, strict=True)], value

    return step, (params, x)


def test_recursive_reuses_repeated_layers_and_matches_ilp():
    step, args = _deep_mlp(16)
    graph = trace(step, *args, unroll_scans=False).graph
    space = build_space(graph, {"data": 2, "model": 4}, resolve_profile("cpu-sim"))
    col = colours(space)
    assert max(col) + 1 < 0.5 * len(space.units)  # layers share colours
    fast = space.total(solve_recursive(space))
    exact = solve_ilp(space, time_limit=60)
    assert fast <= exact.objective * 1.05


def test_recursive_is_near_linear():
    times = {}
    for layers in (8, 16):
        step, args = _deep_mlp(layers)
        m = make_mesh(data=8)
        search(step, *args, mesh=m, method="recursive")  # warm caches
        start = time.perf_counter()
        search(step, *args, mesh=m, method="recursive")
        times[layers] = time.perf_counter() - start
    assert times[16] < 3.5 * times[8] + 0.1


def test_auto_says_which_method(m8):
    case = examples.mlp(64, 64, train=False)
    plan = search(case.fn, *case.args, mesh=m8)
    assert plan.method.split("→")[0] == "auto:ilp", plan.method
    assert any("auto chose ilp" in n for n in plan.notes)


def test_memory_budget_below_data_parallel(m8):
    case = examples.mlp(128, 1024, train=True)
    dp = strategies.data_parallel(case.fn, *case.args, mesh=m8)
    budget = dp.cost.memory.peak // 2
    for method in ("ilp", "recursive"):
        plan = search(case.fn, *case.args, mesh=m8, method=method, memory_budget=budget)
        assert plan.cost.memory.peak <= budget, plan.notes
        assert plan.memory_budget == budget


def test_progress_and_interrupt_return_best_so_far(m8):
    case = examples.mlp(256, 256, train=True)
    seen: list[tuple[float, str]] = []
    search(case.fn, *case.args, mesh=m8, method="recursive",
           progress=lambda f, msg: seen.append((f, msg)))  # fmt: skip
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0

    def interrupt(fraction: float, message: str) -> None:
        if "descent" in message:
            raise KeyboardInterrupt

    plan = search(case.fn, *case.args, mesh=m8, method="recursive", progress=interrupt)
    assert not plan.complete and any("interrupted" in n for n in plan.notes)
    out = plan.jit()(*case.args)
    assert_same_program(out, case.fn(*case.args), fn=case.fn, args=case.args)
