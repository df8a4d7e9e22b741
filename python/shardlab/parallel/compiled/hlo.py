"""Read collectives out of post-partitioning HLO text.

Handles the three ``replica_groups`` forms XLA prints (explicit ``{{0,1},{2,3}}``, iota
``[2,4]<=[4,2]T(1,0)`` and Shardy's mesh form ``mesh['axis_0'=2,'axis_1'=4] {'axis_1'}`` with an
optional ``device_ids=``), ``source_target_pairs`` of collective-permutes, tuple-shaped results
(bytes summed), async ``-start``/``-done`` pairs (counted once, sized by the ``-done`` result)
and collectives inside ``while`` bodies (``count`` = the known trip count).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping

import numpy as np

from shardlab.parallel.cost.profiles import wire_bytes
from shardlab.parallel.mesh import axes_of_groups
from shardlab.parallel.records import COLLECTIVE_KINDS, Collective

DTYPE_BYTES = {
    "pred": 1,
    "s2": 1,
    "u2": 1,
    "s4": 1,
    "u4": 1,
    "s8": 1,
    "u8": 1,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "f8e4m3": 1,
    "f8e5m2fnuz": 1,
    "f8e4m3fnuz": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}

_COMP_RE = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR_RE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][a-z0-9\-]*)\((.*)$")
_ARRAY_RE = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")
_EXPLICIT_RE = re.compile(r"replica_groups=\{((?:\{[\d,\s]*\},?\s*)*)\}")
_IOTA_RE = re.compile(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_MESH_RE = re.compile(
    r"replica_groups=mesh\[([^\]]*)\]"
    r"(?:,?\s*device_ids=\((\[[\d,]+\](?:<=\[[\d,]+\])?(?:T\([\d,]+\))?|[\d,\s]*)\))?"
    r"\s*\{([^}]*)\}"
)
_PAIRS_RE = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")
_CALLS_RE = re.compile(
    r"\b(body|condition|calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)"
)
_BRANCHES_RE = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP_RE = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_OPNAME_RE = re.compile(r'op_name="([^"]*)"')
_SRC_FILE_RE = re.compile(r'source_file="([^"]*)"')
_SRC_LINE_RE = re.compile(r"source_line=(\d+)")
_FRAME_RE = re.compile(r"stack_frame_id=(\d+)")


@dataclasses.dataclass(frozen=True)
class _Instr:
    name: str
    type_text: str
    opcode: str
    rest: str
    computation: str


def shape_bytes(type_text: str) -> int:
    """Bytes of an HLO result type; tuple elements are summed, tokens count 0."""
    total = 0
    for dtype, dims in _ARRAY_RE.findall(type_text):
        if dtype not in DTYPE_BYTES:
            continue
        size = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        total += size * DTYPE_BYTES[dtype]
    return total


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


def _parse(hlo_text: str) -> tuple[list[_Instr], dict[str, int], dict[int, str], int]:
    instrs: list[_Instr] = []
    callers: dict[str, list[tuple[str, int]]] = {}
    entry = ""
    comp = ""
    files: dict[int, str] = {}
    locations: dict[int, tuple[int, int]] = {}
    frames: dict[int, int] = {}
    section = ""
    num_partitions = 1
    for line in hlo_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("HloModule"):
            m = re.search(r"num_partitions=(\d+)", stripped)
            num_partitions = int(m.group(1)) if m else 1
            continue
        if stripped in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = stripped
            continue
        if section and stripped and stripped[0].isdigit():
            key, _, value = stripped.partition(" ")
            if section == "FileNames":
                files[int(key)] = value.strip().strip('"')
            elif section == "FileLocations":
                f = re.search(r"file_name_id=(\d+)", value)
                ln = re.search(r"\bline=(\d+)", value)
                if f and ln:
                    locations[int(key)] = (int(f.group(1)), int(ln.group(1)))
            elif section == "StackFrames":
                loc = re.search(r"file_location_id=(\d+)", value)
                if loc:
                    frames[int(key)] = int(loc.group(1))
            continue
        m = _COMP_RE.match(line)
        if m and "=" not in line.split("(")[0]:
            section = ""
            comp = m.group(2)
            if m.group(1):
                entry = comp
            continue
        m = _INSTR_RE.match(line)
        if not m:
            continue
        instr = _Instr(m.group(1), m.group(2), m.group(3), m.group(4), comp)
        instrs.append(instr)
        trip = 1
        if instr.opcode == "while":
            t = _TRIP_RE.search(instr.rest)
            trip = int(t.group(1)) if t else 1
        for attr, target in _CALLS_RE.findall(instr.rest):
            callers.setdefault(target, []).append((comp, trip if attr == "body" else 1))
        b = _BRANCHES_RE.search(instr.rest)
        if b:
            for target in re.findall(r"%?([\w.\-]+)", b.group(1)):
                callers.setdefault(target, []).append((comp, 1))
    counts: dict[str, int] = {}

    def count_of(name: str, depth: int = 0) -> int:
        if name == entry or depth > 50:
            return 1
        if name not in counts:
            counts[name] = max(
                (count_of(c, depth + 1) * t for c, t in callers.get(name, [])), default=1
            )
        return counts[name]

    sources = {
        frame: f"{files.get(locations[loc][0], '?')}:{locations[loc][1]}"
        for frame, loc in frames.items()
        if loc in locations
    }
    counts_all = {i.computation: count_of(i.computation) for i in instrs}
    return instrs, counts_all, sources, num_partitions


def collectives_from_hlo(hlo_text: str, mesh_shape: Mapping[str, int]) -> tuple[Collective, ...]:
    """One ``Collective`` per collective instruction of post-partitioning HLO text.

    Args:
        hlo_text: ``compiled.as_text()``.
        mesh_shape: ``{axis: size}`` of the mesh the program was partitioned for; group
            members are positions in ``mesh.devices.flat``.
    """
    instrs, counts, sources, num_partitions = _parse(hlo_text)
    by_name = {i.name: i for i in instrs}
    out: list[Collective] = []
    for instr in instrs:
        kind, attrs_from = _kind(instr, by_name)
        if kind is None:
            continue
        groups = parse_replica_groups(attrs_from.rest, num_partitions) or [
            list(range(num_partitions))
        ]
        if kind == "collective-permute":
            group_size = 2 if groups and all(len(g) == 2 for g in groups) else 1
            groups = [g for g in groups if len(g) == 2 and g[0] != g[1]]
            if not groups:
                group_size = 1
        else:
            group_size = max(len(g) for g in groups)
        nbytes = shape_bytes(instr.type_text)
        rest = attrs_from.rest
        op_name = _OPNAME_RE.search(rest)
        out.append(
            Collective(
                kind=kind,
                bytes=nbytes,
                group_size=group_size,
                mesh_axes=axes_of_groups(mesh_shape, groups),
                wire_bytes=wire_bytes(kind, nbytes, group_size),
                op_name=op_name.group(1) if op_name else "",
                source=_source(rest, sources),
                count=counts.get(instr.computation, 1),
                hlo_name=attrs_from.name,
                shape=instr.type_text,
                operands=max(1, len(_ARRAY_RE.findall(instr.type_text))),
            )
        )
    return tuple(out)


def _kind(instr: _Instr, by_name: Mapping[str, _Instr]) -> tuple[str | None, _Instr]:
    op = instr.opcode
    if op in COLLECTIVE_KINDS:
        return op, instr
    if op.endswith("-done") and op[: -len("-done")] in COLLECTIVE_KINDS:
        operand = re.match(r"\s*%?([\w.\-]+)", instr.rest)
        start = by_name.get(operand.group(1)) if operand else None
        return op[: -len("-done")], start or instr
    return None, instr


def _source(rest: str, sources: Mapping[int, str]) -> str:
    f, ln = _SRC_FILE_RE.search(rest), _SRC_LINE_RE.search(rest)
    if f and ln:
        return f"{f.group(1)}:{ln.group(1)}"
    frame = _FRAME_RE.search(rest)
    if frame:
        return sources.get(int(frame.group(1)), "")
    return ""


def primitive_of(op_name: str) -> str:
    """The jaxpr primitive at the end of an HLO ``op_name`` (``jit(f)/jvp()/dot_general``)."""
    tail = op_name.rstrip(")").split("/")[-1]
    return tail.split(":")[-1]


__all__ = ["collectives_from_hlo", "parse_replica_groups", "shape_bytes"]
