"""``_core/equivalence.py``: the one rule for "this program equals that one". Correct
reorderings of a program's roundings pass (sharded, microbatched, reversed sums); faults that
real parallel programs have — a wrong layout, a missing all-reduce, a dropped microbatch, a
stale carry — fail, in the real pipeline and on hand-written ones."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardlab._core.equivalence import (
    assert_same_program,
    rounding_steps,
    same_program,
    tolerance,
)
from shardlab.examples.transformer import gpt_scan
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.plan.pipeline import with_pipeline
from shardlab.parallel.records import PipelineSpec
from shardlab.parallel.search.strategies.baselines import data_parallel


def test_tolerance_follows_the_dtype_and_the_program_length():
    assert tolerance(jnp.float32, 100) < tolerance(jnp.float32, 10_000) < 1e-3
    assert tolerance(jnp.float64, 10_000) < 1e-11
    assert tolerance(jnp.bfloat16, 100) > 100 * tolerance(jnp.float32, 100)
    # sqrt(n) growth: 100x the roundings, about 10x the bound (the log term adds a little)
    assert 10 < tolerance(jnp.float32, 1_000_000) / tolerance(jnp.float32, 10_000) < 12


def test_rounding_steps_count_reductions_and_loop_trips():
    x, w = jnp.ones((4, 64)), jnp.ones((64, 8))
    assert rounding_steps(lambda x, w: x @ w, x, w) == 64
    assert rounding_steps(lambda x: x.sum(), x) == 256
    assert rounding_steps(lambda x: jnp.tanh(x) + 1, x) == 2

    def looped(x, w):
        return jax.lax.scan(lambda h, _: (jnp.tanh(h @ w[:, :64].T @ w[:, :64]), None), x, None, 5)

    w2 = jnp.ones((64, 64))
    assert rounding_steps(looped, x, w2) == 5 * rounding_steps(lambda h: jnp.tanh(h @ w2.T @ w2), x)


def test_reordered_sums_pass_and_any_fault_fails():
    key = jax.random.key(0)
    x = jax.random.normal(key, (64, 4096), jnp.float32)
    w = jax.random.normal(jax.random.key(1), (4096, 32), jnp.float32)
    plain = x @ w
    steps = rounding_steps(jnp.matmul, x, w)
    # the same sums in another order: 16 partial products added last, and reversed
    parts = sum(x[:, i : i + 256] @ w[i : i + 256] for i in range(0, 4096, 256))
    backwards = sum(x[:, i : i + 256] @ w[i : i + 256] for i in reversed(range(0, 4096, 256)))
    assert np.abs(np.asarray(parts - plain)).max() > 0  # the roundings did change
    assert_same_program(parts, plain, steps=steps)
    assert_same_program(backwards, plain, steps=steps)
    # one of 4096 terms dropped, one element moved, the dtype or shape changed: all caught
    assert same_program(plain - x[:, :1] @ w[:1], plain, steps=steps)
    assert same_program(plain.at[3, 5].add(abs(float(plain[3, 5])) + 1.0), plain, steps=steps)
    assert same_program(plain.astype(jnp.bfloat16), plain, steps=steps)
    assert same_program(plain[:, :31], plain, steps=steps)
    assert same_program(plain.at[0, 0].set(jnp.nan), plain, steps=steps)
    assert same_program({"a": plain}, {"b": plain}, steps=steps)
    keys = jax.random.split(key, 2)
    assert not same_program(keys, jax.random.split(key, 2), steps=1)
    assert same_program(keys, jax.random.split(jax.random.key(1), 2), steps=1)


def test_it_needs_a_program_length():
    with pytest.raises(TypeError, match="steps= or fn="):
        same_program(jnp.ones(3), jnp.ones(3))


def test_failure_names_the_leaf_and_the_allowed_error():
    want = {"w": jnp.ones((8, 8)), "b": jnp.zeros(8)}
    got = {"w": jnp.ones((8, 8)) * 1.01, "b": jnp.zeros(8)}
    with pytest.raises(AssertionError, match=r"\['w'\]: values differ: relative error 0.0099"):
        assert_same_program(got, want, steps=64)


# -- faults planted in real parallel programs ---------------------------------------------------


def test_a_missing_all_reduce_or_shards_in_the_wrong_place_fail():
    mesh = make_mesh(model=8)
    x = jax.random.normal(jax.random.key(2), (16, 256))
    w = jax.random.normal(jax.random.key(3), (256, 64))
    specs = (P(None, "model"), P("model", None))

    def local(reduce):
        def f(xs, ws):
            partial = xs @ ws
            return jax.lax.psum(partial, "model") if reduce else partial

        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False))

    plain = x @ w
    steps = rounding_steps(jnp.matmul, x, w)
    assert_same_program(local(True)(x, w), plain, steps=steps)  # the sharded program: same
    assert same_program(local(False)(x, w), plain, steps=steps)  # one device's partial sum
    # batch-sharded rows read back in the wrong device order
    rows = jax.device_put(x, NamedSharding(mesh, P("model", None)))
    good = jax.jit(jnp.matmul)(rows, w)
    assert_same_program(good, plain, steps=steps)
    rolled = np.roll(np.asarray(good), 2, axis=0)  # two rows: one shard off
    assert same_program(rolled, np.asarray(plain), steps=steps)


@pytest.fixture(scope="module")
def pipelined():
    case = gpt_scan(4, batch=8, seq=8, d=16, heads=2, vocab=64)
    mesh = make_mesh(stage=2, data=4)
    plan = data_parallel(case.fn, *case.args, mesh=mesh, axes=("data",))
    plan = with_pipeline(plan, PipelineSpec(stages=2, microbatches=4))
    want = jax.jit(case.fn)(*case.args)
    return case, plan, want, rounding_steps(case.fn, *case.args)


def _rerun(plan, case):
    """The plan traced anew (a patched jax function must be seen by the trace)."""
    jax.clear_caches()
    return jax.jit(plan.function())(*case.args)


def test_the_real_pipeline_passes(pipelined):
    case, plan, want, steps = pipelined
    assert_same_program(plan.jit()(*case.args), want, steps=steps)


def test_a_dropped_microbatch_in_the_real_pipeline_fails(pipelined, monkeypatch):
    case, plan, want, steps = pipelined
    fori = jax.lax.fori_loop
    # the last tick never runs: the last microbatch never leaves the last stage
    monkeypatch.setattr(
        jax.lax, "fori_loop", lambda lo, hi, body, init: fori(lo, hi - 1, body, init)
    )
    misses = same_program(_rerun(plan, case), want, steps=steps)
    assert misses and any("momentum" in m.path or "[1]" in m.path for m in misses), misses


def test_a_stale_carry_in_the_real_pipeline_fails(pipelined, monkeypatch):
    case, plan, want, steps = pipelined
    # activations are not shifted to the next stage: each stage keeps its own old state
    monkeypatch.setattr(jax.lax, "ppermute", lambda x, axis_name, perm: x)
    assert same_program(_rerun(plan, case), want, steps=steps)


def test_hand_written_microbatch_accumulation():
    """A loss's gradient accumulated over 4 microbatches passes; with one of them dropped
    (the others rescaled, as a bug in a loop's bounds would), it fails."""
    case = gpt_scan(4, batch=8, seq=8, d=16, heads=2, vocab=64, train=False)
    params, batch = case.args
    grad = jax.jit(jax.grad(case.fn))
    want = grad(params, batch)
    steps = rounding_steps(jax.grad(case.fn), params, batch)
    micro = [jax.tree.map(lambda a, i=i: a[2 * i : 2 * i + 2], batch) for i in range(4)]
    summed = jax.tree.map(lambda *g: sum(g) / 4, *[grad(params, mb) for mb in micro])
    assert_same_program(summed, want, steps=steps)
    dropped = jax.tree.map(lambda *g: sum(g) / 3, *[grad(params, mb) for mb in micro[:3]])
    misses = same_program(dropped, want, steps=steps)
    assert len(misses) == len(jax.tree.leaves(want)), misses
    assert all(m.error > 100 * m.allowed for m in misses), misses
