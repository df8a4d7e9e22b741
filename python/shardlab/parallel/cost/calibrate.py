"""``shardlab.calibrate``: the cost model's figures measured on the devices at hand.

What is measured, all devices busy at once as in a step (so devices that share a host's
cores, like simulated CPU devices, are measured as they share them):

- per mesh axis and collective kind (all-reduce ``psum``, all-gather, reduce-scatter
  ``psum_scatter``, all-to-all, collective-permute ``ppermute``, each in a ``shard_map``):
  alpha, the marginal time of one more small (16 KiB) collective in a chain of them in one
  program; beta, by least squares on relative error from the median times over a range of
  sizes, less a program that does nothing, less alpha (``alpha + beta · wire bytes``,
  ``profiles.wire_bytes``), residuals kept;
- achieved memory bandwidth: an elementwise ``2 x + 1`` split over every device, the slope
  of time against per-device bytes read and written;
- achieved matmul throughput and overlap: batched matmuls split over every device, square
  ones (compute-bound) and skinny ones near the ridge point, fitted together as
  ``max(c, m) + (1 - overlap) · min(c, m)`` (``c`` flops over the rate, ``m`` bytes over the
  bandwidth): how much of a matmul's weight stream its compute hides (a CPU's cores stall
  on it, a GPU's hide it);
- per-operand latency of a combined all-reduce: a tuple ``psum`` of 8 small arrays against
  one ``psum`` of their total, as a share of the all-reduce latency (XLA:CPU runs a
  tuple's operands one by one; NCCL groups them);
- per-operation overhead: the marginal time of one more small matmul chained in a program;
  and a program's fixed cost (a tiny jitted op), which is not charged per operation.

Every figure is the median of repeated runs after a warm-up run (compilation excluded),
each ended by ``block_until_ready``. The result is a ``DeviceProfile`` whose
``calibration`` says when, on what and how; ``save_profile``/``load_profile`` keep it as JSON
(read with ``json`` and checked field by field, never evaluated; ``profile_file.py``).
"""

from __future__ import annotations

import datetime
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from shardlab.parallel.cost.compilers import compiler_of
from shardlab.parallel.cost.profile_file import FORMAT as FORMAT
from shardlab.parallel.cost.profile_file import VERSION as VERSION
from shardlab.parallel.cost.profile_file import (
    ProfileFileError,
    load_profile,
    profile_from_dict,
    save_profile,
)
from shardlab.parallel.cost.profiles import (
    NARROW_FEATURES,
    Calibration,
    CollectiveFit,
    DeviceProfile,
    register_profile,
    ring_steps,
    wire_bytes,
)
from shardlab.parallel.display import progress_bar
from shardlab.parallel.records import COLLECTIVE_KINDS

# (the profile's file is profile_file.py; its names stay importable from here)
__all__ = ["ProfileFileError", "calibrate", "load_profile", "profile_from_dict", "save_profile"]

_F32 = 4
_CHAIN = 9  # collectives in the chain that measures a collective's latency
_LATENCY_RUNS = 15  # rounds, at least, of the programs compared within each round
_NOISE_FLOOR = 50e-6  # seconds: below this, a difference of two medians is mostly noise


# Quick: 3 sizes per collective (16 KiB – 8 MiB of result per device, the range of a small
# model's gradients) and 9 runs; full: 6 sizes and 15 runs. Figures taken as differences
# or ratios within a round (latencies, operand share, convolutions) take at least
# ``_LATENCY_RUNS`` rounds either way.
_PLANS = {
    True: {"sizes": (16 << 10, 512 << 10, 8 << 20), "runs": 9, "matmul": (256, 384, 512)},
    False: {
        "sizes": (4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20),
        "runs": 15,
        "matmul": (256, 384, 512, 768),
    },
}
# Seconds per compile-and-measure of one figure on 8 simulated CPU devices (for the estimate;
# 2026-12-06, before the figures compared within rounds took 15 rounds: quick 7-12 s for 60
# figures, now 10-12 s; full 17.7 s for 106, where 15 runs was already the count).
_SECONDS_PER_FIGURE = {True: 0.12, False: 0.17}


def _median_seconds(f: Callable[..., Any], x: Any, runs: int) -> float:
    """Median wall seconds of ``f(x)`` over ``runs`` runs after one warm-up run."""
    import jax

    jax.block_until_ready(f(x))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(f(x))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _interleaved_times(
    cases: Sequence[tuple[Callable[..., Any], Any]], runs: int
) -> list[list[float]]:
    """Wall seconds of each ``f(x)`` per round, timed in rounds that run every case once
    (after one warm-up run each), so a burst of other work on the host spreads over all
    cases instead of skewing one."""
    import jax

    for f, x in cases:
        jax.block_until_ready(f(x))
    times: list[list[float]] = [[] for _ in cases]
    for _ in range(runs):
        for i, (f, x) in enumerate(cases):
            start = time.perf_counter()
            jax.block_until_ready(f(x))
            times[i].append(time.perf_counter() - start)
    return times


def _interleaved_medians(cases: Sequence[tuple[Callable[..., Any], Any]], runs: int) -> list[float]:
    """Median wall seconds of each ``f(x)`` over ``_interleaved_times``' rounds."""
    return [float(np.median(t)) for t in _interleaved_times(cases, runs)]


def _paired_difference(long: Sequence[float], short: Sequence[float]) -> float:
    """The median over rounds of ``long - short`` timed in the same round: a burst on the
    host that hits some rounds moves it less than it moves a difference of medians."""
    return float(np.median(np.subtract(long, short)))


def _fit_line(
    xs: Sequence[float], ys: Sequence[float], *, intercept: bool = True
) -> tuple[float, float, float]:
    """Weighted least squares ``y = a + b x`` (``a = 0`` without ``intercept``) minimising
    the *relative* errors, so small and large sizes count alike; ``a >= 0`` and ``b > 0``.
    Returns ``(a, b, residual)``, the residual the RMS relative error of the fit."""
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    # Relative weights, floored: a sample near zero (a collective as cheap as the empty
    # program it is measured against) is timer noise, not a figure to fit exactly.
    w = 1.0 / np.maximum(y, max(_NOISE_FLOOR, 0.1 * float(y.max())))
    a, b = 0.0, 0.0
    if intercept and len(x) >= 2 and np.ptp(x) > 0:
        design = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
        (a, b), *_ = np.linalg.lstsq(design, y * w, rcond=None)
    if not intercept or a < 0:  # no negative latency: through the origin
        a, b = 0.0, float(np.sum(w * w * x * y) / max(np.sum(w * w * x * x), 1e-300))
    if b <= 0:  # time did not grow with size (noise): latency only, a tiny slope
        a, b = float(np.median(y)), 1e-15
    return float(a), float(b), _relative_rms(a + b * x, y)


def _relative_rms(predicted: Any, measured: Any) -> float:
    """RMS of the relative errors, each over the measured time (floored as the fit's
    weights are)."""
    y = np.asarray(measured, float)
    floor = max(_NOISE_FLOOR, 0.1 * float(y.max()))
    return float(np.sqrt(np.mean(((np.asarray(predicted) - y) / np.maximum(y, floor)) ** 2)))


def _collective_body(kind: str, axis: str, n: int) -> Callable[[Any], Any]:
    from jax import lax

    if kind == "all-reduce":
        return lambda v: lax.psum(v, axis)
    if kind == "all-gather":
        return lambda v: lax.all_gather(v, axis, tiled=True)
    if kind == "reduce-scatter":
        return lambda v: lax.psum_scatter(v, axis, tiled=True)
    if kind == "all-to-all":
        return lambda v: lax.all_to_all(v.reshape(n, -1), axis, 0, 0, tiled=True).reshape(-1)
    if kind == "collective-permute":
        return lambda v: lax.ppermute(v, axis, [(i, (i + 1) % n) for i in range(n)])
    raise ValueError(f"unknown collective kind {kind!r}; known: {', '.join(COLLECTIVE_KINDS)}")


def _chain_body(kind: str, axis: str, n: int, length: int) -> Callable[[Any], Any]:
    """``length`` collectives of ``kind`` one after the other, each on the previous one's
    result brought back to the input's shape (by cheap local ops)."""
    import jax.numpy as jnp

    one = _collective_body(kind, axis, n)
    weights = jnp.arange(1.0, n + 1.0) / n

    def run(v: Any) -> Any:
        for _ in range(length):
            out = one(v)
            if kind == "all-gather":  # back to one shard: a weighted sum of the n parts
                out = (out.reshape(n, -1) * weights[:, None]).sum(0)
            elif kind == "reduce-scatter":
                out = jnp.tile(out, n)
            v = out * 0.5
        return v

    return run


def _local_elements(kind: str, result_bytes: int, n: int) -> int:
    """Per-device input elements for a collective whose larger buffer per device (the
    result; the input for a reduce-scatter) is ``result_bytes``."""
    elements = max(result_bytes // _F32, n)
    if kind == "all-gather":
        return max(elements // n, 1)
    if kind == "reduce-scatter":  # the input is the larger buffer: ``size`` is its bytes
        return (elements // n) * n
    return (elements // n) * n  # all-to-all splits it in n


def _default_meshes(devices: Sequence[Any]) -> list[Any]:
    """All devices on one axis, and for 4 or more an ``2 × n/2`` mesh (groups of 2 and n/2),
    so the fits cover the group sizes common meshes have."""
    from jax.sharding import Mesh

    n = len(devices)
    meshes = [Mesh(np.array(devices).reshape(n), ("all",))]
    if n >= 4 and n % 2 == 0:
        meshes.append(Mesh(np.array(devices).reshape(2, n // 2), ("pairs", f"groups{n // 2}")))
    return meshes


def _axes_to_measure(meshes: Sequence[Any]) -> list[tuple[Any, str, int]]:
    out, seen = [], set()
    for mesh in meshes:
        for name, size in dict(mesh.shape).items():
            if size > 1 and (name, size) not in seen:
                seen.add((name, size))
                out.append((mesh, str(name), int(size)))
    return out


class _Progress:
    def __init__(self, report: Callable[[float, str], None], total: int) -> None:
        self.report, self.total, self.done = report, max(total, 1), 0

    def step(self, message: str) -> None:
        self.done += 1
        self.report(min(self.done / self.total, 0.99), message)


def _measure_collectives(
    axes: Sequence[tuple[Any, str, int]],
    sizes: Sequence[int],
    runs: int,
    progress: _Progress,
) -> list[CollectiveFit]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    fits = []
    for mesh, axis, n in axes:
        every = tuple(mesh.axis_names)
        spec = P(every)
        # The program's own cost, timed in the same rounds and subtracted: what is left is
        # the collective's (in a step, collectives share one program). It returns one
        # element per device: the collective's result buffer is written by the collective
        # (an identity program would copy the input and cancel that write out).
        nothing = jax.jit(
            jax.shard_map(lambda v: v[:1] + 0.0, mesh=mesh, in_specs=spec, out_specs=spec)
        )
        for kind in COLLECTIVE_KINDS:
            body = _collective_body(kind, axis, n)
            mapped = jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec)
            f = jax.jit(mapped)
            cases, wires, measured = [], [], []
            for size in sizes:
                local = _local_elements(kind, size, n)
                x = jax.device_put(
                    jnp.ones((local * mesh.size,), jnp.float32), NamedSharding(mesh, spec)
                )
                result_bytes = math.prod(jax.eval_shape(mapped, x).shape) // mesh.size * _F32
                cases.append((f, x))
                wires.append(wire_bytes(kind, result_bytes, n))
                measured.append(result_bytes)
            # The latency: the marginal time of one more small collective in a chain in
            # one program (a difference of two programs' medians over many collectives,
            # steadier than one small collective against an empty program).
            chain = jax.jit(
                jax.shard_map(
                    _chain_body(kind, axis, n, _CHAIN), mesh=mesh, in_specs=spec, out_specs=spec
                )
            )
            *rounds, empty, long = _interleaved_times(
                [*cases, (nothing, cases[0][1]), (chain, cases[0][1])], max(runs, _LATENCY_RUNS)
            )
            base = float(np.median(empty))
            seconds = [max(float(np.median(t)) - base, 1e-6) for t in rounds]
            del cases, chain
            progress.step(f"{kind} over {axis} ({n} devices)")
            # the chain of one is the smallest size's program
            alpha = max(_paired_difference(long, rounds[0]) / (_CHAIN - 1), 0.0)
            _, beta, _ = _fit_line(wires, [max(t - alpha, 1e-6) for t in seconds], intercept=False)
            residual = _relative_rms(alpha + beta * np.asarray(wires), seconds)
            fits.append(
                CollectiveFit(
                    kind=kind,
                    axis=axis,
                    group_size=n,
                    alpha=alpha,
                    beta=beta,
                    residual=residual,
                    result_bytes=tuple(measured),
                    seconds=tuple(seconds),
                )
            )
    return fits


_OPERANDS = 8  # arrays in the tuple ``psum`` that measures a combined all-reduce's operands


def _measure_operand_latency(devices: Sequence[Any], runs: int, progress: _Progress) -> float:
    """What each operand past the first of a combined all-reduce costs, as a share of one
    all-reduce's latency (0 to 1): a tuple ``psum`` of ``_OPERANDS`` small arrays over all
    devices against a ``psum`` of one array of their total size (the same bytes, one
    operand), per extra operand, over the latency of one more ``psum`` in a chain, all
    timed in the same interleaved rounds (a ratio of figures taken apart would carry the
    host's drift between them)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    n = len(devices)
    if n < 2:
        progress.step("combined all-reduce operands")
        return 0.0
    mesh = Mesh(np.array(devices).reshape(n), ("all",))
    spec = P("all")
    split = NamedSharding(mesh, spec)
    elements = 1024  # per operand per device: 4 KiB, latency-bound

    def program(count: int) -> Callable[[Any], Any]:
        def body(v: Any) -> Any:
            parts = jax.lax.psum(tuple(v * (i + 1.0) for i in range(count)), "all")
            return sum(p[:1] for p in parts)

        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))

    def chain(length: int) -> Callable[[Any], Any]:
        body = _chain_body("all-reduce", "all", n, length)
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))

    small = jax.device_put(jnp.ones((elements * n,), jnp.float32), split)
    whole = jax.device_put(jnp.ones((elements * _OPERANDS * n,), jnp.float32), split)
    tuple_time, one_time, short, long = _interleaved_times(
        [
            (program(_OPERANDS), small),
            (program(1), whole),
            (chain(1), small),
            (chain(_CHAIN), small),
        ],
        max(runs, _LATENCY_RUNS),
    )
    progress.step("combined all-reduce operands")
    latency = _paired_difference(long, short) / (_CHAIN - 1)
    if latency <= 0:
        return 0.0
    extra = _paired_difference(tuple_time, one_time) / (_OPERANDS - 1)
    return float(min(max(extra / latency, 0.0), 1.0))


def _measure_convolutions(
    devices: Sequence[Any], runs: int, dispatch: float, progress: _Progress
) -> tuple[float, float]:
    """``(narrow_convolution, feature_overhead)``: three convolutions of the same flops,
    every device busy at once, less a program's launch, timed in the same rounds: a narrow
    one (``NARROW_FEATURES`` input and output features per device), a wide one (twice the
    features) and a thin one (four times the input features, a quarter of the output
    features). Narrow against wide is ``narrow_convolution`` (at least 1); thin against
    wide, ``(1 + 4a) / (1 + a/2)``, gives ``feature_overhead`` ``a`` (0 to 4)."""
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    n = len(devices)
    mesh = Mesh(np.array(devices).reshape(n), ("all",))
    split = NamedSharding(mesh, P("all"))
    whole = NamedSharding(mesh, P())
    narrow = NARROW_FEATURES

    def case(batch: int, features_in: int, features_out: int) -> tuple[Any, Any]:
        kernel = _filled((3, 3, features_in, features_out), whole)
        conv = jax.jit(
            lambda x, k=kernel: jax.lax.conv_general_dilated(
                x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
            ),
            out_shardings=split,
        )
        return conv, _filled((batch * n, 8, 8, features_in), split)

    slow, fast, thin = (
        np.maximum(np.asarray(t) - dispatch, 1e-6)
        for t in _interleaved_times(
            [
                case(128, narrow, narrow),
                case(32, 2 * narrow, 2 * narrow),
                case(128, 4 * narrow, narrow // 4),
            ],
            max(runs, _LATENCY_RUNS),
        )
    )
    progress.step("convolutions")
    # ratios within each round, then their median (as ``_paired_difference``)
    narrow_factor = max(float(np.median(slow / fast)), 1.0)
    ratio = min(max(float(np.median(thin / fast)), 1.0), 7.0)
    overhead = min((ratio - 1.0) / (4.0 - ratio / 2.0), 4.0)
    return float(narrow_factor), float(overhead)


def _measure_roofline(
    devices: Sequence[Any], dims: Sequence[int], runs: int, dispatch: float, progress: _Progress
) -> tuple[float, float, float, float, float]:
    """``(flop/s, residual, bytes/s, residual, overlap)`` per device, every device busy at
    once. The memory bandwidth is the slope of a stream's time against its bytes. The matmul
    rate and how much of a matmul's memory traffic its compute hides (``overlap``) are fitted
    together, less a program's launch (``dispatch``), on square batched matmuls
    (compute-bound) and skinny ones near the roofline's ridge (a few rows against a weight
    that streams from memory, as a data-parallel layer's is)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    n = len(devices)
    mesh = Mesh(np.array(devices).reshape(n), ("all",))
    split = NamedSharding(mesh, P("all"))
    stream = jax.jit(lambda v: v * 2.0 + 1.0)
    # Up to 16 MiB per device: the working set of all devices then exceeds the host's
    # caches as a training step's does, and the slope is the memory (DRAM) bandwidth.
    streamed = (2 << 20, 8 << 20, 16 << 20)
    cases = [
        (stream, jax.device_put(jnp.ones((size // _F32 * n,), jnp.float32), split))
        for size in streamed
    ]
    moved = [2.0 * size for size in streamed]  # read and written
    seconds = [max(t, 1e-6) for t in _interleaved_medians(cases, runs)]
    del cases
    progress.step("memory bandwidth")
    _, byte_slope, byte_residual = _fit_line(moved, seconds)
    bandwidth = 1.0 / byte_slope

    batch = 2  # matmuls per device
    matmul = jax.jit(lambda a, b: jnp.einsum("bij,bjk->bik", a, b))
    shapes = [(k, k, k) for k in dims]  # (rows, contracted, columns) of each matmul
    square = _interleaved_medians(
        [(lambda a: matmul(a, a), _filled((batch * n, k, k), split)) for k, _, _ in shapes], runs
    )
    # Skinny: rows about the ridge point's intensity (a [m, k] x [k, k] f32 matmul does
    # about m / 2 flops per byte), the weight large enough to stream from memory.
    _, through_origin, _ = _fit_line(
        [2.0 * batch * k**3 for k in dims], [max(t, 1e-6) for t in square], intercept=False
    )
    ridge = (1.0 / through_origin) / bandwidth
    k = 1024 if devices[0].platform == "cpu" else 4096
    rows = sorted({int(min(max(8 * round(r * ridge / 8), 8), k)) for r in (1.0, 2.0, 4.0)})
    weight = _filled((batch * n, k, k), split)
    skinny = _interleaved_medians(
        [(lambda a, w=weight: matmul(a, w), _filled((batch * n, m, k), split)) for m in rows],
        runs,
    )
    del weight
    shapes += [(m, k, k) for m in rows]
    progress.step("matmul throughput")
    flops = np.array([2.0 * batch * m * kk * c for m, kk, c in shapes])
    moved_bytes = np.array([batch * _F32 * (m * kk + kk * c + m * c) for m, kk, c in shapes])
    seconds = np.maximum(np.array(square + skinny) - dispatch, 1e-6)
    rate, overlap, flop_residual = _fit_roofline(flops, moved_bytes / bandwidth, seconds)
    return rate, flop_residual, bandwidth, byte_residual, overlap


def _filled(shape: tuple[int, ...], sharding: Any) -> Any:
    import jax
    import jax.numpy as jnp

    return jax.device_put(jnp.full(shape, 0.5, jnp.float32), sharding)


def _fit_roofline(flops: Any, memory_seconds: Any, seconds: Any) -> tuple[float, float, float]:
    """``(flop/s, overlap, residual)`` minimising the relative error of
    ``max(c, m) + (1 - overlap) · min(c, m)``, ``c = flops / rate``, ``m`` the memory time
    (``DeviceProfile.op_time``): a grid over overlap in [0, 1], the rate solved per overlap
    by a log-spaced search around the rate through the origin."""
    f, m, t = (np.asarray(a, float) for a in (flops, memory_seconds, seconds))
    base = float(np.sum(f * t / t**2) / np.sum(f * f / t**2))  # seconds per flop
    best = (math.inf, 1.0, 1.0 / base)
    for overlap in np.linspace(0.0, 1.0, 21):
        for scale in np.geomspace(0.25, 2.0, 121):
            c = f * base * scale
            predicted = np.maximum(c, m) + (1.0 - overlap) * np.minimum(c, m)
            error = float(np.sqrt(np.mean(((predicted - t) / t) ** 2)))
            if error < best[0] - 1e-12:
                best = (error, float(overlap), 1.0 / (base * scale))
    error, overlap, rate = best
    return rate, overlap, error


def _measure_overheads(
    devices: Sequence[Any], runs: int, progress: _Progress
) -> tuple[float, float]:
    """``(program seconds, per-operation seconds)``: a tiny jitted op on every device, and
    the marginal cost of one more small matmul in a chain (XLA does not fuse matmuls)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    n = len(devices)
    mesh = Mesh(np.array(devices).reshape(n), ("all",))
    x = jax.device_put(jnp.ones((n, 8, 8), jnp.float32), NamedSharding(mesh, P("all")))
    tiny = jax.jit(lambda v: v + 1.0)

    def chain(length: int) -> Callable[[Any], Any]:
        def run(v: Any) -> Any:
            for _ in range(length):
                v = jnp.einsum("bij,bjk->bik", v, v) * 0.125
            return v

        return jax.jit(run)

    short, long = 2, 34
    t_tiny, t_short, t_long = _interleaved_medians(
        [(tiny, x), (chain(short), x), (chain(long), x)], max(runs, 9)
    )
    progress.step("per-operation overhead")
    return t_tiny, max((t_long - t_short) / (long - short), 0.0)


def estimate_seconds(mesh: Any = None, *, quick: bool = True) -> float:
    """A rough wall-time estimate of ``calibrate(mesh, quick=quick)`` here."""
    import jax

    devices = list(mesh.devices.flat) if mesh is not None else jax.devices()
    meshes = [mesh] if mesh is not None else _default_meshes(devices)
    plan = _PLANS[quick]
    figures = len(_axes_to_measure(meshes)) * len(COLLECTIVE_KINDS) * len(plan["sizes"])
    figures += len(plan["matmul"]) + 14
    scale = max(len(devices) / 8, 1.0) if jax.devices()[0].platform == "cpu" else 1.0
    return figures * _SECONDS_PER_FIGURE[quick] * scale


def calibrate(
    mesh: Any = None,
    *,
    quick: bool = True,
    progress: Callable[[float, str], None] | None = None,
) -> DeviceProfile:
    """Measure the current devices and return a calibrated ``DeviceProfile``.

    Args:
        mesh: a ``jax.sharding.Mesh`` whose axes to measure collectives along (its devices);
            ``None``: all devices on one axis plus a ``2 × n/2`` mesh, so groups of n, 2
            and n/2 devices are covered.
        quick: 3 sizes per collective (16 KiB – 8 MiB) and 9 runs per figure (under 30 s
            on 8 simulated CPU devices); ``False``: 6 sizes (4 KiB – 16 MiB) and 15 runs,
            and the estimated time is said first.
        progress: ``callback(fraction, message)``; default: the notebook's progress bar.

    Returns:
        A profile usable wherever ``device=`` is accepted (``search``, ``predict``, the
        editor, the explorer, the timeline); it is registered by name, so plans priced with
        it resolve back to it, and ``profile.describe()`` says when and where it was taken.
    """
    import jax

    if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
        raise ValueError(
            f"calibrate(mesh=...) takes a jax.sharding.Mesh (shardlab.mesh(...)) or None, "
            f"got {type(mesh).__name__}"
        )
    if not quick:
        print(
            f"shardlab.calibrate(quick=False): about {estimate_seconds(mesh, quick=False):.0f} s "
            "(quick=True takes a few seconds)",
            flush=True,
        )
    if progress is not None:
        return _calibrate(mesh, quick, progress)
    with progress_bar("calibrate") as bar:
        profile = _calibrate(mesh, quick, bar)
        c = profile.calibration
        assert c is not None
        bar.done(f"done: {c.devices_text} in {c.seconds:.1f} s")
        return profile


def _calibrate(mesh: Any, quick: bool, report: Callable[[float, str], None]) -> DeviceProfile:
    import jax

    start = time.perf_counter()
    plan = _PLANS[quick]
    runs = int(plan["runs"])
    devices = list(mesh.devices.flat) if mesh is not None else jax.devices()
    meshes = [mesh] if mesh is not None else _default_meshes(devices)
    axes = _axes_to_measure(meshes)
    total = len(axes) * len(COLLECTIVE_KINDS) + 5
    steps = _Progress(report, total)
    report(0.0, f"calibrating {len(devices)} devices")
    dispatch, per_op = _measure_overheads(devices, runs, steps)
    fits = _measure_collectives(axes, plan["sizes"], runs, steps)
    operand_latency = _measure_operand_latency(devices, runs, steps)
    narrow_convolution, feature_overhead = _measure_convolutions(devices, runs, dispatch, steps)
    flops, flop_res, bandwidth, byte_res, overlap = _measure_roofline(
        devices, plan["matmul"], runs, dispatch, steps
    )
    first = devices[0]
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    mesh_shape = {str(k): int(v) for m in meshes for k, v in dict(m.shape).items()}
    calibration = Calibration(
        date=now.isoformat().replace("+00:00", "Z"),
        platform=str(first.platform),
        device_kind=str(first.device_kind),
        device_count=len(devices),
        mesh=mesh_shape,
        quick=quick,
        seconds=round(time.perf_counter() - start, 2),
        runs=runs,
        matmul_residual=flop_res,
        bandwidth_residual=byte_res,
        dispatch=dispatch,
        jax_version=str(jax.__version__),
    )
    all_reduce = [f for f in fits if f.kind == "all-reduce"]
    widest = max(all_reduce, key=lambda f: f.group_size) if all_reduce else None
    kinds = {}
    for kind in COLLECTIVE_KINDS:
        of_kind = [f for f in fits if f.kind == kind]
        if of_kind:
            kinds[kind] = 1.0 / max(f.beta for f in of_kind)
    profile = DeviceProfile(
        name=f"calibrated-{first.platform}{len(devices)}-{now.strftime('%Y%m%dT%H%M%S')}",
        peak_flops=flops,
        memory_bytes=_memory_bytes(first),
        memory_bandwidth=bandwidth,
        link_bandwidth=kinds.get("all-reduce", 10e9),
        # Per ring step, from the widest all-reduce (used where no fit applies).
        link_latency=(
            widest.alpha / ring_steps("all-reduce", widest.group_size) if widest else 10e-6
        ),
        kind_bandwidth=kinds,
        platform=compiler_of(str(first.platform)).platform,
        source=f"shardlab.calibrate(quick={quick}) on {calibration.devices_text}",
        op_overhead=per_op,
        overlap=overlap,
        operand_latency=operand_latency,
        narrow_convolution=narrow_convolution,
        feature_overhead=feature_overhead,
        collective_fits=tuple(fits),
        calibration=calibration,
    )
    report(1.0, "done")
    return register_profile(profile)


def _memory_bytes(device: Any) -> int:
    stats = None
    try:
        stats = device.memory_stats()
    except Exception:  # not every backend reports it
        stats = None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return int(pages * os.sysconf("SC_PAGE_SIZE")) if pages else 16 * 1024**3
