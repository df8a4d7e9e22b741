"""Memory budgets (issue 15): the search's five-dimensional mix against hand-made plans.

GPT-style train steps of 8 and 16 scanned layers on 8 devices. The reference is data
parallel's *compiled* per-device memory; budgets are 75 %, 50 % and 35 % of it. Hand-made
plans (``shardlab.strategies``): data parallel, ZeRO-3, ZeRO-3 × full remat, pipeline ×
data, pipeline × tensor and data × tensor × ZeRO-3 × full remat. Each is compiled once
(per-device memory: arguments + outputs + temporaries) and run once against the plain
``jax.jit`` step: every output (loss, new parameters, optimizer state — the new
parameters are the gradients' image under the update, so equal parameters mean equal
gradients) at rtol 1e-5. At each budget ``search(..., memory_budget=b)`` runs on a
``stage=2 × data=4`` mesh (so stages, remat, ZeRO and the splits are all open to it); its
plan is compiled and run the same way.

Targets: at every budget some plan fits when compiled (or the smallest reachable budget is
reported); auto's plan fits when compiled and its predicted step time is no worse than the
best hand-made plan that fits; stages balanced (max/mean stage time ≤ 1.15).

Run: ``make bench`` or ``python -m benchmarks --only budgets``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import numpy as np

from shardlab.examples.transformer import gpt_scan
from shardlab.parallel.display import human_bytes
from shardlab.parallel.errors import SearchError
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.plan.plan import Plan
from shardlab.parallel.search.driver import search
from shardlab.parallel.search.strategies import composite
from shardlab.parallel.search.strategies.baselines import data_parallel, zero
from shardlab.parallel.search.strategies.stages import choose_pipeline

LAYERS = (8, 16)
FRACTIONS = (0.75, 0.5, 0.35)
MICROBATCHES = 4


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    mesh: str
    predicted_time: float
    predicted_memory: int
    compiled_memory: int
    equal: bool


def _measure(name: str, plan: Plan, case: Any, want: Any) -> Row:
    compiled = plan.verify().memory.total
    got = plan.jit()(*case.args)
    equal = all(
        np.allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
        for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
    )
    shape = "×".join(f"{k}{v}" for k, v in plan.mesh_shape.items())
    return Row(name, shape, plan.cost.time, plan.cost.memory.peak, compiled, equal)


def _hand_made(case: Any) -> dict[str, Plan]:
    fn, args = case.fn, case.args
    flat = make_mesh(data=8)
    staged = make_mesh(stage=2, data=4)
    cube = make_mesh(stage=2, data=2, model=2)
    tensor = make_mesh(data=4, model=2)
    return {
        "data parallel": data_parallel(fn, *args, mesh=flat),
        "ZeRO-3": zero(fn, *args, mesh=flat, stage=3),
        "ZeRO-3 × remat(nothing)": composite.zero3_remat(fn, *args, mesh=flat),
        "pipeline × data": composite.pipeline_data(
            fn, *args, mesh=staged, microbatches=MICROBATCHES
        ),
        "pipeline × tensor": composite.pipeline_tensor(
            fn, *args, mesh=cube, microbatches=MICROBATCHES
        ),
        "data × tensor × ZeRO-3 × remat(nothing)": composite.zero3_remat(
            fn, *args, mesh=tensor, model_axis="model"
        ),
    }


def _model(layers: int) -> list[str]:
    case = gpt_scan(layers, batch=32, seq=32, d=64)
    want = jax.jit(case.fn)(*case.args)
    rows = [_measure(name, plan, case, want) for name, plan in _hand_made(case).items()]
    reference = rows[0].compiled_memory
    staged = make_mesh(stage=2, data=4)
    stages = choose_pipeline(
        case.fn, *case.args, mesh=staged, pipeline=2, microbatches=MICROBATCHES
    ).stages
    out = [
        f"### {case.name}: {len(jax.tree.leaves(case.args[0]))} parameter arrays, data "
        f"parallel compiles to {human_bytes(reference)} per device",
        "",
        "| hand-made plan | mesh | predicted step ms | predicted memory | compiled memory | "
        "predicted ÷ compiled | ÷ data parallel | equal |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        out.append(
            f"| {r.name} | {r.mesh} | {r.predicted_time * 1e3:.3f} | "
            f"{human_bytes(r.predicted_memory)} | {human_bytes(r.compiled_memory)} | "
            f"{r.predicted_memory / r.compiled_memory:.2f} | "
            f"{r.compiled_memory / reference:.2f} | {'yes' if r.equal else '**no**'} |"
        )
    if stages is not None:
        bal = stages.balanced
        out += [
            "",
            f"Stages (2 stages × {MICROBATCHES} microbatches): layers per stage "
            f"{list(bal.counts)}, max/mean stage time {bal.imbalance:.3f}; {stages.note}.",
        ]
    out += [
        "",
        "| budget | ÷ data parallel | best hand-made that fits (compiled) | its predicted ms | "
        "auto's plan | search s | auto predicted ms | auto ÷ best | auto compiled memory | "
        "predicted ÷ compiled | fits | equal |",
        "|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for fraction in FRACTIONS:
        budget = int(fraction * reference)
        fitting = [r for r in rows if r.compiled_memory <= budget and r.equal]
        best = min(fitting, key=lambda r: r.predicted_time) if fitting else None
        head = f"| {human_bytes(budget)} | {fraction:.2f} | " + (
            f"{best.name} | {best.predicted_time * 1e3:.3f}" if best else "none | -"
        )
        start = time.perf_counter()
        try:
            plan = search(
                case.fn, *case.args, mesh=staged, memory_budget=budget, progress=lambda f, m: None
            )
        except SearchError as e:
            seconds = time.perf_counter() - start
            why = str(e).replace("|", "/")[:400]
            out.append(f"{head} | refused: {why} | {seconds:.1f} | - | - | - | - | - | - |")
            continue
        seconds = time.perf_counter() - start
        auto = _measure(plan.method, plan, case, want)
        ratio = f"{auto.predicted_time / best.predicted_time:.2f}" if best else "-"
        fits = "yes" if auto.compiled_memory <= budget else "**no**"
        out.append(
            f"{head} | {plan.method} | {seconds:.1f} | {auto.predicted_time * 1e3:.3f} | "
            f"{ratio} | {human_bytes(auto.compiled_memory)} | "
            f"{auto.predicted_memory / auto.compiled_memory:.2f} | {fits} | "
            f"{'yes' if auto.equal else '**no**'} |"
        )
    return out


def run() -> str:
    parts = [
        "## Memory budgets: five-dimensional plans",
        "",
        (__doc__ or "").split("\n\n")[1].replace("\n", " "),
        "",
        "Run: `python -m benchmarks --only budgets`.",
        "",
    ]
    for layers in LAYERS:
        parts += _model(layers)
        parts.append("")
    return "\n".join(parts)


if __name__ == "__main__":
    print(run())
