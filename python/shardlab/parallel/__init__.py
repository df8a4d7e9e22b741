"""The parallel core: mesh, op graph, sharding rules, cost model and HLO analysis.

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
