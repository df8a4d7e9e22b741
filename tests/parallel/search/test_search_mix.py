"""Under a memory budget the search chooses remat and the ZeRO stage too (``search/mix.py``)."""

from __future__ import annotations

import jax
import pytest

from shardlab._core.equivalence import assert_same_program
from shardlab.examples.transformer import gpt_scan
from shardlab.parallel.errors import SearchError
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.plan.remat import with_remat
from shardlab.parallel.search.driver import search
from shardlab.parallel.search.strategies.baselines import data_parallel
from shardlab.parallel.search.strategies.mix import choose, options, remat_specs


@pytest.fixture(scope="module")
def case():
    # activations dominate: 32 sequences of 32 tokens through 4 scanned layers of width 32
    return gpt_scan(4, batch=32, seq=32, d=32, heads=4, vocab=64)


@pytest.fixture(scope="module")
def dp(case):
    plan = data_parallel(case.fn, *case.args, mesh=make_mesh(data=8))
    return plan, plan.verify().memory.total


def _equal(plan, case):
    want = jax.jit(case.fn)(*case.args)
    got = plan.jit()(*case.args)
    assert_same_program(got, want, fn=case.fn, args=case.args)


def test_a_budget_only_remat_meets_returns_a_remat_plan_that_fits_and_equals(case, dp):
    base, compiled = dp
    nothing = with_remat(base, "nothing")
    budget = 0.6 * compiled
    # the budget is below every plain plan's prediction and above full remat's
    assert nothing.cost.memory.peak < budget < base.cost.memory.peak
    plan = search(case.fn, *case.args, mesh=make_mesh(data=8), memory_budget=budget)
    assert plan.remat is not None and plan.remat.policy in ("dots", "nothing")
    assert "remat(" in plan.method
    assert plan.verify().memory.total <= budget
    mix = [n for n in plan.notes if n.startswith("mix: ")]
    assert mix and "fastest plan within the budget" in mix[-1]
    _equal(plan, case)


def test_mixes_are_priced_on_the_cost_model_and_the_fastest_fitting_wins(case, dp):
    base, _ = dp
    plans = {"data_parallel": base}
    specs = remat_specs(base)
    assert {s.policy for s in specs} == {"dots", "nothing"}
    tried = options(None, plans)
    assert [o.time for o in tried] == sorted(o.time for o in tried)
    plain = next(o for o in tried if o.name == "data_parallel")
    full = next(o for o in tried if o.name == "data_parallel+remat(nothing)")
    # remat trades time for memory, as the model prices it
    assert full.peak < plain.peak and full.time > plain.time
    roomy = choose(None, plans, budget=plain.peak)
    assert roomy.chosen is not None and roomy.chosen.name == "data_parallel"
    tight = choose(None, plans, budget=full.peak)
    assert tight.chosen is not None and tight.chosen.name == "data_parallel+remat(nothing)"
    assert choose(None, plans, budget=full.peak - 1).chosen is None


def test_a_budget_no_mix_meets_names_the_smallest_per_dimension(case, dp):
    base, _ = dp
    lightest = min(o.peak for o in options(None, {"data_parallel": base}))
    with pytest.raises(SearchError) as info:
        search(
            case.fn,
            *case.args,
            mesh=make_mesh(data=8),
            memory_budget=lightest * 0.3,
            confirm=False,
            verify_budget=False,
        )
    text = str(info.value)
    assert "no sharding × ZeRO × remat mix fits" in text
    assert "sharding alone:" in text and "with remat:" in text


def test_without_layer_scan_there_is_no_remat_choice():
    def step(w, x):
        return jax.numpy.tanh(x @ w).sum()

    w, x = jax.numpy.ones((64, 64)), jax.numpy.ones((64, 64))
    plan = data_parallel(step, w, x, mesh=make_mesh(data=8))
    assert remat_specs(plan) == []
    got = search(step, w, x, mesh=make_mesh(data=8), memory_budget=10 * plan.cost.memory.peak)
    assert got.remat is None
