"""An embedding-heavy model: a large table, bag-of-ids lookups, a small MLP head."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from shardlab.examples.base import Case, normal, training_case


def embedding(
    *, vocab: int = 4096, d: int = 64, batch: int = 64, bag: int = 8, seed: int = 0
) -> Case:
    """The model's train step: mean of ``bag`` looked-up rows, tanh dense, linear output.

    Args:
        vocab: rows of the table.
        d: the embedding width.
        batch: examples per batch.
        bag: ids per example.
        seed: the PRNG seed of weights and batch.

    Returns:
        The case ``"embedding train"``.
    """
    k = jax.random.split(jax.random.key(seed), 5)
    params = {
        "table": normal(k[0], (vocab, d)),
        "w": normal(k[1], (d, d)),
        "out": normal(k[2], (d, 1)),
    }
    ids = jax.random.randint(k[3], (batch, bag), 0, vocab)
    y = normal(k[4], (batch, 1), 1.0)

    def loss(p, batch_):
        ids, y = batch_
        e = jnp.mean(jnp.take(p["table"], ids, axis=0), axis=1)
        return jnp.mean((jnp.tanh(e @ p["w"]) @ p["out"] - y) ** 2)

    return training_case("embedding train", loss, params, (ids, y))
