"""Plans ranked as they run: predicted against measured step time (issue 14).

For each benchmark case and mesh of the strategy-search benchmark (``bench/search.py``):
every baseline and auto's plan (searched with the calibrated profile, and with the datasheet
profile when that gives another plan) are run side by side in one process — interleaved
rounds, the median of every run after a warm-up — and priced by the cost model twice, with
the profile ``shardlab.calibrate()`` measured at the start of the section and with the
backend's datasheet profile. Reported: Kendall's τ of predicted against measured step time
per case and over all plans, and whether auto's plan measured no slower than the fastest
measured baseline. Every plan is also measured a second time, compiled and placed anew:
τ of the two measurements against each other is about what a model that ranked the plans
exactly as they run would score on this host (two runs of the same plans do not order them
alike when they are closer than the host's noise).

Run: ``python -m benchmarks --only ranking`` (or ``python -m benchmarks.ranking``).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import sys
import time
from collections.abc import Collection, Sequence
from typing import Any

import jax
import numpy as np

from shardlab import examples
from shardlab.parallel.cost.profiles import DeviceProfile, resolve_profile
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.plan.fixed import partitioned_cost
from shardlab.parallel.plan.plan import Plan
from shardlab.parallel.search.confirm import plan_key
from shardlab.parallel.search.driver import search
from shardlab.parallel.search.strategies.baselines import baselines

MESHES = ((8,), (2, 4), (4, 2))
ROUNDS = 6  # interleaved rounds over a case's plans
RUNS = 3  # timed runs per plan per round (after WARMUP untimed ones)
WARMUP = 2
NOISE = 0.05
"""Two medians of the same program differ by up to a few percent here (a shared 2-core
host): auto counts as no slower than the best baseline within this margin; the strict
count is reported as well."""


@dataclasses.dataclass(frozen=True)
class Ranked:
    """One plan of one case: measured and predicted step seconds."""

    case: str
    mesh: str
    name: str
    measured: float
    calibrated: float
    datasheet: float
    is_baseline: bool
    remeasured: float = float("nan")  # the second measurement, compiled and placed anew


def reprice(plan: Plan, profile: DeviceProfile) -> float:
    """The cost model's step seconds of ``plan``'s layouts and constraints under
    ``profile`` (``partitioned_cost``: what ``predict`` and the baselines use)."""
    return partitioned_cost(plan, profile).time


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's τ-b of two rankings (ties counted as neither concordant nor discordant,
    and corrected for); ``nan`` with fewer than two distinct values on a side."""
    n = len(x)
    concordant = discordant = ties_x = ties_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif dx == dy:
                concordant += 1
            else:
                discordant += 1
    pairs_x = concordant + discordant + ties_x
    pairs_y = concordant + discordant + ties_y
    if pairs_x == 0 or pairs_y == 0:
        return float("nan")
    return (concordant - discordant) / math.sqrt(pairs_x * pairs_y)


def _runner(plan: Plan, case: examples.Case) -> Any:
    f = plan.jit()
    args = jax.device_put(case.args, plan.in_shardings)
    for _ in range(WARMUP):
        jax.block_until_ready(f(*args))
    return lambda: jax.block_until_ready(f(*args))


def measure_side_by_side(
    plans: dict[str, Plan], case: examples.Case, *, again: str | Collection[str] = ()
) -> dict[str, float]:
    """Median step seconds of each plan, rounds interleaved so that a busy moment of the
    host falls on every plan alike; plans with the same layouts are run once. ``again``:
    plans also measured a second time, compiled and placed anew, as ``"<name> (again)"``
    (the noise floor: two medians of one program)."""
    runners: dict[Any, Any] = {}
    key_of = {}
    for name, plan in plans.items():
        key_of[name] = plan_key(plan)
        if key_of[name] not in runners:
            runners[key_of[name]] = _runner(plan, case)
    for name in (again,) if isinstance(again, str) else again:
        key_of[f"{name} (again)"] = ("again", key_of[name])
        if ("again", key_of[name]) not in runners:
            runners[("again", key_of[name])] = _runner(plans[name], case)
    times: dict[Any, list[float]] = {k: [] for k in runners}
    for _ in range(ROUNDS):
        for key, run in runners.items():
            for _ in range(RUNS):
                start = time.perf_counter()
                run()
                times[key].append(time.perf_counter() - start)
    return {name: float(np.median(times[key])) for name, key in key_of.items()}


def rank_case(
    case: examples.Case, shape: tuple[int, ...], calibrated: DeviceProfile, datasheet: DeviceProfile
) -> tuple[list[Ranked], str, str, float]:
    """Every baseline and auto's plans of one case on one mesh: ``(rows, auto's method
    with the calibrated profile, with the datasheet, the noise floor: the relative
    difference of two medians of the data-parallel program)``."""
    mesh = make_mesh(shape=shape, names=("data", "model")[: len(shape)])
    text = "×".join(map(str, shape))
    plans: dict[str, Plan] = dict(baselines(case.fn, *case.args, mesh=mesh, device=datasheet))
    auto = search(case.fn, *case.args, mesh=mesh, device=calibrated)
    auto_datasheet = search(case.fn, *case.args, mesh=mesh, device=datasheet)
    plans["auto"] = auto
    plans["auto (datasheet)"] = auto_datasheet
    measured = measure_side_by_side(plans, case, again=list(plans))
    noise = abs(measured["data_parallel (again)"] / measured["data_parallel"] - 1)
    rows = [
        Ranked(
            case=case.name,
            mesh=text,
            name=name,
            measured=measured[name],
            calibrated=reprice(plan, calibrated),
            datasheet=reprice(plan, datasheet),
            is_baseline=not name.startswith("auto"),
            remeasured=measured[f"{name} (again)"],
        )
        for name, plan in plans.items()
    ]
    jax.clear_caches()
    gc.collect()
    return rows, auto.method, auto_datasheet.method, noise


def _ranked_rows(rows: Sequence[Ranked]) -> list[Ranked]:
    """The distinct plans τ is computed over: the baselines and auto's calibrated plan."""
    return [r for r in rows if r.name != "auto (datasheet)"]


def summarize(groups: dict[tuple[str, str], list[Ranked]]) -> dict[str, float]:
    """τ per profile pooled over all plans and its mean over cases, and auto's record."""
    pooled = [r for rows in groups.values() for r in _ranked_rows(rows)]
    out: dict[str, float] = {}
    for which in ("calibrated", "datasheet"):
        taus = [
            kendall_tau([getattr(r, which) for r in rows], [r.measured for r in rows])
            for rows in (_ranked_rows(g) for g in groups.values())
        ]
        finite = [t for t in taus if not math.isnan(t)]
        out[f"tau_{which}_mean"] = float(np.mean(finite)) if finite else float("nan")
        out[f"tau_{which}_pooled"] = kendall_tau(
            [math.log(getattr(r, which)) for r in pooled], [math.log(r.measured) for r in pooled]
        )
    # the measurement ranked against itself: what an exact model would score
    taus = [
        kendall_tau([r.remeasured for r in rows], [r.measured for r in rows])
        for rows in (_ranked_rows(g) for g in groups.values())
    ]
    finite = [t for t in taus if not math.isnan(t)]
    out["tau_repeat_mean"] = float(np.mean(finite)) if finite else float("nan")
    out["tau_repeat_pooled"] = kendall_tau(
        [math.log(r.remeasured) for r in pooled], [math.log(r.measured) for r in pooled]
    )
    for which, name in (("calibrated", "auto"), ("datasheet", "auto (datasheet)")):
        strict = within = 0
        for rows in groups.values():
            auto = next(r for r in rows if r.name == name)
            best = min(r.measured for r in rows if r.is_baseline)
            strict += auto.measured <= best
            within += auto.measured <= best * (1 + NOISE)
        out[f"auto_{which}_strict"] = strict
        out[f"auto_{which}_within"] = within
    out["cases"] = len(groups)
    return out


def run(cases: Sequence[examples.Case] | None = None, meshes=MESHES) -> str:
    """The markdown section for docs/benchmarks.md."""
    from shardlab.parallel.cost.calibrate import calibrate

    start = time.perf_counter()
    datasheet = resolve_profile(None)
    began = time.perf_counter()
    calibrated = calibrate(quick=True, progress=lambda fraction, message: None)
    calibration_seconds = time.perf_counter() - began
    groups: dict[tuple[str, str], list[Ranked]] = {}
    methods: dict[tuple[str, str], tuple[str, str]] = {}
    noises: list[float] = []
    for case in cases if cases is not None else examples.cases():
        for shape in meshes:
            rows, used, used_datasheet, noise = rank_case(case, shape, calibrated, datasheet)
            noises.append(noise)
            key = (case.name, "×".join(map(str, shape)))
            groups[key] = rows
            methods[key] = (used, used_datasheet)
            print(
                f"[bench.ranking] {case.name} {shape}: {time.perf_counter() - start:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    s = summarize(groups)
    devices = jax.devices()
    device_text = f"{len(devices)} × {devices[0].device_kind} ({devices[0].platform})"
    simulated = devices[0].platform == "cpu"
    lines = [
        "## Plans ranked as they run: predicted vs measured step time",
        "",
        "Command: `python -m benchmarks --only ranking` (or `python -m "
        "benchmarks.ranking`). Devices: "
        f"{device_text}. A quick `shardlab.calibrate()` at the start of the section "
        f"({calibration_seconds:.1f} s) gives the *calibrated* profile; the *datasheet* "
        f"profile is `{datasheet.name}`. {_calibrated_figures(calibrated)} "
        "Each case × mesh of the search benchmark: every "
        "baseline and auto's plan (searched with the calibrated profile; `auto (datasheet)` "
        "searched with the datasheet one) run side by side in this process, "
        f"{ROUNDS} interleaved rounds of {RUNS} runs after {WARMUP} warm-up runs, median "
        "step time; each plan priced by the cost model (`layout_cost` of its layouts and "
        "constraints) under both profiles. τ: Kendall's τ-b of predicted against measured "
        "over the baselines and auto's plan.",
        "",
    ]
    if simulated:
        lines += [
            "These are figures of the *simulation*: the devices are threads of one "
            f"process sharing this host's {_cores()} CPU cores, so every device's compute "
            "and every collective's copies queue on the same cores, and a collective's time "
            "includes waiting for the slowest peer. The calibration measures them that way "
            "(all devices busy at once); they say nothing about GPUs or TPUs.",
            "",
        ]
    lines += [
        "| summary | calibrated | datasheet |",
        "|---|---:|---:|",
        f"| τ over all plans (pooled) | {s['tau_calibrated_pooled']:.2f} | "
        f"{s['tau_datasheet_pooled']:.2f} |",
        f"| τ per case (mean) | {s['tau_calibrated_mean']:.2f} | {s['tau_datasheet_mean']:.2f} |",
        f"| auto no slower than the best measured baseline (within {NOISE:.0%}) | "
        f"{s['auto_calibrated_within']:.0f}/{s['cases']:.0f} | "
        f"{s['auto_datasheet_within']:.0f}/{s['cases']:.0f} |",
        f"| auto no slower, strictly | {s['auto_calibrated_strict']:.0f}/{s['cases']:.0f} | "
        f"{s['auto_datasheet_strict']:.0f}/{s['cases']:.0f} |",
        "",
        "Targets: τ ≥ 0.8; auto no slower on ≥ 90% of cases.",
        "",
        "The measurement against itself: every plan measured a second time, compiled and "
        "placed anew, in the same interleaved rounds; τ of the second medians against the "
        f"first is {s['tau_repeat_pooled']:.2f} pooled and {s['tau_repeat_mean']:.2f} per case "
        "(mean): about what a model that ranked the plans exactly as they run would score "
        "against one noisy measurement.",
        "",
        "Noise floor: the data-parallel program of each case compiled and measured twice "
        "in the same interleaved rounds; the two medians differ by "
        f"{float(np.median(noises)):.1%} (median over cases), {max(noises):.1%} at most. "
        "Plans whose measured times are closer than that are not ranked by the measurement.",
        "",
        "| case | mesh | auto (calibrated) | auto (datasheet) | τ calibrated | τ datasheet | "
        "τ repeat | auto ms | best baseline | best baseline ms |",
        "|---|---|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for key, rows in groups.items():
        ranked = _ranked_rows(rows)
        auto = next(r for r in rows if r.name == "auto")
        best = min((r for r in rows if r.is_baseline), key=lambda r: r.measured)
        tau_c = kendall_tau([r.calibrated for r in ranked], [r.measured for r in ranked])
        tau_d = kendall_tau([r.datasheet for r in ranked], [r.measured for r in ranked])
        tau_r = kendall_tau([r.remeasured for r in ranked], [r.measured for r in ranked])
        used, used_datasheet = methods[key]
        lines.append(
            f"| {key[0]} | {key[1]} | {used} | {used_datasheet} | {tau_c:.2f} | {tau_d:.2f} | "
            f"{tau_r:.2f} | {auto.measured * 1e3:.2f} | {best.name} | "
            f"{best.measured * 1e3:.2f} |"
        )
    lines += [
        "",
        "### Every plan",
        "",
        "| case | mesh | plan | measured ms | measured again ms | predicted ms (calibrated) | "
        "predicted ms (datasheet) |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for rows in groups.values():
        for r in rows:
            lines.append(
                f"| {r.case} | {r.mesh} | {r.name} | {r.measured * 1e3:.2f} | "
                f"{r.remeasured * 1e3:.2f} | {r.calibrated * 1e3:.2f} | {r.datasheet * 1e3:.2f} |"
            )
    lines += ["", f"Total section time {time.perf_counter() - start:.0f} s."]
    return "\n".join(lines) + "\n"


def _calibrated_figures(profile: DeviceProfile) -> str:
    """The calibrated figures that vary most between runs, in words (to compare runs)."""
    c = profile.calibration
    fit = profile.fit_for("all-reduce", c.device_count, ("all",)) if c else None
    latency = f", all-reduce latency {fit.alpha * 1e6:.0f} µs over all devices" if fit else ""
    return (
        f"Its figures: matmul {profile.peak_flops / 1e9:.1f} GFLOP/s and memory "
        f"{profile.memory_bandwidth / 1e9:.2f} GB/s per device, overlap "
        f"{profile.overlap:.2f}, each extra operand of a combined all-reduce "
        f"{profile.operand_latency:.2f} of its latency{latency}, narrow convolutions "
        f"{profile.narrow_convolution:.2f}× slower, convolution feature overhead "
        f"{profile.feature_overhead:.2f} (4 output features per device "
        f"{profile.thin_convolution():.2f}× slower than 64)."
    )


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


if __name__ == "__main__":
    import os

    if "JAX_NUM_CPU_DEVICES" not in os.environ:
        jax.config.update("jax_num_cpu_devices", 8)
    print(run())
