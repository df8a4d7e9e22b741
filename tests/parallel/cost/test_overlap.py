"""Overlap of communication with compute in the predicted step (``cost/overlap.py``): on a
compiler with asynchronous collectives the step is compute plus the communication the
compute does not hide; on XLA:CPU all of it is exposed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import shardlab
from shardlab.parallel.cost.schedule import schedule

LAYERS, WIDTH, BATCH = 4, 4096, 8192


def _loss(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.mean(x.astype(jnp.float32) ** 2)


def _step(ws, x):
    grads = jax.grad(_loss)(ws, x)
    return [w - 0.01 * g for w, g in zip(ws, grads, strict=True)]


def _forward(ws, x):
    for i, w in enumerate(ws):
        x = x @ w if i % 2 else jnp.tanh(x @ w)
    return x


def _args(dtype=jnp.bfloat16):
    ws = [jax.ShapeDtypeStruct((WIDTH, WIDTH), dtype) for _ in range(LAYERS)]
    return ws, jax.ShapeDtypeStruct((BATCH, WIDTH), dtype)


@pytest.fixture(scope="module")
def gpu_mesh():
    return shardlab.mesh({"data": 8}, devices=shardlab.target("h100", hosts=1))


def test_data_parallel_gradients_reduce_while_earlier_layers_compute(gpu_mesh):
    ws, x = _args()
    specs = ([P()] * LAYERS, P("data"))
    cost = shardlab.predict(_step, ws, x, mesh=gpu_mesh, in_shardings=specs)
    compute, comm = cost.compute_time, cost.comm_time
    assert comm > 0 and cost.hidden_comm_time > 0
    # Neither stream can be beaten; both cannot run longer than one after the other.
    assert max(compute, comm) * 0.999 <= cost.time < compute + comm
    # The first layer's weight gradient is computed last: nothing is left to hide its
    # all-reduce, so at least one layer's share of the gradient reduction is exposed.
    assert cost.exposed_comm_time >= comm / LAYERS * 0.9
    # The timeline view draws the same two streams: one number for one strategy.
    timeline = schedule(_step, ws, x, mesh=gpu_mesh, in_shardings=specs)
    assert timeline.hidden > 0
    assert timeline.total == pytest.approx(cost.time, rel=1e-9)
    assert timeline.exposed == pytest.approx(cost.exposed_comm_time, rel=1e-9)
    assert "of it hidden" in repr(cost)


def test_tensor_parallel_all_reduces_on_the_critical_path_stay_exposed(gpu_mesh):
    mesh = shardlab.mesh({"model": 8}, devices=shardlab.target("h100", hosts=1))
    ws, x = _args()
    specs = ([P(None, "model") if i % 2 == 0 else P("model", None) for i in range(LAYERS)], P())
    cost = shardlab.predict(_forward, ws, x, mesh=mesh, in_shardings=specs)
    assert cost.comm_time > 0
    # Each all-reduce's result is the next layer's input: the compute waits for it.
    assert cost.exposed_share > 0.9


def test_xla_cpu_runs_every_collective_exposed():
    mesh = shardlab.mesh({"data": 8})
    ws = [jax.ShapeDtypeStruct((256, 256), jnp.float32) for _ in range(LAYERS)]
    x = jax.ShapeDtypeStruct((512, 256), jnp.float32)
    specs = ([P()] * LAYERS, P("data"))
    cost = shardlab.predict(_step, ws, x, mesh=mesh, in_shardings=specs)
    assert cost.comm_time > 0
    assert cost.hidden_comm_time == 0
    assert cost.time == cost.compute_time + cost.comm_time
    timeline = schedule(_step, ws, x, mesh=mesh, in_shardings=specs)
    assert timeline.total == pytest.approx(cost.time, rel=1e-9)
