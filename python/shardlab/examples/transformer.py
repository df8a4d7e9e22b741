"""GPT-style decoders: pre-norm blocks of causal multi-head attention and a GELU MLP.

One block (``block``, ``block_params``) serves three examples: ``gpt`` (embedding, a Python
loop over blocks, head, cross-entropy), ``gpt_scan`` (the same model as a ``lax.scan`` over
stacked blocks) and ``gpt_layer`` (one block regressed onto a target, every intermediate
passed through the sharding hook).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from shardlab.examples.base import Case, Shard, no_shard, normal, training_case

Init = Callable[[tuple[int, ...]], jax.Array]

# Logical axes of the activations (see ``shardlab.examples.base``).
_WHOLE = ("batch", None, None)  # (batch, seq, d): features whole
_SPLIT = ("batch", None, "model")  # (batch, seq, d | f): features split
_HEADS = ("batch", None, "model", None)  # (batch, seq, heads, head dim)
_SCORES = ("batch", "model", None, None)  # (batch, heads, q, k)


def layernorm(x: jax.Array, g: jax.Array, b: jax.Array, shard: Shard = no_shard) -> jax.Array:
    """Layer norm over the last axis of ``(batch, seq, d)``.

    Args:
        x: ``(batch, seq, d)``.
        g: the gain, ``(d,)``.
        b: the bias, ``(d,)``.
        shard: the sharding hook (mean, variance and result ``("batch", None, None)``).

    Returns:
        ``(batch, seq, d)``.
    """
    mu = shard(jnp.mean(x, axis=-1, keepdims=True), *_WHOLE)
    var = shard(jnp.mean((x - mu) ** 2, axis=-1, keepdims=True), *_WHOLE)
    return shard((x - mu) * jax.lax.rsqrt(var + 1e-5) * g + b, *_WHOLE)


def block_params(d: int, f: int, init: Init) -> dict[str, jax.Array]:
    """One block's parameters: layer norms at 1 and 0, every weight from ``init``.

    Args:
        d: the model width.
        f: the MLP's hidden width.
        init: ``init(shape)``, called for ``wq, wk, wv, wo, w1, w2`` in that order.

    Returns:
        ``ln1_g, ln1_b, wq, wk, wv, wo, ln2_g, ln2_b, w1, w2``.
    """
    return {
        "ln1_g": jnp.ones((d,)),
        "ln1_b": jnp.zeros((d,)),
        "wq": init((d, d)),
        "wk": init((d, d)),
        "wv": init((d, d)),
        "wo": init((d, d)),
        "ln2_g": jnp.ones((d,)),
        "ln2_b": jnp.zeros((d,)),
        "w1": init((d, f)),
        "w2": init((f, d)),
    }


def block(
    p: Any,
    x: jax.Array,
    heads: int,
    *,
    mask: jax.Array | None = None,
    shard: Shard = no_shard,
) -> jax.Array:
    """LN, causal multi-head attention, LN, GELU MLP, with residuals.

    Args:
        p: ``block_params``.
        x: ``(batch, seq, d)``.
        heads: attention heads (``d`` divisible by it).
        mask: the ``(seq, seq)`` causal mask; ``None`` builds it inside the traced
            function, where the scores are masked.
        shard: the sharding hook (activations split over ``"model"`` on their feature or
            head dimension, as Megatron tensor parallelism splits them).

    Returns:
        ``(batch, seq, d)``.
    """
    batch, seq, d = x.shape
    hd = d // heads

    def project(a: jax.Array, w: str) -> jax.Array:
        z = shard(jnp.einsum("btd,de->bte", a, p[w]), *_SPLIT)
        return shard(z.reshape(batch, seq, heads, hd), *_HEADS)

    a = layernorm(x, p["ln1_g"], p["ln1_b"], shard)
    q, k, v = project(a, "wq"), project(a, "wk"), project(a, "wv")
    s = shard(jnp.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(hd), *_SCORES)
    if mask is None:
        mask = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    s = shard(jnp.where(mask, s, -1e9), *_SCORES)
    w = shard(jax.nn.softmax(s, axis=-1), *_SCORES)
    o = shard(jnp.einsum("bhqk,bkhe->bqhe", w, v), *_HEADS)
    o = shard(o.reshape(batch, seq, d), *_SPLIT)
    x = shard(x + shard(jnp.einsum("btd,de->bte", o, p["wo"]), *_WHOLE), *_WHOLE)
    a = layernorm(x, p["ln2_g"], p["ln2_b"], shard)
    h = shard(jax.nn.gelu(shard(jnp.einsum("btd,df->btf", a, p["w1"]), *_SPLIT)), *_SPLIT)
    return shard(x + shard(jnp.einsum("btf,fd->btd", h, p["w2"]), *_WHOLE), *_WHOLE)


def _gpt_loss(stack: Callable[[Any, jax.Array], jax.Array]) -> Callable[..., Any]:
    """Embedding, ``stack(blocks, x)``, head, cross-entropy."""

    def loss(p, batch_):
        toks, tgts = batch_
        x = jnp.take(p["embed"], toks, axis=0)
        x = stack(p["blocks"], x)
        logits = jnp.einsum("btd,dv->btv", x, p["head"])
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, tgts[..., None], axis=-1))

    return loss


def gpt(
    layers: int,
    *,
    batch: int = 8,
    seq: int = 16,
    d: int = 64,
    heads: int = 4,
    vocab: int = 256,
    seed: int = 0,
) -> Case:
    """A GPT-style decoder train step: embedding, ``layers`` blocks (MLP width ``4 d``), head.

    Normal-initialised (scale 0.05); layer norms at 1 and 0; random tokens and targets.

    Args:
        layers: blocks, unrolled by a Python loop.
        batch: sequences per batch.
        seq: tokens per sequence.
        d: the model width.
        heads: attention heads.
        vocab: the vocabulary size.
        seed: the PRNG seed of weights and batch.

    Returns:
        The case ``"gpt {layers}L train"``; ``args[0]`` is
        ``{"embed", "blocks": [block_params, ...], "head"}``, ``args[2]`` is
        ``(tokens, targets)``.
    """
    keys = iter(jax.random.split(jax.random.key(seed), 8 * layers + 4))
    blocks = [
        block_params(d, 4 * d, lambda shape: normal(next(keys), shape)) for _ in range(layers)
    ]
    params = {
        "embed": normal(next(keys), (vocab, d)),
        "blocks": blocks,
        "head": normal(next(keys), (d, vocab)),
    }
    tokens = jax.random.randint(next(keys), (batch, seq), 0, vocab)
    targets = jax.random.randint(next(keys), (batch, seq), 0, vocab)
    mask = jnp.tril(jnp.ones((seq, seq), dtype=bool))

    def unrolled(blocks_, x):
        for bp in blocks_:
            x = block(bp, x, heads, mask=mask)
        return x

    return training_case(f"gpt {layers}L train", _gpt_loss(unrolled), params, (tokens, targets))


def gpt_scan(
    layers: int,
    *,
    batch: int = 8,
    seq: int = 16,
    d: int = 64,
    heads: int = 4,
    vocab: int = 256,
    seed: int = 0,
    train: bool = True,
) -> Case:
    """``gpt(layers)`` as a ``jax.lax.scan`` over its blocks' parameters stacked on a leading
    layer axis (the same initial values), as flax ``nn.scan`` models are.

    Args:
        layers: blocks, stacked and scanned over.
        batch: sequences per batch.
        seq: tokens per sequence.
        d: the model width.
        heads: attention heads.
        vocab: the vocabulary size.
        seed: the PRNG seed (the same values as ``gpt``).
        train: a train step, or (``False``) the loss alone (forward).

    Returns:
        The case ``"gpt_scan {layers}L train|fwd"``.
    """
    unrolled = gpt(layers, batch=batch, seq=seq, d=d, heads=heads, vocab=vocab, seed=seed)
    params = dict(unrolled.args[0])
    params["blocks"] = jax.tree.map(lambda *xs: jnp.stack(xs), *params["blocks"])
    mask = jnp.tril(jnp.ones((seq, seq), dtype=bool))

    def scanned(blocks_, x):
        x, _ = jax.lax.scan(lambda h, bp: (block(bp, h, heads, mask=mask), None), x, blocks_)
        return x

    loss = _gpt_loss(scanned)
    name = f"gpt_scan {layers}L"
    if not train:
        return Case(name + " fwd", loss, (params, unrolled.args[2]))
    return training_case(name + " train", loss, params, unrolled.args[2])


def _mse_of_block(
    p: Any, xy: tuple[jax.Array, jax.Array], *, heads: int, shard: Shard
) -> jax.Array:
    x, y = xy
    return jnp.mean((block(p, x, heads, shard=shard) - y) ** 2)


def gpt_layer(shard: Shard = no_shard) -> Case:
    """One block (d 32, 8 heads, MLP width 64) regressed onto a target, constant-initialised
    (weights 0.02, inputs 0.1, targets 1); its causal mask is built inside the loss.

    Args:
        shard: the sharding hook applied to every intermediate.

    Returns:
        ``Case("gpt-layer", loss, (params, (x, y)))`` with ``loss(params, batch)``; ``x`` and
        ``y`` are ``(8, 8, 32)``.
    """
    bsz, t, d, h, f = 8, 8, 32, 8, 64
    params = block_params(d, f, lambda shape: jnp.ones(shape) * 0.02)
    batch = (jnp.ones((bsz, t, d)) * 0.1, jnp.ones((bsz, t, d)))
    loss = functools.partial(_mse_of_block, heads=h, shard=shard)
    return Case("gpt-layer", loss, (params, batch))
