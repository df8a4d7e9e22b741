"""Layouts as per-dimension mesh axes, and what it costs to move a tensor between two.

A layout here is ``DimAxes``: per dimension, the mesh axes it is split over (major first), the
form ``PartitionSpec`` uses. ``reshard`` lists the collectives XLA's SPMD partitioner emits to
go from one layout to another: axes that disappear are all-gathered, axes that move to another
dimension are exchanged with an all-to-all, axes that appear cost nothing (a local slice).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from jax.sharding import NamedSharding, PartitionSpec

from shardlab.parallel.specs import spec_entries

DimAxes = tuple[tuple[str, ...], ...]


def replicated(rank: int) -> DimAxes:
    """The fully replicated layout of a rank-``rank`` tensor."""
    return tuple(() for _ in range(rank))


def from_spec(spec: PartitionSpec | NamedSharding | None, rank: int) -> DimAxes:
    """``DimAxes`` of a spec (``None`` = replicated), padded to ``rank``."""
    if spec is None:
        return replicated(rank)
    if isinstance(spec, NamedSharding):
        spec = spec.spec
    entries = spec_entries(spec)[:rank]
    return tuple(entries) + replicated(rank - len(entries))


def shard_count(dims: DimAxes, sizes: Mapping[str, int]) -> int:
    """Into how many pieces a layout splits its tensor."""
    return math.prod(sizes[a] for axes in dims for a in axes)


def local_bytes(nbytes: int, dims: DimAxes, sizes: Mapping[str, int]) -> int:
    """Per-device bytes of a tensor of ``nbytes`` global bytes laid out as ``dims``."""
    return nbytes // shard_count(dims, sizes)


def to_factors(
    dims: DimAxes,
    dim_factors: Sequence[tuple[int, ...]],
    factor_sizes: Sequence[int],
    sizes: Mapping[str, int],
) -> dict[int, tuple[str, ...]]:
    """Which axes each factor gets from a layout (a dim's axes fill its factors major first)."""
    out: dict[int, tuple[str, ...]] = {}
    for axes, factors in zip(dims, dim_factors, strict=False):
        if not axes or not factors:
            continue
        remaining = list(axes)
        for factor in factors:
            taken: list[str] = []
            room = factor_sizes[factor]
            while remaining and room % sizes[remaining[0]] == 0 and room > 1:
                room //= sizes[remaining[0]]
                taken.append(remaining.pop(0))
            if taken:
                out[factor] = tuple(taken)
            if room != 1:  # factor not fully split: minor factors cannot be split
                break
    return out


def from_factors(
    dim_factors: Sequence[tuple[int, ...]],
    factor_axes: Mapping[int, tuple[str, ...]],
    factor_sizes: Sequence[int],
    sizes: Mapping[str, int],
) -> DimAxes:
    """Project factor axes onto a tensor's dimensions (the inverse of ``to_factors``)."""
    out = []
    for factors in dim_factors:
        axes: list[str] = []
        for factor in factors:
            got = factor_axes.get(factor, ())
            axes.extend(got)
            if math.prod(sizes[a] for a in got) != factor_sizes[factor]:
                break  # a minor factor's axes would not form contiguous blocks
        out.append(tuple(axes))
    return tuple(out)


def reshard(
    src: DimAxes, dst: DimAxes, nbytes: int, sizes: Mapping[str, int]
) -> list[tuple[str, int, int, tuple[str, ...]]]:
    """Collectives to move a tensor from layout ``src`` to ``dst``.

    Returns:
        ``(kind, result_bytes_per_device, group_size, axes)`` per collective.
    """
    if src == dst:
        return []
    where_dst = {a: (d, i) for d, axes in enumerate(dst) for i, a in enumerate(axes)}
    stay: set[str] = set()
    for d, axes in enumerate(src):
        for i, a in enumerate(axes):
            if where_dst.get(a) == (d, i) and all(x in stay for x in axes[:i]):
                stay.add(a)
    src_axes = [a for axes in src for a in axes]
    moved = [a for a in src_axes if a not in stay and a in where_dst]
    gathered = tuple(a for a in src_axes if a not in stay and a not in where_dst)
    out: list[tuple[str, int, int, tuple[str, ...]]] = []
    shard = nbytes // math.prod(sizes[a] for a in src_axes) if src_axes else nbytes
    if any(
        any(a in moved for a in axes) and any(b not in stay and b != a for b in axes)
        for axes in src
    ):
        # An axis moves out of a dimension it shares with another axis that does not stay:
        # XLA's SPMD partitioner does not split that into gathers and an all-to-all; it
        # rematerialises the whole tensor ("involuntary full rematerialization") and slices
        # the target out (measured on XLA:CPU, jax 0.10).
        return [("all-gather", nbytes, math.prod(sizes[a] for a in src_axes), tuple(src_axes))]
    for a in moved:
        out.append(("all-to-all", shard, sizes[a], (a,)))
    if gathered:
        kept = math.prod(sizes[a] for a in src_axes if a not in gathered)
        out.append(("all-gather", nbytes // kept, math.prod(sizes[a] for a in gathered), gathered))
    return out
