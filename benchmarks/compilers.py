"""Fidelity against the compilers users run on: the cost model's communication and memory of
the baselines, next to what XLA:CPU, XLA:GPU (H100) and XLA:TPU (v5e) compile, in bfloat16
and float32.

Each row is one baseline plan (``shardlab.strategies.baselines``) of a train step from
``shardlab.examples`` on one mesh. The prediction is the plan's own cost, priced by the
mesh's profile (so by the profile's compiler: ``cost/compilers.py``); the truth is
``shardlab.analyze`` of the plan's shardings, compiled by that compiler (deviceless for GPU
and TPU targets). Within 5% for communication (total wire bytes per device) and 10% for
memory (arguments + outputs + temp) counts as a match.

The compiled figures are cached in ``benchmarks/cache/compilers.json`` (keyed by row), so
``python -m benchmarks.compilers --cached`` re-prices every row in seconds after a change to
the model; ``make bench`` (``--only compilers``) compiles again.

Run: ``python -m benchmarks --only compilers --out docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

CACHE = os.path.join(os.path.dirname(__file__), "cache", "compilers.json")
DTYPES = ("bfloat16", "float32")


def _meshes() -> Iterator[tuple[str, Any, list[dict[str, int]]]]:
    """(compiler, devices or target, mesh shapes) per compiler and size."""
    import jax

    import shardlab
    from shardlab.parallel.targets.devices import compiler_missing

    yield "XLA:CPU", jax.devices()[:8], [{"data": 8}, {"data": 2, "model": 4}]
    if compiler_missing("gpu") or compiler_missing("tpu"):
        print(
            f"[compilers] no target compilers: {compiler_missing('gpu') or compiler_missing('tpu')}",
            file=sys.stderr,
        )
        return
    small = [{"data": 8}, {"data": 2, "model": 4}]
    medium = [{"data": 64}, {"data": 8, "model": 8}]
    # 256 devices: the GPT's batch of 64 cannot split 256 ways, so two 2-D meshes
    large = [{"data": 64, "model": 4}, {"data": 32, "model": 8}]
    yield "XLA:GPU", shardlab.target("h100", hosts=1), small
    yield "XLA:GPU", shardlab.target("h100", hosts=8), medium
    yield "XLA:GPU", shardlab.target("h100", hosts=32), large
    yield "XLA:TPU", shardlab.target("tpu-v5e", topology="2x4"), small
    yield "XLA:TPU", shardlab.target("tpu-v5e", topology="8x8"), medium
    yield "XLA:TPU", shardlab.target("tpu-v5e", topology="16x16"), large
    yield "XLA:TPU", shardlab.target("tpu-v5p", topology="2x2x2"), small
    yield "XLA:TPU", shardlab.target("tpu-v5p", topology="4x4x4"), medium
    yield "XLA:TPU", shardlab.target("tpu-v5p", topology="4x8x8"), large


def _chip(devices: Any) -> str:
    """The target's kind (``h100``, ``tpu-v5p``); '' for CPU devices."""
    return str(getattr(devices, "kind", ""))


def _cases(dtype: str) -> list[tuple[str, Any, tuple[Any, ...]]]:
    import jax
    import jax.numpy as jnp

    from shardlab.examples.dense import mlp
    from shardlab.examples.transformer import gpt

    def cast(args: Any) -> Any:
        def leaf(a: Any) -> Any:
            floating = jnp.issubdtype(a.dtype, jnp.floating)
            return jax.ShapeDtypeStruct(a.shape, getattr(jnp, dtype) if floating else a.dtype)

        return jax.tree.map(leaf, args)

    out = []
    for case in (mlp(2048, 512, train=True), gpt(2, batch=64, seq=64, d=256, heads=4, vocab=1024)):
        out.append((case.name, case.fn, cast(case.args)))
    return out


def rows(cached: bool = False) -> list[dict[str, Any]]:
    """One row per (compiler, dtype, model, mesh, baseline): predicted and compiled bytes."""
    import shardlab
    from shardlab import strategies

    cache: dict[str, Any] = {}
    if os.path.exists(CACHE):
        with open(CACHE) as handle:
            cache = json.load(handle)
    out = []
    for compiler, devices, shapes in _meshes():
        chip = _chip(devices)
        for shape in shapes:
            mesh = shardlab.mesh(shape, devices=devices)
            size = " × ".join(f"{k}={v}" for k, v in shape.items())
            for dtype in DTYPES:
                for name, fn, args in _cases(dtype):
                    plans = strategies.baselines(fn, *args, mesh=mesh)
                    for strategy, plan in plans.items():
                        if strategy == "replicated":
                            continue
                        key = f"{compiler}|{size}|{dtype}|{name}|{strategy}"
                        if chip not in ("", "h100", "tpu-v5e"):  # rows before v5p and 256
                            key = f"{compiler} {chip}|{size}|{dtype}|{name}|{strategy}"
                        if not (cached and key in cache):
                            start = time.perf_counter()
                            report = shardlab.analyze(
                                fn,
                                *args,
                                mesh=mesh,
                                in_shardings=plan.in_shardings,
                                out_shardings=plan.out_shardings,
                            )
                            cache[key] = {
                                "comm": sum(report.comm_bytes.values()),
                                "kinds": {k: v for k, v in report.comm_bytes.items() if v},
                                "memory": report.memory.total,
                                "seconds": time.perf_counter() - start,
                            }
                            print(
                                f"[compilers] {key}: {cache[key]['seconds']:.1f} s",
                                file=sys.stderr,
                                flush=True,
                            )
                        got = cache[key]
                        out.append(
                            {
                                "compiler": compiler,
                                "chip": chip or "cpu",
                                "mesh": size,
                                "devices": len(mesh.devices.flat),
                                "dtype": dtype,
                                "model": name,
                                "strategy": strategy,
                                "comm": sum(plan.cost.comm_bytes.values()),
                                "memory": plan.cost.memory.peak,
                                "compiled_comm": got["comm"],
                                "compiled_memory": got["memory"],
                            }
                        )
    os.makedirs(os.path.dirname(CACHE), exist_ok=True)
    with open(CACHE, "w") as handle:
        json.dump(cache, handle, indent=1, sort_keys=True)
    return out


def _ratio(a: float, b: float) -> float:
    if b == 0:
        return 1.0 if a == 0 else float("inf")
    return a / b


def table(found: list[dict[str, Any]]) -> str:
    lines = [
        "## Compilers: the cost model against XLA:CPU, XLA:GPU and XLA:TPU",
        "",
        "Every baseline (data parallel, ZeRO, Megatron and their mixes) of an MLP train step "
        "(batch 2048, width 512) and a 2-layer GPT train step (d 256, batch 64 × 64), "
        "predicted by the mesh's profile and compiled by its compiler (GPU and TPU "
        "deviceless, over `shardlab.target`: H100 hosts of 8, 64 and 256 GPUs, TPU v5e and "
        "v5p slices of 8, 64 and 256 chips). A match: communication within 5%, memory "
        "within 10%. Re-price from the cached compiled figures in seconds: "
        "`python -m benchmarks.compilers --cached` (`tools/compiler_fidelity.py` prints each "
        "miss by collective kind).",
        "",
        "| compiler | dtype | communication within 5% | memory within 10% |",
        "|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in found:
        groups.setdefault((row["compiler"], row["dtype"]), []).append(row)
    for (compiler, dtype), rs in groups.items():
        comm = sum(abs(_ratio(r["comm"], r["compiled_comm"]) - 1) <= 0.05 for r in rs)
        mem = sum(abs(_ratio(r["memory"], r["compiled_memory"]) - 1) <= 0.10 for r in rs)
        lines.append(f"| {compiler} | {dtype} | {comm} / {len(rs)} | {mem} / {len(rs)} |")
    lines += [
        "",
        "By chip and size (both dtypes):",
        "",
        "| compiler | chip | devices | communication within 5% | memory within 10% |",
        "|---|---|---|---|---|",
    ]
    sized: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for row in found:
        sized.setdefault((row["compiler"], row["chip"], row["devices"]), []).append(row)
    for (compiler, chip, n), rs in sized.items():
        comm = sum(abs(_ratio(r["comm"], r["compiled_comm"]) - 1) <= 0.05 for r in rs)
        mem = sum(abs(_ratio(r["memory"], r["compiled_memory"]) - 1) <= 0.10 for r in rs)
        lines.append(f"| {compiler} | {chip} | {n} | {comm} / {len(rs)} | {mem} / {len(rs)} |")
    lines += [
        "",
        "<details><summary>every row (predicted ÷ compiled)</summary>",
        "",
        "| compiler | chip | mesh | dtype | model | strategy | comm | memory |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in found:
        c = _ratio(r["comm"], r["compiled_comm"])
        m = _ratio(r["memory"], r["compiled_memory"])
        flag_c = "" if abs(c - 1) <= 0.05 else " ✗"
        flag_m = "" if abs(m - 1) <= 0.10 else " ✗"
        lines.append(
            f"| {r['compiler']} | {r['chip']} | {r['mesh']} | {r['dtype']} | {r['model']} | "
            f"{r['strategy']} | {c:.2f}{flag_c} | {m:.2f}{flag_m} |"
        )
    lines += ["", "</details>"]
    return "\n".join(lines)


def run(cached: bool = False) -> str:
    return table(rows(cached=cached))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compilers")
    parser.add_argument("--cached", action="store_true", help="reuse cached compiled figures")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    start = time.perf_counter()
    print(run(cached=args.cached))
    print(f"\n({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
