"""Arrays too large for XLA or for this machine, refused before XLA sees them.

XLA counts an array's bytes in int64; asked to compile a larger one (``jnp.ones((2**61,))``:
2**63 bytes of float32) it aborts the process (SIGABRT, "overflow in static extent product"),
and in a notebook that process is the kernel with every variable in it. Every program JAX
hands to XLA passes two points, and :func:`install` wraps both:

- **lowering** (``mlir.lower_jaxpr_to_module``): every ``jax.jit``, every eager op (JAX runs
  each op as a small jitted program, ``%%eager`` cells included), graph cells, ``.lower()``,
  shard_map. An array anywhere in the program (an argument, a result, an intermediate,
  inside a loop body or a branch) over :data:`MAX_ARRAY_BYTES` is refused.
- **running** (``pjit._pjit_call_impl_python``: the first call of a function at its shapes,
  before it is lowered): results larger than the memory of the devices they land on (the
  host's, for CPU devices) are refused before anything is compiled or allocated. Lowering
  and compiling ahead of time (``jax.jit(f).lower(...).compile()``) stay allowed for such
  shapes: planning a model larger than this machine is what shardlab is for.

A refusal is an :class:`ArrayTooLargeError` naming the shape, its size, the line that made
it and what fits; nothing has run, so the caller's state is unchanged. A check that fails in
an unexpected way lets the program through, as if the guard were not installed.

The shardlab kernel installs the guard (``ShardlabSession.guard_array_sizes``); a script can
call :func:`install`. Imports jax only.
"""

from __future__ import annotations

import functools
import logging
import math
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardlab._core.units import human_bytes

# XLA's sizes are int64 bytes (2**63 - 1, measured on jaxlib 0.10: f32[2**61] aborts, s8 of
# 2**63 - 1 elements compiles); accelerators pad dimensions to their tiles, which a shape just
# under that bound can overflow, so the guard leaves a factor of two.
MAX_ARRAY_BYTES = 2**62


class ArrayTooLargeError(ValueError):
    """An array XLA cannot compile, or whose bytes exceed the devices' memory."""

    def __init__(self, message: str, *, refusal: Refusal) -> None:
        super().__init__(message)
        self.refusal = refusal

    def _render_traceback_(self) -> list[str]:
        """What IPython shows: the message, which names the line; a traceback through JAX's
        dispatch adds nothing to it."""
        return [f"\x1b[31m{type(self).__name__}\x1b[0m: {self}"]


@dataclass(frozen=True)
class Refusal:
    """What was refused: the array, its size, the limit and who made it."""

    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    limit: int
    why: str  # "xla" (beyond MAX_ARRAY_BYTES) or "memory"
    primitive: str = ""
    where: str = ""  # ``In [3], line 1``
    line: str = ""  # the text of that line
    memory: int | None = None  # bytes of the devices' memory (the host's for CPU devices)
    memory_of: str = ""  # "this host's memory" / "each gpu device's memory"
    per_device: bool = False  # nbytes is one device's share


# -- sizes ---------------------------------------------------------------------------------
def _physical(aval: Any) -> tuple[tuple[int, ...], Any] | None:
    """Shape and element dtype of an abstract array as XLA stores it; None for other values
    (tokens, symbolic dimensions)."""
    inner = getattr(aval, "inner_aval", None)  # a mutable array reference
    if inner is not None:
        aval = inner
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return None
    from jax._src import core, dtypes

    if isinstance(dtype, dtypes.ExtendedDType):  # PRNG keys: uint32 words per key
        aval = core.physical_aval(aval)
        shape, dtype = aval.shape, aval.dtype
    if not all(isinstance(d, int | np.integer) for d in shape):
        return None
    return tuple(int(d) for d in shape), dtype


def _itemsize(dtype: Any) -> int:
    return max(1, np.dtype(dtype).itemsize)  # sub-byte types (int4) take a byte unpacked


def _nbytes(shape: tuple[int, ...], dtype: Any) -> int:
    return math.prod(shape) * _itemsize(dtype)


# -- the program's arrays ------------------------------------------------------------------
# Jaxprs already checked (by id, while they live): a program is checked once per cache miss.
_checked: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def check_program(closed_jaxpr: Any) -> None:
    """Raises :class:`ArrayTooLargeError` for the first array of the program (arguments,
    results and every intermediate, sub-programs included) over :data:`MAX_ARRAY_BYTES`."""
    jaxpr = getattr(closed_jaxpr, "jaxpr", closed_jaxpr)
    if _checked.get(id(jaxpr)) is jaxpr:
        return
    found = _first_oversized(jaxpr)
    if found is not None:
        (shape, dtype), eqn = found
        nbytes = _nbytes(shape, dtype)
        refusal = _with_source(
            Refusal(shape, str(np.dtype(dtype)), nbytes, MAX_ARRAY_BYTES, "xla"), eqn
        )
        memory, memory_of = _memory_of(None)
        refusal = _replace(refusal, memory=memory, memory_of=memory_of)
        raise ArrayTooLargeError(message(refusal), refusal=refusal)
    _checked[id(jaxpr)] = jaxpr


def _first_oversized(jaxpr: Any) -> tuple[tuple[tuple[int, ...], Any], Any] | None:
    """((shape, dtype), the equation that made it or None) of the first array over the
    bound, walking every sub-jaxpr once."""
    from jax._src import core

    seen: set[int] = set()
    stack = [jaxpr]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for var in (*current.constvars, *current.invars):
            found = _oversized(var)
            if found is not None:
                return found, None
        for eqn in current.eqns:
            for var in eqn.outvars:
                found = _oversized(var)
                if found is not None:
                    return found, eqn
            stack.extend(core.jaxprs_in_params(eqn.params))
    return None


def _oversized(var: Any) -> tuple[tuple[int, ...], Any] | None:
    physical = _physical(getattr(var, "aval", None))
    if physical is None:
        return None
    if _nbytes(*physical) > MAX_ARRAY_BYTES:
        return physical
    return None


# -- the results of a run ------------------------------------------------------------------
def check_results(closed_jaxpr: Any, out_shardings: Any, args: Any) -> None:
    """Raises :class:`ArrayTooLargeError` for the first result of the program whose bytes
    exceed the memory of the devices it would land on.

    What is compared is a lower bound, so only what certainly cannot fit is refused: on CPU
    devices (all in the host's memory) the result's global bytes; on an accelerator one
    device's share (its sharding's shard when known, else an even split over the program's
    devices).
    """
    device, count = _program_devices(out_shardings, args)
    memory, memory_of = _memory_of(device)
    if memory is None:
        return
    jaxpr = closed_jaxpr.jaxpr
    shardings = list(out_shardings) if out_shardings is not None else []
    host = device.platform == "cpu"
    for index, (var, aval) in enumerate(zip(jaxpr.outvars, closed_jaxpr.out_avals, strict=False)):
        physical = _physical(aval)
        if physical is None:
            continue
        shape, dtype = physical
        nbytes = _nbytes(shape, dtype)
        if not host:
            sharding = shardings[index] if index < len(shardings) else None
            nbytes = _share(shape, dtype, sharding, count)
        if nbytes > memory:
            refusal = Refusal(
                shape,
                str(np.dtype(dtype)),
                nbytes,
                memory,
                "memory",
                memory=memory,
                memory_of=memory_of,
                per_device=not host,
            )
            refusal = _with_source(refusal, _producer(jaxpr, var))
            raise ArrayTooLargeError(message(refusal), refusal=refusal)


def _share(shape: tuple[int, ...], dtype: Any, sharding: Any, count: int) -> int:
    shard_shape: Any = getattr(sharding, "shard_shape", None)
    if shard_shape is not None:
        try:
            return _nbytes(tuple(shard_shape(shape)), dtype)
        except Exception:  # an abstract or unspecified sharding: the even split below
            pass
    return -(-_nbytes(shape, dtype) // max(1, count))


def _producer(jaxpr: Any, var: Any) -> Any:
    for eqn in reversed(jaxpr.eqns):
        if any(out is var for out in eqn.outvars):
            return eqn
    return None


def _program_devices(out_shardings: Any, args: Any) -> tuple[Any, int]:
    """A device the program runs on and how many it spans (the default device when neither
    its arguments nor its result shardings name any)."""
    candidates = [getattr(a, "sharding", None) for a in args or ()]
    candidates += list(out_shardings or ())
    for sharding in candidates:
        devices = getattr(sharding, "_device_assignment", None)
        if devices:
            return devices[0], len(devices)
    import jax
    from jax._src import config

    default = config.default_device.value
    if default is not None and not isinstance(default, str):
        return default, 1
    return jax.local_devices()[0], 1


def _memory_of(device: Any) -> tuple[int | None, str]:
    """Bytes of memory arrays may use on ``device`` (the default device when None), and how
    a message names it."""
    if device is None:
        import jax

        device = jax.local_devices()[0]
    if device.platform == "cpu":
        return _host_memory(), "this host's memory"
    try:
        stats = device.memory_stats() or {}
    except Exception:  # not available on this platform or device
        stats = {}
    limit = stats.get("bytes_limit")
    return (int(limit), f"each {device.platform} device's memory") if limit else (None, "")


@functools.cache
def _host_memory() -> int | None:
    from shardlab.engine.resources.devices import host_memory

    return host_memory()


# -- messages ------------------------------------------------------------------------------
def _with_source(refusal: Refusal, eqn: Any) -> Refusal:
    """The refusal with the user's line that made the array: the equation's own line (a
    line inside a jitted function), else the line running now (the call of an eager op)."""
    from shardlab._core.source import equation_source, user_frame_of_stack

    where, line = equation_source(eqn) if eqn is not None else ("", "")
    if not where:
        where, line = user_frame_of_stack() or ("", "")
    primitive = eqn.primitive.name if eqn is not None else ""
    return _replace(refusal, primitive=primitive, where=where, line=line)


def _replace(refusal: Refusal, **changes: Any) -> Refusal:
    import dataclasses

    return dataclasses.replace(refusal, **changes)


def _shape_text(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def message(refusal: Refusal) -> str:
    """What the user reads: the array, its size, why it is refused, who made it, what fits."""
    array = f"an array of shape {_shape_text(refusal.shape)} and dtype {refusal.dtype}"
    if refusal.where:
        by = f" ({refusal.primitive})" if refusal.primitive else ""
        code = f": `{refusal.line}`" if refusal.line else ""
        array += f" made at {refusal.where}{by}{code}"
    size = human_bytes(refusal.nbytes)
    if refusal.why == "xla":
        why = (
            f"{size} ({refusal.nbytes:,} bytes) is more than XLA can compile: XLA counts "
            f"bytes in int64 and aborts the whole process beyond it (shardlab refuses arrays "
            f"over {human_bytes(MAX_ARRAY_BYTES)})"
        )
    else:
        share = " per device" if refusal.per_device else ""
        why = f"{size}{share} is more than {refusal.memory_of} ({human_bytes(refusal.limit)})"
    text = f"Refused {array}: {why}. Nothing was compiled or allocated; variables are unchanged."
    if refusal.memory:
        elements = refusal.memory // _itemsize(refusal.dtype)
        share = "" if refusal.memory_of.startswith("this host") else " per device"
        text += (
            f" What fits: at most {elements:,} {refusal.dtype} elements{share} "
            f"({human_bytes(refusal.memory)}, {refusal.memory_of})."
        )
    return text


# -- installing ----------------------------------------------------------------------------
_ORIGINALS: dict[str, Any] = {}


def install() -> bool:
    """Wraps JAX's lowering and first-call paths with the checks (idempotent). False when
    this JAX lacks them (the guard is then off)."""
    if _ORIGINALS:
        return True
    try:
        from jax._src import pjit, traceback_util
        from jax._src.interpreters import mlir

        lower = mlir.lower_jaxpr_to_module
        call = pjit._pjit_call_impl_python
    except (ImportError, AttributeError):
        return False

    @functools.wraps(lower)
    def lower_jaxpr_to_module(module_name: Any, jaxpr: Any, *args: Any, **kwargs: Any) -> Any:
        _guarded(check_program, jaxpr)
        return lower(module_name, jaxpr, *args, **kwargs)

    @functools.wraps(call)
    def _pjit_call_impl_python(*args: Any, **params: Any) -> Any:
        jaxpr = params.get("jaxpr")
        if jaxpr is not None:
            _guarded(check_program, jaxpr)
            _guarded(check_results, jaxpr, params.get("out_shardings"), args)
        return call(*args, **params)

    traceback_util.register_exclusion(__file__)  # tracebacks show the user's line, not these
    _ORIGINALS.update(lower=lower, call=call)
    mlir.lower_jaxpr_to_module = lower_jaxpr_to_module
    pjit._pjit_call_impl_python = _pjit_call_impl_python
    return True


def uninstall() -> None:
    """Puts JAX's own functions back."""
    if not _ORIGINALS:
        return
    from jax._src import pjit
    from jax._src.interpreters import mlir

    mlir.lower_jaxpr_to_module = _ORIGINALS.pop("lower")
    pjit._pjit_call_impl_python = _ORIGINALS.pop("call")


def installed() -> bool:
    return bool(_ORIGINALS)


def _guarded(check: Any, *args: Any) -> None:
    """Runs a check; only its refusal escapes (a check that breaks lets the program run)."""
    try:
        check(*args)
    except ArrayTooLargeError:
        raise
    except Exception:
        logging.getLogger(__name__).debug("shape guard: check failed", exc_info=True)


__all__ = [
    "MAX_ARRAY_BYTES",
    "ArrayTooLargeError",
    "Refusal",
    "check_program",
    "check_results",
    "install",
    "installed",
    "message",
    "uninstall",
]
