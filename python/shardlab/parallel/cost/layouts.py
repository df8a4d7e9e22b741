"""Layouts as per-dimension mesh axes, and what it costs to move a tensor between two.

A layout here is ``DimAxes``: per dimension, the mesh axes it is split over (major first), the
form ``PartitionSpec`` uses. ``reshard`` lists the collectives XLA's SPMD partitioner emits to
go from one layout to another: axes that disappear are all-gathered, axes that move to another
dimension are exchanged with an all-to-all, axes that appear cost nothing (a local slice).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

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


Step = tuple[str, int, int, tuple[str, ...]]


def _count(axes: Sequence[str], sizes: Mapping[str, int]) -> int:
    return math.prod(sizes[a] for a in axes)


def _minor(axes: Sequence[str], factor: int, sizes: Mapping[str, int]) -> tuple[str, ...]:
    """The minor axes of a dimension's ``axes`` that cover ``factor`` pieces (what a
    collective over that factor of the dimension's tiles spans, as the HLO names it)."""
    out: list[str] = []
    for a in reversed(axes):
        if factor <= 1:
            break
        out.insert(0, a)
        factor //= min(factor, sizes[a])
    return tuple(out)


def _gathers(
    src: DimAxes, counts: Sequence[int], shard: int, sizes, dst: DimAxes | None = None
) -> list[Step]:
    """All-gathers dimension by dimension, the last dimension first (as the SPMD
    partitioner gathers a tiled tensor: one all-gather per tiled dimension), each by the
    factor ``counts[d]`` and the shard growing with every one."""
    out: list[Step] = []
    for d in reversed(range(len(src))):
        factor = counts[d]
        if factor <= 1:
            continue
        shard *= factor
        gone = tuple(a for a in src[d] if dst is None or a not in dst[d])
        axes = gone if _count(gone, sizes) == factor else _minor(src[d], factor, sizes)
        out.append(("all-gather", shard, factor, axes))
    return out


def _axes_of(*layouts: DimAxes) -> tuple[str, ...]:
    return tuple(dict.fromkeys(a for lay in layouts for axes in lay for a in axes))


def _extends(dst: DimAxes, src: DimAxes) -> bool:
    """Every dimension of ``dst`` keeps ``src``'s axes as its major part (a local slice
    of the source tiles lands on the devices that hold them)."""
    return all(tuple(t[: len(s)]) == tuple(s) for s, t in zip(src, dst, strict=True))


def _swap_in_place(
    src: DimAxes, dst: DimAxes, moves: Sequence[int], sizes: Mapping[str, int]
) -> bool:
    """Whether all-to-alls (after local slices) leave the tiles on the devices ``dst``
    wants, so that no collective-permute follows: each dimension of ``dst`` is the part of
    ``src`` that stays (its major axes), then axes new to the tensor (sliced out of its
    replicas), then the axes that move in from other dimensions (in their source order);
    the axes leaving a dimension are exactly its ``moves[d]`` tiles that the all-to-all
    exchanges (a mesh axis is not split: the partitioner would exchange part of it)."""
    moved_from: dict[str, int] = {}
    for d, (s, t) in enumerate(zip(src, dst, strict=True)):
        keep = 0
        while keep < len(s) and keep < len(t) and s[keep] == t[keep]:
            keep += 1
        if _count(s[keep:], sizes) != moves[d] or any(a in t for a in s[keep:]):
            return False  # an axis changes position within its own dimension
        for a in s[keep:]:
            moved_from[a] = d
    src_axes = {a for axes in src for a in axes}
    for s, t in zip(src, dst, strict=True):
        keep = 0
        while keep < len(s) and keep < len(t) and s[keep] == t[keep]:
            keep += 1
        rest = t[keep:]
        kinds = [0 if a not in src_axes else 1 for a in rest]
        if kinds != sorted(kinds):
            return False  # an axis sliced out of the replicas after a moved one
        moved = [a for a in rest if a in src_axes]
        for a, b in itertools.pairwise(moved):
            if moved_from[a] == moved_from[b] and src[moved_from[a]].index(a) > src[
                moved_from[b]
            ].index(b):
                return False
    return True


def reshard(src: DimAxes, dst: DimAxes, nbytes: int, sizes: Mapping[str, int]) -> list[Step]:
    """Collectives to move a tensor from layout ``src`` to ``dst``.

    As XLA's SPMD partitioner does (``PartitionedHlo::Reshard``), by tile counts per
    dimension, device order aside: when ``dst`` only refines ``src`` (every dimension's
    tile count a multiple of the source's), a local slice, then a collective-permute of
    the target shard unless the slices already sit on the right devices; when it only
    coarsens, a collective-permute of the source shard unless ``dst`` keeps ``src``'s major
    axes, then one all-gather per dimension; tiles moving between dimensions go by
    all-to-all, of the target shard when the target is fully tiled (replicas are sliced
    first), with a collective-permute when the moved tiles do not land in place; a
    replicated target is gathered per dimension. Mixed cases into a partially replicated
    target gather the axes that leave, then exchange the moved ones; an axis that leaves a
    dimension it shares with another that does not stay rematerialises the whole tensor
    ("involuntary full rematerialization"). Measured on XLA:CPU, jax 0.10, every pair of
    layouts of a matrix on 2×4 and 4×2 meshes (``tests/parallel/test_comm_partitioner.py``).

    Returns:
        ``(kind, result_bytes_per_device, group_size, axes)`` per collective.
    """
    if src == dst:
        return []
    cs = [_count(a, sizes) for a in src]
    ct = [_count(a, sizes) for a in dst]
    n_src, n_dst = math.prod(cs), math.prod(ct)
    if n_src == 1:
        return []  # a local slice
    shard_src, shard_dst = nbytes // n_src, nbytes // n_dst
    permute_axes = _axes_of(src, dst)
    if n_dst == 1:
        return _gathers(src, cs, shard_src, sizes)
    if all(t % s == 0 for s, t in zip(cs, ct, strict=True)):
        if _extends(dst, src):
            return []
        return [("collective-permute", shard_dst, 2, permute_axes)]
    if all(s % t == 0 for s, t in zip(cs, ct, strict=True)):
        out: list[Step] = []
        if not _extends(src, dst):
            out.append(("collective-permute", shard_src, 2, permute_axes))
        factors = [s // t for s, t in zip(cs, ct, strict=True)]
        return out + _gathers(src, factors, shard_src, sizes, dst)
    devices = math.prod(sizes.values())
    if n_dst == devices or (n_src == n_dst and sorted(cs) == sorted(ct)):
        # Tiles move between dimensions: all-to-all per dimension that loses tiles (after
        # slicing the replicas for a fully tiled target), then a permute if out of place.
        moves = [s // math.gcd(s, t) for s, t in zip(cs, ct, strict=True)]
        gains = [t // math.gcd(s, t) for s, t in zip(cs, ct, strict=True)]
        whole = _whole_move(src, dst)
        if whole is not None:
            # The axes leaving one dimension all land whole on an earlier one: the
            # partitioner exchanges them as they are, not by tile counts.
            i, j = whole
            moves = [1] * len(src)
            moves[i] = _count(_leaving(src[i], dst[i]), sizes)
            gains = [ct[j] // cs[j] if d == j else 1 for d in range(len(src))]
        # One dimension that receives exactly the moved tiles: the exchange runs first,
        # on the source shard, and the replicas are sliced after it; otherwise the
        # replicas are sliced first and the exchange runs on the target shard.
        single = sum(k > 1 for k in moves) == 1
        first = single and math.prod(moves) in gains
        size = shard_src if first else shard_dst
        out = [
            ("all-to-all", size, k, _minor(src[d], k, sizes)) for d, k in enumerate(moves) if k > 1
        ]
        if not _swap_in_place(src, dst, moves, sizes):
            out.append(("collective-permute", shard_dst, 2, permute_axes))
        return out
    return _by_axes(src, dst, nbytes, sizes)


def _leaving(s: Sequence[str], t: Sequence[str]) -> tuple[str, ...]:
    """The axes of a source dimension after the major part the target keeps."""
    keep = 0
    while keep < len(s) and keep < len(t) and s[keep] == t[keep]:
        keep += 1
    return tuple(s[keep:])


def _whole_move(src: DimAxes, dst: DimAxes) -> tuple[int, int] | None:
    """``(i, j)`` when only dimension ``i`` loses axes and they all appear, in order, in
    one earlier dimension ``j`` of the target (measured: such a move is exchanged whole;
    into a later dimension the partitioner goes by tile counts)."""
    leaving = [_leaving(s, t) for s, t in zip(src, dst, strict=True)]
    dims = [d for d, a in enumerate(leaving) if a]
    if len(dims) != 1:
        return None
    i = dims[0]
    for j, t in enumerate(dst):
        if j < i and _leaving(t, src[j])[-len(leaving[i]) :] == leaving[i]:
            return i, j
    return None


def _by_axes(src: DimAxes, dst: DimAxes, nbytes: int, sizes: Mapping[str, int]) -> list[Step]:
    """Axes that leave are gathered, then axes that change dimension are exchanged."""
    where_dst = {a: (d, i) for d, axes in enumerate(dst) for i, a in enumerate(axes)}
    stay: set[str] = set()
    for d, axes in enumerate(src):
        for i, a in enumerate(axes):
            if where_dst.get(a) == (d, i) and all(x in stay for x in axes[:i]):
                stay.add(a)
    src_axes = [a for axes in src for a in axes]
    moved = [a for a in src_axes if a not in stay and a in where_dst]
    gathered = tuple(a for a in src_axes if a not in stay and a not in where_dst)
    if any(
        a in moved and any(b not in stay and b != a for b in axes) for axes in src for a in axes
    ):
        # An axis moves out of a dimension it shares with another axis that does not stay:
        # XLA's SPMD partitioner does not split that into gathers and an all-to-all; it
        # rematerialises the whole tensor ("involuntary full rematerialization") and slices
        # the target out (measured on XLA:CPU, jax 0.10).
        return _gathers(
            src, [_count(a, sizes) for a in src], nbytes // _count(src_axes, sizes), sizes
        )
    out: list[Step] = []
    kept = _count([a for a in src_axes if a not in gathered], sizes)
    shard = nbytes // kept
    if gathered:
        out.append(("all-gather", shard, _count(gathered, sizes), gathered))
    for a in moved:
        out.append(("all-to-all", shard, sizes[a], (a,)))
    return out


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def slice_halos(size: int, shards: int, start: int, length: int) -> list[int] | None:
    """The collective-permutes (their widths along the dimension, one per permute) XLA's
    SPMD partitioner emits to slice ``[start, start + length)`` out of a dimension of
    ``size`` split evenly in ``shards``, the result split the same way: each shard's piece
    of the slice is fetched from the shards holding it by a halo exchange
    (``ReshardAsWindowedInput``: ``ExchangeHalo`` when every halo comes from the
    neighbours, ``ExchangeHaloCompact`` for far ones). ``None`` when the partitioner
    replicates the dimension instead (an all-gather), or for uneven splits, which it pads.

    Measured against the compiled program: a fused qkv split three ways over 2, 4, 8
    shards is 2, 7, 9 permutes (``tests/parallel/test_comm_partitioner.py``)."""
    if shards <= 1 or size % shards or length % shards or length <= 0:
        return None
    w, o = size // shards, length // shards
    left = [i * w - start - i * o for i in range(shards)]
    right = [start + (i + 1) * o - (i + 1) * w for i in range(shards)]
    if max(max(left), max(right)) > 2 * o:
        return None if 2 * o >= shards * w else _compact_halos(w, shards, start, o)
    max_left = max(left[1:])
    max_right = max(right[:-1])
    if max_left + max_right + w >= w * shards and (max_left > w or max_right > w):
        return None
    left_bound, right_bound = -max(left), w + max(right)
    if left_bound >= right_bound:
        return None
    out: list[int] = []
    i = _ceil(max_left, w) - 1
    while i >= 0 and (-i - 1) * w < right_bound:
        out.append(min(max_left - w * i, w) - max(-i * w - right_bound, 0))
        i -= 1
    skipped = min(max(left_bound - w, 0), max(max_right, 0)) // w
    for i in range(skipped, _ceil(max_right, w)):
        out.append(min(max_right - w * i, w) - max(left_bound - (i + 1) * w, 0))
    return [h for h in out if h > 0]


def _compact_halos(w: int, shards: int, start: int, o: int) -> list[int]:
    """``ExchangeHaloCompact``: each shard's window cut at source-shard boundaries, then
    permutes built greedily, one source-target pair per source and target each, merging
    the pieces' ranges within the source shard."""
    pending: list[list[tuple[int, int, int, int]]] = [[] for _ in range(shards)]
    pieces = []
    for i in range(shards):
        at, limit, mine = start + i * o, start + (i + 1) * o, []
        while at < limit:
            lo = at % w
            n = min(w - lo, limit - at)
            mine.append((at // w, i, lo, lo + n, at - (start + i * o)))
            at += n
        pieces.append(mine)
    for k in range(max(len(p) for p in pieces)):
        for i in range(shards):
            if k < len(pieces[i]):
                src, dst, lo, hi, offset = pieces[i][k]
                if src != dst:
                    pending[src].append((offset, dst, lo, hi))
    for queue in pending:
        queue.sort(key=lambda p: p[0])  # stable: by offset in the window
    nxt = [0] * shards
    widths: list[int] = []
    while True:
        seen: set[int] = set()
        lo_all, hi_all, pairs = w, 0, 0
        for src in range(shards):
            if nxt[src] >= len(pending[src]):
                continue
            _, dst, lo, hi = pending[src][nxt[src]]
            if pairs and (
                dst in seen
                or (lo_all > hi and hi_all == w and lo == 0)
                or (hi_all < lo and lo_all == 0 and hi == w)
            ):
                continue
            seen.add(dst)
            pairs += 1
            lo_all, hi_all = min(lo_all, lo), max(hi_all, hi)
            nxt[src] += 1
        if not pairs:
            return widths
        widths.append(hi_all - lo_all)


def convolution_features(
    node: Any,
    shapes: Any,
    ins: Sequence[DimAxes],
    outs: Sequence[DimAxes],
    sizes: Mapping[str, int],
) -> tuple[int, int] | None:
    """A convolution's per-device input and output features (its operand and result laid
    out as ``ins``/``outs``), which set how fast it runs
    (``DeviceProfile.convolution_factor``); None for any other op."""
    if node.primitive != "conv_general_dilated":
        return None
    numbers = node.params.get("dimension_numbers")
    if numbers is None:
        return None
    lhs, out = node.inputs[0], node.outputs[0]

    def local(shape: Any, dims: DimAxes, d: int) -> int:
        return int(shape[d]) // max(1, _count(dims[d], sizes) if d < len(dims) else 1)

    return (
        local(shapes[lhs], ins[0], numbers.lhs_spec[1]),
        local(shapes[out], outs[0], numbers.out_spec[1]),
    )


def matmul_dims(
    node: Any,
    shapes: Any,
    ins: Sequence[DimAxes],
    sizes: Mapping[str, int],
) -> tuple[int, int, int, int] | None:
    """A ``dot_general``'s per-device ``(batch, m, n, k)`` (its operands laid out as
    ``ins``): the batch dimensions, the left operand's free dimensions, the right one's,
    and the contracting dimensions, each the product of their local sizes. They set how
    fast it runs on an accelerator (``DeviceProfile.op_time``); None for any other op."""
    if node.primitive != "dot_general" or len(node.inputs) != 2 or len(ins) < 2:
        return None
    numbers = node.params.get("dimension_numbers")
    if numbers is None:
        return None
    (lc, rc), (lb, rb) = numbers
    lhs, rhs = shapes[node.inputs[0]], shapes[node.inputs[1]]

    def local(shape: Any, dims: DimAxes, d: int) -> int:
        return max(1, int(shape[d]) // max(1, _count(dims[d], sizes) if d < len(dims) else 1))

    def product(shape: Any, dims: DimAxes, which: Any) -> int:
        return math.prod(local(shape, dims, d) for d in which)

    batch = product(lhs, ins[0], lb)
    contracting = product(lhs, ins[0], lc)
    m = product(lhs, ins[0], [d for d in range(len(lhs)) if d not in set(lc) | set(lb)])
    n = product(rhs, ins[1], [d for d in range(len(rhs)) if d not in set(rc) | set(rb)])
    return batch, m, n, contracting
