"""What every example shares: the ``Case`` record, the train step, the sharding hook.

A *case* is a function with concrete example arguments. Train cases are one step of SGD with
momentum, ``step(params, momentum, batch) -> (params, momentum, loss)``, so updated
parameters and optimizer state keep their layouts.

Layer examples (``mlp_layer``, ``gpt_layer``, ``conv_layer``) take a ``shard`` hook that is
applied to every intermediate with *logical* axis names, one entry per dimension:
``"batch"`` (the data-parallel dimension), ``"model"`` (the dimension Megatron tensor
parallelism splits) or ``None``. The default, ``no_shard``, returns its input unchanged, so
an unsharded example traces to exactly the operations it computes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Case:
    """One example function with example arguments.

    Attributes:
        name: label.
        fn: the function.
        args: example arguments (concrete arrays).
        expect: the baseline the case is designed to favour ("" for none).
    """

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    expect: str = ""


class Shard(Protocol):
    """A sharding hook: ``shard(x, *axes)`` returns ``x``, possibly constrained.

    ``axes`` has one logical axis name per dimension of ``x``: ``"batch"``, ``"model"`` or
    ``None``.
    """

    def __call__(self, x: jax.Array, *axes: str | None) -> jax.Array: ...


def no_shard(x: jax.Array, *axes: str | None) -> jax.Array:
    """The default sharding hook: ``x`` unchanged.

    Args:
        x: an intermediate.
        *axes: its logical axis names (ignored).

    Returns:
        ``x``.
    """
    del axes
    return x


def normal(key: Any, shape: tuple[int, ...], scale: float = 0.05) -> jax.Array:
    """Float32 normal initial values.

    Args:
        key: a PRNG key.
        shape: the array's shape.
        scale: the standard deviation.

    Returns:
        ``scale`` times a standard normal array of ``shape``.
    """
    return jax.random.normal(key, shape, jnp.float32) * scale


def train_step(loss: Callable[..., Any], lr: float = 0.01) -> Callable[..., Any]:
    """SGD with momentum around ``loss(params, batch)``.

    Args:
        loss: the loss, differentiated with respect to its first argument.
        lr: the learning rate.

    Returns:
        ``step(params, momentum, batch) -> (params, momentum, loss)``.
    """

    def step(params, momentum, batch):
        value, grads = jax.value_and_grad(loss)(params, batch)
        new_m = jax.tree.map(lambda m, g: 0.9 * m + g, momentum, grads)
        new_p = jax.tree.map(lambda p, m: p - lr * m, params, new_m)
        return new_p, new_m, value

    return step


def training_case(
    name: str, loss: Callable[..., Any], params: Any, batch: Any, expect: str = ""
) -> Case:
    """The ``Case`` of one ``train_step(loss)`` from zero momentum.

    Args:
        name: label.
        loss: ``loss(params, batch)``.
        params: initial parameters.
        batch: one batch.
        expect: the baseline the case is designed to favour ("" for none).

    Returns:
        ``Case(name, train_step(loss), (params, zero momentum, batch), expect)``.
    """
    momentum = jax.tree.map(jnp.zeros_like, params)
    return Case(name, train_step(loss), (params, momentum, batch), expect)
