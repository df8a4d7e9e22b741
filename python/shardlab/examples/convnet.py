"""A wide-ResNet-style block: two 3×3 convolutions with a residual, pooling, a dense head."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from shardlab.examples.base import Case, Shard, no_shard, normal, training_case

_DIMENSIONS = ("NHWC", "HWIO", "NHWC")
_IMAGE = ("batch", None, None, None)  # (batch, h, w, channels): channels whole
_CHANNELS = ("batch", None, None, "model")  # channels split


def conv_params(ch: int, classes: int, init: Callable[[tuple[int, ...]], jax.Array]) -> dict:
    """``k1`` (3, 3, ch, 2 ch), ``k2`` (3, 3, 2 ch, ch), ``dense`` (ch, classes).

    Args:
        ch: the block's input (and output) channels; the middle has twice as many.
        classes: outputs of the dense head.
        init: ``init(shape)``, called for ``k1, k2, dense`` in that order.

    Returns:
        The parameters.
    """
    return {
        "k1": init((3, 3, ch, 2 * ch)),
        "k2": init((3, 3, 2 * ch, ch)),
        "dense": init((ch, classes)),
    }


def conv_loss(
    p: Any,
    xy: tuple[jax.Array, jax.Array],
    *,
    relu_before_pool: bool = True,
    shard: Shard = no_shard,
) -> jax.Array:
    """conv, ReLU, conv, + input, (ReLU), mean-pool, dense; mean squared error against ``y``.

    Args:
        p: ``conv_params``.
        xy: images ``(batch, h, w, ch)`` (NHWC) and targets ``(batch, classes)``.
        relu_before_pool: a ReLU after the residual sum (``conv``), or none (``conv_layer``).
        shard: the sharding hook (the middle channels split over ``"model"``).

    Returns:
        The scalar loss.
    """
    x, y = xy
    h = jax.lax.conv_general_dilated(x, p["k1"], (1, 1), "SAME", dimension_numbers=_DIMENSIONS)
    h = shard(jax.nn.relu(shard(h, *_CHANNELS)), *_CHANNELS)
    h = jax.lax.conv_general_dilated(h, p["k2"], (1, 1), "SAME", dimension_numbers=_DIMENSIONS)
    h = shard(shard(h, *_IMAGE) + x, *_IMAGE)
    if relu_before_pool:
        h = jax.nn.relu(h)
    pooled = shard(jnp.mean(h, axis=(1, 2)), "batch", None)
    logits = shard(pooled @ p["dense"], "batch", None)
    return jnp.mean((logits - y) ** 2)


def conv(*, batch: int = 16, hw: int = 8, ch: int = 32, classes: int = 16, seed: int = 0) -> Case:
    """The block's train step, normal-initialised (scale 0.05), ReLU before pooling.

    Args:
        batch: images per batch.
        hw: image height and width.
        ch: the block's channels.
        classes: outputs of the dense head.
        seed: the PRNG seed of weights and batch.

    Returns:
        The case ``"wide-resnet block train"``.
    """
    k = jax.random.split(jax.random.key(seed), 5)
    keys = iter(k[:3])
    params = conv_params(ch, classes, lambda shape: normal(next(keys), shape))
    x, y = normal(k[3], (batch, hw, hw, ch), 1.0), normal(k[4], (batch, classes), 1.0)
    return training_case("wide-resnet block train", conv_loss, params, (x, y))


def conv_layer(shard: Shard = no_shard) -> Case:
    """The block's loss without the ReLU before pooling, constant-initialised (weights 0.01,
    images and targets of ones); batch 8, 8×8 images, 8 channels (16 in the middle), 8 classes.

    Args:
        shard: the sharding hook applied to every intermediate.

    Returns:
        ``Case("conv", loss, (params, (x, y)))`` with ``loss(params, batch)``.
    """
    n, hw, ch, classes = 8, 8, 8, 8
    params = conv_params(ch, classes, lambda shape: jnp.ones(shape) * 0.01)
    batch = (jnp.ones((n, hw, hw, ch)), jnp.ones((n, classes)))
    loss = functools.partial(conv_loss, relu_before_pool=False, shard=shard)
    return Case("conv", loss, (params, batch))
