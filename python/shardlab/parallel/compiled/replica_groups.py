"""Device groups of an HLO collective, in the three forms XLA prints.

``replica_groups`` as explicit lists (``{{0,1},{2,3}}``), as an iota
(``[2,4]<=[4,2]T(1,0)``) or in Shardy's mesh form (``mesh['axis_0'=2,'axis_1'=4] {'axis_1'}``
with an optional ``device_ids=``), and a collective-permute's ``source_target_pairs``. Group
members are logical partition indices (positions in ``mesh.devices.flat``).
"""

from __future__ import annotations

import math
import re

import numpy as np

__all__ = ["parse_replica_groups"]

_EXPLICIT_RE = re.compile(r"replica_groups=\{((?:\{[\d,\s]*\},?\s*)*)\}")
_IOTA_RE = re.compile(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_MESH_RE = re.compile(
    r"replica_groups=mesh\[([^\]]*)\]"
    r"(?:,?\s*device_ids=\((\[[\d,]+\](?:<=\[[\d,]+\])?(?:T\([\d,]+\))?|[\d,\s]*)\))?"
    r"\s*\{([^}]*)\}"
)
_PAIRS_RE = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")


def _iota(dims: list[int], reshape: list[int], perm: list[int] | None) -> np.ndarray:
    ids = np.arange(math.prod(reshape)).reshape(reshape)
    if perm:
        ids = ids.transpose(perm)
    return ids.reshape(dims)


def _ints(text: str) -> list[int]:
    return [int(t) for t in re.findall(r"\d+", text)]


def parse_replica_groups(rest: str, num_partitions: int) -> list[list[int]] | None:
    """Device groups of one instruction's attribute text, or None when it names none."""
    m = _EXPLICIT_RE.search(rest)
    if m:
        groups = [_ints(g) for g in re.findall(r"\{([\d,\s]*)\}", m.group(1))]
        groups = [g for g in groups if g]
        return groups or [list(range(num_partitions))]
    m = _IOTA_RE.search(rest)
    if m:
        dims, reshape = _ints(m.group(1)), _ints(m.group(2))
        perm = _ints(m.group(3)) if m.group(3) else None
        return _iota(dims, reshape, perm).tolist()
    m = _MESH_RE.search(rest)
    if m:
        return _mesh_groups(m.group(1), m.group(2), m.group(3))
    m = _PAIRS_RE.search(rest)
    if m:
        return [_ints(p) for p in re.findall(r"\{(\d+,\d+)\}", m.group(1))]
    return None


def _mesh_groups(axes_text: str, device_ids: str | None, selected: str) -> list[list[int]]:
    axes = [(n, int(s)) for n, s in re.findall(r"'([^']+)'\s*=\s*(\d+)", axes_text)]
    sizes = [s for _, s in axes]
    total = math.prod(sizes)
    if device_ids and device_ids.strip().startswith("["):
        m = re.match(r"\[([\d,]+)\](?:<=\[([\d,]+)\])?(?:T\(([\d,]+)\))?", device_ids.strip())
        assert m is not None
        dims = _ints(m.group(1))
        reshape = _ints(m.group(2)) if m.group(2) else dims
        perm = _ints(m.group(3)) if m.group(3) else None
        ids = _iota([total], reshape, perm)
    elif device_ids and device_ids.strip():
        ids = np.array(_ints(device_ids))
    else:
        ids = np.arange(total)
    # Split every axis into sub-axes where a selection names one ('axis':(pre)size).
    expanded: list[tuple[str, int]] = []
    chosen: list[int] = []
    subs = {
        name: (int(pre), int(size))
        for name, pre, size in re.findall(r"'([^']+)':\((\d+)\)(\d+)", selected)
    }
    whole = {n for n in re.findall(r"'([^']+)'(?!:\()", selected)}
    for name, size in axes:
        if name in subs:
            pre, sub = subs[name]
            parts = [(f"{name}.pre", pre), (name, sub), (f"{name}.post", size // (pre * sub))]
            for part_name, part_size in parts:
                if part_name == name:
                    chosen.append(len(expanded))
                expanded.append((part_name, part_size))
        else:
            if name in whole:
                chosen.append(len(expanded))
            expanded.append((name, size))
    grid = ids.reshape([s for _, s in expanded])
    others = [i for i in range(len(expanded)) if i not in chosen]
    group_size = math.prod(expanded[i][1] for i in chosen)
    moved = np.transpose(grid, others + chosen).reshape(-1, group_size)
    return moved.tolist()
