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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from shardlab.parallel.records import Collective, _Record


def wire_bytes(kind: str, result_bytes: float, group_size: int) -> float:
    """Bytes one device sends under the ring model (see the module docstring)."""
    n = group_size
    if n <= 1:
        return 0.0
    if kind == "all-gather" or kind == "all-to-all":
        return (n - 1) / n * result_bytes
    if kind == "reduce-scatter":
        return float((n - 1) * result_bytes)
    if kind == "all-reduce":
        return 2 * (n - 1) / n * result_bytes
    if kind == "collective-permute":
        return float(result_bytes)
    raise ValueError(f"unknown collective kind {kind!r}")


def ring_steps(kind: str, group_size: int) -> int:
    """Latency terms (alpha) a ring algorithm pays for ``kind`` on ``group_size`` devices."""
    n = group_size
    if n <= 1:
        return 0
    if kind == "all-reduce":
        return 2 * (n - 1)
    if kind == "collective-permute":
        return 1
    return n - 1


@dataclasses.dataclass(frozen=True)
class DeviceProfile(_Record):
    """Peak numbers of one accelerator and its interconnect.

    Attributes:
        name: profile key.
        peak_flops: dense peak, flop/s, in the dtype models usually train in.
        memory_bytes: device memory.
        memory_bandwidth: bytes/s between device memory and the compute units; an operation
            takes ``max(flops / peak_flops, bytes moved / memory_bandwidth)`` (roofline).
        link_bandwidth: bytes/s one device can send per direction within a group.
        link_latency: seconds per ring step (alpha).
        axis_bandwidth: per mesh axis overrides of ``link_bandwidth``.
        kind_bandwidth: per collective kind overrides (an implementation that is slower for
            some kinds, e.g. XLA:CPU's all-gather and all-to-all).
        forms_reduce_scatter: whether the backend turns all-reduce + dynamic-slice into a
            reduce-scatter (XLA:CPU does not; GPU and TPU do).
        expands_select_and_scatter: whether the backend rewrites max pooling's gradient
            into iotas, a reduce-window and a scatter, with scratch buffers for the indices
            (XLA:CPU does; GPU and TPU have a native kernel).
        source: where the numbers come from.
    """

    name: str
    peak_flops: float
    memory_bytes: int
    memory_bandwidth: float
    link_bandwidth: float
    link_latency: float
    axis_bandwidth: Mapping[str, float] = dataclasses.field(default_factory=dict)
    kind_bandwidth: Mapping[str, float] = dataclasses.field(default_factory=dict)
    forms_reduce_scatter: bool = True
    expands_select_and_scatter: bool = False
    source: str = ""

    def bandwidth(self, axes: tuple[str, ...], kind: str | None = None) -> float:
        """Bandwidth for a collective spanning ``axes``: the slowest axis involved, and the
        kind's own figure if it is slower."""
        found = [self.axis_bandwidth[a] for a in axes if a in self.axis_bandwidth]
        if kind is not None and kind in self.kind_bandwidth:
            found.append(self.kind_bandwidth[kind])
        return min(found) if found else self.link_bandwidth

    def op_time(self, flops: float, nbytes: float) -> float:
        """Roofline seconds of one operation: compute- or memory-bound, whichever is slower."""
        return max(flops / self.peak_flops, nbytes / self.memory_bandwidth)

    def collective_time(self, kind: str, wire: float, group_size: int, axes: tuple[str, ...]):
        """Alpha-beta seconds for one collective."""
        return self.link_latency * ring_steps(kind, group_size) + wire / self.bandwidth(axes, kind)

    def time_of(self, collective: Collective) -> float:
        """Alpha-beta seconds of a collective record, times how often it runs (``count``)."""
        c = collective
        return c.count * self.collective_time(c.kind, c.wire_bytes, c.group_size, c.mesh_axes)

    def replace(self, **changes: object) -> DeviceProfile:
        """A copy with some fields changed, e.g. ``profile.replace(link_bandwidth=50e9)``."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


_GiB = 1024**3

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
            forms_reduce_scatter=False,
            expands_select_and_scatter=True,
            source="nominal figures for simulated CPU devices sharing one host (memcpy-bound); "
            "memory bandwidth set so the roofline ridge matches the measured ratio of a "
            "weight-streaming to a compute-bound matmul on a 2-core host; all-gather and "
            "all-to-all bandwidths measured on XLA:CPU's implementations (1 and 8 MiB "
            "tensors, docs/parallel.md), all-reduce runs near the nominal 10 GB/s; "
            "XLA:CPU emits all-reduce + dynamic-slice instead of reduce-scatter (JAX_NOTES)",
        ),
        DeviceProfile(
            name="a100-nvlink",
            peak_flops=312e12,
            memory_bytes=80 * _GiB,
            memory_bandwidth=2.039e12,
            link_bandwidth=300e9,
            link_latency=5e-6,
            source="NVIDIA A100 80GB datasheet: 312 TFLOP/s BF16 dense, 2,039 GB/s HBM2e, "
            "NVLink3 600 GB/s "
            "bidirectional (300 GB/s per direction), 80 GB HBM2e",
        ),
        DeviceProfile(
            name="h100-nvlink",
            peak_flops=989e12,
            memory_bytes=80 * _GiB,
            memory_bandwidth=3.35e12,
            link_bandwidth=450e9,
            link_latency=5e-6,
            source="NVIDIA H100 SXM datasheet: 989 TFLOP/s BF16 dense, 3.35 TB/s HBM3, "
            "NVLink4 900 GB/s "
            "bidirectional (450 GB/s per direction), 80 GB HBM3",
        ),
        DeviceProfile(
            name="h200",
            peak_flops=989e12,
            memory_bytes=141 * 10**9,
            memory_bandwidth=4.8e12,
            link_bandwidth=450e9,
            link_latency=5e-6,
            source="NVIDIA H200 SXM datasheet: 989 TFLOP/s BF16 dense, 141 GB HBM3e at "
            "4.8 TB/s, NVLink4 "
            "900 GB/s bidirectional (450 GB/s per direction)",
        ),
        DeviceProfile(
            name="tpu-v5e",
            peak_flops=197e12,
            memory_bytes=16 * _GiB,
            memory_bandwidth=819e9,
            link_bandwidth=100e9,
            link_latency=10e-6,
            source="Google Cloud TPU v5e docs: 197 TFLOP/s BF16, 16 GB HBM2 at 819 GB/s, "
            "ICI 1,600 Gbps "
            "per chip (4 links; ~100 GB/s per direction along one ring axis assumed)",
        ),
    )
}


def resolve_profile(device: str | DeviceProfile | None) -> DeviceProfile:
    """A profile by name, the given profile, or the default for the current JAX backend."""
    if isinstance(device, DeviceProfile):
        return device
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
            f"unknown device profile {device!r}; known: {', '.join(DEVICE_PROFILES)} "
            "(or pass a DeviceProfile)"
        )
    return DEVICE_PROFILES[device]


def comm_time(
    collectives: Sequence[Collective], device: str | DeviceProfile | None = None
) -> float:
    """Alpha-beta seconds of collectives (predicted or compiled) under a device profile."""
    profile = resolve_profile(device)
    return sum(profile.time_of(c) for c in collectives)
