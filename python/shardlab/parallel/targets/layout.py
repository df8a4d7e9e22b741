"""A mesh laid over a target as people lay meshes on real clusters.

The last (fastest-varying) axes stay inside a host's NVLink domain or a TPU slice's ICI; what
does not fit goes across hosts (InfiniBand) or slices (the data-centre network), outermost
axes first. Each axis of size ``s`` is split into an inner part ``gcd(s, room left in the
granule)``, taken from the innermost axis outwards, and an outer part, the rest — the
``ici_parallelism`` / ``dcn_parallelism`` split MaxText asks its users for, derived here from
the axis order. The devices are then placed by JAX's own ``mesh_utils``:
``create_hybrid_device_mesh`` across granules (hosts for GPUs, slices for TPUs) and, inside
a TPU slice, ``create_device_mesh``, which follows the physical torus.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["Split", "granules", "place", "split_axes"]


@dataclasses.dataclass(frozen=True)
class Split:
    """How each mesh axis divides between the inside and the outside of a granule.

    Attributes:
        inner: per axis, the devices it spans inside one host (GPU) or slice (TPU).
        outer: per axis, the hosts or slices it spans.
    """

    inner: tuple[int, ...]
    outer: tuple[int, ...]

    def crossing(self, names: Sequence[str]) -> tuple[str, ...]:
        """The axes whose groups reach into another host or slice."""
        return tuple(n for n, o in zip(names, self.outer, strict=True) if o > 1)


def granules(devices: Sequence[Any], platform: str) -> tuple[str, int]:
    """The unit of the slower network and how many there are: ``("host", 8)`` for GPUs
    (a host is a process), ``("slice", 2)`` for TPU slices (``slice_index``)."""
    if platform == "tpu":
        slices = {getattr(d, "slice_index", 0) or 0 for d in devices}
        return "slice", len(slices)
    return "host", len({d.process_index for d in devices})


def split_axes(shape: Sequence[int], granule_size: int, count: int) -> Split:
    """Fill each granule from the innermost axis outwards (see the module docstring)."""
    room = granule_size
    inner: list[int] = []
    for size in reversed(shape):
        part = math.gcd(size, room)
        inner.append(part)
        room //= part
    inner.reverse()
    outer = tuple(s // i for s, i in zip(shape, inner, strict=True))
    if room != 1 or math.prod(outer) != count:  # pragma: no cover - prod(shape) is checked
        raise ValueError(f"cannot split {tuple(shape)} over {count} × {granule_size} devices")
    return Split(tuple(inner), outer)


def place(shape: Sequence[int], devices: Sequence[Any], platform: str) -> tuple[np.ndarray, Split]:
    """The device grid of a mesh of ``shape`` over the target's ``devices``."""
    from jax.experimental import mesh_utils

    unit, count = granules(devices, platform)
    split = split_axes(shape, len(devices) // count, count)
    if count > 1:
        grid = mesh_utils.create_hybrid_device_mesh(
            split.inner,
            split.outer,
            devices=list(devices),
            process_is_granule=unit == "host",
            allow_split_physical_axes=True,
        )
        return np.asarray(grid).reshape(tuple(shape)), split
    for kwargs in ({}, {"allow_split_physical_axes": True}):
        try:
            grid = mesh_utils.create_device_mesh(tuple(shape), list(devices), **kwargs)
            return np.asarray(grid), split
        except (ValueError, NotImplementedError, AssertionError):
            continue
    grid = np.empty(len(devices), dtype=object)  # a shape the torus rules do not cover
    grid[:] = list(devices)
    return grid.reshape(tuple(shape)), split
