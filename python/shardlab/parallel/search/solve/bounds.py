"""A lower bound on per-device memory, checked before any search or compile.

No plan can hold less, per device, than its arguments and outputs each split as finely as
their dimensions allow over the mesh (every mesh axis given to some dimension it divides):
ZeRO-3 and tensor splits at best reach that. Activations are counted as zero, which is what
full rematerialisation and as many pipeline stages as layers tend to (never below it), so
the bound is safe for every plan the search, remat or stages can make. A budget below it
is refused in milliseconds (``check_budget``), where the search would try its ILP cuts,
Lagrangian penalties and baselines for minutes before giving up.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping

from shardlab.parallel.errors import SearchError
from shardlab.parallel.graph.opgraph import OpGraph
from shardlab.parallel.records import _Record


@dataclasses.dataclass(frozen=True)
class MemoryBound(_Record):
    """Per-device bytes no plan can go below, and what each dimension gives.

    Attributes:
        replicated: arguments + outputs with every leaf on every device (no sharding).
        sharded: arguments + outputs with every leaf split as finely as its dimensions
            allow over the whole mesh (the bound: activations counted as zero).
        activations: the activation bytes counted (0: full remat and the most stages can
            only approach it).
        devices: devices in the mesh.
    """

    replicated: int
    sharded: int
    activations: int
    devices: int

    @property
    def lower_bound(self) -> int:
        return self.sharded + self.activations


def finest_split(shape: tuple[int, ...], sizes: Mapping[str, int]) -> int:
    """Into how many pieces a tensor of ``shape`` can be split at most on a mesh of
    ``sizes``: each axis given to one dimension whose size the axes on it divide, or to none."""
    axes = [s for s in sizes.values() if s > 1]
    if not shape or not axes:
        return 1
    best = 1
    for assignment in itertools.product(range(len(shape) + 1), repeat=len(axes)):
        per_dim = [1] * len(shape)
        for size, dim in zip(axes, assignment, strict=True):
            if dim < len(shape):
                per_dim[dim] *= size
        if all(shape[d] % per_dim[d] == 0 for d in range(len(shape))):
            best = max(best, math.prod(per_dim))
    return best


def memory_bound(graph: OpGraph, sizes: Mapping[str, int]) -> MemoryBound:
    """The bound for ``graph`` on a mesh of ``sizes`` (see the module docstring)."""
    leaves = [*dict.fromkeys(graph.inputs), *dict.fromkeys(graph.outputs)]
    full = sharded = 0
    for v in leaves:
        nbytes = graph.nbytes(v)
        full += nbytes
        sharded += math.ceil(nbytes / finest_split(graph.shapes[v], sizes))
    return MemoryBound(full, sharded, 0, math.prod(sizes.values()))


def check_budget(graph: OpGraph, sizes: Mapping[str, int], budget: float) -> MemoryBound:
    """Raises ``SearchError`` when ``budget`` is below ``memory_bound``: the message gives
    the smallest figure reachable per dimension (sharding; remat and stages)."""
    bound = memory_bound(graph, sizes)
    if budget < bound.lower_bound:
        mib = 2**20
        raise SearchError(
            f"no plan fits memory_budget={budget:.0f} bytes per device: the smallest "
            f"per-device memory any plan can reach is at least {bound.lower_bound} B "
            f"({bound.lower_bound / mib:.2f} MiB), from a lower bound (nothing was searched "
            f"or compiled). The arguments and outputs take {bound.replicated} B "
            f"({bound.replicated / mib:.2f} MiB) per device unsharded and {bound.sharded} B "
            f"split as finely as their dimensions allow over all {bound.devices} devices "
            "(sharding: ZeRO-3 / tensor splits); full rematerialisation and pipeline stages "
            "can only bring the activations towards 0 B on top of that. Raise the budget to "
            f"at least {bound.lower_bound} B, or use a larger mesh."
        )
    return bound
