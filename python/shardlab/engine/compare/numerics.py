"""How two runs of one program are compared: per-dtype tolerances and the float64 verdict.

The rule (after torch's accuracy minifier, ``torch._dynamo.utils.same``; see docs/guide/compare.md):

1. Compiled and eager *agree* when every element satisfies
   ``|compiled - eager| <= rtol * |eager| + atol * rms(eager)`` (NaN matching NaN), with
   ``rtol``/``atol`` from :data:`TOLERANCES` by dtype. ``atol`` is relative to the leaf's
   root-mean-square magnitude, so a leaf of gradients around 1e-8 is held to its own scale.
2. Otherwise both are measured against the float64 reference: compiled *passes* when
   ``RMSE(compiled - f64) <= k * RMSE(eager - f64) + rtol / 10 * rms(f64)``, ``k`` = 2, or 3
   for 16-bit floats and for leaves of fewer than 1000 elements (torch's multipliers).
3. Otherwise compiled *fails*: it is further from float64 than eager by more than the margin.

Integers, booleans and PRNG keys must match exactly. Which side is closer to float64 is
always reported: XLA's algebraic simplifier can remove a cancellation that eager keeps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from shardlab._core.trees import as_numpy

__all__ = ["TOLERANCES", "Difference", "Tolerance", "difference", "tolerance_for"]


@dataclass(frozen=True)
class Tolerance:
    """Tolerances for one dtype: ``rtol`` per element, ``atol`` times the leaf's RMS, and
    the margin ``multiplier`` of the float64 rule (``small_multiplier`` under 1000 elements)."""

    rtol: float
    atol: float
    multiplier: float = 2.0
    small_multiplier: float = 3.0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(1e-10, 1e-12),
    "complex128": Tolerance(1e-10, 1e-12),
    "float32": Tolerance(1e-5, 1e-6),
    "complex64": Tolerance(1e-5, 1e-6),
    "float16": Tolerance(1e-3, 1e-4, multiplier=3.0),
    "bfloat16": Tolerance(1e-2, 1e-3, multiplier=3.0),
}
EXACT = Tolerance(0.0, 0.0, multiplier=1.0, small_multiplier=1.0)
SMALL_LEAF = 1000


def tolerance_for(dtype: Any, overrides: dict[str, Tolerance] | None = None) -> Tolerance:
    """The tolerance of ``dtype`` (exact for integers, booleans and keys)."""
    name = _dtype_name(dtype)
    if overrides and name in overrides:
        return overrides[name]
    return TOLERANCES.get(name, EXACT)


def _dtype_name(dtype: Any) -> str:
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind in "fc" or dtype.name == "bfloat16"


def _wide(array: np.ndarray) -> np.ndarray:
    return array.astype(np.complex128 if array.dtype.kind == "c" else np.float64)


def _errors(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| elementwise in float64, 0 where both are NaN (or equal infinities), inf where
    only one is NaN."""
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(a - b)
    both_nan = np.isnan(a) & np.isnan(b)
    same_inf = np.isinf(a) & (a == b)
    diff = np.where(both_nan | same_inf, 0.0, diff)
    return np.where(np.isnan(diff), np.inf, diff)


def _rms(array: np.ndarray) -> float:
    finite = np.abs(array[np.isfinite(array)])
    return float(np.sqrt(np.mean(finite.astype(np.float64) ** 2))) if finite.size else 0.0


def _rmse(errors: np.ndarray) -> float:
    return float(np.sqrt(np.mean(errors**2))) if errors.size else 0.0


@dataclass(frozen=True)
class Difference:
    """Compiled against eager (and both against float64) for one array."""

    shape: tuple[int, ...]
    dtype: str
    max_abs: float  # max |compiled - eager|
    max_rel: float  # max |c - e| / max(|c|, |e|, 1e-3 * rms): 1 is 100 %
    magnitude: float  # max |eager| (finite elements)
    agree: bool
    eager_error: float | None = None  # max |eager - f64|
    compiled_error: float | None = None
    eager_rmse: float | None = None
    compiled_rmse: float | None = None
    passed: bool = True
    closer: str = "same"  # "compiled", "eager" or "same": which is nearer float64
    tolerance: Tolerance = EXACT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def difference(
    eager: Any,
    compiled: Any,
    reference: Any | None = None,
    *,
    overrides: dict[str, Tolerance] | None = None,
) -> Difference:
    """Compares ``compiled`` with ``eager`` at the dtype's tolerance and, given the float64
    ``reference``, applies the float64 rule (module docstring)."""
    e, c = as_numpy(eager), as_numpy(compiled)
    tol = tolerance_for(e.dtype, overrides)
    shape, dtype = tuple(e.shape), _dtype_name(e.dtype)
    if c.shape != e.shape:
        return Difference(shape, dtype, np.inf, np.inf, 0.0, False, passed=False, tolerance=tol)
    if not _is_float(e.dtype):  # integers, booleans, key data: exact equality
        same = bool(np.array_equal(e, c))
        return Difference(shape, dtype, 0.0 if same else np.inf, 0.0, 0.0, same, passed=same)
    e64, c64 = _wide(e), _wide(c)
    errors = _errors(c64, e64)
    scale = _rms(e64)
    magnitude = float(np.max(np.abs(e64[np.isfinite(e64)]))) if np.isfinite(e64).any() else 0.0
    both = np.maximum(np.abs(np.nan_to_num(e64)), np.abs(np.nan_to_num(c64)))
    floor = max(1e-3 * max(scale, _rms(c64)), np.finfo(np.float64).tiny)
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = errors / np.maximum(both, floor)
    agree = bool(np.all(errors <= tol.rtol * np.abs(np.nan_to_num(e64)) + tol.atol * scale))
    max_abs = float(errors.max()) if errors.size else 0.0
    max_rel = float(np.nan_to_num(rel, nan=np.inf).max()) if rel.size else 0.0
    base = Difference(shape, dtype, max_abs, max_rel, magnitude, agree, tolerance=tol)
    if reference is None:
        return base if agree else _replace(base, passed=False)
    r = _wide(as_numpy(reference))
    eager_errors, compiled_errors = _errors(e64, r), _errors(c64, r)
    eager_rmse, compiled_rmse = _rmse(eager_errors), _rmse(compiled_errors)
    if np.isclose(eager_rmse, compiled_rmse, rtol=1e-6, atol=0.0):
        closer = "same"
    else:
        closer = "compiled" if compiled_rmse < eager_rmse else "eager"
    multiplier = tol.small_multiplier if e.size < SMALL_LEAF else tol.multiplier
    passed = agree or compiled_rmse <= multiplier * eager_rmse + tol.rtol / 10 * _rms(r)
    return _replace(
        base,
        eager_error=float(eager_errors.max()) if eager_errors.size else 0.0,
        compiled_error=float(compiled_errors.max()) if compiled_errors.size else 0.0,
        eager_rmse=eager_rmse,
        compiled_rmse=compiled_rmse,
        passed=bool(passed),
        closer=closer,
    )


def _replace(d: Difference, **changes: Any) -> Difference:
    import dataclasses

    return dataclasses.replace(d, **changes)


def fmt(value: float | None) -> str:
    """A difference as a person reads it: 0, 3.1e-07, 0.25, inf."""
    if value is None:
        return "—"
    if value == 0:
        return "0"
    if not np.isfinite(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.2g}" if 1e-3 <= abs(value) < 1e4 else f"{value:.1e}"
