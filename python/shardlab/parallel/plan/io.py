"""Plan files: a ``Plan``'s fields read from its JSON form, validated, and the escaping
``Plan.to_code`` applies to everything it copies into Python source.

Nothing here unpickles or evaluates anything. ``parse_json`` reads the text: at most
``MAX_PLAN_CHARS`` characters; nesting deeper than the interpreter's recursion limit is
refused, and integer literals longer than ``MAX_DIGITS`` digits are kept as a marker the
field checks reject (Python refuses to convert more than 4300 digits). ``plan_fields`` then
checks the data field by field before ``Plan.from_json`` builds a plan:

- types are strict: a bool is not an int, a float is not an int, a string is not a number,
  and ``NaN``/``Infinity`` (which ``json`` accepts) or overflowing floats (``1e309``) are not
  finite numbers;
- mesh axis names are Python identifiers that are not keywords (``to_code`` writes them as
  ``shardlab.mesh(data=2)``), NFKC-normal (Python normalises identifiers), and sizes are
  positive ints with at most ``MAX_DEVICES`` devices in all;
- shapes are lists of non-negative ints up to ``MAX_INT``; a 0-size dimension is legal, as
  in JAX (``jnp.zeros((0, 4))``), and any split of it divides it;
- specs have one axis list per dimension, name only the mesh's axes, each axis at most once
  per spec, and split each dimension evenly;
- the method and primitive names match fixed grammars (``METHOD``, ``PRIMITIVE``): they are
  written into comments of the generated code;
- bytes, flops, counts and seconds in the cost are finite and non-negative, memory fields
  are ints; collective kinds are ``records.COLLECTIVE_KINDS``.

Every error is a ``SearchError`` that names the field (``mesh_shape['data']``,
``cost.collectives[0].bytes``), shows the value shortened by ``reprlib`` (a megabyte string
or a 5000-digit integer does not flood the message) and says what would be valid.

``to_code`` does not rely on the checks (a ``Plan`` can be built in memory with any
strings): ``comment`` escapes text for a ``#`` line, ``spec_code`` and ``mesh_code`` write
axis names as string literals or checked identifiers and sizes as checked ints.
"""

from __future__ import annotations

import json
import keyword
import math
import numbers
import re
import reprlib
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from shardlab._core.source import portable_source
from shardlab.parallel.cost import layouts as L
from shardlab.parallel.errors import SearchError
from shardlab.parallel.records import (
    COLLECTIVE_KINDS,
    PIPELINE_SCHEDULES,
    REMAT_POLICIES,
    Collective,
    CostBreakdown,
    DeviceMemoryEstimate,
    PipelineSpec,
    PlanRow,
    RematSpec,
)

FORMAT = "shardlab.plan/1"
MAX_PLAN_CHARS = 64 * 2**20  # characters of JSON text (64 MiB of ASCII)
MAX_DEVICES = 2**20  # devices a plan's mesh may have (the product of its axis sizes)
MAX_INT = 2**63 - 1  # dimensions, bytes, counts, node indices: int64, as in XLA
MAX_DIGITS = 30  # longer integer literals are never converted (MAX_INT has 19 digits)

# Method names: ``ilp``, ``auto:ilp``, ``recursive→data_parallel+megatron``, ``hand``.
METHOD = re.compile(r"[A-Za-z_][A-Za-z0-9_.+-]*(?:[:→][A-Za-z_][A-Za-z0-9_.+-]*)*")
# JAX primitive names: ``dot_general``, ``reduce_sum``, ``custom_vjp_call``, ``scan_slice``.
PRIMITIVE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_METHOD_RULE = (
    "a method name like 'ilp', 'auto:ilp' or 'recursive→zero' (ASCII letters, digits and "
    "_ . + -, parts joined by ':' or '→')"
)
_PRIMITIVE_RULE = "a primitive name like 'dot_general' (ASCII letters, digits and _ . -)"


# -- messages ------------------------------------------------------------------------------
class _Short(reprlib.Repr):
    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxstring = self.maxother = 80
        self.maxlong = 40
        self.maxlist = self.maxtuple = self.maxdict = 6

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 256:  # repr() of a huge int is slow, and fails past 4300 digits
            return f"<an int of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_SHORT = _Short()


def short(value: Any) -> str:
    """``repr(value)`` for a message: truncated, depth-limited, never recursing far."""
    return _SHORT.repr(value)


def _fail(where: str, problem: str) -> SearchError:
    return SearchError(f"not a plan: {where}: {problem}")


# -- parsing -------------------------------------------------------------------------------
class _LongInt:
    """An integer literal of more than ``MAX_DIGITS`` digits, never converted to an int."""

    __slots__ = ("digits",)

    def __init__(self, text: str) -> None:
        self.digits = len(text.lstrip("-"))

    def __repr__(self) -> str:
        return f"<a {self.digits}-digit integer>"


def _parse_int(text: str) -> int | _LongInt:
    return int(text) if len(text) <= MAX_DIGITS else _LongInt(text)


def parse_json(text: Any) -> Any:
    """The JSON value of a plan file's text (``str``, or UTF-8/16/32 ``bytes``).

    Raises:
        SearchError: not text, longer than ``MAX_PLAN_CHARS``, invalid JSON, or nested deeper
            than the recursion limit (a plan nests 6 levels).
    """
    if not isinstance(text, (str, bytes, bytearray)):
        raise SearchError(
            f"not a plan: Plan.from_json expects the JSON text (a str), got a "
            f"{type(text).__name__}; read the file first: Plan.from_json(path.read_text())"
        )
    if len(text) > MAX_PLAN_CHARS:
        raise SearchError(
            f"not a plan: the text has {len(text):,} characters; a plan file has at most "
            f"{MAX_PLAN_CHARS:,} ({MAX_PLAN_CHARS // 2**20} MiB, "
            "shardlab.parallel.plan.io.MAX_PLAN_CHARS)"
        )
    try:
        return json.loads(text, parse_int=_parse_int)
    except RecursionError:
        raise SearchError(
            "not a plan: invalid JSON (nested too deeply to read; a plan nests 6 levels)"
        ) from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        msg = str(e) if len(str(e)) <= 300 else str(e)[:300] + "..."
        raise SearchError(f"not a plan: invalid JSON ({msg})") from e


# -- field checks --------------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(v: Any, where: str, *, low: int = 0, what: str = "a non-negative int") -> int:
    if not _is_int(v) or not low <= v <= MAX_INT:
        raise _fail(where, f"expected {what} (at most 2**63 - 1), got {short(v)}")
    return int(v)


def _number(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _fail(where, f"expected a finite non-negative number, got {short(v)}")
    if _is_int(v) and not 0 <= v <= MAX_INT:
        raise _fail(where, f"expected a finite non-negative number, got {short(v)}")
    f = float(v)
    if not math.isfinite(f) or f < 0:
        raise _fail(where, f"expected a finite non-negative number, got {short(v)}")
    return f


def _finite(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _fail(where, f"expected a finite number, got {short(v)}")
    if _is_int(v) and abs(v) > MAX_INT:
        raise _fail(where, f"expected a finite number, got {short(v)}")
    f = float(v)
    if not math.isfinite(f):
        raise _fail(where, f"expected a finite number, got {short(v)}")
    return f


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise _fail(where, f"expected a string, got {short(v)}")
    return v


def _bool(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise _fail(where, f"expected true or false, got {short(v)}")
    return v


def _list(v: Any, where: str, what: str = "a list") -> list[Any]:
    if not isinstance(v, list):
        raise _fail(where, f"expected {what}, got {short(v)}")
    return v


def _object(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _fail(where, f"expected a JSON object, got {short(v)}")
    return v


def _get(raw: dict[str, Any], key: str, where: str) -> Any:
    if key not in raw:
        raise SearchError(f"not a plan: {where + ': ' if where else ''}missing field {key!r}")
    return raw[key]


def _strings(v: Any, where: str) -> tuple[str, ...]:
    return tuple(_str(s, f"{where}[{i}]") for i, s in enumerate(_list(v, where)))


def _named(v: Any, grammar: re.Pattern[str], where: str, what: str) -> str:
    if not isinstance(v, str) or not grammar.fullmatch(v):
        raise _fail(where, f"expected {what}, got {short(v)}")
    return v


def is_axis_name(name: Any) -> bool:
    """A mesh axis name ``to_code`` can write as a keyword argument: an identifier that is
    not a Python keyword and that Python's NFKC normalisation leaves unchanged."""
    return (
        type(name) is str
        and name.isidentifier()
        and not keyword.iskeyword(name)
        and unicodedata.normalize("NFKC", name) == name
    )


def _mesh(raw: Any) -> dict[str, int]:
    raw = _object(raw, "mesh_shape")
    if not raw:
        raise _fail("mesh_shape", "expected at least one axis, e.g. {'data': 8}, got {}")
    sizes: dict[str, int] = {}
    devices = 1
    for name, size in raw.items():
        if not is_axis_name(name):
            raise _fail(
                "mesh_shape",
                f"axis name {short(name)} is not a Python identifier (or is a keyword); "
                "axis names are written as shardlab.mesh(data=...), e.g. 'data' or 'model'",
            )
        where = f"mesh_shape[{short(name)}]"
        if not _is_int(size) or size < 1:
            raise _fail(where, f"expected a positive int, got {short(size)}")
        devices *= size if size <= MAX_DEVICES else MAX_DEVICES + 1
        if devices > MAX_DEVICES:
            raise _fail(
                where,
                f"the mesh {short(raw)} has more than {MAX_DEVICES:,} (2**20) devices; "
                "a plan's mesh has at most that many",
            )
        sizes[name] = size
    return sizes


def _shapes(raw: Any, where: str) -> tuple[tuple[int, ...], ...]:
    out = []
    for i, s in enumerate(_list(raw, where)):
        dims = _list(s, f"{where}[{i}]", "a list of dimension sizes")
        out.append(
            tuple(
                _int(d, f"{where}[{i}][{j}]", what="a non-negative int") for j, d in enumerate(dims)
            )
        )
    return tuple(out)


def _axes(raw: Any, sizes: Mapping[str, int], seen: set[str], where: str) -> tuple[str, ...]:
    axes = _list(raw, where, "a list of mesh axis names (e.g. ['data'] or [])")
    for a in axes:
        if not isinstance(a, str):
            raise _fail(where, f"expected mesh axis names, got {short(a)} in {short(axes)}")
        if a not in sizes:
            raise _fail(
                where, f"names mesh axis {short(a)}; the plan's mesh has {short(sorted(sizes))}"
            )
        if a in seen:
            raise _fail(where, f"mesh axis {a!r} is used twice in one spec")
        seen.add(a)
    return tuple(axes)


def _layout(
    raw: Any, sizes: Mapping[str, int], where: str, shape: tuple[int, ...] | None
) -> L.DimAxes:
    """A spec: one axis list per dimension (``len(shape)`` of them when the shape is known)."""
    if not isinstance(raw, list) or (shape is not None and len(raw) != len(shape)):
        n = "per-dimension" if shape is None else f"{len(shape)} per-dimension"
        raise _fail(where, f"expected {n} axis lists (e.g. [['data'], []]), got {short(raw)}")
    seen: set[str] = set()
    out = []
    for d, dim in enumerate(raw):
        axes = _axes(dim, sizes, seen, f"{where} dimension {d}")
        if shape is not None:
            n = math.prod(sizes[a] for a in axes)
            if shape[d] % n:
                raise _fail(
                    where,
                    f"dimension {d} of size {shape[d]} is not divisible by {n} ({short(list(axes))})",
                )
        out.append(axes)
    return tuple(out)


def _specs(
    raw: Any,
    shapes: tuple[tuple[int, ...], ...],
    names: Iterable[str],
    sizes: dict[str, int],
    where: str,
) -> tuple[L.DimAxes, ...]:
    specs = _list(raw, where)
    if len(specs) != len(shapes):
        raise _fail(where, f"expected {len(shapes)} specs (one per shape), got {len(specs)}")
    return tuple(
        _layout(s, sizes, f"{where}[{i}] ({name})", shp)
        for i, (s, shp, name) in enumerate(zip(specs, shapes, names, strict=True))
    )


def _constraints(
    raw: Any, sizes: dict[str, int]
) -> tuple[tuple[int, str, tuple[L.DimAxes | None, ...]], ...]:
    out = []
    for i, c in enumerate(_list(raw, "constraints")):
        where = f"constraints[{i}]"
        if not isinstance(c, list) or len(c) != 3:
            raise _fail(
                where, f"expected [node index, primitive, [spec or null, ...]], got {short(c)}"
            )
        node = _int(c[0], f"{where}[0]", what="a node index (a non-negative int)")
        prim = _named(c[1], PRIMITIVE, f"{where}[1]", _PRIMITIVE_RULE)
        specs = tuple(
            None if s is None else _layout(s, sizes, f"{where}[2][{j}]", None)
            for j, s in enumerate(_list(c[2], f"{where}[2]", "a list of specs (or null)"))
        )
        out.append((node, prim, specs))
    return tuple(out)


def _operand_constraints(raw: Any, sizes: dict[str, int]) -> tuple[tuple[int, int, L.DimAxes], ...]:
    out = []
    for i, c in enumerate(_list(raw, "operand_constraints")):
        where = f"operand_constraints[{i}]"
        if not isinstance(c, list) or len(c) != 3:
            raise _fail(where, f"expected [node index, operand position, spec], got {short(c)}")
        node = _int(c[0], f"{where}[0]", what="a node index (a non-negative int)")
        pos = _int(c[1], f"{where}[1]", what="an operand position (a non-negative int)")
        out.append((node, pos, _layout(c[2], sizes, f"{where}[2]", None)))
    return tuple(out)


def _rows(raw: Any) -> tuple[PlanRow, ...]:
    out = []
    for i, r in enumerate(_list(raw, "rows")):
        where = f"rows[{i}]"
        r = _object(r, where)
        alts = []
        for j, a in enumerate(_list(_get(r, "alternatives", where), f"{where}.alternatives")):
            w = f"{where}.alternatives[{j}]"
            if not isinstance(a, list) or len(a) != 2:
                raise _fail(w, f"expected [split, seconds], got {short(a)}")
            alts.append((_str(a[0], f"{w}[0]"), _finite(a[1], f"{w}[1]")))
        out.append(
            PlanRow(
                _str(_get(r, "op", where), f"{where}.op"),
                portable_source(_str(_get(r, "where", where), f"{where}.where")),
                _str(_get(r, "chosen", where), f"{where}.chosen"),
                _finite(_get(r, "cost", where), f"{where}.cost"),
                tuple(alts),
            )
        )
    return tuple(out)


_COLLECTIVE_FIELDS = {
    "kind",
    "bytes",
    "group_size",
    "mesh_axes",
    "wire_bytes",
    "op_name",
    "source",
    "count",
    "hlo_name",
    "shape",
    "operands",
}


def _collective(raw: Any, sizes: dict[str, int], where: str) -> Collective:
    raw = _object(raw, where)
    extra = sorted(set(raw) - _COLLECTIVE_FIELDS)
    if extra:
        raise _fail(
            where, f"unknown fields {short(extra)}; a collective has {sorted(_COLLECTIVE_FIELDS)}"
        )
    kind = _get(raw, "kind", where)
    if kind not in COLLECTIVE_KINDS:
        raise _fail(f"{where}.kind", f"expected one of {list(COLLECTIVE_KINDS)}, got {short(kind)}")
    axes = _strings(raw.get("mesh_axes", []), f"{where}.mesh_axes")
    for a in axes:
        if a not in sizes:
            raise _fail(
                f"{where}.mesh_axes",
                f"unknown mesh axis {short(a)}; the mesh has {short(sorted(sizes))}",
            )
    return Collective(
        kind=kind,
        bytes=_int(_get(raw, "bytes", where), f"{where}.bytes"),
        group_size=_int(
            _get(raw, "group_size", where), f"{where}.group_size", low=1, what="a positive int"
        ),
        mesh_axes=axes,
        wire_bytes=_number(_get(raw, "wire_bytes", where), f"{where}.wire_bytes"),
        op_name=_str(raw.get("op_name", ""), f"{where}.op_name"),
        source=portable_source(_str(raw.get("source", ""), f"{where}.source")),
        count=_int(raw.get("count", 1), f"{where}.count"),
        hlo_name=_str(raw.get("hlo_name", ""), f"{where}.hlo_name"),
        shape=_str(raw.get("shape", ""), f"{where}.shape"),
        operands=_int(raw.get("operands", 1), f"{where}.operands", low=1, what="a positive int"),
    )


def _per_axis(raw: Any, where: str) -> dict[str, float]:
    raw = _object(raw, where)
    return {k: _number(v, f"{where}[{k!r}]") for k, v in raw.items()}


_MEMORY_FIELDS = ("parameters", "outputs", "activations", "peak")


def _cost(raw: Any, sizes: dict[str, int]) -> CostBreakdown:
    raw = _object(raw, "cost")
    memory = _object(_get(raw, "memory", "cost"), "cost.memory")
    extra = sorted(set(memory) - set(_MEMORY_FIELDS))
    if extra:
        raise _fail("cost.memory", f"unknown fields {short(extra)}; it has {list(_MEMORY_FIELDS)}")
    return CostBreakdown(
        collectives=tuple(
            _collective(c, sizes, f"cost.collectives[{i}]")
            for i, c in enumerate(_list(_get(raw, "collectives", "cost"), "cost.collectives"))
        ),
        comm_bytes_per_axis=_per_axis(
            _get(raw, "comm_bytes_per_axis", "cost"), "cost.comm_bytes_per_axis"
        ),
        comm_time_per_axis=_per_axis(
            _get(raw, "comm_time_per_axis", "cost"), "cost.comm_time_per_axis"
        ),
        flops=_number(_get(raw, "flops", "cost"), "cost.flops"),
        compute_time=_number(_get(raw, "compute_time", "cost"), "cost.compute_time"),
        memory=DeviceMemoryEstimate(
            **{k: _int(_get(memory, k, "cost.memory"), f"cost.memory.{k}") for k in _MEMORY_FIELDS}
        ),
        device=_str(_get(raw, "device", "cost"), "cost.device"),
        warnings=_strings(raw.get("warnings", []), "cost.warnings"),
    )


def portable(data: dict[str, Any]) -> dict[str, Any]:
    """``Plan.to_dict()`` output with its source lines relative (``portable_source``): a
    plan file carries no absolute path of the machine that wrote it (loading does the same)."""
    for row in data["rows"]:
        row["where"] = portable_source(row["where"])
    for collective in data["cost"]["collectives"]:
        collective["source"] = portable_source(collective["source"])
    return data


def plan_fields(data: Any) -> dict[str, Any]:
    """The validated fields of an unbound ``Plan`` from ``Plan.to_dict()`` output (parsed
    by ``parse_json``); keys it does not know (``cost.time`` and the other derived values)
    are ignored.

    Raises:
        SearchError: naming the first bad field and what would be valid.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SearchError(f"not a plan: expected a JSON object with format {FORMAT!r}")
    try:
        return _fields(data)
    except RecursionError:  # nothing here recurses on the data; a guard all the same
        raise SearchError("not a plan: nested too deeply") from None


def _fields(data: dict[str, Any]) -> dict[str, Any]:
    sizes = _mesh(_get(data, "mesh_shape", ""))
    paths = _strings(_get(data, "input_paths", ""), "input_paths")
    in_shapes = _shapes(_get(data, "input_shapes", ""), "input_shapes")
    out_shapes = _shapes(_get(data, "output_shapes", ""), "output_shapes")
    if len(paths) != len(in_shapes):
        raise _fail("input_paths", f"{len(paths)} paths for {len(in_shapes)} input shapes")
    ins = _specs(
        _get(data, "input_specs", ""),
        in_shapes,
        (f"input {short(p)}" for p in paths),
        sizes,
        "input_specs",
    )
    outs = _specs(
        _get(data, "output_specs", ""),
        out_shapes,
        (f"output {i}" for i in range(len(out_shapes))),
        sizes,
        "output_specs",
    )
    optimal = data.get("optimal")
    budget = data.get("memory_budget")
    return dict(
        method=_named(_get(data, "method", ""), METHOD, "method", _METHOD_RULE),
        mesh_shape=sizes,
        input_paths=paths,
        input_shapes=in_shapes,
        input_specs=ins,
        output_shapes=out_shapes,
        output_specs=outs,
        constraints=_constraints(_get(data, "constraints", ""), sizes),
        operand_constraints=_operand_constraints(_get(data, "operand_constraints", ""), sizes),
        cost=_cost(_get(data, "cost", ""), sizes),
        optimal=None if optimal is None else _bool(optimal, "optimal"),
        complete=_bool(data.get("complete", True), "complete"),
        search_time=_number(data.get("search_time", 0.0), "search_time"),
        fingerprint=_str(data.get("fingerprint", ""), "fingerprint"),
        rows=_rows(data.get("rows", [])),
        notes=_strings(data.get("notes", []), "notes"),
        memory_budget=None if budget is None else _budget(budget),
        pipeline=_pipeline(data.get("pipeline"), sizes),
        remat=_remat(data.get("remat")),
    )


def _choice(v: Any, valid: tuple[str, ...], where: str) -> str:
    if not isinstance(v, str) or v not in valid:
        raise _fail(where, f"got {short(v)}; expected one of {', '.join(valid)}")
    return v


def _groups(v: Any, where: str) -> tuple[int, ...]:
    return tuple(_int(x, f"{where}[{i}]") for i, x in enumerate(_list(v, where)))


def _pipeline(raw: Any, sizes: dict[str, int]) -> PipelineSpec | None:
    if raw is None:
        return None
    obj = _object(raw, "pipeline")
    axis = _str(_get(obj, "axis", "pipeline"), "pipeline.axis")
    if axis not in sizes:
        raise _fail("pipeline.axis", f"{short(axis)} is not a mesh axis ({', '.join(sizes)})")
    return PipelineSpec(
        stages=_int(
            _get(obj, "stages", "pipeline"), "pipeline.stages", low=1, what="a positive int"
        ),
        microbatches=_int(
            _get(obj, "microbatches", "pipeline"),
            "pipeline.microbatches",
            low=1,
            what="a positive int",
        ),
        axis=axis,
        schedule=_choice(obj.get("schedule", "gpipe"), PIPELINE_SCHEDULES, "pipeline.schedule"),
        scans=_groups(obj.get("scans", []), "pipeline.scans"),
        virtual_stages=_int(
            obj.get("virtual_stages", 1),
            "pipeline.virtual_stages",
            low=1,
            what="a positive int",
        ),
    )


def _remat(raw: Any) -> RematSpec | None:
    if raw is None:
        return None
    obj = _object(raw, "remat")
    return RematSpec(
        policy=_choice(_get(obj, "policy", "remat"), REMAT_POLICIES, "remat.policy"),
        scans=_groups(obj.get("scans", []), "remat.scans"),
    )


def _budget(v: Any) -> int:
    """Bytes; ``search`` stores the budget it was given, an int or a float (floored)."""
    return _int(v, "memory_budget") if _is_int(v) else int(_number(v, "memory_budget"))


# -- writing code --------------------------------------------------------------------------
_CODING = re.compile(r"coding(?=[:=])")


def comment(text: Any) -> str:
    """``str(text)`` made safe inside a ``#`` line of generated code.

    Every character that is not printable is written as its escape (``\\n``, ``\\r`` and the
    other ``str.splitlines`` boundaries ``\\x0b \\x0c \\x1c-\\x1e \\x85 \\u2028 \\u2029``, NUL,
    bidirectional controls, lone surrogates), so the text can neither end the comment nor
    reorder what an editor shows; ``coding:``/``coding=`` get a space, so a comment in the
    first two lines is never read as an encoding declaration.
    """
    s = str.__str__(text if isinstance(text, str) else str(text))  # an exact str
    if not s.isprintable():
        s = "".join(c if c.isprintable() else str.__repr__(c)[1:-1] for c in s)
    return _CODING.sub("coding ", s)


def _literal(name: Any, where: str) -> str:
    if not isinstance(name, str):
        raise SearchError(f"to_code: {where} names a mesh axis that is not a string: {short(name)}")
    return str.__repr__(name)


def spec_code(dim_axes: Any, where: str) -> str:
    """``P(...)`` source of a layout, like ``make_spec``: trailing unsplit dims dropped, each
    axis name a string literal (``repr``), so any name gives a plain literal."""
    entries = []
    for axes in dim_axes:
        names = [_literal(a, where) for a in axes]
        entries.append(
            "None" if not names else names[0] if len(names) == 1 else f"({', '.join(names)})"
        )
    while entries and entries[-1] == "None":
        entries.pop()
    return f"P({', '.join(entries)})"  # P('data') as users write it (the same spec as P('data',))


def _int_code(v: Any, where: str) -> str:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or int(v).bit_length() > 64:
        raise SearchError(f"to_code: {where} is not an int: {short(v)}")
    return int.__repr__(int(v))


def mesh_code(mesh_shape: Mapping[Any, Any]) -> str:
    """Arguments of ``shardlab.mesh(...)`` for ``{axis: size}``: keywords (``data=2,
    model=4``) when every name is an identifier (``is_axis_name``), else one dict of string
    literals (``{'a b': 2}``)."""
    items = [
        (name, _int_code(size, f"mesh_shape[{short(name)}]")) for name, size in mesh_shape.items()
    ]
    if items and all(is_axis_name(n) for n, _ in items):
        return ", ".join(f"{str.__str__(n)}={v}" for n, v in items)
    pairs = ", ".join(f"{_literal(n, 'mesh_shape')}: {v}" for n, v in items)
    return "{" + pairs + "}"
