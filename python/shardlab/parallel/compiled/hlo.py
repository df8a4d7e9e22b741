"""Read collectives out of post-partitioning HLO text (XLA:CPU, XLA:GPU and TPU).

``collectives_from_hlo`` returns one ``Collective`` per collective a device runs, with
``count`` the times it runs per call. What each compiler prints, and how it is counted:

* XLA:CPU: plain synchronous ``all-reduce``, ``all-gather``, ``reduce-scatter``,
  ``all-to-all`` and ``collective-permute`` instructions, one per collective. Several arrays
  combined into one collective print as a tuple-shaped result (bytes summed, ``operands`` = the
  number of arrays; a combined all-reduce may carry the loss scalar with the gradients).
  Sharded gradients are all-reduced in full and then sliced: CPU makes no reduce-scatter.
* XLA:GPU: async pairs ``all-reduce-start``/``all-reduce-done`` (likewise all-gather,
  reduce-scatter, all-to-all, collective-permute). The pair counts once, at the ``-done``,
  sized by the ``-done`` result (the ``-start`` result also holds the operands) and read for
  groups and metadata from the ``-start``. GPU may concatenate gradients into one flat buffer
  (``bf16[1048576]``) or combine collectives into tuple-shaped ones; bytes are what moves.
* TPU: one async collective is cloned into several fusions, its start, update and done phases
  (fusion computations rooted at ``custom-call`` ``AsyncCollectiveStart``/``AsyncCollectiveDone``
  or at a tuple), each holding a copy of the collective with the same ``channel_id``; other
  async collectives are left in the entry computation with a
  ``frontend_attributes={async_collective_name=...}``; TPU ``collective-permute-start``/
  ``-done`` pairs count as on GPU. An all-reduce whose result is dynamic-sliced, fused into
  ``fusion(...), kind=kCustom, calls=%all-reduce-scatter...``, is counted as one
  ``reduce-scatter`` sized by the fusion's result (what each device keeps; on the wire that of
  a reduce-scatter of that result), and the all-reduce inside is not counted on its own; its
  ``hlo_name`` is the fusion's. TPU may also all-reduce a sharded gradient in full and slice
  it (seen on 64 chips): that is read as the all-reduce it is. Layouts such as
  ``{1,0:T(8,128)(2,1)S(1)}`` are ignored when sizing shapes.

Channel rule (holds on all three): instructions of one kind and one ``channel_id`` of which at
least one lies inside a fusion computation are clones of one collective and count once (the
first in the text stands for them, with its shape and groups). Outside fusions every
instruction counts, even where two share a kind and a channel: on XLA:CPU and XLA:GPU each
collective has its own channel within its kind, and none is cloned into fusions; numbers are
not unique across kinds (a collective-permute and an all-to-all may both be ``channel_id=1``,
and so may a TPU all-gather and an all-reduce), so kinds are never merged.

Loops: a collective inside a ``while`` body runs ``count`` = the loop's trip count times
(times that of enclosing loops): the ``known_trip_count`` of the while's backend_config when
printed (CPU, GPU), else inferred from the loop (TPU prints none, e.g. for the
``windowed_dot_general_body_ag``/``_rs`` loops of a windowed einsum, whose bidirectional
collective-permutes run once per trip, or for a ``fori_loop``): the condition compares a tuple
element against a constant (or a loop-invariant element that starts as one), the body adds or
subtracts a constant, and the while's initial tuple holds its start value (through copies,
converts, bitcasts and fusion parameters); ``LT``, ``LE``, ``GT``, ``GE`` and ``NE`` compares.
A loop that fits none of this (or seems to run zero times) counts 1.

Groups: the three ``replica_groups`` forms XLA prints (explicit ``{{0,1},{2,3}}``, iota
``[2,4]<=[4,2]T(1,0)`` and Shardy's mesh form ``mesh['axis_0'=2,'axis_1'=4] {'axis_1'}`` with an
optional ``device_ids=``) and the ``source_target_pairs`` of collective-permutes.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping

from shardlab._core.source import is_own_file
from shardlab.parallel.compiled.replica_groups import parse_replica_groups
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
_CALLS_RE = re.compile(
    r"\b(body|condition|calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)"
)
_BRANCHES_RE = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP_RE = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CHANNEL_RE = re.compile(r"\bchannel_id=(\d+)")
_INDEX_RE = re.compile(r"\bindex=(\d+)")
_DIRECTION_RE = re.compile(r"\bdirection=([A-Z]+)")
_KIND_RE = re.compile(r"\bkind=(\w+)")
# Ops a loop's induction variable and bounds pass through unchanged.
_PASS_THROUGH = ("copy", "convert", "bitcast", "reshape", "bitcast-convert")
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


@dataclasses.dataclass
class _Module:
    instrs: list[_Instr] = dataclasses.field(default_factory=list)
    by_name: dict[str, _Instr] = dataclasses.field(default_factory=dict)
    roots: dict[str, _Instr] = dataclasses.field(default_factory=dict)
    # fusion computation -> the fusion instruction that calls it
    fusion_callers: dict[str, _Instr] = dataclasses.field(default_factory=dict)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    sources: dict[int, str] = dataclasses.field(default_factory=dict)
    entry: str = ""
    num_partitions: int = 1


def shape_bytes(type_text: str) -> int:
    """Bytes of an HLO result type; tuple elements are summed, tokens count 0."""
    total = 0
    for dtype, dims in _ARRAY_RE.findall(type_text):
        if dtype not in DTYPE_BYTES:
            continue
        size = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        total += size * DTYPE_BYTES[dtype]
    return total


def _parse(hlo_text: str) -> _Module:
    mod = _Module()
    comp = ""
    files: dict[int, str] = {}
    locations: dict[int, tuple[int, int]] = {}
    frames: dict[int, int] = {}
    section = ""
    for line in hlo_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("HloModule"):
            m = re.search(r"num_partitions=(\d+)", stripped)
            mod.num_partitions = int(m.group(1)) if m else 1
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
                mod.entry = comp
            continue
        m = _INSTR_RE.match(line)
        if not m:
            continue
        instr = _Instr(m.group(1), m.group(2), m.group(3), m.group(4), comp)
        mod.instrs.append(instr)
        mod.by_name[instr.name] = instr
        if stripped.startswith("ROOT "):
            mod.roots[comp] = instr
        if instr.opcode == "fusion":
            for target in _CALLS_RE.findall(instr.rest):
                mod.fusion_callers[target[1]] = instr
    mod.sources = {
        frame: f"{files.get(locations[loc][0], '?')}:{locations[loc][1]}"
        for frame, loc in frames.items()
        if loc in locations
    }
    callers: dict[str, list[tuple[str, int]]] = {}
    for instr in mod.instrs:
        trip = _trip_count(instr, mod) if instr.opcode == "while" else 1
        for attr, target in _CALLS_RE.findall(instr.rest):
            callers.setdefault(target, []).append(
                (instr.computation, trip if attr == "body" else 1)
            )
        b = _BRANCHES_RE.search(instr.rest)
        if b:
            for target in re.findall(r"%?([\w.\-]+)", b.group(1)):
                callers.setdefault(target, []).append((instr.computation, 1))
    counts: dict[str, int] = {}

    def count_of(name: str, depth: int = 0) -> int:
        if name == mod.entry or depth > 50:
            return 1
        if name not in counts:
            counts[name] = max(
                (count_of(c, depth + 1) * t for c, t in callers.get(name, [])), default=1
            )
        return counts[name]

    mod.counts = {i.computation: count_of(i.computation) for i in mod.instrs}
    return mod


def _operand_text(rest: str) -> str:
    """The text inside an instruction's operand parentheses (``rest`` starts after the '(')."""
    depth = 0
    for i, ch in enumerate(rest):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            if depth == 0:
                return rest[:i]
            depth -= 1
    return rest


def _operands(instr: _Instr) -> list[str]:
    return re.findall(r"%([\w.\-]+)", _operand_text(instr.rest))


def _resolve(instr: _Instr | None, mod: _Module) -> _Instr | None:
    """Follow copies, converts, bitcasts and fusion parameters back to the defining instruction."""
    for _ in range(64):
        if instr is None:
            return None
        if instr.opcode in _PASS_THROUGH:
            ops = _operands(instr)
            instr = mod.by_name.get(ops[0]) if ops else None
        elif instr.opcode == "parameter" and instr.computation in mod.fusion_callers:
            caller = mod.fusion_callers[instr.computation]
            ops = _operands(caller)
            index = int(_operand_text(instr.rest) or 0)
            instr = mod.by_name.get(ops[index]) if index < len(ops) else None
        elif instr.opcode == "fusion" and _called(instr) in mod.roots:
            instr = mod.roots[_called(instr)]
        else:
            return instr
    return None


def _called(instr: _Instr) -> str:
    m = re.search(r"\bcalls=%?([\w.\-]+)", instr.rest)
    return m.group(1) if m else ""


def _constant(instr: _Instr | None, mod: _Module) -> int | None:
    instr = _resolve(instr, mod)
    if instr is None or instr.opcode != "constant":
        return None
    try:
        return int(_operand_text(instr.rest).strip())
    except ValueError:
        return None


def _element(instr: _Instr | None, mod: _Module, param_of: str) -> int | None:
    """The tuple index when ``instr`` is ``get-tuple-element`` of ``param_of``'s parameter."""
    instr = _resolve(instr, mod)
    if instr is None or instr.opcode != "get-tuple-element":
        return None
    ops = _operands(instr)
    source = _resolve(mod.by_name.get(ops[0]), mod) if ops else None
    index = _INDEX_RE.search(instr.rest)
    if source is None or source.opcode != "parameter" or source.computation != param_of:
        return None
    return int(index.group(1)) if index else None


def _trip_count(w: _Instr, mod: _Module) -> int:
    """A while's trip count: ``known_trip_count`` when printed, else inferred; 1 when unknown."""
    t = _TRIP_RE.search(w.rest)
    if t:
        return int(t.group(1))
    cond = re.search(r"\bcondition=%?([\w.\-]+)", w.rest)
    body = re.search(r"\bbody=%?([\w.\-]+)", w.rest)
    ops = _operands(w)
    if not (cond and body and ops):
        return 1
    cond_name, body_name = cond.group(1), body.group(1)
    init = _resolve(mod.by_name.get(ops[0]), mod)
    body_root = mod.roots.get(body_name)
    compare = _resolve(mod.roots.get(cond_name), mod)
    if init is None or init.opcode != "tuple" or body_root is None or body_root.opcode != "tuple":
        return 1
    if compare is None or compare.opcode != "compare":
        return 1
    inits, nexts = _operands(init), _operands(body_root)

    def value(instr: _Instr | None, comp: str) -> int | None:
        # A constant, or a loop-invariant tuple element that starts as one.
        c = _constant(instr, mod)
        if c is not None:
            return c
        k = _element(instr, mod, comp)
        if k is None or k >= len(inits) or k >= len(nexts):
            return None
        if _element(mod.by_name.get(nexts[k]), mod, body_name) != k:
            return None
        return _constant(mod.by_name.get(inits[k]), mod)

    lhs, rhs = (mod.by_name.get(o) for o in _operands(compare)[:2])
    d = _DIRECTION_RE.search(compare.rest)
    direction = d.group(1) if d else ""
    k, bound = _element(lhs, mod, cond_name), value(rhs, cond_name)
    if k is None or bound is None:
        k, bound = _element(rhs, mod, cond_name), value(lhs, cond_name)
        direction = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE"}.get(direction, direction)
    if k is None or bound is None or k >= len(inits) or k >= len(nexts):
        return 1
    start = _constant(mod.by_name.get(inits[k]), mod)
    step_instr = _resolve(mod.by_name.get(nexts[k]), mod)
    if start is None or step_instr is None or step_instr.opcode not in ("add", "subtract"):
        return 1
    a, b = (mod.by_name.get(o) for o in _operands(step_instr)[:2])
    if _element(a, mod, body_name) == k:
        step = value(b, body_name)
    elif step_instr.opcode == "add" and _element(b, mod, body_name) == k:
        step = value(a, body_name)
    else:
        return 1
    if step is None or step == 0:
        return 1
    step = -step if step_instr.opcode == "subtract" else step
    trips = _trips(start, bound, step, direction)
    # XLA removes loops that never run: zero trips means a misread, not a dead loop.
    return trips if trips else 1


def _trips(start: int, bound: int, step: int, direction: str) -> int | None:
    """Iterations of ``for (i = start; i <direction> bound; i += step)``."""
    if direction in ("LT", "LE") and step > 0:
        span = bound - start + (1 if direction == "LE" else 0)
        return max(0, -(-span // step))
    if direction in ("GT", "GE") and step < 0:
        span = start - bound + (1 if direction == "GE" else 0)
        return max(0, -(-span // -step))
    if direction == "NE" and (bound - start) % step == 0 and (bound - start) // step >= 0:
        return (bound - start) // step
    return None


def _dims(type_text: str) -> list[int]:
    m = _ARRAY_RE.search(type_text)
    return [int(d) for d in m.group(2).split(",") if d] if m else []


def _matmul_flops(instr: _Instr, mod: _Module) -> float:
    """2 × output elements × contracted elements of a ``dot`` or ``convolution``."""
    out = math.prod(_dims(instr.type_text))
    ops = _operands(instr)
    if instr.opcode == "dot":
        lhs = mod.by_name.get(ops[0]) if ops else None
        m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instr.rest)
        if lhs is None or m is None:
            return 0.0
        shape = _dims(lhs.type_text)
        picked = [int(d) for d in m.group(1).split(",") if d]
        return 2.0 * out * math.prod(shape[d] for d in picked if d < len(shape))
    kernel = mod.by_name.get(ops[1]) if len(ops) > 1 else None
    m = re.search(r"dim_labels=\w+_(\w+)->", instr.rest)
    if kernel is None or m is None:
        return 0.0
    shape = _dims(kernel.type_text)  # every kernel dim but the output features is summed
    if len(shape) != len(m.group(1)):
        return 0.0
    return (
        2.0 * out * math.prod(n for label, n in zip(m.group(1), shape, strict=True) if label != "o")
    )


def parse_hlo(hlo_text: str) -> _Module:
    """The parsed module, for reading one program's collectives and flops with one parse
    (``collectives_from_hlo`` and ``matmul_flops`` take either the text or this)."""
    return _parse(hlo_text)


def _module(hlo: str | _Module) -> _Module:
    return hlo if isinstance(hlo, _Module) else _parse(hlo)


def matmul_flops(hlo_text: str | _Module) -> tuple[float, float]:
    """Per device, the flops of the program's ``dot``s and ``convolution``s as it runs (each
    times its computation's run count: loop trips included) and as XLA's cost analysis counts
    them (each once: ``HloCostAnalysis`` counts a ``while`` body once, on every compiler).

    ``report.flops`` adds the difference to the compiler's figure, so a scanned model or a
    windowed-einsum loop is not 1/trips of its flops."""
    mod = _module(hlo_text)
    runs = once = 0.0
    for instr in mod.instrs:
        if instr.opcode in ("dot", "convolution"):
            flops = _matmul_flops(instr, mod)
            runs += flops * mod.counts.get(instr.computation, 1)
            once += flops
    return runs, once


def collectives_from_hlo(
    hlo_text: str | _Module, mesh_shape: Mapping[str, int]
) -> tuple[Collective, ...]:
    """One ``Collective`` per collective of post-partitioning HLO text (see the module docstring).

    Args:
        hlo_text: ``compiled.as_text()``, or its ``parse_hlo``.
        mesh_shape: ``{axis: size}`` of the mesh the program was partitioned for; group
            members are positions in ``mesh.devices.flat``.
    """
    mod = _module(hlo_text)
    # TPU's all-reduce + dynamic-slice fusions: the fusion is a reduce-scatter.
    all_reduces: dict[str, list[_Instr]] = {}
    for i in mod.instrs:
        if i.opcode == "all-reduce":
            all_reduces.setdefault(i.computation, []).append(i)
    scatters = {
        i.name: inner
        for i in mod.instrs
        if i.opcode == "fusion"
        for inner in [_scatter_all_reduce(i, mod, all_reduces)]
        if inner is not None
    }
    scatter_bodies = {_called(mod.by_name[name]) for name in scatters}
    # (kind, channel_id) of collectives cloned into fusions by TPU: counted once.
    found: list[tuple[_Instr, str, _Instr]] = []
    in_fusion: set[tuple[str, str]] = set()
    for instr in mod.instrs:
        if instr.computation in scatter_bodies:
            continue
        if instr.name in scatters:
            found.append((instr, "reduce-scatter", scatters[instr.name]))
            continue
        kind, attrs_from = _kind(instr, mod.by_name)
        if kind is None:
            continue
        found.append((instr, kind, attrs_from))
        channel = _CHANNEL_RE.search(attrs_from.rest)
        if channel and instr.computation in mod.fusion_callers:
            in_fusion.add((kind, channel.group(1)))
    seen: set[tuple[str, str]] = set()
    out: list[Collective] = []
    for instr, kind, attrs_from in found:
        channel = _CHANNEL_RE.search(attrs_from.rest)
        key = (kind, channel.group(1)) if channel else None
        if key in in_fusion:
            if key in seen:
                continue
            seen.add(key)
        out.append(_record(instr, kind, attrs_from, mod, mesh_shape))
    return tuple(out)


def _scatter_all_reduce(
    fusion: _Instr, mod: _Module, all_reduces: Mapping[str, list[_Instr]]
) -> _Instr | None:
    """The all-reduce inside a TPU ``all-reduce-scatter`` fusion (a ``kCustom`` fusion named
    so, or whose root is a dynamic-slice or a tuple of them), else None."""
    body = _called(fusion)
    kind = _KIND_RE.search(fusion.rest)
    if not body or not kind or kind.group(1) != "kCustom":
        return None
    inner = all_reduces.get(body, [])
    if len(inner) != 1:
        return None
    root = mod.roots.get(body)
    slices = [root] if root is not None and root.opcode != "tuple" else []
    if root is not None and root.opcode == "tuple":
        slices = [mod.by_name[o] for o in _operands(root) if o in mod.by_name]
    if body.startswith("all-reduce-scatter") or (
        slices and all(s.opcode == "dynamic-slice" for s in slices)
    ):
        return inner[0]
    return None


def _record(
    instr: _Instr, kind: str, attrs_from: _Instr, mod: _Module, mesh_shape: Mapping[str, int]
) -> Collective:
    rest = attrs_from.rest
    groups = parse_replica_groups(rest, mod.num_partitions) or [list(range(mod.num_partitions))]
    if kind == "collective-permute":
        group_size = 2 if groups and all(len(g) == 2 for g in groups) else 1
        groups = [g for g in groups if len(g) == 2 and g[0] != g[1]]
        if not groups:
            group_size = 1
    else:
        group_size = max(len(g) for g in groups)
    nbytes = shape_bytes(instr.type_text)
    op_name = _OPNAME_RE.search(rest) or _OPNAME_RE.search(instr.rest)
    return Collective(
        kind=kind,
        bytes=nbytes,
        group_size=group_size,
        mesh_axes=axes_of_groups(mesh_shape, groups),
        wire_bytes=wire_bytes(kind, nbytes, group_size),
        op_name=op_name.group(1) if op_name else "",
        source=_source(rest, mod.sources) or _source(instr.rest, mod.sources),
        count=mod.counts.get(instr.computation, 1),
        # the fusion for an all-reduce-scatter, the -start for an async pair
        hlo_name=instr.name if instr.opcode == "fusion" else attrs_from.name,
        shape=instr.type_text,
        operands=max(
            1, sum(1 for dtype, _ in _ARRAY_RE.findall(instr.type_text) if dtype in DTYPE_BYTES)
        ),
    )


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
    """The user's ``file:line`` in an instruction's metadata; "" when there is none, or when
    it is shardlab's own (a collective the partitioner made for the program as a whole
    carries the line that compiled it, not a line of the model)."""
    f, ln = _SRC_FILE_RE.search(rest), _SRC_LINE_RE.search(rest)
    found = ""
    if f and ln:
        found = f"{f.group(1)}:{ln.group(1)}"
    else:
        frame = _FRAME_RE.search(rest)
        if frame:
            found = sources.get(int(frame.group(1)), "")
    return "" if found and is_own_file(found.rpartition(":")[0]) else found


def primitive_of(op_name: str) -> str:
    """The jaxpr primitive at the end of an HLO ``op_name`` (``jit(f)/jvp()/dot_general``)."""
    tail = op_name.rstrip(")").split("/")[-1]
    return tail.split(":")[-1]


__all__ = [
    "collectives_from_hlo",
    "matmul_flops",
    "parse_hlo",
    "parse_replica_groups",
    "shape_bytes",
]
