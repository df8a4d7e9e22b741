"""The alpha-beta cost model: ring formulas per collective and device profiles as data.

Per device, on the wire, for a group of ``n`` devices and ``B`` = the collective's *result*
bytes per device (the unit the HLO reader also uses):

====================  =========================  ===========================================
kind                  wire bytes per device       why
====================  =========================  ===========================================
all-gather            (n-1)/n · B                 receives every other device's 1/n shard
reduce-scatter        (n-1) · B                   = (n-1)/n · B_in with B_in = n · B
all-reduce            2 (n-1)/n · B               reduce-scatter then all-gather
all-to-all            (n-1)/n · B                 keeps 1/n of its buffer, sends the rest
collective-permute    B                           each device sends its buffer once
====================  =========================  ===========================================

Time: ``alpha · steps + wire_bytes / bandwidth`` with ``steps`` = n-1 (all-gather,
reduce-scatter, all-to-all), 2(n-1) (all-reduce), 1 (collective-permute).

A calibrated profile (``calibrate.py``) also carries measured fits, which take precedence
where present: per mesh axis and kind ``alpha + beta · wire_bytes`` (``CollectiveFit``), and
a per-operation overhead added to every operation's roofline time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from shardlab._core.units import human_bytes, human_time
from shardlab.parallel.cost.compilers import Compiler, compiler_of
from shardlab.parallel.cost.network import Link, hierarchical_time
from shardlab.parallel.cost.network import ring_steps as ring_steps
from shardlab.parallel.cost.network import wire_bytes as wire_bytes
from shardlab.parallel.records import Collective, _Record


@dataclasses.dataclass(frozen=True)
class CollectiveFit(_Record):
    """A least-squares fit of one collective kind's measured time on one mesh axis.

    Attributes:
        kind: one of ``COLLECTIVE_KINDS``.
        axis: the mesh axis it was measured along.
        group_size: devices per group along that axis.
        alpha: seconds per collective at zero bytes (the fit's intercept).
        beta: seconds per wire byte per device (the slope; ``1 / beta`` is the bandwidth).
        residual: RMS error of the fit over the mean measured time (normalised RMS).
        result_bytes: the measured sizes, result bytes per device.
        seconds: the measured medians, one per size.
    """

    kind: str
    axis: str
    group_size: int
    alpha: float
    beta: float
    residual: float
    result_bytes: tuple[int, ...] = ()
    seconds: tuple[float, ...] = ()

    def time(self, wire: float, group_size: int) -> float:
        """Seconds for ``wire`` bytes per device on a group of ``group_size``: the latency
        scales with the ring steps when the group differs from the measured one."""
        steps, measured = ring_steps(self.kind, group_size), ring_steps(self.kind, self.group_size)
        alpha = self.alpha * steps / measured if measured else self.alpha
        return alpha + wire * self.beta


@dataclasses.dataclass(frozen=True)
class Calibration(_Record):
    """Where a calibrated profile's figures come from (``shardlab.calibrate``).

    Attributes:
        date: ISO 8601 UTC time of the measurement.
        platform: the JAX platform (``cpu``, ``gpu``, ``tpu``).
        device_kind: ``jax.devices()[0].device_kind``.
        device_count: devices measured.
        mesh: the mesh axes measured, ``{name: size}`` (a default mesh when none was given).
        quick: a quick (few sizes and runs) or full calibration.
        seconds: wall time the calibration took.
        runs: timed runs per figure (medians; warm-up excluded).
        matmul_residual: normalised RMS residual of the matmul throughput fit.
        bandwidth_residual: normalised RMS residual of the memory bandwidth fit.
        dispatch: seconds of a tiny jitted op on all devices (a program's fixed cost).
        jax_version: the jax version measured with.
    """

    date: str
    platform: str
    device_kind: str
    device_count: int
    mesh: Mapping[str, int]
    quick: bool
    seconds: float
    runs: int
    matmul_residual: float
    bandwidth_residual: float
    dispatch: float
    jax_version: str = ""

    @property
    def devices_text(self) -> str:
        """``8 × cpu (cpu)``: the device set in words."""
        return f"{self.device_count} × {self.device_kind} ({self.platform})"

    def describe(self) -> str:
        """``calibrated 2026-12-02 13:20 UTC on 8 × cpu (cpu), mesh all=8 (quick)``."""
        when = self.date.replace("T", " ")[:16]
        mesh = " × ".join(f"{k}={v}" for k, v in self.mesh.items()) or "-"
        mode = "quick" if self.quick else "full"
        return f"calibrated {when} UTC on {self.devices_text}, mesh {mesh} ({mode})"


NARROW_FEATURES = 16
"""A convolution with at most this many input and output features per device runs off
XLA:CPU's YNNPACK path (``IsConvolutionOpSupportedByYnn``: ``max(input, output features) <=
16``)."""


@dataclasses.dataclass(frozen=True)
class DeviceProfile(_Record):
    """Peak numbers of one accelerator and its interconnect.

    Attributes:
        name: profile key.
        peak_flops: dense peak, flop/s, in the dtype models usually train in.
        memory_bytes: device memory.
        memory_bandwidth: bytes/s between device memory and the compute units; an operation
            takes ``max(flops / peak_flops, bytes moved / memory_bandwidth)`` (roofline),
            plus ``1 - overlap`` of the shorter of the two.
        link_bandwidth: bytes/s one device can send per direction within a group.
        link_latency: seconds per ring step (alpha).
        axis_bandwidth: per mesh axis overrides of ``link_bandwidth``.
        kind_bandwidth: per collective kind overrides (an implementation that is slower for
            some kinds, e.g. XLA:CPU's all-gather and all-to-all).
        platform: the JAX platform (``cpu``, ``gpu``, ``tpu``); it chooses the compiler
            whose rules the model follows (``compiler``, ``compilers.py``): which dtypes it
            computes in, whether reduce-scatter forms, how max pooling's gradient runs.
        source: where the numbers come from.
        op_overhead: seconds every operation costs on top of its roofline (dispatching one
            kernel; measured by calibration, 0 for datasheet profiles).
        overlap: how much of an operation's memory traffic its compute hides (1: the
            roofline, whichever is slower; 0: the two add up, as on a CPU whose cores stall
            on a matmul's weight stream). Measured by calibration (skinny matmuls near the
            ridge point); 1 for datasheet profiles.
        operand_latency: how much of a collective's latency each operand past the first of a
            combined collective pays again, 0 to 1 (0: one latency for the tuple, as NCCL's
            grouped calls; 1: the operands run as separate collectives, as XLA:CPU's do —
            a 10-operand ``psum`` of small arrays costs about 10 single ones). Measured by
            calibration; 0 for datasheet profiles.
        narrow_convolution: how many times slower a convolution with at most
            ``NARROW_FEATURES`` input and output features per device computes than one
            with twice the features and the same flops (XLA:CPU runs those outside its
            YNNPACK library, on a slower path; measured by calibration; 1 for datasheet
            profiles). Its cost grows as ``feature_overhead``'s does with fewer output
            features (``convolution_factor``).
        feature_overhead: a convolution with ``f`` output features per device computes
            ``1 + feature_overhead * NARROW_FEATURES / f`` times slower than the rate: it
            gathers each output's window of inputs, work that does not shrink with ``f``
            (measured by calibration: 4 output features against 32, the same flops; 0 for
            datasheet profiles).
        collective_fits: measured per kind (and per axis or group size) alpha-beta fits;
            where one matches a collective it replaces ``link_latency`` and the bandwidths.
        links: the network's levels, innermost first (``network.Link``: NVLink then
            InfiniBand; ICI then DCN); where given they price collectives instead of
            ``link_bandwidth`` and ``link_latency``.
        axis_split: per mesh axis, ``(devices inside one host or slice, hosts or slices)``
            (set by ``resolve_profile`` for a mesh over a target); an axis not named stays
            inside.
        calibration: when, where and how the figures were measured (None: a datasheet).
        matmul_efficiency: the share of ``peak_flops`` a large matrix multiply reaches
            (datasheet profiles: measured figures, see ``MATMUL_SOURCES``; 1 for calibrated
            profiles, whose ``peak_flops`` is already a measured rate).
        memory_efficiency: the share of ``memory_bandwidth`` operations reach (1 for
            calibrated profiles, whose bandwidth is measured).
        matmul_latency: seconds every matrix multiply costs on top of its roofline, however
            small (a kernel's start and its last tile's drain; 0 for calibrated profiles,
            whose ``op_overhead`` covers every operation).
        matmul_tile: a systolic matrix unit's side (a TPU's MXU: 128 on v5e and v5p, 256
            on v6e): a matrix multiply's free and contracting dimensions are computed in
            whole tiles, so a dimension of 130 costs as 256; 0: no such rounding (GPUs,
            whose kernels choose their tile to the shape).
    """

    name: str
    peak_flops: float
    memory_bytes: int
    memory_bandwidth: float
    link_bandwidth: float
    link_latency: float
    axis_bandwidth: Mapping[str, float] = dataclasses.field(default_factory=dict)
    kind_bandwidth: Mapping[str, float] = dataclasses.field(default_factory=dict)
    platform: str = "gpu"
    source: str = ""
    op_overhead: float = 0.0
    overlap: float = 1.0
    operand_latency: float = 0.0
    narrow_convolution: float = 1.0
    feature_overhead: float = 0.0
    collective_fits: tuple[CollectiveFit, ...] = ()
    calibration: Calibration | None = None
    links: tuple[Link, ...] = ()
    axis_split: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    matmul_efficiency: float = 1.0
    memory_efficiency: float = 1.0
    matmul_latency: float = 0.0
    matmul_tile: int = 0

    @property
    def calibrated(self) -> bool:
        """Whether the figures were measured (``shardlab.calibrate``), not a datasheet's."""
        return self.calibration is not None

    @property
    def priced_by(self) -> str:
        """Which figures price a plan: ``datasheet profile h100-nvlink`` or
        ``calibrated profile … (calibrated 2026-12-02 13:20 UTC on 8 × cpu …)``."""
        if self.calibration is None:
            return f"datasheet profile {self.name}"
        return f"calibrated profile {self.name} ({self.calibration.describe()})"

    def describe(self) -> str:
        """The same as ``priced_by``."""
        return self.priced_by

    def fit_for(self, kind: str, group_size: int, axes: tuple[str, ...]) -> CollectiveFit | None:
        """The measured fit that prices ``kind`` on ``axes``: the same single axis and group
        size, else any axis of that group size (the slowest), else the nearest group size
        measured (``CollectiveFit.time`` rescales its latency by ring steps)."""
        same = [f for f in self.collective_fits if f.kind == kind]
        if not same:
            return None
        axis = "+".join(axes)
        for f in same:
            if f.axis == axis and f.group_size == group_size:
                return f
        sized = [f for f in same if f.group_size == group_size]
        if sized:
            return max(sized, key=lambda f: f.time(1e6, group_size))
        return min(same, key=lambda f: (abs(f.group_size - group_size), -f.group_size))

    def bandwidth(self, axes: tuple[str, ...], kind: str | None = None) -> float:
        """Bandwidth for a collective spanning ``axes``: the slowest axis involved, and the
        kind's own figure if it is slower."""
        found = [self.axis_bandwidth[a] for a in axes if a in self.axis_bandwidth]
        if kind is not None and kind in self.kind_bandwidth:
            found.append(self.kind_bandwidth[kind])
        return min(found) if found else self.link_bandwidth

    def op_time(
        self,
        flops: float,
        nbytes: float,
        *,
        features: tuple[int, int] | None = None,
        matmul: tuple[int, int, int, int] | None = None,
    ) -> float:
        """Roofline seconds of one operation: compute- or memory-bound, whichever is slower,
        plus the part of the other that does not overlap it (``overlap``), at the rates the
        device reaches (``memory_efficiency``; a matrix multiply at ``matmul_efficiency``
        of the peak, in whole ``matmul_tile`` tiles, plus ``matmul_latency``).
        ``features``: a convolution's per-device input and output features
        (``convolution_factor``); ``matmul``: a matrix multiply's per-device
        ``(batch, m, n, k)`` (``layouts.matmul_dims``)."""
        compute = flops / self.peak_flops
        extra = self.op_overhead
        if features is not None:
            compute *= self.convolution_factor(*features)
        if matmul is not None:
            compute /= self.matmul_efficiency
            if self.matmul_tile > 1:
                compute *= self.tile_padding(matmul)
            extra += self.matmul_latency
        return self._roofline(compute, nbytes, extra)

    def program_time(self, flops: float, nbytes: float) -> float:
        """The roofline of a whole program's per-device totals (what ``cost_analysis``
        reports): its flops at the matrix multiplies' achievable rate (they are nearly all
        of a training step's), its bytes at the achievable memory bandwidth."""
        compute = flops / (self.peak_flops * self.matmul_efficiency)
        return self._roofline(compute, nbytes, self.op_overhead)

    def _roofline(self, compute: float, nbytes: float, extra: float) -> float:
        """``compute`` seconds against ``nbytes`` at the achievable bandwidth: the longer,
        the part of the shorter ``overlap`` does not hide, and ``extra`` if any work."""
        memory = nbytes / (self.memory_bandwidth * self.memory_efficiency)
        roofline = max(compute, memory) + (1.0 - self.overlap) * min(compute, memory)
        return roofline + extra if roofline > 0 else roofline

    def tile_padding(self, matmul: tuple[int, int, int, int]) -> float:
        """How many times the work of a ``(batch, m, n, k)`` matrix multiply its whole
        ``matmul_tile`` tiles hold (1: every dimension a multiple of the tile)."""
        t = self.matmul_tile
        _, m, n, k = matmul
        padded = [-(-d // t) * t / d for d in (m, n, k) if d > 0]
        return math.prod(padded)

    def achieved_rate(self, matmul: tuple[int, int, int, int], itemsize: int = 2) -> float:
        """Flop/s one matrix multiply of this ``(batch, m, n, k)`` reaches on this device
        (its operands and result of ``itemsize`` bytes, read and written once)."""
        b, m, n, k = matmul
        flops = 2.0 * b * m * n * k
        nbytes = float(itemsize * b * (m * k + k * n + m * n))
        return flops / self.op_time(flops, nbytes, matmul=matmul)

    def convolution_factor(self, features_in: int, features_out: int) -> float:
        """How many times slower than the rate a convolution with these per-device input
        and output features computes: ``1 + slope * NARROW_FEATURES / features_out``, the
        slope ``feature_overhead``, or on the narrow path (both at most
        ``NARROW_FEATURES``) the slope that makes it ``narrow_convolution`` times slower than
        a convolution of twice the features (how calibration measures it)."""
        slope = self.feature_overhead
        if max(features_in, features_out) <= NARROW_FEATURES:
            slope = self.narrow_convolution * (1.0 + self.feature_overhead / 2.0) - 1.0
        return 1.0 + slope * NARROW_FEATURES / max(features_out, 1)

    def thin_convolution(self) -> float:
        """How many times slower a convolution with 4 output features per device runs than
        one with 64 (both with 64 input features): ``feature_overhead`` in words."""
        return self.convolution_factor(64, 4) / self.convolution_factor(64, 64)

    def collective_time(self, kind: str, wire: float, group_size: int, axes: tuple[str, ...]):
        """Alpha-beta seconds for one collective (a measured fit where one matches)."""
        if group_size > 1 and self.collective_fits:
            fit = self.fit_for(kind, group_size, tuple(axes))
            if fit is not None:
                return fit.time(wire, group_size)
        if self.links and group_size > 1:
            return self.link_time(kind, wire, group_size, tuple(axes))
        return self.link_latency * ring_steps(kind, group_size) + wire / self.bandwidth(axes, kind)

    def hosts_spanned(self, group_size: int, axes: tuple[str, ...]) -> int:
        """How many hosts (or slices) a group over ``axes`` spans (``axis_split``)."""
        out = math.prod(self.axis_split[a][1] for a in axes if a in self.axis_split)
        return out if out > 1 and group_size % out == 0 else 1

    def link_time(self, kind: str, wire: float, group_size: int, axes: tuple[str, ...]) -> float:
        """Seconds of one collective on the network levels (``links``): inside a host on
        the inner link; spanning hosts, hierarchically (``network.hierarchical_time``)."""
        g_out = self.hosts_spanned(group_size, axes)
        if g_out == 1 or len(self.links) == 1:
            return self.links[0].time(kind, wire, group_size)
        result = wire / wire_bytes(kind, 1.0, group_size)
        return hierarchical_time(
            self.links[0], self.links[1], kind, result, group_size // g_out, g_out
        )

    def link_of(self, group_size: int, axes: tuple[str, ...]) -> str:
        """The name of the slowest network level a collective over ``axes`` crosses
        (``NVLink 4``, ``InfiniBand NDR``); ``""`` for a profile without levels."""
        if not self.links:
            return ""
        crosses = self.hosts_spanned(group_size, axes) > 1 and len(self.links) > 1
        return self.links[1 if crosses else 0].name

    def levels_note(self, collectives: Sequence[Collective]) -> str:
        """``communication by network level: InfiniBand NDR 12 MiB per device, 2.1 ms
        (over data); NVLink 4 …``: what each level carries of ``collectives``, slowest first;
        ``""`` when everything stays on one level of one host."""
        if not self.links or not self.axis_split:
            return ""
        levels: dict[str, list[Any]] = {}
        for c in collectives:
            if c.group_size <= 1:
                continue
            name = self.link_of(c.group_size, c.mesh_axes)
            got = levels.setdefault(name, [0.0, 0.0, set()])
            got[0] += c.wire_bytes * c.count
            got[1] += self.time_of(c)
            got[2].update(c.mesh_axes)
        if not levels:
            return ""
        parts = [
            f"{name} {human_bytes(b)} per device, {human_time(t)} (over {', '.join(sorted(a))})"
            for name, (b, t, a) in sorted(levels.items(), key=lambda kv: -kv[1][1])
        ]
        return "communication by network level: " + "; ".join(parts)

    def on_layout(self, split: Mapping[str, tuple[int, int]]) -> DeviceProfile:
        """This profile on a mesh whose axes run ``{axis: (inside, hosts)}``."""
        return (
            self if dict(self.axis_split) == dict(split) else self.replace(axis_split=dict(split))
        )

    def time_of(self, collective: Collective) -> float:
        """Alpha-beta seconds of a collective record, times how often it runs (``count``);
        each operand past the first pays ``operand_latency`` of the latency again."""
        c = collective
        t = self.collective_time(c.kind, c.wire_bytes, c.group_size, c.mesh_axes)
        if c.operands > 1 and self.operand_latency > 0:
            latency = self.collective_time(c.kind, 0.0, c.group_size, c.mesh_axes)
            t += (c.operands - 1) * self.operand_latency * latency
        return c.count * t

    @property
    def compiler(self) -> Compiler:
        """The compiler whose rules price this profile's programs (chosen by ``platform``)."""
        return compiler_of(self.platform)

    def replace(self, **changes: object) -> DeviceProfile:
        """A copy with some fields changed, e.g. ``profile.replace(link_bandwidth=50e9)``.
        Changing ``link_bandwidth`` or ``link_latency`` (and not ``links``) prices every
        collective by those figures again: the network levels are dropped."""
        if ({"link_bandwidth", "link_latency"} & set(changes)) and "links" not in changes:
            changes["links"] = ()
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


_GiB = 1024**3

_MiB = 1024**2

NVLINK4 = Link(
    "NVLink 4",
    bandwidth=370e9,
    latency=13e-6,
    curve=(
        (8, 13.0e-6),
        (1024, 16.2e-6),
        (64 * 1024, 18.9e-6),
        (_MiB, 26.9e-6),
        (16 * _MiB, 123e-6),
        (64 * _MiB, 325e-6),
        (256 * _MiB, 1113e-6),
        (1024 * _MiB, 4016e-6),
        (16 * 1024 * _MiB, 62636e-6),
    ),
    all_reduce_bandwidth=480e9,
    source="8 x H100 all-reduce by size (NVIDIA/dgxc-benchmarking nccl/README.md: 13 us at "
    "8 B, 26.9 us at 1 MiB, 123 us at 16 MiB, 4.0 ms at 1 GiB); ~370 GB/s bus bandwidth for "
    "the other kinds and ~480 GB/s for all-reduce with NVLink SHARP (NVIDIA/nccl-tests#212)",
)
INFINIBAND_NDR = Link(
    "InfiniBand NDR",
    bandwidth=47e9,
    latency=20e-6,
    source="one 400 Gb/s NDR NIC per GPU (DGX H100): 46-48 GB/s per NIC in nccl-tests "
    "(NVIDIA/nccl-tests#290); an 8-byte all-reduce across 2 nodes takes 19-20 us "
    "(NVIDIA/nccl-tests#150)",
)
NVLINK3 = Link(
    "NVLink 3",
    bandwidth=230e9,
    latency=0.0,
    step_latency=5e-6,
    source="8 x A100: ~230 GB/s bus bandwidth at >= 8 GB messages (NVIDIA/nccl-tests#149); "
    "5 us per ring step as the datasheet profile",
)
INFINIBAND_HDR = Link(
    "InfiniBand HDR",
    bandwidth=24e9,
    latency=20e-6,
    source="one 200 Gb/s HDR NIC per GPU (DGX A100): 85-96 GB/s over 4 NICs in nccl-tests "
    "(NVIDIA/nccl-tests#119); 19-20 us for an 8-byte all-reduce across 2 nodes "
    "(NVIDIA/nccl-tests#150)",
)


def _ici(bandwidth: float, source: str) -> Link:
    return Link("ICI", bandwidth=bandwidth, latency=0.0, step_latency=10e-6, source=source)


def _dcn(bandwidth: float, source: str) -> Link:
    return Link("DCN", bandwidth=bandwidth, latency=20e-6, source=source)


_DCN_LATENCY = "; latency taken as InfiniBand's (20 us), none published"

# What a datasheet's peak becomes in a real step (``DeviceProfile.op_time``). GPU figures come
# from XLA's own measured table of matrix multiplies on H100 (openxla/xla:
# xla/service/gpu/model/matmul_interpolator_data.h, "sm_90", bf16, batch 1-4 and m, n, k from
# 256 to 4096): one roofline with 800 TFLOP/s (0.81 of 989), 0.9 of the HBM bandwidth and
# 6 us per multiply reproduces its 4096^3 row (783 TFLOP/s) and the small rows (11-42
# TFLOP/s at 256-512), mean error 7% on the rows the figures were not read from
# (docs/design/parallel.md, "Achievable rates"). The scaling book measures 94% of HBM
# bandwidth on a large add (jax-ml/scaling-book gpus.md). A100: no such table is published
# (XLA ships sm_90 and sm_100 only); taken as H100's shares. TPU: the MXU is a 128 x 128
# systolic array (256 x 256 on v6e; cloud.google.com/tpu/docs/system-architecture), so
# dimensions are computed in whole tiles; no per-shape table is published, the share 0.9 is
# assumed (MaxText's 71.5% MFU on v5p-128, runtime_performance_results.md, needs at least
# 0.75) and there is no kernel launch to pay.
GPU_RATES: dict[str, Any] = {
    "matmul_efficiency": 0.81,
    "memory_efficiency": 0.9,
    "matmul_latency": 6e-6,
}
TPU_RATES: dict[str, Any] = {"matmul_efficiency": 0.9, "memory_efficiency": 0.9}
MATMUL_SOURCES = (
    "achievable rates: GPU from XLA's measured H100 matmul table (sm_90, "
    "matmul_interpolator_data.h): 0.81 of peak, 0.9 of HBM, 6 us per matmul; A100 taken "
    "as H100's; TPU: 0.9 of peak assumed, dimensions in whole MXU tiles"
)

DEVICE_PROFILES: dict[str, DeviceProfile] = {
    p.name: p
    for p in (
        DeviceProfile(
            name="cpu-sim",
            peak_flops=50e9,
            memory_bytes=16 * _GiB,
            memory_bandwidth=4e9,
            link_bandwidth=10e9,
            link_latency=10e-6,
            kind_bandwidth={"all-gather": 1.2e9, "all-to-all": 0.35e9, "collective-permute": 1.2e9},
            platform="cpu",
            source="nominal figures for simulated CPU devices sharing one host (memcpy-bound); "
            "memory bandwidth set so the roofline ridge matches the measured ratio of a "
            "weight-streaming to a compute-bound matmul on a 2-core host; all-gather and "
            "all-to-all bandwidths measured on XLA:CPU's implementations (1 and 8 MiB "
            "tensors, docs/design/parallel.md), all-reduce runs near the nominal 10 GB/s; "
            "XLA:CPU emits all-reduce + dynamic-slice instead of reduce-scatter (JAX_NOTES)",
        ),
        DeviceProfile(
            name="a100-nvlink",
            **GPU_RATES,
            peak_flops=312e12,
            memory_bytes=80 * _GiB,
            memory_bandwidth=2.039e12,
            link_bandwidth=300e9,
            link_latency=5e-6,
            links=(NVLINK3, INFINIBAND_HDR),
            source="NVIDIA A100 80GB datasheet: 312 TFLOP/s BF16 dense, 2,039 GB/s HBM2e, "
            "NVLink3 600 GB/s "
            "bidirectional (300 GB/s per direction), 80 GB HBM2e",
        ),
        DeviceProfile(
            name="h100-nvlink",
            **GPU_RATES,
            peak_flops=989e12,
            memory_bytes=80 * _GiB,
            memory_bandwidth=3.35e12,
            link_bandwidth=450e9,
            link_latency=5e-6,
            links=(NVLINK4, INFINIBAND_NDR),
            source="NVIDIA H100 SXM datasheet: 989 TFLOP/s BF16 dense, 3.35 TB/s HBM3, "
            "NVLink4 900 GB/s "
            "bidirectional (450 GB/s per direction), 80 GB HBM3",
        ),
        DeviceProfile(
            name="h200",
            **GPU_RATES,
            peak_flops=989e12,
            memory_bytes=141 * 10**9,
            memory_bandwidth=4.8e12,
            link_bandwidth=450e9,
            link_latency=5e-6,
            links=(NVLINK4, INFINIBAND_NDR),
            source="NVIDIA H200 SXM datasheet: 989 TFLOP/s BF16 dense, 141 GB HBM3e at "
            "4.8 TB/s, NVLink4 "
            "900 GB/s bidirectional (450 GB/s per direction)",
        ),
        DeviceProfile(
            name="tpu-v5e",
            **TPU_RATES,
            matmul_tile=128,
            platform="tpu",
            peak_flops=197e12,
            memory_bytes=16 * _GiB,
            memory_bandwidth=819e9,
            link_bandwidth=100e9,
            link_latency=10e-6,
            links=(
                _ici(
                    100e9,
                    "400 GB/s bidirectional ICI per chip over 4 ports: 100 GB/s one "
                    "way along one torus axis (both neighbours)",
                ),
                _dcn(
                    3.125e9,
                    "2 x 100 Gb/s NICs per 8-chip host: 25 Gb/s per chip "
                    "(cloud.google.com/tpu/docs/v5e)" + _DCN_LATENCY,
                ),
            ),
            source="Google Cloud TPU v5e docs: 197 TFLOP/s BF16, 16 GB HBM2 at 819 GB/s, "
            "ICI 1,600 Gbps "
            "per chip (4 links; ~100 GB/s per direction along one ring axis assumed)",
        ),
        DeviceProfile(
            name="tpu-v5p",
            **TPU_RATES,
            matmul_tile=128,
            platform="tpu",
            peak_flops=459e12,
            memory_bytes=95 * 10**9,
            memory_bandwidth=2.765e12,
            link_bandwidth=200e9,
            link_latency=10e-6,
            links=(
                _ici(
                    200e9,
                    "1,200 GB/s bidirectional ICI per chip over 6 ports: 200 GB/s "
                    "one way along one torus axis",
                ),
                _dcn(6.25e9, "50 Gb/s DCN per chip (cloud.google.com/tpu/docs/v5p)" + _DCN_LATENCY),
            ),
            source="Google Cloud TPU v5p docs: 459 TFLOP/s BF16, 95 GB HBM2e at 2,765 GB/s, "
            "ICI 4,800 Gbps per chip (6 links of a 3D torus; ~200 GB/s per direction along "
            "one ring axis assumed)",
        ),
        DeviceProfile(
            name="tpu-v6e",
            **TPU_RATES,
            matmul_tile=256,
            platform="tpu",
            peak_flops=918e12,
            memory_bytes=32 * 10**9,
            memory_bandwidth=1.64e12,
            link_bandwidth=224e9,
            link_latency=10e-6,
            links=(
                _ici(224e9, "as link_bandwidth"),
                _dcn(
                    3.125e9, "not published for v6e; taken as v5e's 25 Gb/s per chip" + _DCN_LATENCY
                ),
            ),
            source="Google Cloud TPU v6e (Trillium) docs: 918 TFLOP/s BF16, 32 GB HBM at "
            "1,640 GB/s, ICI 3,584 Gbps per chip (4 links; ~224 GB/s per direction along one "
            "ring axis assumed)",
        ),
    )
}


CALIBRATED: dict[str, DeviceProfile] = {}
"""Calibrated profiles by name (``shardlab.calibrate`` and ``load_profile`` register theirs),
so a plan's ``cost.device`` name resolves to the figures that priced it."""

DEFAULT_PROFILE: list[DeviceProfile] = []
"""A profile that ``device=None`` resolves to before the backend's datasheet, on the device
set it was measured on (the kernel's ``%calibrate --use``); empty: none."""


def register_profile(profile: DeviceProfile) -> DeviceProfile:
    """Makes a calibrated profile resolvable by its name (``resolve_profile``).

    Raises:
        ValueError: the name is a datasheet profile's.
    """
    if profile.name in DEVICE_PROFILES:
        raise ValueError(
            f"profile name {profile.name!r} is a datasheet profile's; name a calibrated "
            "profile differently (e.g. 'calibrated-cpu-8')"
        )
    CALIBRATED[profile.name] = profile
    return profile


def use_profile(profile: DeviceProfile | None) -> None:
    """Makes ``profile`` what ``device=None`` means on the devices it was measured on
    (``None``: back to the backend's datasheet)."""
    DEFAULT_PROFILE.clear()
    if profile is not None:
        DEFAULT_PROFILE.append(register_profile(profile))


def default_profile() -> DeviceProfile | None:
    """The profile set by ``use_profile``, if any."""
    return DEFAULT_PROFILE[-1] if DEFAULT_PROFILE else None


def describe_profile(name: str) -> str:
    """A profile name (``CostBreakdown.device``) in words: datasheet or calibrated, when,
    on which devices."""
    profile = CALIBRATED.get(name) or DEVICE_PROFILES.get(name)
    return profile.priced_by if profile is not None else f"profile {name}"


def _matches_devices(profile: DeviceProfile) -> bool:
    import jax

    c = profile.calibration
    if c is None:
        return True
    devices = jax.devices()
    return c.platform == devices[0].platform and c.device_count == len(devices)


def resolve_profile(device: str | DeviceProfile | None, mesh: Any = None) -> DeviceProfile:
    """A profile by name (datasheet or registered calibrated), the given profile, the
    datasheet of the target ``mesh`` is laid over (``shardlab.target``), the default set by
    ``use_profile`` (when measured on the current devices), or the datasheet for the current
    JAX backend."""
    profile = _resolve(device, mesh)
    if mesh is not None and profile.links:
        from shardlab.parallel.targets.target import mesh_layout

        layout = mesh_layout(mesh)
        if layout is not None:
            split = zip(layout.names, layout.inner, layout.outer, strict=True)
            return profile.on_layout({n: (i, o) for n, i, o in split if o > 1})
    return profile


def _resolve(device: str | DeviceProfile | None, mesh: Any) -> DeviceProfile:
    if isinstance(device, DeviceProfile):
        return device
    if device is None and mesh is not None:
        from shardlab.parallel.targets.target import target_of

        target = target_of(mesh)
        if target is not None:
            return DEVICE_PROFILES[target.profile]
    if device is None and DEFAULT_PROFILE and _matches_devices(DEFAULT_PROFILE[-1]):
        return DEFAULT_PROFILE[-1]
    if isinstance(device, str) and device in CALIBRATED:
        return CALIBRATED[device]
    if device is None:
        import jax

        platform = jax.devices()[0].platform
        if platform == "cpu":
            return DEVICE_PROFILES["cpu-sim"]
        if platform == "tpu":
            return DEVICE_PROFILES["tpu-v5e"]
        kind = jax.devices()[0].device_kind.lower()
        for key in ("h200", "h100", "a100"):
            if key in kind:
                return next(p for n, p in DEVICE_PROFILES.items() if n.startswith(key))
        return DEVICE_PROFILES["h100-nvlink"]
    if device not in DEVICE_PROFILES:
        raise ValueError(
            f"unknown device profile {device!r}; known: "
            f"{', '.join([*DEVICE_PROFILES, *CALIBRATED])} (or pass a DeviceProfile, e.g. "
            "shardlab.calibrate())"
        )
    return DEVICE_PROFILES[device]


def comm_time(
    collectives: Sequence[Collective], device: str | DeviceProfile | None = None
) -> float:
    """Alpha-beta seconds of collectives (predicted or compiled) under a device profile."""
    profile = resolve_profile(device)
    return sum(profile.time_of(c) for c in collectives)
