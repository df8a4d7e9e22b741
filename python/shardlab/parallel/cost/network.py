"""Network levels: the links a collective crosses, and what a collective costs on each.

A cluster has levels: NVLink inside an 8-GPU host and InfiniBand across hosts; ICI inside a
TPU slice and the data-centre network (DCN) across slices. A datasheet profile of such a
machine lists its ``Link`` per level, innermost first (``DeviceProfile.links``); a profile
laid over a target mesh also knows how many devices of each mesh axis sit inside one host or
slice and how many hosts or slices it spans (``DeviceProfile.axis_split``, from
``shardlab.target``'s layout).

A collective whose group stays inside one host is priced by the inner link. One whose group
spans hosts runs as NCCL and XLA:TPU run them on such machines, hierarchically: inside each
host first, then across hosts on the part each device is left with, then inside again
(``hierarchical_time``). Each device has its own network port (a GPU its NIC, a TPU chip its
share of the host's), so the across phase moves ``1/g_in`` of the data per device, where
``g_in`` devices of the group share a host.

Bandwidth depends on message size. A ``Link`` with a measured ``curve`` (seconds of an
all-reduce by message size, as ``nccl-tests`` prints them) prices every message by the bus
bandwidth the curve reaches at that size, interpolated in log-log between its points; NCCL's
bus bandwidth is defined so that it is the same figure for every collective kind (its wire
bytes per device — the ring formulas of ``wire_bytes``, tabled in ``profiles.py`` — over the
time). A link without a curve is alpha-beta: a fixed latency (or one per ring step) plus the wire
bytes over its bandwidth. The figures and their sources are in ``profiles.py`` and
docs/design/parallel.md.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math

from shardlab.parallel.records import _Record

__all__ = ["Link", "hierarchical_time", "message_bytes", "ring_steps", "wire_bytes"]


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


def wire_bytes(kind: str, result_bytes: float, group_size: int) -> float:
    """Bytes one device sends under the ring model (the table in ``profiles.py``)."""
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


def message_bytes(kind: str, wire: float, group: int) -> float:
    """The message size (buffer bytes, as ``nccl-tests`` reports ``size``) of a collective
    that sends ``wire`` bytes per device on ``group`` devices."""
    per_result = wire_bytes(kind, 1.0, group)
    if not per_result:
        return 0.0
    result = wire / per_result
    return result * group if kind == "reduce-scatter" else result  # its input


@dataclasses.dataclass(frozen=True)
class Link(_Record):
    """One level of a cluster's network as collectives see it.

    Attributes:
        name: ``NVLink 4``, ``InfiniBand NDR``, ``ICI``, ``DCN``.
        bandwidth: bus bandwidth per device at large messages, bytes/s (NCCL's ``busbw``:
            wire bytes per device per second).
        latency: seconds every collective pays at least (the time of a tiny one).
        step_latency: seconds per ring step on top (``profiles.ring_steps``), for links
            priced as rings of point-to-point hops; 0 where ``latency`` is the floor.
        curve: measured ``(message bytes, seconds)`` of an all-reduce on ``curve_devices``
            devices, ascending; where given it prices every kind by the bus bandwidth it
            reaches at the message's size (others capped at ``bandwidth``).
        curve_devices: devices the curve was measured on.
        all_reduce_bandwidth: an all-reduce's own large-message bus bandwidth where the
            link reduces in the switch (NVLink SHARP: ~480 GB/s on H100 against ~370 for
            the other kinds); 0: ``bandwidth``.
        source: where the figures come from.
    """

    name: str
    bandwidth: float
    latency: float
    step_latency: float = 0.0
    curve: tuple[tuple[float, float], ...] = ()
    curve_devices: int = 8
    all_reduce_bandwidth: float = 0.0
    source: str = ""

    def bus_bandwidth(self, kind: str, message: float) -> float:
        """Bus bandwidth, bytes/s per device, of a ``kind`` collective of ``message`` bytes."""
        cap = self.bandwidth
        if kind == "all-reduce" and self.all_reduce_bandwidth:
            cap = self.all_reduce_bandwidth
        if not self.curve:
            return cap
        sizes, bus, log_sizes, log_bus = self._points
        if message <= sizes[0]:
            return bus[0] * message / sizes[0]  # below the curve: the smallest one's time
        if message >= sizes[-1]:
            return min(bus[-1], cap)
        i = bisect.bisect_right(sizes, message) - 1
        x0, x1, y0, y1 = log_sizes[i], log_sizes[i + 1], log_bus[i], log_bus[i + 1]
        y = y0 + (y1 - y0) * (math.log(message) - x0) / (x1 - x0)
        return min(math.exp(y), cap)

    @functools.cached_property
    def _points(self) -> tuple[list[float], list[float], list[float], list[float]]:
        """The curve as message sizes and bus bandwidths, and their logarithms."""
        factor = wire_bytes("all-reduce", 1.0, self.curve_devices)
        sizes = [float(s) for s, _ in self.curve]
        bus = [factor * s / t for s, t in self.curve]
        return sizes, bus, [math.log(s) for s in sizes], [math.log(b) for b in bus]

    def time(self, kind: str, wire: float, group: int) -> float:
        """Seconds of one collective sending ``wire`` bytes per device on ``group`` devices
        over this link."""
        if group <= 1:
            return 0.0
        steps = self.step_latency * ring_steps(kind, group) if self.step_latency else 0.0
        if wire <= 0:
            return self.latency + steps
        if self.curve:
            rate = self.bus_bandwidth(kind, message_bytes(kind, wire, group))
            return max(self.latency, wire / rate) + steps
        return self.latency + steps + wire / self.bus_bandwidth(kind, 0.0)


def _phase_bytes(kind: str, result: float, g_in: int, g_out: int) -> tuple[float, float]:
    """Wire bytes per device inside a host and across hosts of a hierarchical collective
    whose result is ``result`` bytes per device, on ``g_in`` devices per host × ``g_out``
    hosts: an all-reduce reduce-scatters inside, all-reduces its ``1/g_in`` across and
    all-gathers inside; an all-gather gathers ``1/g_in`` across then inside; a
    reduce-scatter the reverse; an all-to-all sends the ``(g_out-1)/g_out`` of its buffer
    bound for other hosts across and the rest inside; a permute crosses with all of it."""
    n = g_in * g_out
    if kind == "all-reduce":
        inner = 2 * (g_in - 1) / g_in * result
        return inner, 2 * (g_out - 1) / g_out * result / g_in
    if kind == "all-gather":
        inner = (g_in - 1) / g_in * result
        return inner, (g_out - 1) / g_out * result / g_in
    if kind == "reduce-scatter":
        return (g_in - 1) * g_out * result, (g_out - 1) * result
    if kind == "all-to-all":
        return (g_in - 1) / n * result, (g_out - 1) / g_out * result
    return 0.0, result


def hierarchical_time(
    inner: Link, outer: Link, kind: str, result: float, g_in: int, g_out: int
) -> float:
    """Seconds of a collective over ``g_in`` devices in each of ``g_out`` hosts (or slices):
    its phase inside the hosts on ``inner``, the phase across on ``outer``
    (``_phase_bytes``). A group of one device per host is the across phase alone."""
    wire_in, wire_out = _phase_bytes(kind, result, g_in, g_out)
    if kind == "collective-permute":
        return outer.time(kind, wire_out, 2)
    return inner.time(kind, wire_in, g_in) + outer.time(kind, wire_out, g_out)
