"""Records the parallel core hands to its users: frozen dataclasses with ``to_dict()``.

Views (widgets, docs, tests) render these records, never live arrays or compiled objects, so a
strategy that was only predicted can be drawn the same way as one that was compiled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from shardlab.parallel.display import cost_text, html_of, report_text
from shardlab.parallel.labels import spec_label

COLLECTIVE_KINDS = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class _Record:
    def to_dict(self) -> dict[str, Any]:
        """Plain ``dict``/``list``/scalar form, ready for JSON."""
        out = _plain(self)
        assert isinstance(out, dict)
        return out


@dataclasses.dataclass(frozen=True)
class Collective(_Record):
    """One collective instruction of a compiled program (or one the cost model expects).

    Attributes:
        kind: one of ``COLLECTIVE_KINDS``.
        bytes: result bytes per device (tuple results summed).
        group_size: devices per replica group (2 for a collective-permute pair).
        mesh_axes: the mesh axis names the groups span.
        wire_bytes: bytes each device sends on the wire under the ring model.
        op_name: the jaxpr op name from the instruction metadata ("" when absent).
        source: the user's ``file:line`` ("" when absent).
        count: how many times it runs per call (trip count of an enclosing loop, else 1).
        hlo_name: the instruction name in the HLO text ("" for predicted collectives).
        shape: the result shape text, e.g. ``f32[8,16]``.
        operands: arrays it reduces or moves (a combined all-reduce's tuple has several;
            a backend that runs them one by one pays a latency each,
            ``DeviceProfile.operand_latency``).
    """

    kind: str
    bytes: int
    group_size: int
    mesh_axes: tuple[str, ...]
    wire_bytes: float
    op_name: str = ""
    source: str = ""
    count: int = 1
    hlo_name: str = ""
    shape: str = ""
    operands: int = 1


@dataclasses.dataclass(frozen=True)
class MemoryBreakdown(_Record):
    """Per-device memory of a compiled program, in bytes.

    ``total = argument + output - alias + temp`` (CPU's ``peak_memory_in_bytes`` is not
    trustworthy, see JAX_NOTES).
    """

    argument: int
    output: int
    alias: int
    temp: int

    @property
    def total(self) -> int:
        return self.argument + self.output - self.alias + self.temp

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "total": self.total}


def comm_by_kind(collectives: tuple[Collective, ...]) -> dict[str, float]:
    """Wire bytes per device summed per collective kind (every kind present, 0 when absent)."""
    out: dict[str, float] = dict.fromkeys(COLLECTIVE_KINDS, 0.0)
    for c in collectives:
        out[c.kind] += c.wire_bytes * c.count
    return out


class _Communicates:
    """Per-kind wire bytes of a record's ``collectives`` (Report and CostBreakdown alike)."""

    collectives: tuple[Collective, ...]

    @property
    def comm_bytes(self) -> dict[str, float]:
        """Per kind, per device, on the wire (ring model); the same units in every record."""
        return comm_by_kind(self.collectives)

    @property
    def total_comm_bytes(self) -> float:
        return sum(self.comm_bytes.values())


@dataclasses.dataclass(frozen=True)
class Report(_Communicates, _Record):
    """What the compiler actually did: read from the compiled, partitioned HLO.

    Attributes:
        collectives: one record per collective instruction.
        memory: per-device memory.
        flops: per-device flops from ``compiled.cost_analysis()``.
        input_shardings: the compiler's input shardings, as ``PartitionSpec`` strings per leaf.
        output_shardings: likewise for outputs.
        mesh_shape: ``{axis: size}`` of the mesh.
        bytes_accessed: per-device bytes the operations read and write
            (``cost_analysis()["bytes accessed"]``; the roofline's memory term).
        hlo: the post-partitioning HLO text.
    """

    collectives: tuple[Collective, ...]
    memory: MemoryBreakdown
    flops: float
    input_shardings: tuple[str, ...]
    output_shardings: tuple[str, ...]
    mesh_shape: dict[str, int]
    bytes_accessed: float = 0.0
    hlo: str = dataclasses.field(repr=False, default="")

    def __repr__(self) -> str:
        return report_text(self)

    def _repr_html_(self) -> str:
        return html_of("report", self)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out.pop("hlo")
        out["comm_bytes"] = self.comm_bytes
        out["total_comm_bytes"] = self.total_comm_bytes
        return out


@dataclasses.dataclass(frozen=True)
class Layout(_Record):
    """How one tensor is laid out on a mesh, without any array.

    Attributes:
        shape: the global shape.
        dim_axes: per dimension, the mesh axes it is split over (major first).
        partial: mesh axes over which the values are pending partial sums.
    """

    shape: tuple[int, ...]
    dim_axes: tuple[tuple[str, ...], ...]
    partial: tuple[str, ...] = ()

    @property
    def spec(self) -> str:
        """``P('data', None)``: one entry per dimension, as users write it."""
        return spec_label(self.dim_axes)


@dataclasses.dataclass(frozen=True)
class DeviceMemoryEstimate(_Record):
    """Per-device memory the cost model expects, in bytes."""

    parameters: int
    outputs: int
    activations: int
    peak: int


class CollectiveTiming(Protocol):
    """What a breakdown needs of a device profile (``cost.profiles.DeviceProfile``)."""

    @property
    def name(self) -> str: ...

    def time_of(self, collective: Collective) -> float: ...


@dataclasses.dataclass(frozen=True)
class CostBreakdown(_Communicates, _Record):
    """What the cost model expects for a fully specified strategy (nothing compiled).

    Attributes:
        collectives: the collectives the model expects, with bytes in ``Report`` units.
        comm_bytes_per_axis: wire bytes per device per mesh axis.
        comm_time_per_axis: alpha-beta seconds per mesh axis.
        flops: per-device compute flops.
        compute_time: ``flops / device peak`` seconds.
        memory: per-device memory estimate.
        device: the device profile name used.
        warnings: primitives the rules did not know (treated as replicated), and similar notes.
        hidden_comm_time: seconds of ``comm_time`` that run while the device computes
            (asynchronous collectives on XLA:GPU and XLA:TPU, ``cost/overlap.py``); 0 where
            every collective is exposed (XLA:CPU).
    """

    collectives: tuple[Collective, ...]
    comm_bytes_per_axis: dict[str, float]
    comm_time_per_axis: dict[str, float]
    flops: float
    compute_time: float
    memory: DeviceMemoryEstimate
    device: str
    warnings: tuple[str, ...] = ()
    hidden_comm_time: float = 0.0

    @classmethod
    def from_collectives(
        cls,
        collectives: Sequence[Collective],
        profile: CollectiveTiming,
        *,
        flops: float,
        compute_time: float,
        memory: DeviceMemoryEstimate,
        warnings: Sequence[str] = (),
        exposed_share: float = 1.0,
    ) -> CostBreakdown:
        """The one assembly of a breakdown: per mesh axis (``"data+model"``, ``"-"`` for
        none), wire bytes and alpha-beta seconds of ``collectives``, each counted ``count``
        times (the trip count of an enclosing loop); ``exposed_share``: the share of their
        time the compute does not hide (``cost/overlap.py``)."""
        per_axis: dict[str, float] = {}
        time_axis: dict[str, float] = {}
        for c in collectives:
            key = "+".join(c.mesh_axes) or "-"
            per_axis[key] = per_axis.get(key, 0.0) + c.wire_bytes * c.count
            time_axis[key] = time_axis.get(key, 0.0) + profile.time_of(c)
        return cls(
            collectives=tuple(collectives),
            comm_bytes_per_axis=per_axis,
            comm_time_per_axis=time_axis,
            flops=flops,
            compute_time=compute_time,
            memory=memory,
            device=profile.name,
            warnings=tuple(warnings),
            hidden_comm_time=sum(time_axis.values()) * (1.0 - min(1.0, max(0.0, exposed_share))),
        )

    @property
    def comm_time(self) -> float:
        return sum(self.comm_time_per_axis.values())

    @property
    def exposed_comm_time(self) -> float:
        """The communication the device waits for: ``comm_time`` less what it hides."""
        return max(0.0, self.comm_time - self.hidden_comm_time)

    @property
    def time(self) -> float:
        """The predicted step: compute plus the communication it does not hide."""
        return self.compute_time + self.exposed_comm_time

    @property
    def exposed_share(self) -> float:
        """The share of the communication time the device waits for (1: none hidden)."""
        return self.exposed_comm_time / self.comm_time if self.comm_time > 0 else 1.0

    def comm_words(self, fmt: Callable[[float], str], word: str = "comm") -> str:
        """``comm 572.5 µs`` or, where compute hides some, ``comm 572.5 µs, 410 µs of it
        hidden`` (``fmt`` formats seconds)."""
        text = f"{word} {fmt(self.comm_time)}"
        if self.hidden_comm_time > 0:
            text += f", {fmt(self.hidden_comm_time)} of it hidden"
        return text

    def __repr__(self) -> str:
        return cost_text(self)

    def _repr_html_(self) -> str:
        return html_of("cost", self)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out.update(
            comm_bytes=self.comm_bytes,
            total_comm_bytes=self.total_comm_bytes,
            comm_time=self.comm_time,
            exposed_comm_time=self.exposed_comm_time,
            time=self.time,
        )
        return out


@dataclasses.dataclass(frozen=True)
class PlanRow(_Record):
    """One decision of the search, for ``Plan.table()``.

    Attributes:
        op: the primitive(s) of the unit (``input`` for an argument).
        where: the argument path or the user's ``file:line``.
        chosen: the split chosen (factor → mesh axes, or a ``P(...)`` for inputs).
        cost: seconds of the chosen split: its own cost plus resharding from its producers.
        alternatives: ``(split, seconds)`` of the next best candidates, same accounting.
    """

    op: str
    where: str
    chosen: str
    cost: float
    alternatives: tuple[tuple[str, float], ...] = ()


PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved")
REMAT_POLICIES = ("none", "dots", "nothing")


@dataclasses.dataclass(frozen=True)
class PipelineSpec(_Record):
    """Pipeline stages of a plan: the layers of its layer scans cut into ``stages``
    contiguous groups over the mesh axis ``axis``, the batch into ``microbatches``.

    Attributes:
        stages: pipeline stages (the size of ``axis``; divides the scanned layers).
        microbatches: microbatches per step (divides the batch).
        axis: the mesh axis the stages run on.
        schedule: ``gpipe`` (every forward, then every backward), ``1f1b`` (one forward,
            one backward: at most ``stages`` microbatches in flight) or ``interleaved``
            (Megatron's interleaved 1F1B: ``virtual_stages`` model chunks per stage, the
            bubble ``1/virtual_stages`` of 1F1B's, ``virtual_stages`` times the transfers;
            microbatches a multiple of the stages); the cost model prices all three, the
            compiled program runs the forward and the backward scans one after the other
            for every schedule (``plan/pipeline.py``): 1F1B and interleaved are priced only.
        scans: the scan groups (``OpGraph.scan_groups`` indices) that are pipelined; empty:
            every scan over the layers.
        virtual_stages: model chunks per stage for ``interleaved`` (stage s holds layer
            chunks s, s + stages, s + 2·stages, …; the layers divide by stages ×
            virtual_stages); 1 for the other schedules (interleaved with 1 is 1F1B).
    """

    stages: int
    microbatches: int
    axis: str = "stage"
    schedule: str = "gpipe"
    scans: tuple[int, ...] = ()
    virtual_stages: int = 1


@dataclasses.dataclass(frozen=True)
class RematSpec(_Record):
    """Rematerialisation of a plan's layer scans: what the forward scan keeps for the
    backward one, the rest recomputed in the backward scan (``plan/remat.py``; priced by
    ``cost/remat.py``; ``with_remat`` sets it with the cost).

    Attributes:
        policy: ``none`` (keep every residual), ``dots`` (keep the matmul outputs and each
            layer's input, as ``jax.checkpoint_policies.dots_saveable``), ``nothing`` (keep
            only each layer's input: ``nothing_saveable``).
        scans: the forward layer scans (``OpGraph.scan_groups`` indices) this applies to;
            empty: every layer scan.
    """

    policy: str
    scans: tuple[int, ...] = ()
