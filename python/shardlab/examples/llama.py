"""Llama-style decoders at any size, abstract or concrete: what people plan for clusters.

The architecture of Llama 3 (and of most open decoders since): RMSNorm, rotary position
embeddings, grouped-query attention (``kv_heads`` key/value heads shared by ``heads`` query
heads), a SwiGLU MLP, untied embedding and head; the layers' parameters stacked on a leading
axis and run by one ``lax.scan``, as MaxText and flax ``nn.scan`` models do. A train step is
the cross-entropy loss, its gradient and SGD with momentum (``base.train_step``), in bfloat16.

``llama(LLAMA_8B, batch=..., seq=...)`` gives ``jax.ShapeDtypeStruct`` arguments by default:
an 8B or 70B model is planned without its memory. ``abstract=False`` gives real arrays (small
configurations only), for checking a plan numerically against the plain step.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from shardlab.examples.base import Case, train_step, training_case

__all__ = ["LLAMA_8B", "LLAMA_70B", "LLAMA_405B", "LLAMA_TINY", "LlamaConfig", "llama"]


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """The sizes of a Llama-style decoder.

    Attributes:
        name: label (``"llama-8b"``).
        layers: decoder blocks.
        d: the model width.
        heads: query heads.
        kv_heads: key/value heads (grouped-query attention; ``heads`` divides by it).
        ffn: the SwiGLU hidden width.
        vocab: the vocabulary size.
        rope_theta: the rotary embedding's base.
        head_size: the width of one head (0: ``d / heads``, as in Llama; MaxText's
            scaled models keep it at 128 while the heads grow).
    """

    name: str
    layers: int
    d: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    rope_theta: float = 500000.0
    head_size: int = 0

    @property
    def head_dim(self) -> int:
        return self.head_size or self.d // self.heads

    def parameter_count(self) -> int:
        """Parameters in all (embedding and head included)."""
        hd = self.head_dim
        per_layer = (
            2 * self.d
            + self.d * self.heads * hd
            + 2 * self.d * self.kv_heads * hd
            + self.heads * hd * self.d
            + 3 * self.d * self.ffn
        )
        return self.layers * per_layer + self.d + 2 * self.vocab * self.d


# Llama 3.1's published configurations (config.json of the 8B, 70B and 405B models).
LLAMA_8B = LlamaConfig("llama-8b", 32, 4096, 32, 8, 14336, 128256)
LLAMA_70B = LlamaConfig("llama-70b", 80, 8192, 64, 8, 28672, 128256)
LLAMA_405B = LlamaConfig("llama-405b", 126, 16384, 128, 8, 53248, 128256)
# The same architecture small enough to run and compare on 8 simulated CPU devices.
LLAMA_TINY = LlamaConfig("llama-tiny", 2, 128, 4, 2, 256, 512)


def _shapes(c: LlamaConfig) -> dict[str, Any]:
    hd, n = c.head_dim, c.layers
    return {
        "embed": (c.vocab, c.d),
        "layers": {
            "attn_norm": (n, c.d),
            "wq": (n, c.d, c.heads * hd),
            "wk": (n, c.d, c.kv_heads * hd),
            "wv": (n, c.d, c.kv_heads * hd),
            "wo": (n, c.heads * hd, c.d),
            "mlp_norm": (n, c.d),
            "w_gate": (n, c.d, c.ffn),
            "w_up": (n, c.d, c.ffn),
            "w_down": (n, c.ffn, c.d),
        },
        "final_norm": (c.d,),
        "head": (c.d, c.vocab),
    }


def _is_shape(x: Any) -> bool:
    return isinstance(x, tuple) and all(isinstance(i, int) for i in x)


def rms_norm(x: jax.Array, g: jax.Array, eps: float = 1e-5) -> jax.Array:
    """Root-mean-square normalisation (in float32) scaled by ``g``."""
    x32 = x.astype(jnp.float32)
    scale = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * scale).astype(x.dtype) * g


def rope(x: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding over (batch, seq, heads, head_dim), halves rotated."""
    seq, dim = x.shape[1], x.shape[-1]
    freqs = theta ** (-jnp.arange(0, dim // 2, dtype=jnp.float32) * 2 / dim)
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * freqs[None, :]
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return out.astype(x.dtype)


def _block(c: LlamaConfig, h: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    b, s, _ = h.shape
    hd, group = c.head_dim, c.heads // c.kv_heads
    x = rms_norm(h, p["attn_norm"])
    q = (x @ p["wq"]).reshape(b, s, c.heads, hd)
    k = (x @ p["wk"]).reshape(b, s, c.kv_heads, hd)
    v = (x @ p["wv"]).reshape(b, s, c.kv_heads, hd)
    q, k = rope(q, c.rope_theta), rope(k, c.rope_theta)
    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / math.sqrt(hd)
    mask = jnp.tril(jnp.ones((s, s), dtype=bool))
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    attn = jax.nn.softmax(scores, axis=-1).astype(h.dtype)
    out = jnp.einsum("bhqk,bkhd->bqhd", attn, v).reshape(b, s, c.heads * hd)
    h = h + out @ p["wo"]
    x = rms_norm(h, p["mlp_norm"])
    return h + (jax.nn.silu(x @ p["w_gate"]) * (x @ p["w_up"])) @ p["w_down"]


def llama_loss(c: LlamaConfig):
    """``loss(params, (tokens, targets))``: the decoder's mean next-token cross-entropy."""

    def loss(params: dict[str, Any], batch: tuple[jax.Array, jax.Array]) -> jax.Array:
        tokens, targets = batch
        h = jnp.take(params["embed"], tokens, axis=0)
        h, _ = jax.lax.scan(lambda h, p: (_block(c, h, p), None), h, params["layers"])
        h = rms_norm(h, params["final_norm"])
        logits = (h @ params["head"]).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))

    return loss


def llama(
    config: LlamaConfig,
    *,
    batch: int = 8,
    seq: int = 128,
    dtype: Any = jnp.bfloat16,
    abstract: bool = True,
    seed: int = 0,
) -> Case:
    """A Llama-style train step and its arguments ``(params, momentum, (tokens, targets))``.

    Args:
        config: the sizes (``LLAMA_8B``, ``LLAMA_70B``, ``LLAMA_TINY`` or your own).
        batch: sequences per step (the global batch).
        seq: tokens per sequence.
        dtype: the parameters' dtype (bfloat16, as people train).
        abstract: ``jax.ShapeDtypeStruct`` arguments (nothing allocated); ``False``: normal
            initial values (scale 0.02; norms at 1) and random tokens.
        seed: the PRNG seed of concrete arguments.

    Returns:
        The case ``"{name} train"``.
    """
    shapes = _shapes(config)
    if abstract:
        params = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, dtype), shapes, is_leaf=_is_shape)
        tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
        step = train_step(llama_loss(config))
        return Case(f"{config.name} train", step, (params, params, (tokens, tokens)))
    leaves, tree = jax.tree.flatten(shapes, is_leaf=_is_shape)
    keys = jax.random.split(jax.random.key(seed), len(leaves) + 2)
    values = [
        jnp.ones(s, dtype)
        if "norm" in name
        else (jax.random.normal(k, s, jnp.float32) * 0.02).astype(dtype)
        for k, s, name in zip(keys[: len(leaves)], leaves, _leaf_names(shapes), strict=True)
    ]
    params = jax.tree.unflatten(tree, values)
    tokens = jax.random.randint(keys[-2], (batch, seq), 0, config.vocab)
    targets = jax.random.randint(keys[-1], (batch, seq), 0, config.vocab)
    return training_case(f"{config.name} train", llama_loss(config), params, (tokens, targets))


def _leaf_names(shapes: dict[str, Any]) -> list[str]:
    paths = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=_is_shape)[0]
    return [jax.tree_util.keystr(path) for path, _ in paths]
