"""The corpus benchmark (issue 17): auto and every baseline on other people's models.

Per model of the zoo (``examples.zoo``, outside the package) and mesh:
``search(method="auto")`` (its method and search time) and every baseline; each plan is
compiled (``plan.verify()``) and run once against the unsharded step. Reported: the compiled
objective of each plan (what ``auto`` confirms on: alpha-beta seconds of the compiled
collectives under the ``cpu-sim`` profile plus the roofline of the compiled flops and bytes
accessed), compiled communication and per-device memory, the cost model's prediction of both
(predicted ÷ compiled), the ops no sharding rule knows, and equality with the unsharded step.

Run: ``make bench`` or ``python -m benchmarks --only corpus``.
"""

from __future__ import annotations

import dataclasses
import gc
import sys
import time
from typing import Any

import jax
import numpy as np

from examples.zoo.models import corpus, fallbacks
from shardlab._core.equivalence import same_program
from shardlab.examples.base import Case
from shardlab.parallel.cost.profiles import comm_time, resolve_profile
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.plan.plan import Plan
from shardlab.parallel.search.confirm import compiled_objective
from shardlab.parallel.search.driver import search
from shardlab.parallel.search.strategies.baselines import baselines

MESHES = ((8,), (2, 4), (4, 2))
PROFILE = "cpu-sim"
COMM_WITHIN = 0.05
MEMORY_WITHIN = 0.10


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """One plan of one model on one mesh, predicted and compiled."""

    model: str
    mesh: str
    name: str  # "auto" or the baseline's name
    method: str
    objective: float  # compiled: comm + roofline compute, seconds
    predicted_comm: float  # seconds
    compiled_comm: float  # seconds
    compiled_bytes: float
    predicted_memory: int
    compiled_memory: int
    equal: bool

    @property
    def comm_ratio(self) -> float:
        return ratio(self.predicted_comm, self.compiled_comm)

    @property
    def memory_ratio(self) -> float:
        return ratio(self.predicted_memory, self.compiled_memory)


@dataclasses.dataclass(frozen=True)
class CaseRow:
    """One model on one mesh: auto against the best baseline."""

    model: str
    mesh: str
    equations: int
    fallbacks: str
    search_time: float
    plans: tuple[PlanRow, ...]

    @property
    def auto(self) -> PlanRow:
        return self.plans[0]

    @property
    def best_baseline(self) -> PlanRow:
        return min(self.plans[1:], key=lambda r: r.objective)


def ratio(predicted: float, compiled: float) -> float:
    """Predicted ÷ compiled (1 when both are 0, infinite when only compiled is)."""
    if compiled == 0:
        return 1.0 if predicted == 0 else float("inf")
    return predicted / compiled


def _plan_row(case: Case, mesh_text: str, name: str, plan: Plan, reference: Any) -> PlanRow:
    report = plan.verify()
    comm, compute = compiled_objective(report, resolve_profile(PROFILE))
    out = plan.jit()(*case.args)
    return PlanRow(
        model=case.name,
        mesh=mesh_text,
        name=name,
        method=plan.method,
        objective=comm + compute,
        predicted_comm=plan.cost.comm_time,
        compiled_comm=comm_time(report.collectives, PROFILE),
        compiled_bytes=report.total_comm_bytes,
        predicted_memory=plan.cost.memory.peak,
        compiled_memory=report.memory.total,
        equal=not same_program(out, reference, fn=case.fn, args=case.args),
    )


def run_case(case: Case, shape: tuple[int, ...]) -> CaseRow:
    mesh = make_mesh(shape=shape, names=("data", "model")[: len(shape)])
    text = "×".join(map(str, shape))
    reference = jax.jit(case.fn)(*case.args)
    start = time.perf_counter()
    auto = search(case.fn, *case.args, mesh=mesh, method="auto", device=PROFILE)
    elapsed = time.perf_counter() - start
    rows = [_plan_row(case, text, "auto", auto, reference)]
    for name, plan in baselines(case.fn, *case.args, mesh=mesh, device=PROFILE).items():
        rows.append(_plan_row(case, text, name, plan, reference))
    assert auto.binding is not None
    unknown = fallbacks(case)
    jax.clear_caches()
    gc.collect()
    return CaseRow(
        model=case.name,
        mesh=text,
        equations=len(auto.binding.traced.jaxpr.eqns),
        fallbacks=", ".join(f"{p} ×{n}" for p, n in sorted(unknown.items())) or "none",
        search_time=elapsed,
        plans=tuple(rows),
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _kib(nbytes: float) -> str:
    return f"{nbytes / 1024:,.1f}"


def _r(x: float) -> str:
    return "∞" if x == float("inf") else f"{x:.2f}"


def _percentiles(values: list[float]) -> str:
    finite = [v for v in values if np.isfinite(v)]
    if not finite:
        return "-"
    q = np.percentile(finite, [0, 10, 50, 90, 100])
    return " / ".join(f"{v:.2f}" for v in q)


def markdown(cases: list[CaseRow]) -> str:
    plans = [p for c in cases for p in c.plans]
    wins = sum(c.auto.objective <= c.best_baseline.objective * 1.005 for c in cases)
    comm_ok = sum(abs(p.comm_ratio - 1) <= COMM_WITHIN for p in plans)
    mem_ok = sum(abs(p.memory_ratio - 1) <= MEMORY_WITHIN for p in plans)
    equal = sum(p.equal for p in plans)
    clean = sum(c.fallbacks == "none" for c in cases)
    lines = [
        "## Corpus: other people's models",
        "",
        "Train steps written after public JAX code on the real libraries (flax linen and nnx, "
        'equinox, optax; `examples.zoo`), searched with `method="auto"` and compared '
        "with every baseline, each plan compiled and run against the unsharded step. "
        "*Objective*: what auto confirms on, the alpha-beta time of the compiled collectives "
        f"(`{PROFILE}` profile) plus the roofline of the compiled flops and bytes accessed. "
        "Ratios are predicted ÷ compiled.",
        "",
        "| target | result |",
        "|---|---|",
        f"| auto ≤ best baseline on the compiled objective (0.5% tie) | {wins}/{len(cases)} |",
        f"| predicted ÷ compiled communication within {COMM_WITHIN:.0%} | "
        f"{comm_ok}/{len(plans)} plans |",
        f"| predicted ÷ compiled memory within {MEMORY_WITHIN:.0%} | {mem_ok}/{len(plans)} plans |",
        f"| models × meshes with no primitive falling back | {clean}/{len(cases)} |",
        f"| plans equal to the unsharded step | {equal}/{len(plans)} |",
        "",
        "Predicted ÷ compiled, min / p10 / median / p90 / max over all plans: communication "
        f"{_percentiles([p.comm_ratio for p in plans])}; memory "
        f"{_percentiles([p.memory_ratio for p in plans])}.",
        "",
        "### Auto against the best baseline",
        "",
        "| model | mesh | eqns | auto used | search s | auto objective ms | best baseline | "
        "its objective ms | auto ÷ best | auto comm KiB | auto memory KiB | fallbacks |",
        "|---|---|---:|---|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for c in cases:
        a, b = c.auto, c.best_baseline
        lines.append(
            f"| {c.model} | {c.mesh} | {c.equations:,} | {a.method} | {c.search_time:.2f} | "
            f"{_ms(a.objective)} | {b.name} | {_ms(b.objective)} | "
            f"{_r(a.objective / b.objective if b.objective else float('inf'))} | "
            f"{_kib(a.compiled_bytes)} | {_kib(a.compiled_memory)} | {c.fallbacks} |"
        )
    worst_comm = sorted(plans, key=lambda p: -abs(np.log(max(p.comm_ratio, 1e-9))))[:5]
    worst_mem = sorted(plans, key=lambda p: -abs(np.log(max(p.memory_ratio, 1e-9))))[:5]
    lines += [
        "",
        "### Worst predictions",
        "",
        "| what | model | mesh | plan | predicted | compiled | ratio |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for p in worst_comm:
        lines.append(
            f"| comm ms | {p.model} | {p.mesh} | {p.name} | {_ms(p.predicted_comm)} | "
            f"{_ms(p.compiled_comm)} | {_r(p.comm_ratio)} |"
        )
    for p in worst_mem:
        lines.append(
            f"| memory KiB | {p.model} | {p.mesh} | {p.name} | {_kib(p.predicted_memory)} | "
            f"{_kib(p.compiled_memory)} | {_r(p.memory_ratio)} |"
        )
    lines += [
        "",
        "### Every plan",
        "",
        "| model | mesh | plan | objective ms | comm pred ms | comm compiled ms | ratio | "
        "comm KiB | memory pred KiB | memory compiled KiB | ratio | equal |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in plans:
        lines.append(
            f"| {p.model} | {p.mesh} | {p.name if p.name != 'auto' else p.method} | "
            f"{_ms(p.objective)} | {_ms(p.predicted_comm)} | {_ms(p.compiled_comm)} | "
            f"{_r(p.comm_ratio)} | {_kib(p.compiled_bytes)} | {_kib(p.predicted_memory)} | "
            f"{_kib(p.compiled_memory)} | {_r(p.memory_ratio)} | {'yes' if p.equal else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def run(models: list[Case] | None = None, meshes=MESHES) -> str:
    rows = []
    for case in models or corpus():
        for shape in meshes:
            start = time.perf_counter()
            rows.append(run_case(case, shape))
            print(
                f"[bench] corpus {case.name} {shape}: {time.perf_counter() - start:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    return markdown(rows)


if __name__ == "__main__":
    import os

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    jax.config.update("jax_num_cpu_devices", 8)
    print(run())
