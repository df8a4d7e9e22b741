"""Rules the published-runs replay found wrong on models they were not derived from
(``benchmarks/published``): each is stated in general and checked here on small programs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import shardlab
from shardlab.parallel.cost.predict import prepare_strategy
from shardlab.parallel.cost.remat import layer_scans, recomputed_nodes
from shardlab.parallel.graph.trace import trace


def test_a_broadcast_made_for_a_split_consumer_is_computed_split():
    """A cross-entropy's gradient scatters into zeros of the logits' shape: the zeros are a
    broadcast of a scalar, which XLA makes where each shard lives. Priced whole, it cost
    8x an elementwise op of the same shape on 8 devices (5.7 s of a Llama 70B step)."""
    b, s, v, d = 64, 32, 512, 64

    def loss(w, h, t):
        logp = jax.nn.log_softmax((h @ w).astype(jnp.float32), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, t[..., None], axis=-1))

    args = (jnp.ones((d, v)), jnp.ones((b, s, d)), jnp.zeros((b, s), jnp.int32))
    mesh = shardlab.mesh({"data": 8})
    p = prepare_strategy(jax.grad(loss), *args, mesh=mesh, in_shardings=(P(), P("data"), P("data")))
    prop = p.propagate()
    seconds = {}
    for index, _, _, t in prop.spans:
        node = p.graph.nodes[index]
        if p.graph.shapes[node.outputs[0]] == (b, s, v):
            seconds.setdefault(node.primitive, []).append(t)
    elementwise = max(seconds["neg"])
    assert elementwise > 0
    assert max(seconds["broadcast_in_dim"]) <= elementwise * 1.01


def _biased_layers(p, x):
    def body(h, w):
        a = jax.nn.gelu(h @ w["w1"] + w["b1"])
        return h + a @ w["w2"] + w["b2"], None

    return jnp.mean(jax.lax.scan(body, x, p)[0] ** 2)


def test_dots_keeps_a_biased_matmul_output_and_recomputes_only_elementwise_work():
    """``dots_saveable`` saves a matmul's output; with a bias, autodiff's residual is
    ``dot + bias`` (the same size), so ``dots`` keeps it and the backward recomputes the
    activation only. Treated as dropped, the matmul was recomputed: ``dots`` cost as much
    as ``nothing`` (175B: 15.70 s against 15.75 s)."""
    layers, d = 4, 64
    params = {
        "w1": jnp.ones((layers, d, 4 * d)),
        "b1": jnp.zeros((layers, 4 * d)),
        "w2": jnp.ones((layers, 4 * d, d)),
        "b2": jnp.zeros((layers, d)),
    }

    def step(p, x):
        return jax.grad(_biased_layers)(p, x)

    graph = trace(step, params, jnp.ones((32, d)), unroll_scans=True).graph
    ((f, pair),) = layer_scans(graph).items()
    group = graph.scan_groups[f]
    dots = [group.body.nodes[i].primitive for i in recomputed_nodes(group, pair, "dots")]
    nothing = [group.body.nodes[i].primitive for i in recomputed_nodes(group, pair, "nothing")]
    assert "dot_general" in nothing
    assert "dot_general" not in dots
    assert dots  # the activation's elementwise work is still recomputed
