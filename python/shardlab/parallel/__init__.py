"""The parallel core, in layers that import only downwards: ``graph`` (tracing, op graph,
sharding rules), ``cost`` (the cost model and ``predict``), ``compiled`` (what the compiler
did: ``analyze``), ``plan`` (``Plan`` records) and ``search`` (the strategy search), over the
base modules ``errors``, ``records``, ``mesh`` and ``specs``. This face re-exports the
records and entry points the public API names.

Imports jax, numpy and scipy only (never IPython or widget libraries).
"""

from __future__ import annotations

from shardlab.parallel.compiled.analyze import analyze
from shardlab.parallel.compiled.hlo import collectives_from_hlo, parse_replica_groups
from shardlab.parallel.cost.predict import predict
from shardlab.parallel.cost.profiles import DEVICE_PROFILES, DeviceProfile, wire_bytes
from shardlab.parallel.mesh import mesh
from shardlab.parallel.records import (
    Collective,
    CostBreakdown,
    DeviceMemoryEstimate,
    Layout,
    MemoryBreakdown,
    Report,
)
from shardlab.parallel.specs import ShardingSpecError

__all__ = [
    "DEVICE_PROFILES",
    "Collective",
    "CostBreakdown",
    "DeviceMemoryEstimate",
    "DeviceProfile",
    "Layout",
    "MemoryBreakdown",
    "Report",
    "ShardingSpecError",
    "analyze",
    "collectives_from_hlo",
    "mesh",
    "parse_replica_groups",
    "predict",
    "wire_bytes",
]
