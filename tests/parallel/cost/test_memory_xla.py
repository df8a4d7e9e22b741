"""The memory model against what XLA:CPU's buffer assignment really keeps live (issue 17):
each test is a small model showing one behaviour, predicted within 10% of the compiled
``arguments + outputs + temp``."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest

import shardlab
from shardlab import strategies
from shardlab.parallel.cost.memory import liveness
from shardlab.parallel.graph.opgraph import live_nodes
from shardlab.parallel.graph.trace import trace
from shardlab.parallel.mesh import mesh as make_mesh


@pytest.fixture(scope="module")
def m8():
    return make_mesh(data=8)


def _adam_step(loss):
    tx = optax.adam(1e-3)

    def step(params, state, batch):
        grads = jax.grad(loss)(params, batch)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return step, tx


def _ratio(plan) -> float:
    return plan.cost.memory.peak / plan.verify().memory.total


def test_zero_gradients_are_all_reduced_whole_into_buffers_of_their_own(m8):
    """ZeRO on CPU: each gradient is all-reduced whole (no reduce-scatter) and sliced for
    the split update. The unreduced gradients live in output buffers until the combined
    all-reduce; its results cannot overwrite them and sit in temp until the update."""

    def loss(p, batch):
        x, y = batch
        h = jnp.tanh(x @ p["w1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)

    step, tx = _adam_step(loss)
    k = jax.random.split(jax.random.key(0), 4)
    params = {
        "w1": jax.random.normal(k[0], (64, 256)) * 0.1,
        "w2": jax.random.normal(k[1], (256, 64)) * 0.1,
    }
    batch = (jax.random.normal(k[2], (64, 64)), jax.random.normal(k[3], (64, 64)))
    plans = strategies.baselines(step, params, tx.init(params), batch, mesh=m8)
    for name in ("zero", "data_parallel"):
        assert 0.9 <= _ratio(plans[name]) <= 1.1, name


def test_a_broadcast_a_reduction_cannot_absorb_is_written_out(m8):
    """XLA:CPU emits a reduction and the elementwise ops feeding it as one library fusion
    that takes a broadcast only along the reduced dimensions: a LayerNorm's scale (
    broadcast over the batch) and its per-row statistics (summed over rows for the scale's
    gradient) are written out in full and live from the forward to the backward pass."""

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Dense(32)(x)  # every LayerNorm's input is differentiated
            for _ in range(3):
                x = jnp.tanh(nn.Dense(32)(nn.LayerNorm()(x)))
            return x

    net = Net()
    x = jax.random.normal(jax.random.key(1), (16, 16, 32))
    params = net.init(jax.random.key(2), x)["params"]
    step, tx = _adam_step(lambda p, x: jnp.mean(net.apply({"params": p}, x) ** 2))
    plans = strategies.baselines(step, params, tx.init(params), x, mesh=m8)
    assert 0.9 <= _ratio(plans["replicated"]) <= 1.1

    # In the model: the scale's broadcast copy is recorded; a softmax's max, broadcast
    # along the axis it was reduced over, stays fused.
    def softmax_sum(x, s):
        z = x - jnp.max(x, -1, keepdims=True)
        return jnp.sum(jnp.exp(z) * s, -1)

    g = trace(softmax_sum, jnp.ones((8, 16)), jnp.ones((16,)), unroll_scans=False).graph
    lv = liveness(g, live_nodes(g), copies=True)
    wide = {g.shapes[v] for v in lv.expanded}
    assert wide == {(1, 16)}  # the scale's, not the max's (8, 1)


@pytest.mark.xfail(
    strict=True,
    reason="data parallel predicted at 0.88 of compiled: the library-reduction size cut-off "
    "(LIBRARY_REDUCTION) that fixes PINN Megatron leaves some forward-mode broadcasts fused "
    "that XLA writes out; the rule is not found yet (issue 17)",
)
def test_pinn_hessian_residual(m8):
    """A PINN's residual: ``jax.hessian`` of a tanh MLP under ``vmap``. The forward-mode
    tangents are broadcast per point and summed over the batch for the weight gradients:
    XLA writes those broadcasts out."""

    def u(p, q):
        h = q
        for i in range(3):
            h = jnp.tanh(h @ p[f"w{i}"] + p[f"b{i}"])
        return (h @ p["out"])[0]

    def loss(p, pts):
        hess = jax.vmap(jax.hessian(lambda q: u(p, q)))(pts)
        return jnp.mean((hess[:, 1, 1] - 0.25 * hess[:, 0, 0]) ** 2)

    step, tx = _adam_step(loss)
    k = jax.random.split(jax.random.key(2), 5)
    params = {"out": jax.random.normal(k[4], (32, 1)) * 0.3}
    for i in range(3):
        params[f"w{i}"] = jax.random.normal(k[i], (2 if i == 0 else 32, 32)) * 0.3
        params[f"b{i}"] = jnp.zeros((32,))
    pts = jax.random.uniform(k[3], (64, 2))
    plans = strategies.baselines(step, params, tx.init(params), pts, mesh=m8)
    for name in ("replicated", "data_parallel"):
        assert 0.9 <= _ratio(plans[name]) <= 1.1, name


def test_a_weight_gradient_convolution_reads_transposed_copies(m8):
    """XLA:CPU convolves only in the canonical layout (``b01f_01io->b01f``): a weight
    gradient's convolution (batch and features swapped) reads its activations and
    cotangents through transposed copies, and the activations' copy is written in the
    forward pass and held until the backward."""

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(3):
                x = jnp.tanh(nn.Conv(16, (3, 3))(x))
            return x

    net = Net()
    x = jax.random.normal(jax.random.key(3), (8, 16, 16, 4))
    params = net.init(jax.random.key(4), x)["params"]
    step, tx = _adam_step(lambda p, x: jnp.mean(net.apply({"params": p}, x) ** 2))
    plans = strategies.baselines(step, params, tx.init(params), x, mesh=m8)
    for name in ("replicated", "data_parallel"):
        assert 0.9 <= _ratio(plans[name]) <= 1.1, name


def test_a_library_reduction_writes_out_what_else_reads_its_inputs(m8):
    """XLA:CPU's library rewriter builds a large reduction's fusion before instruction
    fusion, from the elementwise producers only it reads: in a PINN's train step the
    ``1 - tanh²`` and the gradient sums feeding the weight gradients' reductions are read
    by other operations too, so each is written out for the reduction (8 of the benchmark
    suite's PINN plans were 14% under before this was modelled). Where the reduction reads
    its operand resharded, the loop fusion before the reshard takes them instead."""
    from shardlab.examples.physics import pinn

    case = pinn()
    plans = strategies.baselines(case.fn, *case.args, mesh=m8)
    for name in ("data_parallel", "zero"):
        assert 0.9 <= _ratio(plans[name]) <= 1.1, name
    searched = shardlab.search(
        case.fn, *case.args, mesh=make_mesh(data=2, model=4), method="propagate"
    )
    assert 0.9 <= _ratio(searched) <= 1.1


def test_a_convolution_copy_outlives_the_value_and_a_concatenation_is_read_whole(m8):
    """A U-Net block (GroupNorm, SiLU, a skip concatenation): the SiLU output's own buffer
    is freed after the forward convolution reads it; its transposed copy for the weight
    gradient lives to the backward. A kernel's flipped copy for the input gradient is
    written at the program's start (its operand is an argument). The concatenation feeds
    GroupNorm's library reductions, so it is written out, and the backward reads that
    buffer."""

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.Conv(16, (3, 3))(x)
            skip = h
            h = nn.Conv(16, (3, 3))(nn.silu(nn.GroupNorm(4)(h)))
            h = jnp.concatenate([h, skip], -1)
            return nn.Conv(8, (3, 3))(nn.silu(nn.GroupNorm(4)(h)))

    net = Block()
    x = jax.random.normal(jax.random.key(3), (8, 16, 16, 4))
    params = net.init(jax.random.key(4), x)["params"]
    step, tx = _adam_step(lambda p, x: jnp.mean(net.apply({"params": p}, x) ** 2))
    plans = strategies.baselines(step, params, tx.init(params), x, mesh=m8)
    for name in ("replicated", "data_parallel", "zero"):
        assert 0.9 <= _ratio(plans[name]) <= 1.1, name


@pytest.fixture(scope="module")
def gpt_layers():
    from shardlab.examples.transformer import gpt_scan

    return gpt_scan(8, batch=32, seq=32, d=64)


def test_zero3_layer_scan_stacks_split_gradients_and_updates_its_stacks_in_place(gpt_layers, m8):
    """ZeRO-3 over a layer scan: the backward scan's stacked weight gradients are held
    split as the optimizer update reads them (each layer's partial sums reduce-scattered),
    and each stacked result is one buffer updated in place, so a stack's versions before
    and after an iteration are never both held. Remat on top keeps within 15%."""
    case = gpt_layers
    plan = strategies.zero(case.fn, *case.args, mesh=m8, stage=3)
    assert 0.9 <= _ratio(plan) <= 1.1
    remat = strategies.zero3_remat(case.fn, *case.args, mesh=m8)
    assert 0.85 <= _ratio(remat) <= 1.15


def test_zero3_with_megatron_gathers_each_layer_where_the_scan_reads_it(gpt_layers):
    """ZeRO-3 × Megatron: the baseline constrains each layer's parameter slice to its
    gathered (Megatron-only) layout, so the partitioner keeps the batch split inside the
    scan; unconstrained it computed every data replica's whole batch at 2.8× this memory."""
    case = gpt_layers
    mesh = make_mesh(data=4, model=2)
    plan = strategies.zero(case.fn, *case.args, mesh=mesh, stage=3, model_axis="model")
    assert any("gathered where its scan reads them" in n for n in plan.notes)
    assert plan.constraints and {p for _, p, _ in plan.constraints} == {"scan_slice"}
    assert 0.9 <= _ratio(plan) <= 1.1


def test_a_layer_scans_carry_is_a_buffer_per_layer(gpt_layers):
    """The residual stream ``x + attention(x) + mlp(x)`` is the layer scan's carry: the
    compiled loop writes it out every layer, so the all-reduced Megatron outputs it adds
    are freed layer by layer, not held (fused) to the last layer. With remat, which leaves
    little else at the peak, that was 1.30× compiled."""
    case = gpt_layers
    mesh = make_mesh(data=4, model=2)
    remat = strategies.zero3_remat(case.fn, *case.args, mesh=mesh, model_axis="model")
    assert 0.85 <= _ratio(remat) <= 1.15


def test_remat_memory_is_the_memory_model_walked_again_without_the_residuals():
    """With 16 layers, the output buffers host some residual stacks, so subtracting every
    dropped stack from the plain step's temp predicted no temp at all (0.82× compiled for
    ZeRO × remat(nothing)); walking the model again without them finds the new peak."""
    from shardlab.examples.transformer import gpt_scan

    case = gpt_scan(16, batch=32, seq=32, d=64)
    mesh = make_mesh(stage=2, data=4)
    plan = shardlab.with_remat(strategies.zero(case.fn, *case.args, mesh=mesh), "nothing")
    assert plan.cost.memory.activations > 0
    assert 0.9 <= _ratio(plan) <= 1.1


@pytest.mark.parametrize("count", [1, 2, 4])
def test_outputs_gathered_along_an_inner_dimension_wait_for_a_copy(count):
    """Outputs computed split over their third dimension and returned replicated: XLA:CPU
    gathers along the major dimension and copies each into row-major order at the end,
    about every other gathered buffer waiting in temp (1, 1, 2 of them for 1, 2, 4
    outputs). The old model held the split buffers to the end and no gathered one."""
    mesh = make_mesh(data=8)
    shape = (3, 3, 32, 32)

    def step(*xs):
        return tuple(x * 2.0 + 1.0 for x in xs)

    args = [jax.ShapeDtypeStruct(shape, jnp.float32)] * count
    split = jax.sharding.PartitionSpec(None, None, "data")
    ins = (split,) * count
    outs = (jax.sharding.PartitionSpec(),) * count
    cost = shardlab.predict(step, *args, mesh=mesh, in_shardings=ins, out_shardings=outs)
    report = shardlab.analyze(step, *args, mesh=mesh, in_shardings=ins, out_shardings=outs)
    assert report.memory.temp >= 36864 * ((count + 1) // 2)  # the behaviour, measured
    assert cost.memory.peak == pytest.approx(report.memory.total, rel=0.1)


def test_an_output_moved_to_its_layout_is_recomputed_by_its_fused_readers():
    """An Adam moment kept replicated while the gradient is split (Megatron's weights,
    the optimizer state not sharded): the moment is computed split, gathered into its
    output, and the split parameter update recomputes it fused; no split copy of every
    moment waits for the update (the old model: 1.12x the compiled memory of nnx_scan's
    Megatron step on 4x2)."""
    from examples.zoo import models
    from shardlab.parallel.search.strategies.baselines import baselines

    case = models.nnx_scan()
    mesh = make_mesh(shape=(4, 2), names=("data", "model"))
    plan = baselines(case.fn, *case.args, mesh=mesh)["megatron"]
    assert 0.9 <= _ratio(plan) <= 1.1


def test_a_value_and_its_copies_are_placed_apart():
    """A weight gradient and its ZeRO slice are separate buffers in XLA's assignment: the
    gradient fits the output buffer its update writes later even when the two together do
    not. Counted as one buffer, the MoE's ZeRO × Megatron step on 4×2 was predicted at
    1.11x its compiled memory."""
    from examples.zoo import models
    from shardlab.parallel.search.strategies.baselines import baselines

    case = models.topk_moe()
    mesh = make_mesh(shape=(4, 2), names=("data", "model"))
    plan = baselines(case.fn, *case.args, mesh=mesh)["zero+megatron"]
    assert 0.9 <= _ratio(plan) <= 1.1


def _mlp_forward():
    def forward(p, x):
        return jnp.maximum(x @ p["w1"], 0.0) @ p["w2"]

    k = jax.random.split(jax.random.key(1), 3)
    params = {
        "w1": jax.random.normal(k[0], (128, 128)) * 0.1,
        "w2": jax.random.normal(k[1], (128, 128)) * 0.1,
    }
    return forward, (params, jax.random.normal(k[2], (1024, 128)))


def test_an_elementwise_result_is_written_over_the_operand_it_reads_last(m8):
    """A dot's output passed through a ReLU into the next dot is one buffer: XLA lets the
    ReLU's fusion write over its operand, read there for the last time (ZeRO gathers
    both weights, and they cannot share). The model without the rule: 1.24×."""
    fn, args = _mlp_forward()
    plan = strategies.baselines(fn, *args, mesh=m8)["zero"]
    assert 0.98 <= _ratio(plan) <= 1.02


def test_an_all_reduced_output_hosts_temporaries_until_its_all_reduce():
    """Megatron's second matmul writes a partial sum that is all-reduced into the output:
    the output's buffer is written by the all-reduce, so the first matmul's activations
    live in it until then, and the partial sum cannot. The model without the rule: 1.16×
    (4×2), and 0.84× if the partial sum were hosted too."""
    fn, args = _mlp_forward()
    mesh = make_mesh(shape=(4, 2), names=("data", "model"))
    for name in ("megatron", "data_parallel+megatron"):
        plan = strategies.baselines(fn, *args, mesh=mesh)[name]
        assert 0.98 <= _ratio(plan) <= 1.02, name


def test_max_pool_gradient_indices_are_found_in_the_forward_pass(m8):
    """XLA:CPU expands max pooling's gradient: a reduce-window over the forward operand
    and one s32 iota per dimension finds each window's argmax where the operand is
    computed, and the indices, with the zeros the scatter writes over, wait for the
    backward pass; the operand is not kept for it. The flax ResNet (BatchNorm, max and
    average pooling) replicated: 0.89× with the expansion priced at the gradient."""
    from examples.zoo.models import linen_resnet

    case = linen_resnet()
    plan = strategies.baselines(case.fn, *case.args, mesh=m8)["replicated"]
    assert 0.93 <= _ratio(plan) <= 1.07


def test_a_gradient_read_through_a_transpose_keeps_its_own_buffer(m8):
    """Data parallel with momentum: each weight gradient is all-reduced before the
    transpose its dot leaves it in, and the momentum update reads it through that
    transpose, so it cannot write over it; the reduced gradients need buffers of their
    own (one of them in temp). The model that let the update write over it: 0.89×."""
    case = shardlab.examples.mlp(128, 1024, train=True)
    for name in ("data_parallel", "data_parallel+megatron"):
        mesh = m8 if name == "data_parallel" else make_mesh(shape=(4, 2), names=("data", "model"))
        plan = strategies.baselines(case.fn, *case.args, mesh=mesh)[name]
        assert 0.98 <= _ratio(plan) <= 1.02, name


def test_two_max_pools_each_find_their_indices_in_the_forward_pass(m8):
    """Every max pool's gradient is expanded, each with its own indices (a model with two
    pools, data parallel: within 10% of the compiled total)."""

    def step(w, x):
        def loss(w):
            dn = ("NHWC", "HWIO", "NHWC")
            y = jax.lax.conv_general_dilated(x, w[0], (1, 1), "SAME", dimension_numbers=dn)
            y = nn.max_pool(jnp.maximum(y, 0.0), (2, 2), (2, 2))
            y = jax.lax.conv_general_dilated(y, w[1], (1, 1), "SAME", dimension_numbers=dn)
            y = nn.max_pool(jnp.maximum(y, 0.0), (2, 2), (2, 2))
            return jnp.mean(y**2)

        return w - 0.1 * jax.grad(loss)(w)

    w = jnp.full((2, 3, 3, 8, 8), 0.1)
    x = jax.random.normal(jax.random.key(0), (16, 32, 32, 8))
    for name in ("replicated", "data_parallel"):
        plan = strategies.baselines(step, w, x, mesh=m8)[name]
        assert 0.9 <= _ratio(plan) <= 1.1, name


def test_a_searched_plans_memory_is_priced_by_the_full_model(m8):
    """A searched plan's reported memory comes from the model the baselines use
    (all-reduce spans, the buffers XLA writes that the program does not name), on the
    search's layouts: the conv block's ILP plan, whose Megatron-style kernels leave
    partial sums all-reduced next to their results, was reported at 0.67× of compiled by
    the search's own walk."""
    from shardlab.parallel.search.driver import search

    case = shardlab.examples.conv()
    plan = search(case.fn, *case.args, mesh=m8, method="ilp")
    assert 0.9 <= _ratio(plan) <= 1.1


def test_an_all_reduce_runs_after_the_last_reads_of_the_node_before_it(m8):
    """The combined all-reduce of a train step's weight gradients is its own instruction,
    after the last gradient's convolution: that convolution's operands are freed before the
    all-reduce writes its results. The model that held both at once: 1.145× (ZeRO on the
    conv block)."""
    case = shardlab.examples.conv()
    plan = strategies.baselines(case.fn, *case.args, mesh=m8)["zero"]
    assert 0.9 <= _ratio(plan) <= 1.1


def test_a_value_only_convolutions_read_transposed_is_computed_into_the_copy():
    """A ReLU gradient's ``select`` that only the weight gradient's convolution reads, and
    the kernel ``rev`` of the input gradient's, are fused into the transposed copies the
    convolutions read (``transpose_copy_fusion``): one buffer each, in the copy's layout.
    The model that also gave them a buffer of their own: 1.135× and 1.115× (the conv
    block, ZeRO with Megatron on 2x4 and 4x2)."""
    case = shardlab.examples.conv()
    g = trace(case.fn, *case.args, unroll_scans=False).graph
    lv = liveness(g, live_nodes(g), copies=True)
    kinds = sorted(g.nodes[g.producer(v)].primitive for v in lv.in_copies)
    assert kinds == ["rev", "select_n"]
    for shape in ((2, 4), (4, 2)):
        mesh = make_mesh(shape=shape, names=("data", "model"))
        plan = strategies.baselines(case.fn, *case.args, mesh=mesh)["zero+megatron"]
        assert 0.9 <= _ratio(plan) <= 1.1, shape
