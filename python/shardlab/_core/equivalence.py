"""Whether two runs compute the same program: a sharded, pipelined, converted or
rematerialised program against the plain one, with a tolerance derived, not picked.

Two correct implementations of one program differ only in the order of their roundings: a
sharded matmul adds its partial sums in another order, a pipeline adds microbatch gradients
one at a time, XLA:CPU splits a reduction across however many threads are free. Which element
lands furthest off changes from run to run, so a fixed per-element ``rtol``/``atol`` fails now
and then on a correct program (a busy host is enough) while a loose one hides real bugs.

The rule: every floating leaf must satisfy

    ||actual - expected||_2  <=  2 * gamma(n, lambda) * max(||actual||_2, ||expected||_2)

where ``gamma(n, lambda) = exp(lambda * sqrt(n) * u + n * u**2 / (1 - u)) - 1`` is Higham and
Mary's probabilistic rounding-error bound ("A new approach to probabilistic rounding error
analysis", SIAM J. Sci. Comput. 41(5), 2019), ``u`` the unit roundoff of the leaf's dtype,
``n`` the number of roundings the program can chain (:func:`rounding_steps`: every
reduction counts its length, every other equation one, a scan body its trip count, a while
body once: its trips are not in the jaxpr, and both runs take them in the same order), and
``lambda = sqrt(2 * ln(2 n / delta))`` with ``delta`` = 1e-6, so that the bound fails with
probability at most ``delta`` for each side. The factor 2 is the two sides' errors added.
The theorem bounds an error relative to the magnitudes of the terms summed; the rule takes
the leaf's norm for them, which holds unless a whole leaf is cancellation (on the pipeline
tests the differences observed sit 100-200x under the bound).

Shapes, dtypes and the positions of NaN and infinity must match exactly; integer, boolean and
PRNG-key leaves must be equal. A real fault (a wrong layout, a dropped microbatch, a stale
carry) moves a leaf by a fraction of its norm, orders of magnitude above the bound
(``tests/core/test_equivalence.py`` plants each).

``engine/compare/numerics.py`` answers a different question, for the compare tool: which of
two runs is closer to a float64 run of the same cell. This module needs no third run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core

from shardlab._core.trees import as_numpy, dynamic_part

__all__ = ["Mismatch", "assert_same_program", "rounding_steps", "same_program", "tolerance"]

FAILURE_PROBABILITY = 1e-6
# Reductions: how many terms one output element adds (the roundings it chains).
_SUMS = {"reduce_sum", "reduce_prod", "cumsum", "cumprod", "cumlogsumexp"}
_COLLECTIVE_SUMS = {"psum", "psum_scatter", "reduce_scatter", "all_reduce"}


def rounding_steps(fn: Any, *args: Any, **kwargs: Any) -> int:
    """The roundings ``fn(*args)`` can chain, counted on its jaxpr: an upper bound on the
    roundings on any path from an input to an output (each equation counted once, a
    reduction by its length, a scan body by its trip count, a while body once).

    Leaves that are not arrays (an equinox module's functions, strings, Python numbers) are
    closed over, as ``jax.jit`` would treat them as static; only array outputs are traced.
    """
    dynamic, arrays = dynamic_part(fn, args, kwargs)

    def array_outputs(*values: Any) -> list[Any]:
        return [x for x in jax.tree.leaves(dynamic(*values)) if isinstance(x, jax.Array)]

    closed = jax.make_jaxpr(array_outputs)(*arrays)
    return max(1, _steps(closed.jaxpr))


def _steps(jaxpr: Any) -> int:
    total = 0
    for eqn in jaxpr.eqns:
        inner = list(jex_core.jaxprs_in_params(eqn.params))
        name = eqn.primitive.name
        if not inner:
            total += _reduction_length(eqn)
        elif name == "cond":  # one branch runs
            total += max(_steps(j) for j in inner)
        else:  # a call runs its body once, a scan ``length`` times (a while loop: once)
            trips = int(eqn.params.get("length", 1)) if name == "scan" else 1
            total += trips * sum(_steps(j) for j in inner)
    return total


def _reduction_length(eqn: Any) -> int:
    name, params = eqn.primitive.name, eqn.params
    first = getattr(eqn.invars[0].aval, "shape", ()) if eqn.invars else ()
    shape = [int(n) for n in first]
    if name == "dot_general":
        (contracting, _), _ = params["dimension_numbers"]
        return max(1, math.prod([shape[d] for d in contracting]))
    if name == "conv_general_dilated":
        rhs = [int(n) for n in eqn.invars[1].aval.shape]
        out_feature_dim = params["dimension_numbers"].rhs_spec[0]
        return max(1, math.prod(rhs) // max(1, rhs[out_feature_dim]))
    if name in _SUMS:
        axes = params.get("axes", (params.get("axis", 0),))
        return max(1, math.prod([shape[a] for a in axes if a < len(shape)]))
    if name in _COLLECTIVE_SUMS:
        return jax.device_count()  # the axis's size is not in the jaxpr; at most every device
    return 1


@dataclass(frozen=True)
class Mismatch:
    """One leaf that differs: where, by how much, and what was allowed."""

    path: str
    reason: str
    error: float = math.inf  # ||actual - expected|| / max(||actual||, ||expected||)
    allowed: float = 0.0

    def __str__(self) -> str:
        if math.isfinite(self.error):
            return (
                f"{self.path}: {self.reason}: relative error {self.error:.3g} > "
                f"allowed {self.allowed:.3g}"
            )
        return f"{self.path}: {self.reason}"


def unit_roundoff(dtype: Any) -> float:
    """Half the machine epsilon of a floating dtype (bfloat16's 2**-8 included)."""
    return float(jax.numpy.finfo(dtype).eps) / 2


def tolerance(dtype: Any, steps: int, *, failure_probability: float = FAILURE_PROBABILITY) -> float:
    """The relative 2-norm difference two correct runs of a program of ``steps`` roundings
    may show in ``dtype`` (module docstring)."""
    u, n = unit_roundoff(dtype), max(1, int(steps))
    lam = math.sqrt(2 * math.log(2 * n / failure_probability))
    return 2 * math.expm1(lam * math.sqrt(n) * u + n * u * u / (1 - u))


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind in "fc" or dtype.name in ("bfloat16", "float16")


def same_program(
    actual: Any,
    expected: Any,
    *,
    steps: int | None = None,
    fn: Any = None,
    args: tuple[Any, ...] = (),
) -> list[Mismatch]:
    """The leaves where ``actual`` and ``expected`` (pytrees of the same structure) differ
    by more than reordered roundings explain; empty when they are the same program's results.

    ``steps`` is the number of roundings the program chains; given ``fn`` and ``args`` instead,
    it is counted on ``fn``'s jaxpr (:func:`rounding_steps`).
    """
    if steps is None:
        if fn is None:
            raise TypeError("same_program needs steps= or fn= (with args=) to derive its tolerance")
        steps = rounding_steps(fn, *args)
    got, got_tree = jax.tree_util.tree_flatten_with_path(actual)
    want, want_tree = jax.tree_util.tree_flatten_with_path(expected)
    if got_tree != want_tree:
        return [Mismatch("<tree>", f"structures differ: {got_tree} against {want_tree}")]
    out: list[Mismatch] = []
    for (path, a), (_, e) in zip(got, want, strict=True):
        name = jax.tree_util.keystr(path) or "<leaf>"
        miss = _leaf(name, as_numpy(a), as_numpy(e), steps)
        if miss is not None:
            out.append(miss)
    return out


def _leaf(name: str, a: np.ndarray, e: np.ndarray, steps: int) -> Mismatch | None:
    if a.shape != e.shape:
        return Mismatch(name, f"shape {a.shape} against {e.shape}")
    if a.dtype != e.dtype:
        return Mismatch(name, f"dtype {a.dtype} against {e.dtype}")
    if not _is_float(e.dtype):
        return None if np.array_equal(a, e) else Mismatch(name, f"{e.dtype} values differ")
    a64, e64 = a.astype(np.complex128 if a.dtype.kind == "c" else np.float64), None
    e64 = e.astype(a64.dtype)
    finite_a, finite_e = np.isfinite(a64), np.isfinite(e64)
    if not np.array_equal(finite_a, finite_e) or not np.array_equal(
        a64[~finite_a], e64[~finite_e], equal_nan=True
    ):
        return Mismatch(name, "NaN or infinity at different positions")
    diff = float(np.linalg.norm((a64 - e64)[finite_e]))
    scale = max(float(np.linalg.norm(a64[finite_a])), float(np.linalg.norm(e64[finite_e])))
    allowed = tolerance(e.dtype, steps)
    if diff == 0.0 or diff <= allowed * scale:
        return None
    return Mismatch(name, "values differ", diff / scale if scale else math.inf, allowed)


def assert_same_program(
    actual: Any,
    expected: Any,
    *,
    steps: int | None = None,
    fn: Any = None,
    args: tuple[Any, ...] = (),
) -> None:
    """Raises ``AssertionError`` naming every leaf :func:`same_program` finds different."""
    misses = same_program(actual, expected, steps=steps, fn=fn, args=args)
    if misses:
        lines = "\n  ".join(str(m) for m in misses[:20])
        more = f"\n  … and {len(misses) - 20} more" if len(misses) > 20 else ""
        raise AssertionError(f"{len(misses)} leaves differ:\n  {lines}{more}")
