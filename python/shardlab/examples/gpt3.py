"""GPT-3 / Megatron-LM decoders at their published sizes, abstract: what the papers trained.

The architecture of GPT-3 as Megatron-LM trains it (Narayanan et al. 2021, arXiv 2104.04473;
Korthikanti et al. 2022, arXiv 2205.05198): learned position embeddings, pre-LayerNorm blocks
of causal multi-head attention and a GeLU MLP of width ``4h``, biases on every linear layer,
a final LayerNorm and the output layer tied to the word embedding; vocabulary 51,200. The
layers' parameters are stacked on a leading axis and run by one ``lax.scan``. A train step is
the cross-entropy loss, its gradient and SGD with momentum (``base.train_step``; Megatron
uses Adam, whose update is elementwise too), in bfloat16, with ``jax.ShapeDtypeStruct``
arguments: a 1T-parameter model is planned without its memory.

``megatron_flops`` is the paper's Eq. 3, the FLOPs per iteration with activation recompute,
which the published TFLOP/s figures are computed from.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from shardlab.examples.base import Case, train_step

__all__ = [
    "ALPA_2_6B",
    "GPT3_175B",
    "GPT_22B",
    "GPT_162B",
    "MEGATRON_TABLE_1",
    "GPTConfig",
    "gpt",
    "gpt_loss",
    "megatron_flops",
]


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """The sizes of a GPT-3 / Megatron-LM decoder.

    Attributes:
        name: label (``"gpt-175b"``).
        layers: transformer blocks (l).
        d: the hidden size (h); the MLP is ``4h`` wide.
        heads: attention heads (``d`` divisible by it).
        vocab: the vocabulary (V; Megatron's padded GPT-2 vocabulary, 51,200).
        positions: learned position embeddings (the longest sequence, s).
    """

    name: str
    layers: int
    d: int
    heads: int
    vocab: int = 51200
    positions: int = 2048

    def parameter_count(self) -> int:
        """Parameters in all: Megatron's ``12 l h² (1 + 13/(12h) + (V+s)/(12 l h))`` plus
        the final LayerNorm (the output layer is the word embedding)."""
        h = self.d
        per_layer = 12 * h * h + 13 * h
        return self.layers * per_layer + (self.vocab + self.positions) * h + 2 * h


def megatron_flops(config: GPTConfig, batch: int, seq: int, *, recompute: bool = True) -> float:
    """FLOPs of one iteration, arXiv 2104.04473 Eq. 3: ``96 B s l h² (1 + s/(6h) +
    V/(16 l h))`` with full activation recompute (a fourth pass of each layer's forward);
    ``recompute=False``: the model FLOPs, ``72 B s l h² (1 + s/(6h)) + 6 B s h V``."""
    b, s, n, h, v = batch, seq, config.layers, config.d, config.vocab
    layer_passes = 4 if recompute else 3
    return layer_passes * 24 * b * s * n * h * h * (1 + s / (6 * h)) + 6 * b * s * h * v


# Megatron-LM 2021, Table 1 (weak scaling on Selene): (name, layers, hidden, heads).
MEGATRON_TABLE_1 = tuple(
    GPTConfig(f"gpt-{size}", layers, d, heads)
    for size, layers, d, heads in (
        ("3.6b", 30, 3072, 32),
        ("7.5b", 36, 4096, 32),
        ("39b", 48, 8192, 64),
        ("76b", 60, 10240, 80),
        ("145b", 80, 12288, 96),
        ("310b", 96, 16384, 128),
        ("530b", 105, 20480, 128),
        ("1t", 128, 25600, 160),
    )
)
GPT3_175B = GPTConfig("gpt-175b", 96, 12288, 96)
# Korthikanti et al. 2022 (arXiv 2205.05198) Table 3's 22B; Megatron-LM 2021 Fig. 13's 162.2B.
GPT_22B = GPTConfig("gpt-22b", 48, 6144, 64)
GPT_162B = GPTConfig("gpt-162b", 32, 20480, 128)
# Alpa's GPT 2.6B (alpa-projects/alpa benchmark/alpa/paper_auto_gpt_suite.py): seq 1024.
ALPA_2_6B = GPTConfig("gpt-2.6b", 32, 2560, 32, positions=1024)


def _shapes(c: GPTConfig) -> dict[str, Any]:
    n, h = c.layers, c.d
    return {
        "embed": (c.vocab, h),
        "positions": (c.positions, h),
        "layers": {
            "ln1_g": (n, h),
            "ln1_b": (n, h),
            "wq": (n, h, h),
            "wk": (n, h, h),
            "wv": (n, h, h),
            "bq": (n, h),
            "bk": (n, h),
            "bv": (n, h),
            "wo": (n, h, h),
            "bo": (n, h),
            "ln2_g": (n, h),
            "ln2_b": (n, h),
            "w1": (n, h, 4 * h),
            "b1": (n, 4 * h),
            "w2": (n, 4 * h, h),
            "b2": (n, h),
        },
        "final_g": (h,),
        "final_b": (h,),
    }


def _is_shape(x: Any) -> bool:
    return isinstance(x, tuple) and all(isinstance(i, int) for i in x)


def layer_norm(x: jax.Array, g: jax.Array, b: jax.Array, eps: float = 1e-5) -> jax.Array:
    """LayerNorm over the last axis, statistics in float32 (as Megatron's fused kernel)."""
    x32 = x.astype(jnp.float32)
    mu = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mu), axis=-1, keepdims=True)
    return ((x32 - mu) * jax.lax.rsqrt(var + eps)).astype(x.dtype) * g + b


def _block(c: GPTConfig, x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    b, s, h = x.shape
    hd = h // c.heads
    a = layer_norm(x, p["ln1_g"], p["ln1_b"])
    q = (a @ p["wq"] + p["bq"]).reshape(b, s, c.heads, hd)
    k = (a @ p["wk"] + p["bk"]).reshape(b, s, c.heads, hd)
    v = (a @ p["wv"] + p["bv"]).reshape(b, s, c.heads, hd)
    # Scaled, masked softmax on the bf16 scores (Megatron's fused kernel reads and writes
    # bf16 and computes in float32 inside).
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
    mask = jnp.tril(jnp.ones((s, s), dtype=bool))
    probs = jax.nn.softmax(jnp.where(mask, scores, -1e4), axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, h)
    x = x + out @ p["wo"] + p["bo"]
    a = layer_norm(x, p["ln2_g"], p["ln2_b"])
    return x + jax.nn.gelu(a @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def gpt_loss(c: GPTConfig):
    """``loss(params, (tokens, targets))``: the decoder's mean next-token cross-entropy
    (logits in float32, as Megatron's vocab-parallel cross-entropy)."""

    def loss(params: dict[str, Any], batch: tuple[jax.Array, jax.Array]) -> jax.Array:
        tokens, targets = batch
        seq = tokens.shape[1]
        x = jnp.take(params["embed"], tokens, axis=0) + params["positions"][:seq]
        x, _ = jax.lax.scan(lambda x, p: (_block(c, x, p), None), x, params["layers"])
        x = layer_norm(x, params["final_g"], params["final_b"])
        logits = jnp.einsum("bsh,vh->bsv", x, params["embed"]).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits, axis=-1)
        # The target's log-probability through a one-hot mask (as MaxText writes it), which
        # stays split with a vocabulary split over the tensor axis, as Megatron's
        # vocab-parallel cross-entropy; a take_along_axis would gather the whole logits.
        onehot = jax.nn.one_hot(targets, c.vocab, dtype=logp.dtype)
        return -jnp.mean(jnp.sum(logp * onehot, axis=-1))

    return loss


def gpt(
    config: GPTConfig, *, batch: int, seq: int | None = None, dtype: Any = jnp.bfloat16
) -> Case:
    """A GPT train step with abstract arguments ``(params, momentum, (tokens, targets))``.

    Args:
        config: the sizes (``GPT3_175B``, one of ``MEGATRON_TABLE_1`` or your own).
        batch: sequences per step (the global batch).
        seq: tokens per sequence (default: ``config.positions``).
        dtype: the parameters' dtype (bfloat16, as the papers train).

    Returns:
        The case ``"{name} train"``; every argument a ``jax.ShapeDtypeStruct``.

    Raises:
        ValueError: ``seq`` longer than the position table, or heads not dividing ``d``.
    """
    seq = config.positions if seq is None else seq
    if seq > config.positions:
        raise ValueError(
            f"seq={seq} is longer than the {config.positions} learned positions of "
            f"{config.name}; use seq <= {config.positions} or a config with more positions"
        )
    if config.d % config.heads:
        raise ValueError(f"{config.name}: heads={config.heads} does not divide d={config.d}")
    shapes = _shapes(config)
    params = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, dtype), shapes, is_leaf=_is_shape)
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    return Case(
        f"{config.name} train", train_step(gpt_loss(config)), (params, params, (tokens, tokens))
    )
