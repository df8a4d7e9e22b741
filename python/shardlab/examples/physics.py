"""A physics-informed network (PINN): the loss differentiates the network by its inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from shardlab.examples.base import Case, normal, training_case


def pinn(*, points: int = 512, width: int = 64, seed: int = 0) -> Case:
    """u(x, t) by a tanh MLP; the loss uses ∂u/∂x and ∂u/∂t (a Burgers-like transport
    residual) plus a fit to sin(x). Train step.

    Args:
        points: collocation points per batch.
        width: the hidden width.
        seed: the PRNG seed of weights and points.

    Returns:
        The case ``"pinn train"``.
    """
    k = jax.random.split(jax.random.key(seed), 4)
    params = {
        "w1": normal(k[0], (2, width), 1.0),
        "w2": normal(k[1], (width, width), 0.2),
        "w3": normal(k[2], (width, 1), 0.2),
    }
    xs = jax.random.uniform(k[3], (points, 2))

    def u(p, x):  # one point
        h = jnp.tanh(x @ p["w1"])
        h = jnp.tanh(h @ p["w2"])
        return (h @ p["w3"])[0]

    def loss(p, xs):
        du = jax.vmap(jax.grad(u, argnums=1), in_axes=(None, 0))(p, xs)  # (points, 2)
        values = jax.vmap(u, in_axes=(None, 0))(p, xs)
        residual = du[:, 1] + values * du[:, 0]  # Burgers-like transport
        return jnp.mean(residual**2) + jnp.mean((values - jnp.sin(xs[:, 0])) ** 2)

    return training_case("pinn train", loss, params, xs)
