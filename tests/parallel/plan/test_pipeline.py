"""Pipelined layer scans (``plan/pipeline.py``): the pipelined train step equals the plain one
(loss, new parameters and momentum, so the gradients), ``jax.grad`` through a pipelined loss
equals plain ``jax.grad``, the compiled program shifts activations with collective-permutes
over the stage axis, and bad input gets a clear error."""

from __future__ import annotations

import dataclasses

import jax
import jax.core as jax_core
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from examples.zoo.models import nnx_scan
from shardlab._core.equivalence import assert_same_program
from shardlab.examples.transformer import gpt, gpt_scan
from shardlab.parallel.graph.opgraph import build_from_jaxpr
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.plan.pipeline import PipelineError, _analyse, gpipe_runner, with_pipeline
from shardlab.parallel.records import PipelineSpec
from shardlab.parallel.search.strategies.baselines import data_parallel, zero


def _gpt_scan(layers: int, *, train: bool = True):
    return gpt_scan(layers, batch=8, seq=8, d=16, heads=2, vocab=64, train=train)


def _equal(got, want, fn, *args):
    """The pipelined program computes the plain one (``_core/equivalence.py``'s rule)."""
    assert_same_program(got, want, fn=fn, args=args)


@pytest.fixture(scope="module")
def train():
    case = _gpt_scan(8)
    return case, jax.jit(case.fn)(*case.args)


def _pipelined(case, mesh, **spec):
    plan = data_parallel(case.fn, *case.args, mesh=mesh, axes=("data",))
    return with_pipeline(plan, PipelineSpec(**spec))


@pytest.mark.parametrize(
    ("axes", "microbatches"),
    [
        ({"stage": 4, "data": 2}, 2),
        ({"stage": 4, "data": 2}, 4),
        ({"stage": 4, "data": 2}, 8),
        ({"stage": 2, "data": 4}, 2),
        ({"stage": 2, "data": 4}, 4),
        ({"stage": 2, "data": 4}, 8),
    ],
)
def test_train_step_equals_plain(train, axes, microbatches):
    case, want = train
    plan = _pipelined(case, make_mesh(axes), stages=axes["stage"], microbatches=microbatches)
    assert plan.pipeline is not None and plan.pipeline.microbatches == microbatches
    # the stacked layer parameters (and their momentum) live split over the stages
    blocks = [s for p, s in zip(plan.input_paths, plan.input_specs, strict=True) if "blocks" in p]
    assert blocks and all(s[0] == ("stage",) for s in blocks)
    step = plan.jit()
    _equal(step(*case.args), want, case.fn, *case.args)
    if microbatches == 4:  # the comparison can fail: a perturbed momentum is caught
        params, momentum, batch = case.args
        with pytest.raises(AssertionError):
            _equal(
                step(params, jax.tree.map(lambda m: m + 1e-3, momentum), batch),
                want,
                case.fn,
                *case.args,
            )


def test_compiled_program_permutes_over_the_stage_axis(train):
    case, _ = train
    plan = _pipelined(case, make_mesh(stage=4, data=2), stages=4, microbatches=4)
    report = plan.verify()
    permutes = [c for c in report.collectives if c.kind == "collective-permute"]
    # forward and backward shifts, each in a loop of microbatches + stages - 1 iterations
    assert len(permutes) >= 2
    assert all(c.mesh_axes == ("stage",) for c in permutes)
    assert any(c.count == 4 + 4 - 1 for c in permutes), [c.count for c in permutes]
    assert "while" in report.hlo  # the loop is kept, not unrolled by us


def test_grad_through_pipelined_forward():
    axes = {"stage": 2, "data": 4}
    case = _gpt_scan(8, train=False)
    params, batch = case.args
    want_loss, want_grad = jax.jit(jax.value_and_grad(case.fn))(params, batch)
    plan = _pipelined(case, make_mesh(axes), stages=axes["stage"], microbatches=4)
    loss = plan.function()

    got_loss, got_grad = jax.jit(jax.value_and_grad(loss))(params, batch)
    _equal((got_loss, got_grad), (want_loss, want_grad), jax.value_and_grad(case.fn), *case.args)


def test_pipeline_with_remat_equals_plain(train):
    """``plan/remat.py``'s runners wrap the pipelined ones (remat's step, with the forward's
    consts and saved layer inputs, goes through the batch analysis): still the plain step."""
    from shardlab.parallel.records import RematSpec

    case, want = train
    plan = _pipelined(case, make_mesh(stage=4, data=2), stages=4, microbatches=2)
    plan = dataclasses.replace(plan, remat=RematSpec("nothing"))
    _equal(plan.jit()(*case.args), want, case.fn, *case.args)


def test_nnx_scan_with_dropout_and_adamw():
    """Another scanned model (flax nnx, stacked state from ``nnx.split``, dropout keys per
    layer, typed PRNG keys, adamw): the per-layer dropout masks are drawn for the whole batch
    and sliced per microbatch, so the pipelined step equals the plain one."""
    case = nnx_scan(layers=4)
    plan = _pipelined(case, make_mesh(stage=2, data=4), stages=2, microbatches=4)
    _equal(plan.jit()(*case.args), jax.jit(case.fn)(*case.args), case.fn, *case.args)


def test_batch_dims_come_from_the_step():
    """The analysis reads the step it is given: the attention mixes the sequence dim, so the
    batch (dim 0 of the carry) is found even when the sequence has the same size."""
    case = _gpt_scan(2)
    closed = jax.make_jaxpr(case.fn)(*case.args)
    scan = next(e for e in closed.jaxpr.eqns if e.primitive.name == "scan")
    body = scan.params["jaxpr"]
    n_consts, n_carry = scan.params["num_consts"], scan.params["num_carry"]
    consts = [np.zeros(v.aval.shape, v.aval.dtype) for v in scan.invars[:n_consts]]

    def step(carry, x):
        out = jax_core.eval_jaxpr(body.jaxpr, body.consts, *consts, *carry, *x)
        return out[:n_carry], out[n_carry:]

    init = [np.zeros(v.aval.shape, v.aval.dtype) for v in scan.invars[n_consts:][:n_carry]]
    xs = [np.zeros(v.aval.shape[1:], v.aval.dtype) for v in scan.invars[n_consts + n_carry :]]
    shape = tuple(init[0].shape)
    assert shape[0] == shape[1]  # batch and sequence of equal size
    got = _analyse(step, init, xs, 2)
    assert got.state[got.graph.inputs[0]] == 0
    # residuals (forward ys) are split on their batch dim or do not depend on the batch
    ys = [got.state[v] for v in got.graph.outputs[n_carry:]]
    assert 0 in ys and set(ys) <= {0, None}


def test_runner_keeps_a_wrapped_checkpoint():
    """A remat runner calls the pipeline runner with ``jax.checkpoint(step, policy=...)``: the
    checkpoint is kept around each microbatch step, and value and gradient equal
    ``lax.scan``'s (a per-layer sum over the batch in ``ys`` is summed over microbatches)."""
    runner = gpipe_runner(make_mesh(stage=4, data=2), PipelineSpec(stages=4, microbatches=4))
    k = jax.random.split(jax.random.key(0), 2)
    w, x = jax.random.normal(k[0], (8, 16, 16)) * 0.3, jax.random.normal(k[1], (8, 16))

    def body(carry, x):
        (h,), (wl,) = carry, x
        return [jnp.tanh(h @ wl)], [h.sum()]

    step = jax.checkpoint(body, policy=jax.checkpoint_policies.nothing_saveable)

    def loss(w, x, run):
        (h,), (sums,) = run(step, [x], [w], length=8, reverse=False, unroll=1)
        return jnp.sum(h**2) + sums.sum()

    def plain(step, init, xs, **kw):
        return jax.lax.scan(step, init, xs, **kw)

    got = jax.jit(jax.value_and_grad(lambda w, x: loss(w, x, runner)))(w, x)
    want = jax.jit(jax.value_and_grad(lambda w, x: loss(w, x, plain)))(w, x)
    _equal(got, want, jax.value_and_grad(lambda w, x: loss(w, x, plain)), w, x)
    grad_jaxpr = str(jax.make_jaxpr(jax.grad(lambda w, x: loss(w, x, runner)))(w, x))
    assert "remat" in grad_jaxpr or "checkpoint" in grad_jaxpr


def test_plan_constraints_inside_the_layers_are_kept():
    """A plan's sharding constraints inside the scan body (a searched plan has them, on any
    mesh axis) are re-applied inside the shard_map, the stage axis dropped."""
    mesh = make_mesh(stage=4, data=2)
    runner = gpipe_runner(mesh, PipelineSpec(stages=4, microbatches=2))
    k = jax.random.split(jax.random.key(1), 2)
    w, x = jax.random.normal(k[0], (8, 16, 16)) * 0.3, jax.random.normal(k[1], (8, 16))
    spec = NamedSharding(mesh, P("data", "stage"))

    def body(carry, x):
        (h,), (wl,) = carry, x
        return [jnp.tanh(jax.lax.with_sharding_constraint(h, spec) @ wl)], []

    def loss(w, x, run):
        (h,), _ = run(body, [x], [w], length=8, reverse=False, unroll=1)
        return jnp.sum(h**2)

    def plain(step, init, xs, **kw):
        return jax.lax.scan(step, init, xs, **kw)

    got = jax.jit(jax.value_and_grad(lambda w, x: loss(w, x, runner)))(w, x)
    want = jax.jit(jax.value_and_grad(lambda w, x: loss(w, x, plain)))(w, x)
    _equal(got, want, jax.value_and_grad(lambda w, x: loss(w, x, plain)), w, x)


def test_whole_batch_op_is_refused():
    def step(carry, x):
        (h,), (w,) = carry, x
        h = h @ w
        return [h - h.max(axis=0, keepdims=True)], []

    with pytest.raises(PipelineError, match=r"reduce_max at .*test_pipeline.py:\d+"):
        _analyse(step, [np.ones((8, 4), np.float32)], [np.ones((4, 4), np.float32)], 2)


def test_gradients_are_summed_over_microbatches():
    def step(carry, x):
        (h,), (w,) = carry, x
        return [h], [h.T @ h * w, h.sum(0)]

    got = _analyse(step, [np.ones((8, 4), np.float32)], [np.ones((4, 4), np.float32)], 4)
    g = got.graph
    assert [got.state[v] for v in g.outputs] == [0, -1, -1]
    assert build_from_jaxpr  # the graph is the step's own


# -- bad input ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dp_plan():
    case = _gpt_scan(8)
    return data_parallel(case.fn, *case.args, mesh=make_mesh(stage=4, data=2), axes=("data",))


def test_missing_stage_axis():
    case = _gpt_scan(8)
    plan = data_parallel(case.fn, *case.args, mesh=make_mesh(data=8))
    with pytest.raises(PipelineError, match=r"'stage' is not a mesh axis .*\['data'\]"):
        with_pipeline(plan, PipelineSpec(stages=4, microbatches=2))


def test_stages_not_the_axis_size(dp_plan):
    with pytest.raises(PipelineError, match=r"stages=2 but mesh axis 'stage' has 4.*stages=4"):
        with_pipeline(dp_plan, PipelineSpec(stages=2, microbatches=2))


def test_stages_not_dividing_the_layers():
    case = _gpt_scan(6)
    plan = data_parallel(case.fn, *case.args, mesh=make_mesh(stage=4, data=2), axes=("data",))
    with pytest.raises(PipelineError, match=r"stages=4 does not divide the 6 layers.*\[2, 3, 6\]"):
        with_pipeline(plan, PipelineSpec(stages=4, microbatches=2))


def test_microbatches_not_dividing_the_batch(dp_plan):
    with pytest.raises(
        PipelineError, match=r"microbatches=3 does not divide the batch of 8 .*\[1, 2, 4, 8\]"
    ):
        with_pipeline(dp_plan, PipelineSpec(stages=4, microbatches=3))


def test_no_layer_scan():
    case = gpt(2, batch=8, seq=8, d=16, heads=2, vocab=64)
    plan = data_parallel(case.fn, *case.args, mesh=make_mesh(stage=4, data=2), axes=("data",))
    with pytest.raises(PipelineError, match=r"lax.scan over parameters.*unrolled Python loops"):
        with_pipeline(plan, PipelineSpec(stages=4, microbatches=2))


def test_bad_schedule_and_1f1b_note(dp_plan):
    with pytest.raises(
        PipelineError, match=r"schedule 'zb' is not one of \['gpipe', '1f1b', 'interleaved'\]"
    ):
        with_pipeline(dp_plan, PipelineSpec(stages=4, microbatches=2, schedule="zb"))
    with pytest.raises(PipelineError, match=r"virtual_stages=2 is for schedule='interleaved'"):
        with_pipeline(dp_plan, PipelineSpec(stages=4, microbatches=2, virtual_stages=2))
    plan = with_pipeline(dp_plan, PipelineSpec(stages=4, microbatches=2, schedule="1f1b"))
    assert any("1f1b runs as GPipe" in n for n in plan.notes)
    # interleaved is priced, not executed: the same loop runs, with a note
    spec = PipelineSpec(stages=4, microbatches=4, schedule="interleaved", virtual_stages=2)
    assert any("interleaved runs as GPipe" in n for n in with_pipeline(dp_plan, spec).notes)


@pytest.mark.slow  # four compiles and two pipelined runs (~40 s on 2 cores)
def test_a_baseline_made_on_the_whole_stage_mesh_pipelines_as_the_hand_made_one(train):
    # data parallel and ZeRO made on stage×data split the batch (and ZeRO the state) over
    # 'stage' too; pipelined, the stage axis moves to the layer dim of the stacked leaves
    # and leaves the rest: otherwise every stage gathers the batch (4× the memory, measured)
    case, want = train
    mesh = make_mesh(stage=2, data=4)
    hand_memory = _pipelined(case, mesh, stages=2, microbatches=2).verify().memory.total
    for name, make in (("data_parallel", data_parallel), ("zero", zero)):
        plan = with_pipeline(
            make(case.fn, *case.args, mesh=mesh), PipelineSpec(stages=2, microbatches=2)
        )
        for path, spec in zip(plan.input_paths, plan.input_specs, strict=True):
            used = [a for ax in spec for a in ax]
            ok = used.count("stage") <= 1 and ("stage" not in used or spec[0] == ("stage",))
            assert ok, (name, path, spec)
        # its cost is the pipeline's (collective-permutes), not the unpipelined plan's
        assert plan.cost.comm_bytes.get("collective-permute", 0) > 0
        assert plan.verify().memory.total <= 1.15 * hand_memory, name
        _equal(plan.jit()(*case.args), want, case.fn, *case.args)
