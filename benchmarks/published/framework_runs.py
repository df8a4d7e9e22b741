"""The frameworks' published runs: NVIDIA's DGX-Cloud recipes, torchtitan, MaxText on TPU,
Alpa.

- DGX-Cloud (``NVIDIA/dgxc-benchmarking``): step times as published, H100 SXM, 8 per host.
- torchtitan (``pytorch/torchtitan: benchmarks/llama3_h100_202412_torchtitan.md``; the
  pipeline splits and microbatches are torchtitan's defaults at the benchmark's commit
  9dec370: ``generate_split_points``, ``pipeline_parallel_microbatches = pp``): step time =
  tokens per GPU per step / tokens/s/GPU.
- MaxText on TPU (``AI-Hypercomputer/maxtext: docs/.../runtime_performance_results.md`` and
  ``MaxText/configs/v5p|v5e/*.sh``): step time = MaxText's own FLOPs per device per step
  (``calculate_tflops_training_per_device``) / the TFLOP/s per chip it reports.
- Alpa (``alpa-projects/alpa: benchmark/alpa/README.md``).
"""

from __future__ import annotations

from benchmarks.published.record import H100, V5E, V5P, Run, skipped
from shardlab.examples.gpt3 import GPT3_175B
from shardlab.examples.llama import LLAMA_8B, LLAMA_70B, LLAMA_405B, LlamaConfig

DGXC_GPT3_FLOPS = 2.20e15  # per sequence (dgxc-benchmarking nemo_megatron/README_175b.md)
DGXC_LLAMA3_70B_FLOPS = 3.94e15  # per sequence, seq 8192 (llama3.1/README_70b.md)


def dgx_cloud() -> list[Run]:
    """NVIDIA DGX-Cloud recipes on H100 (8 per host, InfiniBand NDR)."""
    out = []
    for gpus, gbs, step, mfu in ((128, 256, 8.309, 0.5354), (2048, 4096, 8.49, 0.5240)):
        dp = gpus // 32
        out.append(
            Run(
                "DGXC NeMo",
                f"GPT-3 175B BF16, {gpus} GPUs (TP4 PP8 VP12 DP{dp}, MBS 1)",
                GPT3_175B,
                gbs,
                2048,
                "h100",
                (("stage", 8), ("data", dp), ("model", 4)),
                "megatron",
                "none",
                step,
                "step time as published",
                gbs * DGXC_GPT3_FLOPS,
                H100,
                mfu,
                microbatches=gbs // dp,
                schedule="interleaved",
                virtual=12,
                note="no recompute (gpt3_175b_hydra.yaml); sequence parallelism and TP/DP/PP "
                "communication overlap not modelled",
            )
        )
    for gpus, mesh, gbs, step, mfu in (
        (128, (("data", 128),), 256, 15.563, 0.5120),
        (2048, (("replica", 16), ("data", 128)), 4096, 15.898, 0.5012),
    ):
        out.append(
            Run(
                "DGXC MaxText",
                f"Llama 3 70B BF16, {gpus} GPUs (FSDP 128"
                + (" × DP 16" if gpus > 128 else "")
                + ", 2 per device)",
                LLAMA_70B,
                gbs,
                8192,
                "h100",
                mesh,
                "zero3",
                "dots",
                step,
                "step time as published",
                gbs * DGXC_LLAMA3_70B_FLOPS,
                H100,
                mfu,
                note="remat save_qkv_proj taken as dots; cuDNN flash attention (the model "
                "materialises the scores)",
            )
        )
    fp8 = "FP8 matmuls: the cost model prices BF16 only"
    for label, skip in (
        ("GPT-3 175B FP8, 128 GPUs (5.626 s)", fp8),
        ("Llama 3.1 70B BF16, 64 GPUs, TP4 PP4 CP2 VP5 (14.72 s)", "context parallelism (CP2)"),
        ("Llama 3.1 70B BF16, 2048 GPUs, TP4 PP4 CP2 VP5 (14.98 s)", "context parallelism (CP2)"),
        ("MaxText Llama 3 70B FP8, 128 GPUs (9.074 s)", fp8),
        ("Paxml GPT-3 175B FP8, 128 GPUs (7.47 s)", fp8),
    ):
        out.append(skipped("DGXC", label, skip))
    return out


def torchtitan_flops(config: LlamaConfig, tokens: int, seq: int) -> float:
    """torchtitan's MFU FLOPs: ``6 · (parameters − embedding) + 12 · l · h · s`` per token."""
    params = config.parameter_count() - config.vocab * config.d
    return tokens * (6 * params + 12 * config.layers * config.d * seq)


def torchtitan() -> list[Run]:
    """torchtitan Llama 3.1 on H100 (Grand Teton, 500 W, HBM2e). Step = tokens per GPU per
    step / tokens/s/GPU."""
    out = []
    seq = 8192
    eager = "eager PyTorch (no fusion): the model prices a compiled program; not counted"
    float8 = "torch.compile + Float8 (+AsyncTP): the model prices BF16; not counted"
    for hosts, gbs, label, tps, counted, note in (
        (1, 16, "T1 FSDP", 5762, False, eager),
        (1, 16, "T1 FSDP + compile", 6667, True, ""),
        (16, 256, "T3 FSDP", 5605, False, eager),
        (16, 256, "T3 FSDP + compile", 6514, True, ""),
    ):
        gpus = 8 * hosts
        per_gpu = gbs * seq / gpus
        out.append(
            Run(
                "torchtitan",
                f"8B {label}, {gpus} GPUs (local batch 2, selective AC)",
                LLAMA_8B,
                gbs,
                seq,
                "h100",
                (("data", gpus),),
                "zero3",
                "dots",
                per_gpu / tps,
                f"{per_gpu:,.0f} tokens/GPU / {tps:,} tokens/s",
                torchtitan_flops(LLAMA_8B, gbs * seq, seq),
                H100,
                counted=counted,
                note=note or "500 W H100 with HBM2e (between SXM and NVL); priced as SXM",
            )
        )
    for label, tps in (("T4 2D", 829), ("T4 2D + AsyncTP", 876)):
        out.append(
            Run(
                "torchtitan",
                f"70B {label}, 256 GPUs (FSDP 32 × TP 8, local batch 16, full AC)",
                LLAMA_70B,
                512,
                seq,
                "h100",
                (("data", 32), ("model", 8)),
                "fsdp+tp",
                "nothing",
                512 * seq / 256 / tps,
                f"{512 * seq // 256:,} tokens/GPU / {tps:,} tokens/s",
                torchtitan_flops(LLAMA_70B, 512 * seq, seq),
                H100,
                counted=False,
                note=float8 + "; head not vocab-parallel (torchtitan uses loss_parallel)",
            )
        )
    one_f_one_b = (15, 16, 16, 16, 16, 16, 16, 15)  # torchtitan's generate_split_points
    interleaved = (7, *([8] * 14), 7)
    for label, tps, schedule, v, split in (
        ("1F1B", 100, "1f1b", 1, one_f_one_b),
        ("interleaved 1F1B", 128, "interleaved", 2, interleaved),
    ):
        out.append(
            Run(
                "torchtitan",
                f"405B T5 {label}, 512 GPUs (FSDP 8 × TP 8 × PP 8, m 8, full AC)",
                LLAMA_405B,
                256,
                seq,
                "h100",
                (("stage", 8), ("data", 8), ("model", 8)),
                "fsdp+tp",
                "nothing",
                256 * seq / 512 / tps,
                f"{256 * seq // 512:,} tokens/GPU / {tps} tokens/s",
                torchtitan_flops(LLAMA_405B, 256 * seq, seq),
                H100,
                microbatches=8,
                schedule=schedule,
                virtual=v,
                assignment=split,
                counted=False,
                note=float8,
                tag=f"tt-{schedule}",
            )
        )
    return out


def maxtext_config(scale: int) -> LlamaConfig:
    """MaxText's default decoder at ``global_parameter_scale`` (``base.yml``: emb 2048, 16
    heads of 128, MLP 7168 SwiGLU, 16 layers, vocab 32,000; ``get_individual_scales``)."""
    base, rem = divmod(scale.bit_length() - 1, 3)
    heads = 2 ** (base + (rem > 0))
    emb = 2 ** (base + (rem > 1))
    layers = 2**base
    return LlamaConfig(
        f"maxtext-{scale}b",
        16 * layers,
        2048 * emb,
        16 * heads,
        16 * heads,
        7168 * heads,
        32000,
        rope_theta=10000.0,
        head_size=128,
    )


def maxtext_flops(config: LlamaConfig, per_device_batch: int, seq: int) -> float:
    """MaxText's ``calculate_tflops_training_per_device`` (2024): FLOPs per device per step."""
    b, s, d, f, h = per_device_batch, seq, config.d, config.ffn, config.heads
    hd, kv = config.head_dim, config.kv_heads
    ffn = 2 * b * s * f * d * 2 + 2 * b * s * f * d
    qkv = 2 * b * s * d * (h + 2 * kv) * hd
    projection = 2 * b * s * d * h * hd
    embedding = 2 * b * s * d * config.vocab
    attention = 4 * b * s * s * h * hd
    learnable = (ffn + qkv + projection) * config.layers + embedding
    return 3 * learnable + 3 * attention * config.layers


def maxtext_tpu() -> list[Run]:
    """MaxText MFU table on TPU (per-device batch, tensor degree and remat from the config
    scripts); FSDP over the rest of the slice."""
    out = []
    for chip, scale, slice_name, topology, pdb, tp, remat, mfu in (
        ("tpu-v5p", 32, "v5p-128", "4x4x4", 7, 4, "dots", 0.7147),
        ("tpu-v5p", 64, "v5p-128", "4x4x4", 3, 4, "dots", 0.7031),
        ("tpu-v5p", 128, "v5p-256", "4x4x8", 1, 8, "dots", 0.6868),
        ("tpu-v5p", 128, "v5p-512", "4x8x8", 1, 8, "dots", 0.6853),
        ("tpu-v5p", 512, "v5p-1024", "8x8x8", 2, 8, "nothing", 0.6399),
        ("tpu-v5e", 32, "v5e-256", "16x16", 4, 1, "nothing", 0.6686),
    ):
        config = maxtext_config(scale)
        peak = V5P if chip == "tpu-v5p" else V5E
        chips = 1
        for n in topology.split("x"):
            chips *= int(n)
        per_device = maxtext_flops(config, pdb, 2048)
        tflops = mfu * peak
        mesh = (("data", chips // tp), ("model", tp)) if tp > 1 else (("data", chips),)
        out.append(
            Run(
                "MaxText TPU",
                f"{scale}B on {slice_name} ({chips} chips, FSDP {chips // tp}"
                + (f" × TP {tp}" if tp > 1 else "")
                + f", {pdb} per device)",
                config,
                pdb * chips,
                2048,
                chip,
                mesh,
                "fsdp+tp" if tp > 1 else "zero3",
                remat,
                per_device / tflops,
                f"MaxText FLOPs / ({tflops / 1e12:.0f} TFLOP/s)",
                per_device * chips,
                peak,
                mfu,
                topology=topology,
                note="remat minimal taken as dots; splash/flash attention not modelled"
                if remat == "dots"
                else "flash attention not modelled",
            )
        )
    for label, why in (
        ("1160B on v5p-12288 (66.23%)", "6,144 chips: its config (v5p-12288.sh) not transcribed"),
        ("32B on 32× v5e-256 (60.40%)", "8,192 chips over 32 slices: not transcribed"),
        ("128B on v5e-256 (56.06%, 46.25% on 32×)", "host-offloaded remat (minimal_offloaded)"),
    ):
        out.append(skipped("MaxText TPU", label, why))
    return out


def alpa() -> list[Run]:
    return [
        skipped(
            "Alpa",
            "GPT 2.6B, 8 × V100 (DP2 × OP2 × PP2, 2.425 s)",
            "no V100 target or profile in the catalog (targets/catalog.py)",
        )
    ]
