"""A mixture-of-experts layer: soft routing, dense dispatch."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from shardlab.examples.base import Case, normal, training_case


def moe(*, tokens: int = 256, d: int = 64, f: int = 128, experts: int = 8, seed: int = 0) -> Case:
    """A mixture-of-experts layer (soft routing, dense dispatch) train step.

    Args:
        tokens: tokens per batch.
        d: the model width.
        f: each expert's hidden width.
        experts: the number of experts.
        seed: the PRNG seed of weights and batch.

    Returns:
        The case ``"moe train"``.
    """
    k = jax.random.split(jax.random.key(seed), 5)
    params = {
        "router": normal(k[0], (d, experts)),
        "w1": normal(k[1], (experts, d, f)),
        "w2": normal(k[2], (experts, f, d)),
    }
    x, y = normal(k[3], (tokens, d), 1.0), normal(k[4], (tokens, d), 1.0)

    def loss(p, xy):
        x, y = xy
        # Soft routing (every expert, weighted by its gate): the same expert-parallel
        # einsums as top-k routing, without an argmax whose ties could flip between
        # differently-ordered sharded reductions.
        gates = jax.nn.softmax(x @ p["router"], axis=-1)
        routed = jnp.einsum("te,td->etd", gates, x)
        h = jax.nn.relu(jnp.einsum("etd,edf->etf", routed, p["w1"]))
        out = jnp.einsum("etf,efd->td", h, p["w2"])
        return jnp.mean((out - y) ** 2)

    return training_case("moe train", loss, params, (x, y))
