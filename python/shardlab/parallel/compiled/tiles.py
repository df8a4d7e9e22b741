"""Tile maps: which device holds which slice of an array, as a record (no array needed).

Asks JAX: ``NamedSharding(mesh, spec).devices_indices_map(shape)`` and ``shard_shape`` give
the slices; we only group devices that hold the same tile and name the mesh axes a tile is
replicated over. Views draw a ``TileMap``, so they can show a layout that does not exist yet.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from shardlab.parallel.mesh import mesh_shape_of
from shardlab.parallel.records import _Record
from shardlab.parallel.specs import check_spec, spec_entries


@dataclasses.dataclass(frozen=True)
class Tile(_Record):
    """One distinct slice of the array and the devices that hold a copy of it."""

    index: tuple[tuple[int, int], ...]  # (start, stop) per dimension
    devices: tuple[int, ...]  # device ids
    mesh_coords: tuple[tuple[int, ...], ...]  # per device, its coordinates on the mesh


@dataclasses.dataclass(frozen=True)
class TileMap(_Record):
    """How an array of ``shape`` is laid out on a mesh.

    Attributes:
        shape: global shape.
        dtype: dtype name.
        itemsize: bytes per element.
        spec: the PartitionSpec as text, e.g. ``P('data', None)``.
        dim_axes: per dimension, the mesh axes it is split over.
        mesh_axes: mesh axis names and sizes, in mesh order.
        replicated_axes: mesh axes the array is not split over (each tile is copied along them).
        shard_shape: the shape every device holds.
        tiles: the distinct tiles, in index order.
        placement: for a mesh over a ``shardlab.target``: the target and where each axis
            runs (``64 × H100 SXM: data across 8 hosts; model within a host (NVLink …)``);
            "" otherwise.
    """

    shape: tuple[int, ...]
    dtype: str
    itemsize: int
    spec: str
    dim_axes: tuple[tuple[str, ...], ...]
    mesh_axes: tuple[tuple[str, int], ...]
    replicated_axes: tuple[str, ...]
    shard_shape: tuple[int, ...]
    tiles: tuple[Tile, ...]
    placement: str = ""

    @property
    def shard_bytes(self) -> int:
        return math.prod(self.shard_shape) * self.itemsize

    @property
    def total_bytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    @property
    def num_devices(self) -> int:
        return math.prod(size for _, size in self.mesh_axes)


def _mesh_coords(mesh: Mesh) -> dict[int, tuple[int, ...]]:
    ids = np.vectorize(lambda d: d.id)(mesh.devices)
    return {int(ids[idx]): tuple(int(i) for i in idx) for idx in np.ndindex(ids.shape)}


def tile_map(
    shape: Sequence[int],
    spec: PartitionSpec | None,
    mesh: Mesh,
    *,
    dtype: Any = "float32",
    where: str = "array",
) -> TileMap:
    """The tile map of an array of ``shape`` laid out with ``spec`` on ``mesh``.

    Raises:
        ShardingSpecError: the spec does not fit the shape or the mesh; the message names the
            dimension, the sizes and the nearest valid spec.
    """
    shape = tuple(int(s) for s in shape)
    spec = spec if spec is not None else PartitionSpec()
    check_spec(spec, shape, mesh, where=where)
    sharding = NamedSharding(mesh, spec)
    coords = _mesh_coords(mesh)
    by_index: dict[tuple[tuple[int, int], ...], list[int]] = {}
    for device, index in sharding.devices_indices_map(shape).items():
        key = tuple(
            (0 if s.start is None else int(s.start), size if s.stop is None else int(s.stop))
            for s, size in zip(index, shape, strict=True)
        )
        by_index.setdefault(key, []).append(device.id)
    tiles = tuple(
        Tile(index, tuple(sorted(ids)), tuple(coords[i] for i in sorted(ids)))
        for index, ids in sorted(by_index.items())
    )
    entries = spec_entries(spec)
    entries = entries + [()] * (len(shape) - len(entries))
    used = {a for axes in entries for a in axes}
    axes = tuple((str(name), int(size)) for name, size in mesh_shape_of(mesh).items())
    np_dtype = np.dtype(dtype)
    return TileMap(
        shape=shape,
        dtype=np_dtype.name,
        itemsize=int(np_dtype.itemsize),
        spec=str(spec),
        dim_axes=tuple(tuple(a) for a in entries),
        mesh_axes=axes,
        replicated_axes=tuple(name for name, _ in axes if name not in used),
        shard_shape=tuple(sharding.shard_shape(shape)),
        tiles=tiles,
        placement=_placement(mesh),
    )


def _placement(mesh: Any) -> str:
    """Where a target mesh's axes run, for people; "" for this process's devices."""
    from shardlab.parallel.targets.target import placement_note

    return placement_note(mesh)


def tile_map_of(array: jax.Array) -> TileMap:
    """The tile map of a live array (a ``NamedSharding``; other shardings as one device)."""
    sharding = array.sharding
    if isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh):
        return tile_map(array.shape, sharding.spec, sharding.mesh, dtype=array.dtype)
    devices = sorted(sharding.device_set, key=lambda d: d.id)
    mesh = Mesh(np.array(devices[:1]), ("device",))
    return tile_map(array.shape, PartitionSpec(), mesh, dtype=array.dtype)
