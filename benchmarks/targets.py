"""Targets: GPU and TPU programs compiled deviceless on this CPU machine, at cluster sizes.

Each row is one call timed end to end in this process (tracing, pricing, and compiling with
the target's own compiler), first call of its kind after ``jax.clear_caches()``:

- ``analyze`` of a 2-layer GPT train step (bf16, width 1024) on 256 H100s and on a 256-chip
  v5e slice, data × model;
- ``search`` of a Llama 3.1 8B train step (32 layers, bf16, abstract arguments) on 64 H100s
  and of the 70B one (80 layers) on 256 H100s, and the searched plan's ``verify()``:
  compiled by XLA:GPU, with its per-device memory against the device's HBM.

Targets (issue 33): analyze ≤ 20 s each; search ≤ 60 s (8B, 64 GPUs) and ≤ 120 s (70B, 256
GPUs); the plan's memory under the device's HBM.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

GIB = 2**30


def _timed(call: Callable[[], Any]) -> tuple[Any, float]:
    jax.clear_caches()
    start = time.perf_counter()
    out = call()
    return out, time.perf_counter() - start


def _gpt_step() -> tuple[Callable[..., Any], tuple[Any, ...], Any]:
    from shardlab.examples.transformer import gpt

    case = gpt(2, batch=256, seq=256, d=1024, heads=16, vocab=32768)
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(
            x.shape, jnp.bfloat16 if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype
        ),
        case.args,
    )
    return case.fn, abstract, None


def rows() -> list[dict[str, Any]]:
    import shardlab
    from shardlab.examples.llama import LLAMA_8B, LLAMA_70B, llama
    from shardlab.parallel.cost.profiles import DEVICE_PROFILES

    out: list[dict[str, Any]] = []
    fn, args, _ = _gpt_step()
    data_specs = (None, None, (P("data", None), P("data", None)))
    for t, shape in (
        (shardlab.target("h100", hosts=32), {"data": 32, "model": 8}),
        (shardlab.target("tpu-v5e", topology="16x16"), {"data": 16, "model": 16}),
    ):
        mesh = shardlab.mesh(shape, devices=t)
        report, seconds = _timed(
            lambda mesh=mesh: shardlab.analyze(fn, *args, mesh=mesh, in_shardings=data_specs)
        )
        out.append(
            {
                "what": "analyze gpt 2L train (bf16, d 1024, batch 256 × 256)",
                "target": t.description,
                "mesh": " × ".join(f"{k}={v}" for k, v in shape.items()),
                "seconds": seconds,
                "limit": 20.0,
                "memory": report.memory.total,
                "collectives": len(report.collectives),
                "hbm": DEVICE_PROFILES[t.profile].memory_bytes,
            }
        )
    for config, hosts, shape, limit in (
        (LLAMA_8B, 8, {"data": 8, "model": 8}, 60.0),
        (LLAMA_70B, 32, {"data": 32, "model": 8}, 120.0),
    ):
        t = shardlab.target("h100", hosts=hosts)
        mesh = shardlab.mesh(shape, devices=t)
        case = llama(config, batch=8 * hosts, seq=2048)
        plan, seconds = _timed(
            lambda case=case, mesh=mesh: shardlab.search(case.fn, *case.args, mesh=mesh)
        )
        report, verify_s = _timed(plan.verify)
        compiled = report.memory.total
        out.append(
            {
                "what": f"search {config.name} train ({config.parameter_count() / 1e9:.1f}B, "
                f"{config.layers} layers, bf16, abstract; batch {case.args[2][0].shape[0]} × 2048)",
                "target": t.description,
                "mesh": " × ".join(f"{k}={v}" for k, v in shape.items()),
                "seconds": seconds,
                "limit": limit,
                "plan": plan.method,
                "predicted": plan.cost.memory.peak,
                "compiled": compiled,
                "verify_s": verify_s,
                "hbm": DEVICE_PROFILES[t.profile].memory_bytes,
            }
        )
    return out


def run() -> str:
    found = rows()
    lines = [
        "## Targets: deviceless compiles for GPU hosts and TPU slices",
        "",
        "One call each, timed end to end (tracing, pricing, compiling with the target's own "
        "compiler), after `jax.clear_caches()`. Targets: `analyze` ≤ 20 s; `search` ≤ 60 s "
        "(8B on 64 GPUs) and ≤ 120 s (70B on 256 GPUs); the plan's compiled memory per device "
        "under the device's HBM.",
        "",
        "| call | target | mesh | seconds (target) | result |",
        "|---|---|---|---|---|",
    ]
    for row in found:
        ok = "✓" if row["seconds"] <= row["limit"] else "✗"
        if row["what"].startswith("analyze"):
            result = (
                f"{row['collectives']} collectives; compiled {row['memory'] / GIB:.2f} GiB "
                "per device"
            )
        else:
            fits = "under" if row["compiled"] <= row["hbm"] else "OVER"
            result = (
                f"plan {row['plan']}; predicted {row['predicted'] / GIB:.1f} GiB, compiled "
                f"{row['compiled'] / GIB:.1f} GiB per device, "
                f"{fits} the {row['hbm'] / GIB:.0f} GiB HBM (verify {row['verify_s']:.0f} s)"
            )
        lines.append(
            f"| {row['what']} | {row['target']} | {row['mesh']} | "
            f"{row['seconds']:.1f} ({row['limit']:.0f}) {ok} | {result} |"
        )
    return "\n".join(lines)
