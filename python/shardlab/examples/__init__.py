"""Small, deterministic example models for shardlab's notebooks, tests and benchmarks.

Each example is a ``Case``: a function and concrete example arguments, ready for
``shardlab.search``, ``shardlab.predict`` or ``shardlab.editor``::

    from shardlab.examples import gpt

    case = gpt(4)  # step(params, momentum, (tokens, targets))
    plan = shardlab.search(case.fn, *case.args, mesh=mesh)

Train cases are one step of SGD with momentum (``train_step``). The ``*_layer`` examples are
losses ``loss(params, batch)`` of one constant-initialised layer whose every intermediate
goes through a sharding hook (``Shard``), for comparing fully specified strategies.

Families: ``dense`` (``mlp``, ``mlp_layer``), ``transformer`` (``gpt``, ``gpt_scan``,
``gpt_layer``), ``convnet`` (``conv``, ``conv_layer``), ``experts`` (``moe``),
``embeddings`` (``embedding``), ``physics`` (``pinn``). Abstract models at published sizes,
imported from their modules: ``shardlab.examples.llama`` (Llama 3.1) and
``shardlab.examples.gpt3`` (GPT-3 / Megatron-LM).
"""

from __future__ import annotations

from shardlab.examples.base import Case, Shard, no_shard, train_step, training_case
from shardlab.examples.convnet import conv, conv_layer
from shardlab.examples.dense import mlp, mlp_layer
from shardlab.examples.embeddings import embedding
from shardlab.examples.experts import moe
from shardlab.examples.physics import pinn
from shardlab.examples.transformer import gpt, gpt_layer, gpt_scan

__all__ = [
    "Case",
    "Shard",
    "cases",
    "conv",
    "conv_layer",
    "embedding",
    "gpt",
    "gpt_layer",
    "gpt_scan",
    "mlp",
    "mlp_layer",
    "moe",
    "no_shard",
    "pinn",
    "train_step",
    "training_case",
]


def cases() -> list[Case]:
    """The strategy-search benchmark's small cases (each verified by compiling there).

    Returns:
        MLP forward and train steps in both regimes (batch 1024 × hidden 128 and the
        reverse), a 2-layer GPT, MoE, conv block, embedding model and PINN train steps.
    """
    return [
        mlp(1024, 128, train=False),
        mlp(1024, 128, train=True),
        mlp(128, 1024, train=False),
        mlp(128, 1024, train=True),
        gpt(2),
        moe(),
        conv(),
        embedding(),
        pinn(),
    ]
