"""Rematerialisation of layer scans: the step's numbers and gradients stay the plain step's,
the compiled temporaries fall (``dots``, then ``nothing``), the backward loop recomputes,
and the cost model's memory is within 15% of the compiled one."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from examples.zoo.models import nnx_scan
from shardlab._core.equivalence import assert_same_program
from shardlab.examples.transformer import gpt, gpt_scan
from shardlab.parallel.errors import SearchError
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.plan.remat import remat_runners, with_remat
from shardlab.parallel.records import RematSpec
from shardlab.parallel.search.strategies.baselines import data_parallel

POLICIES = ("none", "dots", "nothing")
# XLA:CPU's LLVM backend at -O0: the HLO passes (fusion, buffer assignment: the memory
# figures) are the same, the compile is ~3x faster.
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
# Residuals dominate at this size: batch 32 x seq 32 (4 sequences per device), width 64.
BATCH, SEQ, WIDTH = 32, 32, 64


@pytest.fixture(scope="module")
def mesh8():
    return make_mesh(data=8)


def _equal(got, want, case):
    """The rematerialised program computes the plain one (``_core/equivalence.py``)."""
    assert_same_program(got, want, fn=case.fn, args=case.args)


def _compiled(plan, args):
    """One compile per plan: run it, and read memory, flops and dots from it."""
    compiled = plan.jit(compiler_options=FAST).lower(*args).compile()
    out = compiled(*plan.shard(*args))
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost if isinstance(cost, dict) else cost[0]
    total = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
    dots = len(re.findall(r"\bdot\(", compiled.as_text()))
    return out, {
        "temp": mem.temp_size_in_bytes,
        "total": total,
        "flops": cost["flops"],
        "dots": dots,
    }


@pytest.fixture(scope="module", params=[4, 8], ids=lambda n: f"gpt_scan{n}")
def measured(request, mesh8):
    case = gpt_scan(request.param, batch=BATCH, seq=SEQ, d=WIDTH)
    base = data_parallel(case.fn, *case.args, mesh=mesh8)
    ref = jax.jit(case.fn, compiler_options=FAST)(*case.args)
    got = {}
    for policy in POLICIES:
        plan = with_remat(base, policy)
        out, stats = _compiled(plan, case.args)
        got[policy] = (plan, out, stats)
    return request.param, ref, got, case


def test_outputs_and_gradients_equal_the_plain_step(measured):
    _, ref, got, case = measured
    for policy in POLICIES:
        # new params = params - lr * momentum(grads): equal params mean equal gradients
        _equal(got[policy][1], ref, case)


def test_compiled_temporaries_fall_and_prediction_within_15_percent(measured):
    layers, _, got, _ = measured
    temp = {p: got[p][2]["temp"] for p in POLICIES}
    assert temp["dots"] < 0.5 * temp["none"], temp
    assert temp["nothing"] < 0.8 * temp["dots"], temp
    for policy in POLICIES:
        plan, _, stats = got[policy]
        assert plan.remat == RematSpec(policy)
        assert plan.cost.memory.peak == pytest.approx(stats["total"], rel=0.15), (policy, stats)
    # the remat plan's cost says what it dropped
    assert any(n.startswith("remat nothing") for n in got["nothing"][0].notes)
    assert layers in (4, 8)


def test_backward_loop_recomputes(measured):
    layers, _, got, _ = measured
    none, dots, nothing = (got[p][2] for p in POLICIES)
    # the recomputed forward matmuls are in the compiled program
    assert nothing["dots"] > none["dots"], (none["dots"], nothing["dots"])
    assert none["flops"] < dots["flops"] < nothing["flops"]
    # XLA's cost analysis counts a while body once: the extra flops are one layer's
    # (the plan's predicted flops include the recompute of all layers)
    for policy, stats in (("dots", dots), ("nothing", nothing)):
        predicted = (got[policy][0].cost.flops - got["none"][0].cost.flops) / layers
        assert predicted > 0
        assert stats["flops"] - none["flops"] == pytest.approx(predicted, rel=0.15), policy


def test_nnx_scan_with_dropout(mesh8):
    """A model we did not write: flax nnx layers created stacked and scanned, dropout keys
    among the scanned inputs (recomputed masks must be the same masks)."""
    case = nnx_scan()
    base = data_parallel(case.fn, *case.args, mesh=mesh8)
    ref = jax.jit(case.fn, compiler_options=FAST)(*case.args)
    plan = with_remat(base, "nothing")  # (dots: covered on gpt_scan; keeps this test short)
    out, stats = _compiled(plan, case.args)
    _equal(out, ref, case)
    assert plan.cost.memory.peak == pytest.approx(stats["total"], rel=0.15), stats


@pytest.fixture(scope="module")
def small(mesh8):
    case = gpt_scan(2)
    return case, data_parallel(case.fn, *case.args, mesh=mesh8)


def test_base_runners_are_wrapped(small):
    """Where a scan group already has a runner (a pipelined scan), remat calls it."""
    case, plan = small
    calls = []

    def counting(group):
        def run(step, init, xs, **kw):
            calls.append(group)
            return jax.lax.scan(step, init, xs, **kw)

        return run

    b = plan.binding
    assert b is not None
    runners = remat_runners(b.graph, RematSpec("nothing"), {0: counting(0), 1: counting(1)})
    fn = b.constrained(plan.intermediate_specs(), runners=runners)
    got = jax.jit(fn, compiler_options=FAST)(*case.args)
    _equal(got, jax.jit(case.fn, compiler_options=FAST)(*case.args), case)
    assert sorted(calls) == [0, 1]


def test_bad_input(small, mesh8):
    _, plan = small
    with pytest.raises(SearchError, match=r"'everything'.*'dots', 'nothing'"):
        with_remat(plan, "everything")
    with pytest.raises(SearchError, match=r"scan group 1 is not a forward layer scan.*\[0\]"):
        with_remat(plan, RematSpec("dots", scans=(1,)))
    loop = gpt(2)  # blocks as a Python loop: no scan to rematerialise
    unrolled = data_parallel(loop.fn, *loop.args, mesh=mesh8)
    with pytest.raises(SearchError, match=r"lax\.scan.*nnx\.scan.*jax\.checkpoint"):
        with_remat(unrolled, "nothing")


def test_composes_with_pipeline(small):
    """Remat wraps the pipelined scans' runners (plan/pipeline.py): still the plain step."""
    from shardlab.parallel.plan.pipeline import with_pipeline
    from shardlab.parallel.records import PipelineSpec

    case, _ = small
    mesh = make_mesh(stage=2, data=4)
    plan = data_parallel(case.fn, *case.args, mesh=mesh, axes=("data",))
    plan = with_remat(with_pipeline(plan, PipelineSpec(stages=2, microbatches=2)), "nothing")
    assert plan.pipeline is not None and plan.remat == RematSpec("nothing")
    out, _ = _compiled(plan, case.args)
    _equal(out, jax.jit(case.fn, compiler_options=FAST)(*case.args), case)


def test_residual_read_elsewhere_is_refused(mesh8):
    """A forward scan's stacked output read by the reverse scan and by something else cannot
    be dropped: refused with the node that reads it."""

    def fn(w, x):
        h, hs = jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi), h), x, w)
        back = lambda g, hw: (g @ hw[1].T * (1 - hw[0] ** 2), g)  # noqa: E731
        g, gs = jax.lax.scan(back, h, (hs, w), reverse=True)
        return g, gs, jnp.sum(hs)  # hs is also summed

    w, x = jnp.full((3, 16, 16), 0.1), jnp.ones((8, 16))
    plan = data_parallel(fn, w, x, mesh=mesh8, batch_argnums=(1,))
    with pytest.raises(SearchError, match=r"residual 0 .* also by node \d+ \(reduce_sum\)"):
        with_remat(plan, "nothing")
    assert with_remat(plan, "none").remat == RematSpec("none")  # nothing dropped: fine
