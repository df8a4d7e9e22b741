"""Train steps written the way public JAX projects write them, on the real libraries.

Each function returns a ``Case`` whose ``fn`` is one whole, pure, jittable train step (the
loss, its gradient and an optax update) and whose ``args`` are concrete pytrees exactly as the
library hands them out: flax linen ``params`` dicts and ``batch_stats``, flax nnx ``State``
(typed PRNG keys included), equinox modules partitioned into their arrays, optax states.
The models are small (every step compiles in about a second on CPU) and fit an 8-device mesh:
batches and widths divide by 8. Everything is seeded.

The idioms are the ones public code uses, each written here from scratch: a linen GPT with
RoPE, a fused qkv ``Dense`` split three ways and tied embeddings (``embed.attend``); a linen
encoder-decoder on ``nn.MultiHeadDotProductAttention``; a ResNet with ``nn.BatchNorm`` and
pooling; a top-2 mixture of experts with one-hot dispatch and a load-balancing loss; a PINN
whose residual takes a Hessian under ``vmap``; an ``eqx.nn.MLP`` trained with
``eqx.filter_value_and_grad``; an nnx model whose stacked layers are scanned, with dropout
drawing on the ``nnx.Rngs`` state passed in; a ViT; and a diffusion U-Net.

``primitive_inventory`` counts what a case's jaxpr is made of (sub-jaxprs included);
``fallbacks`` counts the op-graph nodes no sharding rule knows (``rules.rule_for(...).known``
is False), which the strategy search can only keep replicated.

Outside the package (``examples.zoo``; unlike ``shardlab.examples``, not in the wheel): it
imports flax, equinox and optax, which are only development dependencies.
"""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.extend import core as jex_core

from shardlab.examples.base import Case
from shardlab.parallel.graph.opgraph import OpGraph
from shardlab.parallel.graph.rules import rule_for
from shardlab.parallel.graph.trace import trace

# -- shared pieces --------------------------------------------------------------------------


def _keys(seed: int, n: int) -> list[jax.Array]:
    return list(jax.random.split(jax.random.key(seed), n))


def _optax_step(loss_fn: Callable[..., Any], tx: optax.GradientTransformation):
    """``step(params, opt_state, batch) -> (params, opt_state, loss)`` around
    ``loss_fn(params, batch)``: the usual optax loop body."""

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, loss

    return step


# Initialisation runs once per case: compiled fast rather than well (XLA:CPU's optimising
# backend takes seconds on the threefry-heavy initialisers of a conv net).
_FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _built(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` as one quickly compiled program (initialisers, not op by op)."""
    return jax.jit(fn, compiler_options=_FAST_COMPILE)(*args)


def _init(model: nn.Module, key: jax.Array, *args: Any, **kwargs: Any) -> Any:
    """``model.init(key, *args, **kwargs)``'s variables, by ``lazy_init`` on the arguments'
    shapes (the forward pass is not run) compiled as one program."""
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)
    return _built(lambda key: model.lazy_init(key, *shapes, **kwargs), key)


def _apply(model: nn.Module, variables: Any, *args: Any, **kwargs: Any) -> Any:
    """``model.apply`` (typed ``Any``: its result is the output, or (output, mutated state))."""
    return model.apply(variables, *args, **kwargs)


def _tokens(key: jax.Array, shape: tuple[int, ...], vocab: int) -> jax.Array:
    return jax.random.randint(key, shape, 0, vocab, jnp.int32)


# -- 1. linen GPT ---------------------------------------------------------------------------


def _rope(x: jax.Array, base: float = 10_000.0) -> jax.Array:
    """Rotary position embedding of ``x[batch, seq, heads, head_dim]`` (rotate-half form)."""
    seq, dim = x.shape[1], x.shape[-1]
    inv = 1.0 / base ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * inv[None, :]  # (seq, dim/2)
    sin = jnp.sin(angles)[None, :, None, :]
    cos = jnp.cos(angles)[None, :, None, :]
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class _GPTBlock(nn.Module):
    d: int
    heads: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, _ = x.shape
        hd = self.d // self.heads
        h = nn.LayerNorm(name="ln1")(x)
        qkv = nn.Dense(3 * self.d, use_bias=False, name="qkv")(h)
        q, k, v = jnp.split(qkv, 3, axis=-1)
        q, k, v = (a.reshape(b, t, self.heads, hd) for a in (q, k, v))
        q, k = _rope(q), _rope(k)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
        mask = nn.make_causal_mask(jnp.ones((b, t)))  # (b, 1, t, t)
        scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
        att = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, t, self.d)
        x = x + nn.Dense(self.d, use_bias=False, name="proj")(out)
        h = nn.LayerNorm(name="ln2")(x)
        h = nn.gelu(nn.Dense(4 * self.d, name="fc")(h))
        return x + nn.Dense(self.d, name="out")(h)


class _GPT(nn.Module):
    vocab: int
    d: int
    heads: int
    layers: int

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        embed = nn.Embed(self.vocab, self.d, name="wte")
        x = embed(tokens)
        for i in range(self.layers):
            x = _GPTBlock(self.d, self.heads, name=f"h{i}")(x)
        x = nn.LayerNorm(name="ln_f")(x)
        return embed.attend(x)  # tied output projection


def linen_gpt(
    *, batch: int = 8, seq: int = 16, vocab: int = 64, d: int = 32, heads: int = 4, seed: int = 0
) -> Case:
    """A 2-layer flax linen decoder: fused qkv ``Dense`` split three ways, RoPE on split
    halves, causal mask, tied embeddings; next-token cross-entropy, adamw."""
    k = _keys(seed, 3)
    model = _GPT(vocab, d, heads, 2)
    tokens = _tokens(k[0], (batch, seq + 1), vocab)
    params = _init(model, k[1], tokens[:, :-1])["params"]
    tx = optax.adamw(3e-3, weight_decay=0.01)

    def loss_fn(params, tokens):
        logits = _apply(model, {"params": params}, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    return Case("linen_gpt", _optax_step(loss_fn, tx), (params, _built(tx.init, params), tokens))


# -- 2. linen encoder-decoder ---------------------------------------------------------------


def _attention(heads: int, **kwargs: Any) -> nn.MultiHeadDotProductAttention:
    """``nn.MultiHeadDotProductAttention`` without biases, as flax's WMT example builds it.
    (A key bias has a zero gradient, softmax being shift-invariant: its computed gradient is
    rounding noise, which adam's first step normalises to ±lr, so two equal programs that
    round differently would disagree on it by the learning rate.)"""
    return nn.MultiHeadDotProductAttention(heads, use_bias=False, **kwargs)


class _EncoderLayer(nn.Module):
    d: int
    heads: int

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        h = _attention(self.heads, name="self_attn")(x, x, mask=mask)
        x = nn.LayerNorm()(x + h)
        h = nn.Dense(self.d)(nn.relu(nn.Dense(2 * self.d)(x)))
        return nn.LayerNorm()(x + h)


class _DecoderLayer(nn.Module):
    d: int
    heads: int

    @nn.compact
    def __call__(self, y: jax.Array, memory: jax.Array, cross_mask: jax.Array) -> jax.Array:
        causal = nn.make_causal_mask(jnp.ones(y.shape[:2]))
        h = _attention(self.heads, name="self_attn")(y, y, mask=causal)
        y = nn.LayerNorm()(y + h)
        h = _attention(self.heads, name="cross_attn")(y, memory, mask=cross_mask)
        y = nn.LayerNorm()(y + h)
        h = nn.Dense(self.d)(nn.relu(nn.Dense(2 * self.d)(y)))
        return nn.LayerNorm()(y + h)


class _Seq2Seq(nn.Module):
    vocab: int
    d: int
    heads: int

    @nn.compact
    def __call__(self, src: jax.Array, tgt: jax.Array) -> jax.Array:
        src_embed = nn.Embed(self.vocab, self.d, name="src_embed")
        tgt_embed = nn.Embed(self.vocab, self.d, name="tgt_embed")
        pos = self.param(
            "pos", nn.initializers.normal(0.02), (max(src.shape[1], tgt.shape[1]), self.d)
        )
        src_valid = src > 0  # token 0 is padding
        enc_mask = nn.make_attention_mask(src_valid, src_valid)
        memory = _EncoderLayer(self.d, self.heads, name="encoder")(
            src_embed(src) + pos[: src.shape[1]], enc_mask
        )
        cross = nn.make_attention_mask(jnp.ones(tgt.shape, bool), src_valid)
        y = _DecoderLayer(self.d, self.heads, name="decoder")(
            tgt_embed(tgt) + pos[: tgt.shape[1]], memory, cross
        )
        return nn.Dense(self.vocab, name="lm_head")(y)


def linen_seq2seq(
    *,
    batch: int = 8,
    src_len: int = 16,
    tgt_len: int = 8,
    vocab: int = 48,
    d: int = 32,
    heads: int = 4,
    seed: int = 1,
) -> Case:
    """A flax linen encoder-decoder (one layer each; ``nn.MultiHeadDotProductAttention`` for
    encoder self-attention, decoder causal self-attention and cross-attention; padding
    masks); teacher-forced cross-entropy, adamw."""
    k = _keys(seed, 3)
    model = _Seq2Seq(vocab, d, heads)
    src = _tokens(k[0], (batch, src_len), vocab)
    src = src.at[:, -3:].set(0)  # padded tail
    tgt = _tokens(k[1], (batch, tgt_len + 1), vocab)
    params = _init(model, k[2], src, tgt[:, :-1])["params"]
    tx = optax.adamw(1e-3)

    def loss_fn(params, batch):
        src, tgt = batch
        logits = _apply(model, {"params": params}, src, tgt[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tgt[:, 1:]).mean()

    return Case(
        "linen_seq2seq", _optax_step(loss_fn, tx), (params, _built(tx.init, params), (src, tgt))
    )


# -- 3. linen ResNet ------------------------------------------------------------------------


class _ResBlock(nn.Module):
    channels: int
    strides: int = 1

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9)
        s = (self.strides, self.strides)
        h = nn.Conv(self.channels, (3, 3), s, use_bias=False)(x)
        h = nn.relu(norm()(h))
        h = nn.Conv(self.channels, (3, 3), use_bias=False)(h)
        h = norm(scale_init=nn.initializers.zeros)(h)
        if x.shape != h.shape:
            x = nn.Conv(self.channels, (1, 1), s, use_bias=False, name="proj")(x)
            x = norm(name="proj_bn")(x)
        return nn.relu(x + h)


class _ResNet(nn.Module):
    classes: int = 10

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        x = nn.Conv(16, (3, 3), use_bias=False, name="stem")(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(x))
        x = nn.max_pool(x, (2, 2), (2, 2))  # 16x16 -> 8x8
        x = _ResBlock(16)(x, train)
        x = _ResBlock(32, strides=2)(x, train)  # -> 4x4
        x = nn.avg_pool(x, (2, 2), (2, 2))  # -> 2x2
        x = jnp.mean(x, axis=(1, 2))  # global average
        return nn.Dense(self.classes)(x)


def linen_resnet(*, batch: int = 8, size: int = 16, classes: int = 16, seed: int = 2) -> Case:
    """A small flax linen ResNet on NHWC images: ``nn.BatchNorm`` whose ``batch_stats``
    go through the step as state (``mutable=["batch_stats"]``), ``nn.max_pool``,
    ``nn.avg_pool``, a global mean; sgd with momentum.

    ``step(params, batch_stats, opt_state, (images, labels)) ->
    (params, batch_stats, opt_state, loss)``.
    """
    k = _keys(seed, 3)
    model = _ResNet(classes)
    images = jax.random.normal(k[0], (batch, size, size, 3), jnp.float32)
    labels = jax.random.randint(k[1], (batch,), 0, classes)
    variables = _init(model, k[2], images, train=False)
    params, batch_stats = variables["params"], variables["batch_stats"]
    tx = optax.sgd(0.05, momentum=0.9)

    def step(params, batch_stats, opt_state, batch):
        images, labels = batch

        def loss_fn(params):
            logits, updates = _apply(
                model,
                {"params": params, "batch_stats": batch_stats},
                images,
                train=True,
                mutable=["batch_stats"],
            )
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
            return loss, updates["batch_stats"]

        (loss, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_stats, opt_state, loss

    return Case(
        "linen_resnet", step, (params, batch_stats, _built(tx.init, params), (images, labels))
    )


# -- 4. top-k mixture of experts ------------------------------------------------------------


class _TopKMoE(nn.Module):
    d: int
    hidden: int
    experts: int
    k: int = 2

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``x[tokens, d]`` -> (output, load-balancing loss)."""
        e = self.experts
        logits = nn.Dense(e, use_bias=False, name="router")(x)
        probs = jax.nn.softmax(logits, axis=-1)
        top_vals, top_idx = jax.lax.top_k(logits, self.k)  # (tokens, k)
        gates = jnp.take_along_axis(probs, top_idx, axis=-1)  # gather
        gates = gates / gates.sum(-1, keepdims=True)
        dispatch = jax.nn.one_hot(top_idx, e, dtype=x.dtype)  # (tokens, k, e)
        combine = jnp.einsum("tk,tke->te", gates, dispatch)
        init = nn.initializers.lecun_normal(batch_axis=(0,))
        w_in = self.param("w_in", init, (e, self.d, self.hidden))
        w_out = self.param("w_out", init, (e, self.hidden, self.d))
        routed = jnp.einsum("te,td->etd", dispatch.sum(1), x)  # every token to its experts
        h = nn.gelu(jnp.einsum("etd,edh->eth", routed, w_in))
        y = jnp.einsum("eth,ehd,te->td", h, w_out, combine)
        # Switch-style aux loss: fraction of routed slots per expert x mean router prob.
        frac = dispatch.sum((0, 1)) / (x.shape[0] * self.k)
        aux = e * jnp.sum(frac * probs.mean(0))
        del top_vals
        return y, aux


class _MoEModel(nn.Module):
    vocab: int
    d: int
    experts: int

    @nn.compact
    def __call__(self, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = nn.Embed(self.vocab, self.d)(tokens)  # (batch, seq, d)
        b, t, _ = x.shape
        h = nn.LayerNorm()(x).reshape(b * t, self.d)
        y, aux = _TopKMoE(self.d, 2 * self.d, self.experts, name="moe")(h)
        x = x + y.reshape(b, t, self.d)
        return nn.Dense(self.vocab)(nn.LayerNorm()(x)), aux


def topk_moe(
    *, batch: int = 8, seq: int = 8, vocab: int = 32, d: int = 32, experts: int = 8, seed: int = 3
) -> Case:
    """A top-2 mixture of experts (flax linen): ``lax.top_k`` of the router logits, gates
    gathered with ``take_along_axis``, capacity-free dense dispatch through ``one_hot`` of
    the indices, per-expert einsums, a Switch-style load-balancing loss; adamw."""
    k = _keys(seed, 3)
    model = _MoEModel(vocab, d, experts)
    tokens = _tokens(k[0], (batch, seq), vocab)
    targets = _tokens(k[1], (batch, seq), vocab)
    params = _init(model, k[2], tokens)["params"]
    tx = optax.adamw(1e-3)

    def loss_fn(params, batch):
        tokens, targets = batch
        logits, aux = _apply(model, {"params": params}, tokens)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
        return ce + 0.01 * aux

    return Case(
        "topk_moe", _optax_step(loss_fn, tx), (params, _built(tx.init, params), (tokens, targets))
    )


# -- 5. PINN --------------------------------------------------------------------------------


class _TanhMLP(nn.Module):
    width: int
    depth: int

    @nn.compact
    def __call__(self, p: jax.Array) -> jax.Array:
        h = p
        for _ in range(self.depth):
            h = jnp.tanh(nn.Dense(self.width)(h))
        return nn.Dense(1)(h)[..., 0]


def pinn(*, points: int = 64, boundary: int = 16, width: int = 32, seed: int = 4) -> Case:
    """A PINN for the 1-D wave equation ``u_tt = c² u_xx`` (flax linen tanh MLP of
    ``(x, t)``): the residual takes ``jax.hessian`` of the network under ``jax.vmap`` over
    collocation points, the initial velocity ``jax.grad``; adam."""
    k = _keys(seed, 3)
    model = _TanhMLP(width, 3)
    interior = jax.random.uniform(k[0], (points, 2))
    x0 = jax.random.uniform(k[1], (boundary,))
    params = _init(model, k[2], interior[0])["params"]
    tx = optax.adam(1e-3)
    c2 = 0.25

    def loss_fn(params, batch):
        interior, x0 = batch

        def u(p):  # one point (x, t) -> scalar
            return _apply(model, {"params": params}, p)

        hess = jax.vmap(jax.hessian(u))(interior)  # (points, 2, 2)
        residual = hess[:, 1, 1] - c2 * hess[:, 0, 0]
        start = jnp.stack([x0, jnp.zeros_like(x0)], axis=-1)
        u0 = jax.vmap(u)(start)
        v0 = jax.vmap(lambda p: jax.grad(u)(p)[1])(start)
        ic = (u0 - jnp.sin(jnp.pi * x0)) ** 2 + v0**2
        return jnp.mean(residual**2) + jnp.mean(ic)

    return Case("pinn", _optax_step(loss_fn, tx), (params, _built(tx.init, params), (interior, x0)))


# -- 6. equinox MLP -------------------------------------------------------------------------


def equinox_mlp(
    *, batch: int = 32, features: int = 16, width: int = 32, out: int = 8, seed: int = 5
) -> Case:
    """An ``eqx.nn.MLP`` regression, vmapped over the batch and differentiated with
    ``eqx.filter_value_and_grad``; the step takes only the model's arrays (``eqx.partition``;
    the static part is closed over and ``eqx.combine``-d back); adamw."""
    k = _keys(seed, 3)

    def make(key: jax.Array) -> eqx.nn.MLP:
        return eqx.nn.MLP(features, out, width, depth=2, activation=jax.nn.gelu, key=key)

    params, static = eqx.partition(eqx.filter_eval_shape(make, k[0]), eqx.is_array)
    params = _built(lambda key: eqx.partition(make(key), eqx.is_array)[0], k[0])
    x = jax.random.normal(k[1], (batch, features), jnp.float32)
    y = jax.random.normal(k[2], (batch, out), jnp.float32)
    tx = optax.adamw(1e-3)

    def loss(model, x, y):
        pred = jax.vmap(model)(x)
        return jnp.mean((pred - y) ** 2)

    def step(params, opt_state, batch):
        x, y = batch
        model = eqx.combine(params, static)
        value, grads = eqx.filter_value_and_grad(loss)(model, x, y)
        grads = eqx.filter(grads, eqx.is_array)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = eqx.apply_updates(params, updates)
        return params, opt_state, value

    return Case("equinox_mlp", step, (params, _built(tx.init, params), (x, y)))


# -- 7. flax nnx, scanned layers ------------------------------------------------------------


class _NNXBlock(nnx.Module):
    def __init__(self, d: int, rate: float, rngs: nnx.Rngs):
        self.norm = nnx.LayerNorm(d, rngs=rngs)
        self.up = nnx.Linear(d, 2 * d, rngs=rngs)
        self.down = nnx.Linear(2 * d, d, rngs=rngs)
        self.dropout = nnx.Dropout(rate)

    def __call__(self, x: jax.Array, key: jax.Array) -> jax.Array:
        h = nnx.relu(self.up(self.norm(x)))
        return x + self.dropout(self.down(h), rngs=key)


class _NNXScanned(nnx.Module):
    def __init__(self, features: int, d: int, out: int, layers: int, rngs: nnx.Rngs):
        self.inp = nnx.Linear(features, d, rngs=rngs)

        @nnx.split_rngs(splits=layers)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs: nnx.Rngs) -> _NNXBlock:
            return _NNXBlock(d, 0.1, rngs)

        self.blocks = make(rngs)  # every Param has a leading layer axis
        self.head = nnx.Linear(d, out, rngs=rngs)
        self.layers = layers

    def __call__(self, x: jax.Array, key: jax.Array) -> jax.Array:
        h = self.inp(x)
        graphdef, stacked = nnx.split(self.blocks)
        keys = jax.random.split(key, self.layers)  # one dropout key per layer

        def body(h, layer):
            state, key = layer
            return nnx.merge(graphdef, state)(h, key), None

        h, _ = jax.lax.scan(body, h, (stacked, keys))
        return self.head(h)


def nnx_scan(
    *,
    batch: int = 16,
    features: int = 16,
    d: int = 32,
    out: int = 8,
    layers: int = 3,
    seed: int = 6,
) -> Case:
    """A flax nnx residual MLP whose layers are created stacked (``nnx.vmap`` over split
    rngs) and run under ``jax.lax.scan`` over the stacked state from ``nnx.split``; dropout
    draws from the ``nnx.Rngs`` state (a typed ``key<fry>`` and its counter) passed to the
    step and returned advanced; adamw.

    ``step(params, rng_state, opt_state, (x, y)) -> (params, rng_state, opt_state, loss)``.
    """
    k = _keys(seed, 2)

    def make() -> _NNXScanned:
        return _NNXScanned(features, d, out, layers, nnx.Rngs(params=seed))

    graphdef, _ = nnx.split(nnx.eval_shape(make), nnx.Param)
    params = _built(lambda: nnx.split(make(), nnx.Param)[1])
    rng_def, rng_state = nnx.split(nnx.Rngs(dropout=seed + 100))
    x = jax.random.normal(k[0], (batch, features), jnp.float32)
    y = jax.random.normal(k[1], (batch, out), jnp.float32)
    tx = optax.adamw(1e-3)

    def step(params, rng_state, opt_state, batch):
        x, y = batch
        rngs = nnx.merge(rng_def, rng_state)
        key = rngs.dropout()  # advances the stream's counter

        def loss_fn(params):
            model = nnx.merge(graphdef, params)
            return jnp.mean((model(x, key) - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        _, rng_state = nnx.split(rngs)
        return params, rng_state, opt_state, loss

    return Case("nnx_scan", step, (params, rng_state, _built(tx.init, params), (x, y)))


# -- 8. ViT ---------------------------------------------------------------------------------


class _ViTBlock(nn.Module):
    d: int
    heads: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nn.LayerNorm()(x)
        x = x + _attention(self.heads)(h, h)
        h = nn.LayerNorm()(x)
        h = nn.Dense(self.d)(nn.gelu(nn.Dense(2 * self.d)(h)))
        return x + h


class _ViT(nn.Module):
    patch: int
    d: int
    heads: int
    classes: int

    @nn.compact
    def __call__(self, images: jax.Array) -> jax.Array:
        b, hgt, wid, c = images.shape
        p = self.patch
        # patchify: (b, H/p, p, W/p, p, c) -> (b, H/p, W/p, p, p, c) -> (b, n, p*p*c)
        x = images.reshape(b, hgt // p, p, wid // p, p, c).transpose(0, 1, 3, 2, 4, 5)
        x = nn.Dense(self.d, name="patch_embed")(x.reshape(b, -1, p * p * c))
        cls = self.param("cls", nn.initializers.zeros, (1, 1, self.d))
        x = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, self.d)), x], axis=1)
        pos = self.param("pos_embed", nn.initializers.normal(0.02), (1, x.shape[1], self.d))
        x = x + pos
        for i in range(2):
            x = _ViTBlock(self.d, self.heads, name=f"block{i}")(x)
        return nn.Dense(self.classes, name="head")(nn.LayerNorm()(x[:, 0]))


def vit(*, batch: int = 8, size: int = 16, patch: int = 4, d: int = 32, seed: int = 7) -> Case:
    """A small flax linen ViT: patchify by reshape/transpose, a class token concatenated in
    front, learned position embeddings, 2 pre-norm blocks, the head on the class token;
    label-smoothed cross-entropy, adamw."""
    k = _keys(seed, 3)
    classes = 8
    model = _ViT(patch, d, 4, classes)
    images = jax.random.normal(k[0], (batch, size, size, 3), jnp.float32)
    labels = jax.random.randint(k[1], (batch,), 0, classes)
    params = _init(model, k[2], images)["params"]
    tx = optax.adamw(1e-3)

    def loss_fn(params, batch):
        images, labels = batch
        logits = _apply(model, {"params": params}, images)
        target = optax.smooth_labels(jax.nn.one_hot(labels, classes), 0.1)
        return optax.softmax_cross_entropy(logits, target).mean()

    return Case(
        "vit", _optax_step(loss_fn, tx), (params, _built(tx.init, params), (images, labels))
    )


# -- 9. diffusion U-Net ---------------------------------------------------------------------


def _timestep_embedding(t: jax.Array, dim: int, max_period: float = 10_000.0) -> jax.Array:
    half = dim // 2
    freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
    args = t.astype(jnp.float32)[:, None] * freqs[None]
    return jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)


class _UNetBlock(nn.Module):
    channels: int

    @nn.compact
    def __call__(self, x: jax.Array, temb: jax.Array) -> jax.Array:
        h = nn.Conv(self.channels, (3, 3))(nn.swish(nn.GroupNorm(num_groups=4)(x)))
        h = h + nn.Dense(self.channels)(temb)[:, None, None, :]
        h = nn.Conv(self.channels, (3, 3))(nn.swish(nn.GroupNorm(num_groups=4)(h)))
        if x.shape[-1] != self.channels:
            x = nn.Conv(self.channels, (1, 1), name="skip")(x)
        return x + h


class _UNet(nn.Module):
    base: int = 16

    @nn.compact
    def __call__(self, x: jax.Array, t: jax.Array) -> jax.Array:
        c = self.base
        temb = _timestep_embedding(t, c)
        temb = nn.Dense(2 * c)(nn.swish(nn.Dense(2 * c)(temb)))
        h0 = nn.Conv(c, (3, 3), name="stem")(x)  # 16x16
        h1 = _UNetBlock(c)(h0, temb)
        d1 = nn.Conv(2 * c, (3, 3), strides=(2, 2), name="down1")(h1)  # 8x8
        h2 = _UNetBlock(2 * c)(d1, temb)
        d2 = nn.Conv(2 * c, (3, 3), strides=(2, 2), name="down2")(h2)  # 4x4
        mid = _UNetBlock(2 * c)(d2, temb)
        b, hh, ww, ch = mid.shape
        u2 = jax.image.resize(mid, (b, 2 * hh, 2 * ww, ch), "nearest")  # 8x8
        u2 = _UNetBlock(2 * c)(jnp.concatenate([u2, h2], axis=-1), temb)
        u1 = nn.ConvTranspose(c, (2, 2), strides=(2, 2), name="up1")(u2)  # 16x16
        u1 = _UNetBlock(c)(jnp.concatenate([u1, h1], axis=-1), temb)
        out = nn.swish(nn.GroupNorm(num_groups=4)(u1))
        return nn.Conv(x.shape[-1], (3, 3), name="out")(out)


def unet(*, batch: int = 8, size: int = 16, steps: int = 1000, seed: int = 8) -> Case:
    """A tiny diffusion U-Net (flax linen): strided-conv downsampling, upsampling by
    ``jax.image.resize`` and by ``nn.ConvTranspose``, skip concatenation, ``nn.GroupNorm``,
    a sinusoidal time embedding; the DDPM noise-prediction loss under a cosine schedule
    (noise and timesteps come in the batch); adamw."""
    k = _keys(seed, 4)
    model = _UNet()
    x0 = jax.random.normal(k[0], (batch, size, size, 3), jnp.float32)
    noise = jax.random.normal(k[1], x0.shape, jnp.float32)
    t = jax.random.randint(k[2], (batch,), 0, steps)
    params = _init(model, k[3], x0, t)["params"]
    tx = optax.adamw(2e-4)

    def loss_fn(params, batch):
        x0, noise, t = batch
        s = (t.astype(jnp.float32) / steps + 0.008) / 1.008
        alpha_bar = (jnp.cos(s * jnp.pi / 2) ** 2)[:, None, None, None]
        xt = jnp.sqrt(alpha_bar) * x0 + jnp.sqrt(1.0 - alpha_bar) * noise
        pred = _apply(model, {"params": params}, xt, t)
        return jnp.mean((pred - noise) ** 2)

    return Case("unet", _optax_step(loss_fn, tx), (params, _built(tx.init, params), (x0, noise, t)))


# -- the corpus and what it is made of ------------------------------------------------------

MODELS: tuple[Callable[[], Case], ...] = (
    linen_gpt,
    linen_seq2seq,
    linen_resnet,
    topk_moe,
    pinn,
    equinox_mlp,
    nnx_scan,
    vit,
    unet,
)


def corpus() -> list[Case]:
    """Every corpus model, in a fixed order (``MODELS``)."""
    return [make() for make in MODELS]


def _sub_jaxprs(params: dict[str, Any]) -> Iterator[Any]:
    for sub in jex_core.jaxprs_in_params(params):
        yield sub.jaxpr if isinstance(sub, jex_core.ClosedJaxpr) else sub


def _count(jaxpr: Any, counts: collections.Counter[str]) -> None:
    for eqn in jaxpr.eqns:
        counts[eqn.primitive.name] += 1
        for sub in _sub_jaxprs(eqn.params):
            _count(sub, counts)


def primitive_inventory(case: Case) -> collections.Counter[str]:
    """How many equations of each primitive ``case.fn(*case.args)`` traces to, counted
    through every sub-jaxpr (``pjit``, ``custom_jvp_call``/``custom_vjp_call``, ``scan``,
    ``cond`` branches, ``while`` cond and body): the call equations count too."""
    closed = jax.make_jaxpr(case.fn)(*case.args)
    counts: collections.Counter[str] = collections.Counter()
    _count(closed.jaxpr, counts)
    return counts


def _unknown(graph: OpGraph, counts: collections.Counter[str]) -> None:
    for node in graph.nodes:
        if not rule_for(node, graph).known:
            counts[node.primitive] += 1
        for sub in node.subgraphs:  # cond branches, while bodies, nested scans
            _unknown(sub, counts)


def fallbacks(case: Case, *, unroll_scans: bool = True) -> collections.Counter[str]:
    """Per primitive, how many op-graph nodes have no sharding rule (``known`` is False:
    replicated in and out), nodes of ``cond``/``while`` bodies included.

    ``unroll_scans``: the graph the search sees (True: top-level scans unrolled) or the one
    ``predict`` sees (False), where a ``scan`` node itself counts, having no rule (the cost
    model costs it through its body instead).
    """
    graph = trace(case.fn, *case.args, unroll_scans=unroll_scans).graph
    counts: collections.Counter[str] = collections.Counter()
    _unknown(graph, counts)
    return counts


def equations(case: Case) -> int:
    """Equations of the case's jaxpr, sub-jaxprs included (``primitive_inventory``'s total)."""
    return sum(primitive_inventory(case).values())


def leaves_equal(a: Any, b: Any) -> bool:
    """Whether two pytrees hold identical leaves (key leaves compared by their data)."""

    def data(x: Any) -> np.ndarray:
        if jax.dtypes.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.extended):
            x = jax.random.key_data(x)
        return np.asarray(x)

    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.array_equal(data(x), data(y)) for x, y in zip(la, lb, strict=True)
    )
