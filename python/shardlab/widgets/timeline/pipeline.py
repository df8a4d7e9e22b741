"""``shardlab.pipeline_timeline(plan)``: a pipelined plan's schedule, one lane per stage.

It draws the cost model's schedule simulator (``parallel/cost/pipeline.py``): per stage, the
forward and backward of each microbatch (numbered), the exposed stage-to-stage transfers and
the idle gaps (the bubble), with the bubble under both common definitions, labelled, and the
microbatches each stage holds at its peak. Self-contained SVG + HTML (VS Code and saved
notebooks show it); ``text/plain`` gives the same figures.
"""

from __future__ import annotations

from typing import Any

from shardlab.parallel.cost.pipeline import PipelineCost, ScheduleResult, predict_pipeline
from shardlab.parallel.errors import SearchError
from shardlab.parallel.plan.plan import Plan
from shardlab.parallel.records import PipelineSpec
from shardlab.widgets._base.html import esc, fmt_time, panel

WIDTH = 760
LANE = 22
COLORS = {"forward": "#6baed6", "backward": "#fd8d3c", "send": "#756bb1", "idle": "#eeeeee"}


def schedule_svg(s: ScheduleResult) -> str:
    """One lane per stage: forward/backward boxes labelled with their microbatch, exposed
    transfers, and the idle gaps hatched grey."""
    total = max(s.step_time, 1e-12)
    scale = WIDTH / total
    parts = []
    for stage in range(s.stages):
        y = stage * (LANE + 6)
        parts.append(
            f"<text x='-8' y='{y + LANE - 7}' text-anchor='end' font-size='11'>stage {stage}</text>"
        )
    for e in s.events:
        y = e.stage * (LANE + 6)
        x, w = e.start * scale, max((e.end - e.start) * scale, 0.6)
        what = e.kind if e.microbatch < 0 else f"{e.kind} of microbatch {e.microbatch}"
        if s.virtual_stages > 1 and e.microbatch >= 0:
            what += f", chunk {e.chunk}"
        title = f"stage {e.stage}: {what}, {fmt_time(e.end - e.start)} at {fmt_time(e.start)}"
        height = LANE if e.kind != "send" else LANE // 3
        top = y if e.kind != "send" else y + LANE - height
        parts.append(
            f"<g class='sl-stage-{e.kind}'><title>{esc(title)}</title>"
            f"<rect x='{x:.2f}' y='{top}' width='{w:.2f}' height='{height}' "
            f"fill='{COLORS.get(e.kind, '#888')}' stroke='#fff' stroke-width='0.5'/>"
        )
        if e.kind in ("forward", "backward") and w >= 11:
            label = ("F" if e.kind == "forward" else "B") + str(e.microbatch)
            if s.virtual_stages > 1:
                label += f".{e.chunk}"
            parts.append(
                f"<text x='{x + w / 2:.2f}' y='{y + LANE - 7}' text-anchor='middle' "
                f"font-size='10' fill='#222'>{label}</text>"
            )
        parts.append("</g>")
    height = s.stages * (LANE + 6) + 16
    axis = (
        f"<text x='0' y='{height - 2}' font-size='10'>0</text><text x='{WIDTH}' "
        f"y='{height - 2}' font-size='10' text-anchor='end'>{fmt_time(s.step_time)}</text>"
    )
    legend = "".join(
        f"<span style='display:inline-block;margin-right:10px'><span style='display:inline-"
        f"block;width:10px;height:10px;background:{c};margin-right:3px'></span>{k}</span>"
        for k, c in COLORS.items()
    )
    return (
        f"<svg class='sl-pipeline-svg' width='{WIDTH + 70}' height='{height}' "
        f"viewBox='-66 0 {WIDTH + 70} {height}'>{''.join(parts)}{axis}</svg>"
        f"<div class='sl-note'>{legend}</div>"
    )


def summary_lines(cost: PipelineCost) -> list[str]:
    """The figures beside the drawing, in words."""
    s, spec = cost.schedule, cost.spec
    per_stage = ", ".join(str(n) for n in cost.layers_per_stage)
    v = s.virtual_stages
    schedule = spec.schedule if v == 1 else f"{spec.schedule} ({v} chunks per stage)"
    vm = "m" if v == 1 else "v·m"
    return [
        f"{spec.stages} stages × {spec.microbatches} microbatches, {schedule}, "
        f"layers per stage {per_stage}; pipelined part {fmt_time(s.step_time)}, whole step "
        f"{fmt_time(cost.time)} predicted",
        f"bubble: {s.bubble_share_of_step:.1%} of the pipelined part idle (GPipe/MaxText "
        f"definition; (p−1)/({vm}+p−1) = {s.bubble_share_of_step_formula:.1%}), "
        f"{s.bubble_over_ideal:.1%} over the ideal time (Megatron definition; (p−1)/{vm} = "
        f"{s.bubble_over_ideal_formula:.1%})",
        f"in flight at the peak: {s.peak_in_flight} microbatches on the busiest stage; "
        f"{cost.permute_count} collective-permutes per step, "
        f"{cost.permute_bytes / 1024:.1f} KiB per device",
    ]


def schedule_html(cost: PipelineCost) -> str:
    """The drawing and its figures (``shardlab.pipeline_timeline``'s body, and the pipelined
    model in ``shardlab.timeline`` and the strategy editor)."""
    lines = "".join(f"<div class='sl-note'>{esc(t)}</div>" for t in summary_lines(cost))
    return schedule_svg(cost.schedule) + lines


class PipelineTimeline:
    """The rendered schedule of one pipelined plan (``_repr_html_``, ``__repr__``)."""

    def __init__(self, cost: PipelineCost, title: str):
        self.cost = cost
        self.title = title

    def _repr_html_(self) -> str:
        return panel("sl-pipeline", schedule_html(self.cost), title=self.title)

    def __repr__(self) -> str:
        return "\n".join([self.title, *summary_lines(self.cost)])


def pipeline_timeline(
    plan: Plan, spec: PipelineSpec | None = None, *, device: Any = None
) -> PipelineTimeline:
    """The simulated schedule of ``plan``'s pipeline (or of ``spec`` on that plan).

    Raises:
        SearchError: the plan has no pipeline and no ``spec`` is given (with what to pass),
            or the spec does not fit the plan (stages, microbatches, axis).
    """
    spec = spec or plan.pipeline
    if spec is None:
        raise SearchError(
            "this plan has no pipeline stages: pass one, e.g. "
            "pipeline_timeline(plan, shardlab.PipelineSpec(stages=2, microbatches=4)), or "
            "use shardlab.timeline(plan) for an unpipelined plan"
        )
    cost = predict_pipeline(plan, spec, device=device)
    return PipelineTimeline(cost, f"pipeline schedule of {plan.method} (cost model)")
