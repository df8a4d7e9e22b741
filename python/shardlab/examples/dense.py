"""Two-layer MLPs: ``activation(x @ w1) @ w2``, with a squared-error loss."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from shardlab.examples.base import Case, Shard, no_shard, normal, training_case


def mlp_apply(
    p: Any,
    x: jax.Array,
    *,
    activation: Callable[[jax.Array], jax.Array] = jax.nn.relu,
    shard: Shard = no_shard,
) -> jax.Array:
    """``activation(x @ w1) @ w2``, each intermediate passed through ``shard``.

    Args:
        p: ``{"w1": (d, f), "w2": (f, d)}``.
        x: ``(batch, d)``.
        activation: the hidden layer's nonlinearity.
        shard: the sharding hook (hidden ``("batch", "model")``, output ``("batch", None)``).

    Returns:
        ``(batch, d)``.
    """
    h = shard(activation(shard(x @ p["w1"], "batch", "model")), "batch", "model")
    return shard(h @ p["w2"], "batch", None)


def mlp_loss(
    p: Any,
    xy: tuple[jax.Array, jax.Array],
    *,
    activation: Callable[[jax.Array], jax.Array] = jax.nn.relu,
    shard: Shard = no_shard,
) -> jax.Array:
    """Mean squared error of ``mlp_apply(p, x)`` against ``y``.

    Args:
        p: the parameters of ``mlp_apply``.
        xy: ``(x, y)``, both ``(batch, d)``.
        activation: the hidden layer's nonlinearity.
        shard: the sharding hook.

    Returns:
        The scalar loss.
    """
    return jnp.mean((mlp_apply(p, xy[0], activation=activation, shard=shard) - xy[1]) ** 2)


def mlp(batch: int, hidden: int, *, train: bool, seed: int = 0) -> Case:
    """A square 2-layer ReLU MLP, normal-initialised, forward or train step.

    Batch ≫ hidden favours data parallel, hidden ≫ batch tensor parallel.

    Args:
        batch: rows of the batch.
        hidden: width of both weights (``hidden × hidden``).
        train: a train step (``True``) or the forward ``fn(p, x)`` alone.
        seed: the PRNG seed of weights and batch.

    Returns:
        The case, named ``"mlp b{batch} h{hidden} fwd|train"``.
    """
    k = jax.random.split(jax.random.key(seed), 4)
    params = {"w1": normal(k[0], (hidden, hidden)), "w2": normal(k[1], (hidden, hidden))}
    x, y = normal(k[2], (batch, hidden), 1.0), normal(k[3], (batch, hidden), 1.0)
    expect = "data_parallel" if batch > hidden else "megatron"
    name = f"mlp b{batch} h{hidden}"
    if not train:
        return Case(name + " fwd", mlp_apply, (params, x), expect)
    return training_case(name + " train", mlp_loss, params, (x, y), expect)


def mlp_layer(shard: Shard = no_shard) -> Case:
    """A 32 → 64 → 32 tanh MLP's loss, constant-initialised (weights 0.01, batch of ones).

    Args:
        shard: the sharding hook applied to every intermediate.

    Returns:
        ``Case("mlp", loss, (params, (x, y)))`` with ``loss(params, batch)``; batch 16.
    """
    d, f = 32, 64
    params = {"w1": jnp.ones((d, f)) * 0.01, "w2": jnp.ones((f, d)) * 0.01}
    batch = (jnp.ones((16, d)), jnp.ones((16, d)))
    loss = functools.partial(mlp_loss, activation=jnp.tanh, shard=shard)
    return Case("mlp", loss, (params, batch))
