"""Per-process data: each process reads only the slice of a global array its devices hold.

The pitfall this answers: every process of a multi-process job loads the whole dataset and
then keeps its part. :func:`shard` asks the sharding which part of the global array this
process's devices hold (``addressable_devices_indices_map``), reads that one block, and builds
the global ``jax.Array`` from it with ``jax.make_array_from_process_local_data``. In one process
it reads everything, once; on 2 processes with a batch split over the mesh, each reads half.

Example (on every process, e.g. in a ``%%spmd`` cell)::

    mesh = shardlab.mesh(data=2, model=4)
    tokens = np.load("tokens.npy", mmap_mode="r")  # nothing read yet
    batch = shardlab.data.shard(tokens, mesh, P("data"))  # each process reads its rows
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Index = tuple[slice, ...]


def process_slice(
    mesh: Any, spec: Any, shape: Sequence[int], *, process_index: int | None = None
) -> Index:
    """The block of a ``shape`` array laid out as ``spec`` on ``mesh`` that one process holds.

    Args:
        mesh: a ``jax.sharding.Mesh`` (its devices may span processes).
        spec: a ``PartitionSpec``.
        shape: the global shape.
        process_index: which process (default: this one).

    Returns:
        One slice per dimension, with explicit start and stop.

    Raises:
        ValueError: the process's devices do not hold one rectangular block (a mesh whose
            devices are ordered across processes in a way that interleaves their shards);
            the message names the blocks.
    """
    import jax
    from jax.sharding import NamedSharding

    sharding = NamedSharding(mesh, spec)
    me = jax.process_index() if process_index is None else process_index
    indices = [
        _explicit(index, shape)
        for device, index in sharding.devices_indices_map(tuple(shape)).items()
        if device.process_index == me
    ]
    if not indices:
        raise ValueError(f"process {me} holds no device of the mesh {dict(mesh.shape)}")
    block = tuple(
        slice(min(ix[d].start for ix in indices), max(ix[d].stop for ix in indices))
        for d in range(len(shape))
    )
    held = {tuple((s.start, s.stop) for s in ix) for ix in indices}
    if not _covers(block, held):
        raise ValueError(
            f"process {me}'s shards of a {tuple(shape)} array laid out as {spec} are not one "
            f"block (they are {sorted(held)}); order the mesh's devices by process, e.g. "
            "shardlab.mesh(...) over jax.devices(), or give each process a contiguous part"
        )
    return block


def shard(
    load: Callable[[Index], Any] | Any,
    mesh: Any,
    spec: Any,
    *,
    shape: Sequence[int] | None = None,
    dtype: Any = None,
) -> Any:
    """A global ``jax.Array`` whose every process read only its own block.

    Args:
        load: either a function ``load(index) -> array`` called once with this process's
            block (a tuple of slices of the global array), or an array-like indexed the same
            way (``numpy.memmap``, an ``h5py``/``zarr`` dataset, a NumPy array).
        mesh: the mesh the array is laid out on (``shardlab.mesh(data=2, model=4)``).
        spec: its ``PartitionSpec``; dimensions not named are replicated, so every process
            holding a copy reads that part too (as it must).
        shape: the global shape; needed when ``load`` is a function.
        dtype: cast what was read to this dtype (default: as read).

    Returns:
        The global array, laid out as ``NamedSharding(mesh, spec)``.

    Raises:
        ValueError: no shape for a function, a read block of the wrong shape (naming the
            block and what came back), or a layout whose local shards are not one block.
    """
    import jax
    from jax.sharding import NamedSharding

    if shape is None:
        shape = getattr(load, "shape", None)
        if shape is None:
            raise ValueError(
                "shardlab.data.shard: give shape=(...) (the global shape) when load is a "
                "function; an array-like load (np.load(..., mmap_mode='r')) carries its own"
            )
    shape = tuple(int(s) for s in shape)
    block = process_slice(mesh, spec, shape)
    source: Any = load
    is_array = hasattr(source, "shape") or not callable(source)
    # pyright narrows ``source`` by callable() although it is Any: indexing is the point here
    local = source[block] if is_array else source(block)  # pyright: ignore[reportIndexIssue]
    local = np.asarray(local, dtype=dtype)
    want = tuple(s.stop - s.start for s in block)
    if local.shape != want:
        raise ValueError(
            f"shardlab.data.shard: load({_text(block)}) returned shape {local.shape}; this "
            f"process's block of the {shape} array is {want}"
        )
    sharding = NamedSharding(mesh, spec)
    return jax.make_array_from_process_local_data(sharding, local, shape)


def _explicit(index: tuple[slice, ...], shape: Sequence[int]) -> tuple[slice, ...]:
    return tuple(
        slice(*s.indices(n)[:2]) if isinstance(s, slice) else slice(s, s + 1)
        for s, n in zip(index, shape, strict=True)
    )


def _covers(block: Index, held: set[tuple[tuple[int, int], ...]]) -> bool:
    """Whether the shards ``held`` tile ``block`` (per dimension, their bounds partition it)."""
    per_dimension = [sorted({h[d] for h in held}) for d in range(len(block))]
    if len(held) != math.prod(len(b) for b in per_dimension):
        return False
    for whole, bounds in zip(block, per_dimension, strict=True):
        position = whole.start
        for start, stop in bounds:
            if start != position:
                return False
            position = stop
        if position != whole.stop:
            return False
    return True


def _text(block: Index) -> str:
    return "(" + ", ".join(f"{s.start}:{s.stop}" for s in block) + ")"


__all__ = ["process_slice", "shard"]
