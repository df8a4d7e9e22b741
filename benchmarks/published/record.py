"""One published train step and how to replay it (``Run``), and the sources' peaks."""

from __future__ import annotations

import dataclasses

from shardlab.examples.gpt3 import GPT3_175B, GPTConfig
from shardlab.examples.llama import LlamaConfig

A100, H100, V5P, V5E = 312e12, 989e12, 459e12, 197e12  # the sources' BF16 peaks


@dataclasses.dataclass(frozen=True)
class Run:
    """One published train step and how to replay it.

    Attributes:
        source: the table or figure (``"Megatron 2021 T1"``).
        label: the row in words.
        model: a ``GPTConfig`` or ``LlamaConfig``.
        batch: the global batch in sequences.
        seq: tokens per sequence.
        kind: the target kind (``"a100"``, ``"h100"``, ``"tpu-v5p"``, ``"tpu-v5e"``).
        mesh: ``((axis, size), ...)``, outermost first (the last axes stay within a host).
        layout: ``megatron`` (data × tensor), ``zero3`` (FSDP over ``data``), ``fsdp+tp``
            (FSDP over ``data`` × tensor over ``model``).
        remat: the remat policy standing for the published recompute mode.
        published: the published (or derived) step time, seconds.
        how: how ``published`` was derived.
        flops: FLOPs of one step by the source's own formula (for the MFU columns).
        peak: the per-device peak the source's MFU uses.
        published_mfu: the source's MFU (or % of peak), if it gives one.
        microbatches: per step (pipelined rows), ``batch / (data × microbatch size)``.
        schedule: ``""`` (no pipeline), ``1f1b`` or ``interleaved``.
        virtual: model chunks per stage (interleaved).
        assignment: layers per (virtual) stage when uneven.
        topology: TPU slice topology.
        slices: TPU slices.
        counted: in the within-15% tally.
        note: caveats (what the replay does not model, why not counted).
        skip: the reason the row is not replayed at all ("" replays it).
        tag: a name the ordering checks find the row by.
    """

    source: str
    label: str
    model: GPTConfig | LlamaConfig
    batch: int
    seq: int
    kind: str
    mesh: tuple[tuple[str, int], ...]
    layout: str
    remat: str
    published: float
    how: str
    flops: float
    peak: float
    published_mfu: float | None = None
    microbatches: int = 1
    schedule: str = ""
    virtual: int = 1
    assignment: tuple[int, ...] | None = None
    topology: str = ""
    slices: int = 1
    counted: bool = True
    note: str = ""
    skip: str = ""
    tag: str = ""

    @property
    def devices(self) -> int:
        n = 1
        for _, size in self.mesh:
            n *= size
        return n

    @property
    def stages(self) -> int:
        return dict(self.mesh).get("stage", 1)


def skipped(source: str, label: str, why: str) -> Run:
    return Run(source, label, GPT3_175B, 1, 2048, "h100", (), "", "", 0.0, "", 0.0, H100, skip=why)
