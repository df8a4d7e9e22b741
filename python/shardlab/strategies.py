"""``shardlab.strategies``: baseline sharding strategies as ``Plan``s.

``replicated``, ``data_parallel``, ``megatron`` (tensor parallel for the MLP/attention
matmul pairs found in the graph), ``zero`` (optimizer-state sharding over the data axes),
their combinations on 2-D meshes, and ``baselines`` (all of them for a mesh); the
five-dimensional ones ``pipeline_data``, ``pipeline_tensor`` (pipeline stages over a
``stage`` axis with data or tensor splits) and ``zero3_remat`` (data × tensor × ZeRO-3 ×
rematerialisation). Each returns a
``Plan`` with ``jit()``, ``verify()``, ``to_code()`` like ``shardlab.search``'s.
"""

from __future__ import annotations

from shardlab.parallel.search.strategies.baselines import (
    baselines,
    build,
    data_parallel,
    megatron,
    replicated,
    zero,
)
from shardlab.parallel.search.strategies.composite import (
    pipeline_data,
    pipeline_tensor,
    zero3_remat,
)

__all__ = [
    "baselines",
    "build",
    "data_parallel",
    "megatron",
    "pipeline_data",
    "pipeline_tensor",
    "replicated",
    "zero",
    "zero3_remat",
]
