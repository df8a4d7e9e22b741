"""Pipeline stages chosen on the cost model: Alpa's stage DP and ``choose_pipeline``.

``stage_dp`` cuts ``L`` layers into ``p`` contiguous stages minimising Alpa's objective
``Σ t_stage + (m-1) · max t_stage`` (the pipelined step of ``m`` microbatches, with
``t_stage`` one microbatch's forward + backward) under a per-stage memory constraint that
counts the in-flight microbatches per schedule (m for GPipe, p - s for stage s under 1F1B).
As Alpa's ``training_dp`` does, it enumerates every distinct stage cost as ``t_max`` (ascending,
stopping once ``m · t_max`` cannot beat the best), and for each runs a DP over (stages, layers)
minimising Σ t_stage with every stage ≤ ``t_max`` and within memory.

The SPMD pipeline (``plan/pipeline.py``) runs equal layer counts per stage (the stacked
parameters split over the stage axis), so ``choose_stages`` reports the balanced assignment
and says when the DP's unequal one would be better.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from jax.sharding import Mesh

from shardlab.parallel.cost import layouts as L
from shardlab.parallel.cost.pipeline import PipelineCost, divisors, layer_times, predict_pipeline
from shardlab.parallel.cost.profiles import DeviceProfile, resolve_profile
from shardlab.parallel.errors import SearchError
from shardlab.parallel.graph.trace import trace
from shardlab.parallel.records import PipelineSpec, _Record

# The schedules the search chooses among: those the SPMD pipeline executes as priced. 1F1B
# and interleaved 1F1B are simulated (``cost/pipeline.py``) but run in GPipe's order, so
# choosing them would only trust a simulated time the program does not have.
EXECUTED_SCHEDULES = ("gpipe",)


@dataclasses.dataclass(frozen=True)
class StageAssignment(_Record):
    """Layers per stage and what the objective makes of them.

    Attributes:
        counts: layers per stage.
        stage_times: per stage, one microbatch's forward + backward seconds.
        objective: ``Σ t_stage + (m-1) · max t_stage``.
        feasible: every stage within the memory limit.
    """

    counts: tuple[int, ...]
    stage_times: tuple[float, ...]
    objective: float
    feasible: bool = True

    @property
    def imbalance(self) -> float:
        """max / mean stage time (1.0: balanced)."""
        mean = sum(self.stage_times) / len(self.stage_times)
        return max(self.stage_times) / mean if mean > 0 else 1.0


def in_flight(schedule: str, stages: int, microbatches: int, stage: int) -> int:
    """Microbatches stage ``stage`` holds activations of at its peak."""
    if schedule == "gpipe":
        return microbatches
    return min(microbatches, stages - stage)


def objective(times: Sequence[float], microbatches: int) -> float:
    return sum(times) + (microbatches - 1) * max(times)


def assignment_of(
    counts: Sequence[int],
    layer_time: Sequence[float],
    microbatches: int,
    *,
    memory: Callable[[int, int, int], float] | None = None,
    limit: float = math.inf,
) -> StageAssignment:
    """The record of a given assignment (``memory(stage, first, end)``: its bytes)."""
    bounds = [sum(counts[:s]) for s in range(len(counts) + 1)]
    times = tuple(sum(layer_time[bounds[s] : bounds[s + 1]]) for s in range(len(counts)))
    ok = memory is None or all(
        memory(s, bounds[s], bounds[s + 1]) <= limit for s in range(len(counts))
    )
    return StageAssignment(tuple(counts), times, objective(times, microbatches), ok)


def stage_dp(
    layer_time: Sequence[float],
    stages: int,
    microbatches: int,
    *,
    memory: Callable[[int, int, int], float] | None = None,
    limit: float = math.inf,
) -> StageAssignment | None:
    """Alpa's DP (see the module docstring); ``memory(stage, first, end)``: per-device bytes
    of stage ``stage`` holding layers ``first:end`` (in-flight activations included), at most
    ``limit``. ``None`` when no assignment fits."""
    n, p, m = len(layer_time), stages, microbatches
    if not 1 <= p <= n:
        raise SearchError(f"stages={p}: between 1 and the {n} layers")
    prefix = [0.0]
    for t in layer_time:
        prefix.append(prefix[-1] + t)

    def cost(i: int, k: int) -> float:
        return prefix[k] - prefix[i]

    def fits(s: int, i: int, k: int) -> bool:
        return memory is None or memory(s, i, k) <= limit

    candidates = sorted({cost(i, k) for i in range(n) for k in range(i + 1, n + 1)})
    best: tuple[float, list[int]] | None = None
    for t_max in candidates:
        if best is not None and m * t_max >= best[0] - 1e-15:
            break  # Σ t ≥ t_max, so this and every larger t_max cannot beat the best
        inf = math.inf
        # f[s][k]: least Σ t of layers 0:k in s stages; cut[s][k]: the start of stage s-1
        f = [[inf] * (n + 1) for _ in range(p + 1)]
        cut = [[-1] * (n + 1) for _ in range(p + 1)]
        f[0][0] = 0.0
        for s in range(1, p + 1):
            for k in range(s, n - (p - s) + 1):
                for i in range(s - 1, k):
                    if f[s - 1][i] == inf:
                        continue
                    c = cost(i, k)
                    if c > t_max + 1e-15 or not fits(s - 1, i, k):
                        continue
                    if f[s - 1][i] + c < f[s][k]:
                        f[s][k], cut[s][k] = f[s - 1][i] + c, i
        if f[p][n] == inf:
            continue
        counts, k = [], n
        for s in range(p, 0, -1):
            i = cut[s][k]
            counts.append(k - i)
            k = i
        counts.reverse()
        got = assignment_of(counts, layer_time, m)
        if best is None or got.objective < best[0] - 1e-15:
            best = (got.objective, counts)
    if best is None:
        return None
    return assignment_of(best[1], layer_time, m, memory=memory, limit=limit)


@dataclasses.dataclass(frozen=True)
class StageChoice(_Record):
    """``choose_stages``'s answer: the DP's optimum and the balanced assignment executed.

    Attributes:
        optimum: the DP's assignment (``None``: nothing fits memory).
        balanced: equal layer counts (what the SPMD pipeline runs).
        note: whether an unequal assignment would be better, and by how much.
    """

    optimum: StageAssignment | None
    balanced: StageAssignment
    note: str


def choose_stages(
    layer_time: Sequence[float],
    stages: int,
    microbatches: int,
    *,
    memory: Callable[[int, int, int], float] | None = None,
    limit: float = math.inf,
) -> StageChoice:
    """The DP's assignment next to the balanced one (``layers / stages`` each)."""
    n = len(layer_time)
    if n % stages:
        good = divisors(n)
        raise SearchError(f"stages={stages} does not divide the {n} layers; use one of {good}")
    opt = stage_dp(layer_time, stages, microbatches, memory=memory, limit=limit)
    equal = assignment_of(
        [n // stages] * stages, layer_time, microbatches, memory=memory, limit=limit
    )
    if opt is None:
        note = "no assignment of the layers fits the memory limit"
    elif opt.objective < equal.objective * (1 - 0.01) or (opt.feasible and not equal.feasible):
        note = (
            f"an unequal assignment {list(opt.counts)} would be better "
            f"({opt.objective * 1e3:.4f} vs {equal.objective * 1e3:.4f} ms"
            + ("" if equal.feasible else "; the equal one does not fit memory")
            + "); the SPMD pipeline runs equal layer counts per stage"
        )
    else:
        note = f"equal layer counts {list(equal.counts)} are within 1% of the DP's optimum"
    return StageChoice(opt, equal, note)


@dataclasses.dataclass(frozen=True)
class PipelineChoice(_Record):
    """``choose_pipeline``'s answer.

    Attributes:
        spec: the best pipeline, or ``None`` when stages do not pay (or cannot run).
        cost: its predicted cost (``None`` with no spec).
        unpipelined_time: the best unpipelined baseline's predicted step time.
        unpipelined: that baseline's name.
        tried: ``(stages, microbatches, schedule, layouts, predicted seconds, peak bytes)``.
        stages: the DP's account of the chosen stage count.
        reason: why this answer.
    """

    spec: PipelineSpec | None
    cost: PipelineCost | None
    unpipelined_time: float
    unpipelined: str
    tried: tuple[tuple[int, int, str, str, float, int], ...]
    stages: StageChoice | None
    reason: str


def choose_pipeline(
    fn: Callable[..., Any],
    *args: Any,
    mesh: Mesh,
    memory_budget: float | None = None,
    pipeline: str | bool | int = "auto",
    microbatches: int | None = None,
    schedules: Sequence[str] = EXECUTED_SCHEDULES,
    axis: str = "stage",
    device: str | DeviceProfile | None = None,
) -> PipelineChoice:
    """Whether pipeline stages pay for ``fn(*args)`` on ``mesh``, and which.

    Tries stage counts (the size of the mesh's ``axis``, when it divides the layers; or
    ``pipeline`` when an int), microbatch counts dividing the batch (or ``microbatches``),
    the schedules (``interleaved``: every number of model chunks > 1 dividing a stage's
    layers, with the microbatch counts that are multiples of the stages; tried rows name it
    ``interleaved×v``), and within each stage the data-parallel and tensor baselines' layouts
    with the stage axis taken out; compares with the unpipelined baselines on the same
    mesh, within ``memory_budget`` (the cost model's per-device peak).

    Raises:
        SearchError: ``pipeline`` an int without a ``stage`` axis, one that is not the
            axis's size or does not divide the layers, ``microbatches`` not dividing the
            batch, a model without a repeated layer scan asked for stages, or a bad
            ``pipeline`` value.
    """
    from shardlab.parallel.search.strategies.baselines import baselines

    if pipeline not in ("auto", False) and not (
        isinstance(pipeline, int) and not isinstance(pipeline, bool)
    ):
        raise SearchError(f"pipeline={pipeline!r}: use 'auto', False or a number of stages")
    profile = resolve_profile(device, mesh)
    traced = trace(fn, *args)
    budget = math.inf if memory_budget is None else float(memory_budget)
    made: dict[str, Any] = {}

    def unpipelined() -> tuple[dict[str, Any], str, float]:
        """The baselines (made once, after the arguments were checked), the fastest that
        fits and its time."""
        if not made:
            plans = baselines(fn, *args, mesh=mesh, device=profile, traced=traced)
            fitting = {k: p for k, p in plans.items() if p.cost.memory.peak <= budget}
            name, base = (
                min(fitting.items(), key=lambda kv: kv[1].cost.time) if fitting else ("", None)
            )
            made.update(plans=plans, name=name, time=base.cost.time if base else math.inf)
        return made["plans"], made["name"], made["time"]

    def answer(reason: str, **kw: Any) -> PipelineChoice:
        fields = {"spec": None, "cost": None, "tried": (), "stages": None}
        fields.update(kw)
        _, name, seconds = unpipelined()
        return PipelineChoice(unpipelined_time=seconds, unpipelined=name, reason=reason, **fields)

    if pipeline is False:
        return answer("pipeline=False")
    sizes = {str(k): int(v) for k, v in mesh.shape.items()}
    if axis not in sizes:
        if pipeline == "auto":
            return answer(f"the mesh has no {axis!r} axis (axes {list(sizes)}): no stages tried")
        raise SearchError(
            f"pipeline={pipeline}: the mesh has no {axis!r} axis (axes {list(sizes)}); make "
            f"one, e.g. shardlab.mesh({axis}={pipeline}, ...), or use pipeline=False"
        )
    graph = traced.graph
    any_layout = [L.replicated(len(graph.shapes[v])) for v in graph.inputs]
    try:
        times, _ = layer_times(graph, any_layout, sizes, profile, axis=axis)
    except SearchError as e:  # no repeated layer scan: an error when stages were asked for
        if pipeline == "auto":
            return answer(f"no stages: {e}")
        raise
    n = times.layers
    size = sizes[axis]
    if isinstance(pipeline, int):
        if n % pipeline:
            raise SearchError(
                f"pipeline={pipeline} stages do not divide the {n} scanned layers; use one of "
                f"{[d for d in divisors(n) if d > 1]}"
            )
        if pipeline != size:
            raise SearchError(
                f"pipeline={pipeline} stages: the SPMD pipeline runs one stage per index of "
                f"the {axis!r} axis (size {size}); use pipeline={size} or a mesh with "
                f"{axis}={pipeline}"
            )
        stage_counts = [pipeline]
    else:
        stage_counts = [size] if n % size == 0 and size > 1 else []
        if not stage_counts:
            return answer(
                f"the {axis!r} axis (size {size}) does not divide the {n} layers: no stages"
            )
    rows = times.carry_rows
    if microbatches is not None:
        if microbatches < 1 or rows % microbatches:
            raise SearchError(
                f"microbatches={microbatches} does not divide the batch of {rows}; use one of "
                f"{divisors(rows)}"
            )
        micro = [microbatches]
    else:
        micro = divisors(rows)
    plans, base_name, base_time = unpipelined()
    tried = []
    best: PipelineCost | None = None
    best_layout = ""
    for name, plan in plans.items():
        if name == "replicated":
            continue
        ins = list(plan.input_specs)
        layers = layer_times(graph, ins, sizes, profile, axis=axis)
        for p in stage_counts:
            for m in micro:
                for schedule, v in _variants(schedules, n, p, m):
                    spec = PipelineSpec(p, m, axis=axis, schedule=schedule, virtual_stages=v)
                    got = predict_pipeline(plan, spec, device=profile, layers=layers)
                    label = schedule if v == 1 else f"{schedule}×{v}"
                    tried.append((p, m, label, name, got.time, got.cost.memory.peak))
                    if got.cost.memory.peak > budget:
                        continue
                    if best is None or got.time < best.time:
                        best, best_layout = got, name
    if best is None:
        if not tried:
            return answer(
                f"no schedule of {list(schedules)} applies to {stage_counts} stages and "
                f"microbatches {micro} (interleaved needs a multiple of the stages)"
            )
        return answer("no pipelined plan fits the memory budget", tried=tuple(tried))
    per_layer = [f + b for f, b in zip(times.forward, times.backward, strict=True)]
    stages = choose_stages(per_layer, best.spec.stages, best.spec.microbatches)
    if best.time >= base_time:
        return answer(
            f"stages do not pay: the best pipeline ({best.spec.stages} stages, "
            f"{best.spec.microbatches} microbatches, {_label(best.spec)}, {best_layout} "
            f"inside) takes {best.time * 1e3:.3f} ms, the {base_name} baseline "
            f"{base_time * 1e3:.3f} ms",
            tried=tuple(tried),
            stages=stages,
        )
    return answer(
        f"{best.spec.stages} stages × {best.spec.microbatches} microbatches "
        f"({_label(best.spec)}, {best_layout} inside each stage): {best.time * 1e3:.3f} ms "
        f"predicted vs {base_time * 1e3:.3f} ms for {base_name or 'no unpipelined plan'}",
        spec=best.spec,
        cost=best,
        tried=tuple(tried),
        stages=stages,
    )


def _variants(
    schedules: Sequence[str], layers: int, stages: int, microbatches: int
) -> list[tuple[str, int]]:
    """(schedule, virtual stages) pairs to try: one per schedule, and for ``interleaved``
    every number of chunks > 1 that divides a stage's layers, when the microbatches are a
    multiple of the stages (Megatron's requirement)."""
    out = []
    for schedule in schedules:
        if schedule != "interleaved":
            out.append((schedule, 1))
        elif microbatches % stages == 0:
            out += [(schedule, v) for v in divisors(layers // stages) if v > 1]
    return out


def _label(spec: PipelineSpec) -> str:
    v = spec.virtual_stages
    return spec.schedule if v == 1 else f"{spec.schedule}×{v}"


__all__ = [
    "PipelineChoice",
    "StageAssignment",
    "StageChoice",
    "choose_pipeline",
    "choose_stages",
    "in_flight",
    "stage_dp",
]
