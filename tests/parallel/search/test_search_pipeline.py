"""``search(..., pipeline=...)``: stages chosen by the schedule simulator, run pipelined."""

from __future__ import annotations

import jax
import pytest

from shardlab._core.equivalence import assert_same_program
from shardlab.examples.transformer import gpt_scan
from shardlab.parallel.errors import SearchError
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.search.driver import search


@pytest.fixture(scope="module")
def case():
    return gpt_scan(4, batch=8, seq=8, d=32, heads=4, vocab=64)


@pytest.fixture(scope="module")
def staged(case):
    return search(case.fn, *case.args, mesh=make_mesh(stage=2, data=4), pipeline=2, confirm=False)


def test_asked_stages_run_pipelined_and_equal(case, staged):
    assert staged.pipeline is not None and staged.pipeline.stages == 2
    assert "→pipeline+" in staged.method
    assert any(n.startswith("pipeline: 2 stages") for n in staged.notes)
    # the cost is the schedule simulator's: it names the collective-permutes it predicts
    assert staged.cost.comm_bytes.get("collective-permute", 0) > 0
    want = jax.jit(case.fn)(*case.args)
    got = staged.jit()(*case.args)
    assert_same_program(got, want, fn=case.fn, args=case.args)


def test_auto_keeps_the_plan_when_stages_do_not_pay_or_cannot_run(case):
    flat = search(case.fn, *case.args, mesh=make_mesh(data=8), confirm=False)
    assert flat.pipeline is None and not any(n.startswith("pipeline") for n in flat.notes)
    auto = search(case.fn, *case.args, mesh=make_mesh(stage=2, data=4), confirm=False)
    assert any(n.startswith("pipeline") for n in auto.notes)
    if auto.pipeline is None:  # the note gives both predicted times
        assert any("do not pay" in n for n in auto.notes)


def test_bad_pipeline_requests(case):
    m = make_mesh(stage=2, data=4)
    with pytest.raises(SearchError, match=r"pipeline=3 stages do not divide the 4"):
        search(case.fn, *case.args, mesh=m, pipeline=3, confirm=False)
    with pytest.raises(SearchError, match=r"microbatches=3 does not divide the batch of 8"):
        search(case.fn, *case.args, mesh=m, pipeline=2, microbatches=3, confirm=False)
    with pytest.raises(SearchError, match=r"no 'stage' axis"):
        search(case.fn, *case.args, mesh=make_mesh(data=8), pipeline=2, confirm=False)


def test_auto_on_a_model_without_layer_scan_searches_as_usual():
    def step(w, x):
        return jax.numpy.tanh(x @ w).sum()

    w, x = jax.numpy.ones((16, 16)), jax.numpy.ones((8, 16))
    plan = search(step, w, x, mesh=make_mesh(stage=2, data=4), confirm=False)
    assert plan.pipeline is None
    assert any(n.startswith("pipeline") for n in plan.notes), plan.notes
    assert_same_program(plan.jit()(w, x), step(w, x), fn=step, args=(w, x))
