"""Megatron-LM 2021 (Narayanan et al., arXiv 2104.04473) and Korthikanti et al. 2022 (arXiv
2205.05198): the rows of Tables 1 and 2, Figs. 12 and 13, and Tables 3 and 5.

Microbatch sizes and virtual stages come from the paper's own scripts
(``NVIDIA/Megatron-LM: examples/sc21/run_table_1.sh``, ``run_figure_12.sh``,
``run_figure_13.sh``: ``--micro-batch-size``, ``--num-layers-per-virtual-pipeline-stage``;
all with ``--recompute-method uniform``, full recompute). Megatron 2021's step time is derived
from its TFLOP/s with its Eq. 3 (FLOPs per iteration, recompute included); Korthikanti's
iteration times are published.
"""

from __future__ import annotations

import dataclasses

from benchmarks.published.record import A100, Run
from shardlab.examples.gpt3 import (
    GPT3_175B,
    GPT_22B,
    GPT_162B,
    MEGATRON_TABLE_1,
    GPTConfig,
    megatron_flops,
)


def _megatron(
    source: str,
    config: GPTConfig,
    tflops: float,
    *,
    tp: int,
    pp: int,
    dp: int,
    batch: int,
    mbs: int,
    virtual: int = 1,
    remat: str = "nothing",
    note: str = "",
    counted: bool = True,
    tag: str = "",
) -> Run:
    """A Megatron-LM 2021 row: step = Eq. 3 / (TFLOP/s × GPUs)."""
    gpus = tp * pp * dp
    flops = megatron_flops(config, batch, 2048)
    m = batch // (dp * mbs)
    return Run(
        source,
        f"{config.parameter_count() / 1e9:.1f}B, {gpus} GPUs (TP{tp} PP{pp} DP{dp}, MBS {mbs})",
        config,
        batch,
        2048,
        "a100",
        (("stage", pp), ("data", dp), ("model", tp)),
        "megatron",
        remat,
        flops / (tflops * 1e12 * gpus),
        f"Eq. 3 / ({tflops:g} TFLOP/s × {gpus})",
        flops,
        A100,
        tflops * 1e12 / A100,
        microbatches=m if pp > 1 else 1,
        schedule=("interleaved" if virtual > 1 else "1f1b") if pp > 1 else "",
        virtual=virtual,
        counted=counted,
        note=note,
        tag=tag,
    )


def megatron_table_1() -> list[Run]:
    """Megatron 2021 Table 1 (Selene, weak scaling); MBS and virtual stages from
    ``examples/sc21/run_table_1.sh``; full recompute."""
    c = MEGATRON_TABLE_1
    t = "Megatron 2021 T1"
    return [
        _megatron(t, c[0], 138, tp=2, pp=1, dp=32, batch=512, mbs=16),
        _megatron(t, c[1], 142, tp=4, pp=1, dp=32, batch=512, mbs=16),
        _megatron(t, c[2], 138, tp=8, pp=2, dp=32, batch=1536, mbs=4),
        _megatron(t, c[3], 140, tp=8, pp=4, dp=32, batch=1792, mbs=2, virtual=3),
        _megatron(t, c[4], 148, tp=8, pp=8, dp=24, batch=2304, mbs=2, virtual=2),
        _megatron(t, c[5], 155, tp=8, pp=16, dp=15, batch=2160, mbs=1, virtual=2),
        _megatron(t, c[6], 163, tp=8, pp=35, dp=9, batch=2520, mbs=1, virtual=3),
        _megatron(t, c[7], 163, tp=8, pp=64, dp=6, batch=3072, mbs=1),
    ]


def _zero3(config: GPTConfig, gpus: int, mbs: int, batch: int, tflops: float) -> Run:
    """A ZeRO-3 row of Table 2 (DeepSpeed, data parallel only)."""
    flops = megatron_flops(config, batch, 2048)
    skip = ""
    dims = (config.d, 4 * config.d, config.vocab, config.layers)
    if all(n % gpus for n in dims):
        skip = (
            f"{gpus} devices divide no dimension of the parameters (h {config.d:,}, 4h "
            f"{4 * config.d:,}, V {config.vocab:,}, {config.layers} layers): the baselines "
            "split whole dimensions, DeepSpeed's ZeRO-3 flattens and pads"
        )
    return Run(
        "Megatron 2021 T2",
        f"ZeRO-3 {config.parameter_count() / 1e9:.1f}B, {gpus} GPUs (DP{gpus}, MBS {mbs})",
        config,
        batch,
        2048,
        "a100",
        (("data", gpus),),
        "zero3",
        "nothing",
        flops / (tflops * 1e12 * gpus),
        f"Eq. 3 / ({tflops:g} TFLOP/s × {gpus})",
        flops,
        A100,
        tflops * 1e12 / A100,
        note="recompute assumed full (not stated for the ZeRO-3 runs)",
        skip=skip,
        tag=f"t2-zero3-{config.name}-{gpus}",
    )


def megatron_table_2() -> list[Run]:
    """Megatron 2021 Table 2: PTD-P against ZeRO-3 (DeepSpeed) without model parallelism.
    PTD-P's schedule is not given: taken as the paper's interleaved runs of these models
    (175B: 2 layers per virtual stage, Fig. 12's script; 530B: 1, Table 1's)."""
    t = "Megatron 2021 T2"
    big = MEGATRON_TABLE_1[6]
    note = "schedule assumed interleaved as in the paper's scripts for this model"
    rows = [
        _zero3(GPT3_175B, 384, 4, 1536, 144),
        _zero3(GPT3_175B, 768, 2, 1536, 88),
        _zero3(GPT3_175B, 1536, 1, 1536, 44),
        _zero3(big, 640, 4, 2560, 138),
        _zero3(big, 1120, 2, 2240, 98),
        _zero3(big, 2240, 1, 2240, 48),
    ]
    for dp, tflops in ((4, 153), (8, 149), (16, 141)):
        rows.append(
            _megatron(
                t,
                GPT3_175B,
                tflops,
                tp=8,
                pp=12,
                dp=dp,
                batch=1536,
                mbs=1,
                virtual=4,
                note=note,
                tag=f"t2-ptdp-gpt-175b-{96 * dp}",
            )
        )
    for dp, tflops in ((2, 171), (4, 167), (8, 159)):
        rows.append(
            _megatron(t, big, tflops, tp=8, pp=35, dp=dp, batch=2240, mbs=1, virtual=3, note=note)
        )
    return [
        dataclasses.replace(r, label=f"PTD-P {r.label}") if r.layout == "megatron" else r
        for r in rows
    ]


def megatron_figures() -> list[Run]:
    """Figs. 12 and 13 (values read off plots, 2nd-hand: ordering checks, not counted)."""
    out = []
    for gbs, inter, default in ((12, 115, 95), (60, 142, 137)):
        for v, tflops in ((4, inter), (1, default)):
            out.append(
                _megatron(
                    "Megatron 2021 F12",
                    GPT3_175B,
                    tflops,
                    tp=8,
                    pp=12,
                    dp=1,
                    batch=gbs,
                    mbs=1,
                    virtual=v,
                    counted=False,
                    note="TFLOP/s read off a plot (2nd-hand): an ordering check",
                    tag=f"f12-{gbs}-{'interleaved' if v > 1 else '1f1b'}",
                )
            )
    for p, t, tflops in ((8, 8, 195), (4, 16, 175), (32, 2, 140), (2, 32, 100)):
        out.append(
            _megatron(
                "Megatron 2021 F13",
                GPT_162B,
                tflops,
                tp=t,
                pp=p,
                dp=1,
                batch=128,
                mbs=1,
                counted=False,
                note="TFLOP/s read off a plot (2nd-hand): an ordering check",
                tag=f"f13-{p}x{t}",
            )
        )
    return out


def korthikanti() -> list[Run]:
    """Korthikanti 2022 Tables 3 and 5: full recompute vs sequence parallel + selective
    recompute, TP8, no data parallelism, interleaved with 3 chunks for 175B and 530B."""
    out = []
    big, huge = MEGATRON_TABLE_1[6], MEGATRON_TABLE_1[7]
    cases = (
        (GPT_22B, 1, 8, 4, 4, 1, 1.42, 1.10, 0.415),
        (GPT3_175B, 8, 64, 64, 1, 3, 18.13, 13.75, 0.514),
        (big, 35, 280, 280, 1, 3, 49.05, 37.83, 0.560),
        (huge, 64, 512, 512, 1, 1, 94.42, 71.49, 0.563),
    )
    for config, pp, gpus, gbs, mbs, v, full, selective, mfu in cases:
        for remat, seconds, label in (
            ("nothing", full, "full"),
            ("dots", selective, "SP + selective"),
        ):
            model_flops = megatron_flops(config, gbs, 2048, recompute=False)
            out.append(
                Run(
                    "Korthikanti 2022 T3",
                    f"{config.parameter_count() / 1e9:.0f}B, {gpus} GPUs (TP8 PP{pp}), {label}",
                    config,
                    gbs,
                    2048,
                    "a100",
                    (("stage", pp), ("model", 8)),
                    "megatron",
                    remat,
                    seconds,
                    "iteration time as published",
                    model_flops,
                    A100,
                    mfu if remat == "dots" else None,
                    microbatches=gbs // mbs if pp > 1 else 1,
                    schedule=("interleaved" if v > 1 else "1f1b") if pp > 1 else "",
                    virtual=v,
                    note="sequence parallelism not modelled (Table 4: −3% per layer)"
                    if remat == "dots"
                    else "",
                    tag=f"k-{config.name}-{remat}",
                )
            )
    out.append(
        Run(
            "Korthikanti 2022 §6",
            "530B, 2240 GPUs (TP8 PP35 DP8), SP + selective",
            big,
            2240,
            2048,
            "a100",
            (("stage", 35), ("data", 8), ("model", 8)),
            "megatron",
            "dots",
            39.15,
            "iteration time as published",
            megatron_flops(big, 2240, 2048, recompute=False),
            A100,
            0.542,
            microbatches=280,
            schedule="interleaved",
            virtual=3,
            note="gradient all-reduce not overlapped (as published); sequence parallelism not modelled",
        )
    )
    return out
