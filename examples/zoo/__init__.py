"""A model zoo of "other people's models": small train steps written the way public JAX
projects write them, on flax linen, flax nnx, equinox and optax (``models.py``).

Every model is a ``Case`` whose function is a whole train step, for the strategy search and
the baselines to be run on as they are: ``corpus()`` lists them in a fixed order;
``primitive_inventory`` counts the primitives a case traces to (sub-jaxprs included) and
``fallbacks`` the op-graph nodes no sharding rule knows. The corpus benchmark
(``benchmarks.corpus``, ``python -m benchmarks --only corpus``) runs on them.

How it differs from ``shardlab.examples``: those are shardlab's own small models, written on
plain JAX, shipped in the wheel and used by the notebooks and tests; this zoo is third-party
code on libraries that are only development dependencies (the ``corpus`` group in
pyproject.toml), so it lives outside the package, at the repository root, and is never
installed. It uses ``shardlab.examples.Case`` for its cases; shardlab never imports it.
"""

from __future__ import annotations

from examples.zoo.models import (
    MODELS,
    corpus,
    equations,
    equinox_mlp,
    fallbacks,
    leaves_equal,
    linen_gpt,
    linen_resnet,
    linen_seq2seq,
    nnx_scan,
    pinn,
    primitive_inventory,
    topk_moe,
    unet,
    vit,
)

__all__ = [
    "MODELS",
    "corpus",
    "equations",
    "equinox_mlp",
    "fallbacks",
    "leaves_equal",
    "linen_gpt",
    "linen_resnet",
    "linen_seq2seq",
    "nnx_scan",
    "pinn",
    "primitive_inventory",
    "topk_moe",
    "unet",
    "vit",
]
