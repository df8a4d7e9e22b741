"""``shardlab.timeline(...)``: the step's compute and communication over time.

The cost model's schedule (communication that is not hidden behind compute is marked), and,
where a profile can be taken (``jax.profiler`` on CPU/GPU), the measured timeline beside it.
A pipelined plan's model is the pipeline simulator's schedule, one lane per stage with the
forward and backward of each microbatch, the transfers and the bubble (drawn as
``shardlab.pipeline_timeline`` draws it), and its measured lanes name each device's stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardlab._core.wording import time_ratio_text
from shardlab.parallel.cost.pipeline import PipelineCost, predict_pipeline
from shardlab.parallel.cost.profiles import resolve_profile
from shardlab.parallel.cost.schedule import Timeline, measure, schedule, stage_timeline
from shardlab.parallel.plan.plan import Plan
from shardlab.parallel.records import COLLECTIVE_KINDS
from shardlab.widgets._base.html import KIND_COLORS, View, esc, fmt_time, panel, source_label
from shardlab.widgets.timeline.lanes import build_lanes
from shardlab.widgets.timeline.pipeline import schedule_html, summary_lines

WIDTH = 860
LANE = 18
MAX_RECTS = 3000
COMPUTE_COLOR = "#9ecae1"


def _svg(timeline: Timeline, stage_of: Mapping[int, int] | None = None) -> str:
    """Lanes of two rows (compute over communication); at most ``MAX_RECTS`` rectangles,
    shared fairly between the lanes (``timeline_lanes.reduce_fairly``): every device drawn."""
    lanes = build_lanes(timeline, budget=MAX_RECTS, stage_of=stage_of)
    scale = WIDTH / max(timeline.total, 1e-12)
    row = LANE // 2
    parts = []
    for index, name in enumerate(lanes.lanes):
        y = index * (LANE + 4)
        parts.append(
            f"<text x='-6' y='{y + LANE - 5}' text-anchor='end' font-size='10'>{esc(name)}</text>"
        )
    for item in lanes.intervals:
        y = item.lane * (LANE + 4) + (row if item.stream == "communication" else 0)
        x, w = item.start * scale, max((item.end - item.start) * scale, 0.6)
        fill = KIND_COLORS.get(item.kind, "#888") if item.kind != "compute" else COMPUTE_COLOR
        stroke = " stroke='#b00020' stroke-width='1.5'" if item.exposed > 0 else ""
        title = (
            f"{item.label}: {fmt_time(item.end - item.start)} at {fmt_time(item.start)}"
            + (f"\nexposed (compute waits): {fmt_time(item.exposed)}" if item.exposed else "")
            + (f"\nsource: {source_label(item.source)}" if item.source else "")
        )
        cls = "sl-comm" if item.stream == "communication" else "sl-compute"
        exposed = " sl-exposed" if item.exposed > 0 else ""
        parts.append(
            f"<g class='{cls}{exposed}' data-lane='{item.lane}'><title>{esc(title)}</title>"
            f"<rect x='{x:.2f}' y='{y}' width='{w:.2f}' height='{row}' fill='{fill}'{stroke}/></g>"
        )
    height = len(lanes.lanes) * (LANE + 4) + 14
    axis = (
        f"<text x='0' y='{height - 2}' font-size='10'>0</text><text x='{WIDTH}' "
        f"y='{height - 2}' font-size='10' text-anchor='end'>{fmt_time(timeline.total)}</text>"
    )
    note = f"<div class='sl-note sl-reduced'>{esc(lanes.note())}</div>" if lanes.reduced else ""
    return (
        f"<svg class='sl-timeline-svg' width='{WIDTH + 110}' height='{height}' "
        f"viewBox='-100 0 {WIDTH + 110} {height}'>{''.join(parts)}{axis}</svg>{note}"
    )


def phases(t: Timeline) -> dict[str, float]:
    """Seconds per phase of one device's step: compute, each collective kind, and idle (the
    step less both; on a measured trace, the mean over devices)."""
    devices = max(t.devices, 1) if t.measured else 1
    out = {"compute": t.compute}
    for kind in COLLECTIVE_KINDS:
        seconds = sum(e.end - e.start for e in t.events if e.kind == kind) / devices
        if seconds > 0:
            out[kind] = seconds
    busy = t.compute + (t.communication if t.measured else t.exposed)
    out["idle"] = max(0.0, t.total - busy)
    return out


def phase_gaps(model: Timeline, measured: Timeline) -> list[tuple[str, float, float]]:
    """``(phase, model seconds, measured seconds)`` for every phase either has. The model's
    collectives count whole (hidden ones too); its idle is the step less compute and the
    communication compute waits for. Measured collectives on CPU include waiting for peers."""
    a, b = phases(model), phases(measured)
    order = ["compute", *COLLECTIVE_KINDS, "idle"]
    return [(k, a.get(k, 0.0), b.get(k, 0.0)) for k in order if k in a or k in b]


def _ratio(model: float, measured: float) -> str:
    return time_ratio_text(measured, model)


class TimelineView(View):
    """One or two timelines (model, measured) with their totals, which profile priced the
    model, and the measured-vs-model gap per phase.

    Args:
        pipeline: a pipelined plan's simulated schedule (the model timeline is its
            ``stage_timeline``): drawn one lane per stage, with the bubble labelled.
        stage_of: per device id, its pipeline stage (names a measured lane's stage).
    """

    def __init__(
        self,
        timelines: Sequence[Timeline],
        *,
        notes: Sequence[str] = (),
        priced_by: str = "",
        pipeline: PipelineCost | None = None,
        stage_of: Mapping[int, int] | None = None,
    ) -> None:
        self.timelines = tuple(timelines)
        self.notes = tuple(notes)
        self.priced_by = priced_by
        self.pipeline = pipeline
        self.stage_of = dict(stage_of) if stage_of else None

    def gaps(self) -> list[tuple[str, float, float]]:
        """The gap per phase, when there is a model and a measured timeline."""
        model = next((t for t in self.timelines if not t.measured), None)
        measured = next((t for t in self.timelines if t.measured), None)
        if model is None or measured is None:
            return []
        return phase_gaps(model, measured)

    @staticmethod
    def _summary(t: Timeline) -> str:
        title = "measured" if t.measured else "cost model"
        step = "pipelined part (compute: the mean stage)" if t.stages else "step"
        return (
            f"{title}: {step} {fmt_time(t.total)}; compute {fmt_time(t.compute)}, communication "
            f"{fmt_time(t.communication)} of which {fmt_time(t.exposed)} not overlapped with "
            f"compute ({fmt_time(t.hidden)} hidden)"
        )

    def text(self) -> str:
        lines = [f"model priced by the {self.priced_by}"] if self.priced_by else []
        for t in self.timelines:
            lines.append(self._summary(t))
            lines.append(f"  {t.note}")
            if t.stages and self.pipeline is not None:  # its transfers are all exposed
                lines.extend(f"  {line}" for line in summary_lines(self.pipeline))
                continue
            exposed = [e for e in t.events if e.exposed > 0]
            for e in exposed[:10]:
                lines.append(
                    f"  exposed {e.kind} {fmt_time(e.exposed)} at {fmt_time(e.start)} "
                    f"({source_label(e.source)})"
                )
        gaps = self.gaps()
        if gaps:
            lines.append("per phase (one device): model → measured")
            lines.extend(
                f"  {phase:<19} {fmt_time(m)} → {fmt_time(x)}"
                + (f" ({ratio})" if (ratio := _ratio(m, x)) else "")
                for phase, m, x in gaps
            )
        lines.extend(self.notes)
        return "\n".join(lines)

    def html(self) -> str:
        parts = (
            [f"<div class='sl-note sl-priced-by'>model priced by the {esc(self.priced_by)}</div>"]
            if self.priced_by
            else []
        )
        for t in self.timelines:
            drawn = (
                schedule_html(self.pipeline)
                if t.stages and self.pipeline is not None
                else _svg(t, self.stage_of)
            )
            parts.append(
                f"<div class='sl-timeline {'sl-measured' if t.measured else 'sl-model'}'>"
                f"<div>{esc(self._summary(t))}</div><div class='sl-note'>{esc(t.note)}</div>"
                f"{drawn}</div>"
            )
        legend = " ".join(
            f"<span style='color:{c}'>■</span> {esc(k)}" for k, c in KIND_COLORS.items()
        )
        parts.append(
            f"<div class='sl-note'><span style='color:{COMPUTE_COLOR}'>■</span> compute {legend}; "
            "red outline: communication the compute stream waits for</div>"
        )
        gaps = self.gaps()
        if gaps:
            rows = "".join(
                f"<tr><td>{esc(phase)}</td><td>{fmt_time(m)}</td><td>{fmt_time(x)}</td>"
                f"<td>{_ratio(m, x) or '-'}</td></tr>"
                for phase, m, x in gaps
            )
            parts.append(
                "<table class='sl-phase-gaps'><tr><th>phase (one device)</th><th>model</th>"
                f"<th>measured</th><th>measured ÷ model</th></tr>{rows}</table>"
            )
        parts.extend(f"<div class='sl-note'>{esc(n)}</div>" for n in self.notes)
        return panel("sl-timeline-view", "".join(parts), title="timeline")

    def bokeh(self) -> View:
        """The interactive form (``bokeh_timeline``), this view as its static fallback."""
        from shardlab.widgets.timeline.bokeh import BokehTimelineView

        extra = [f"model priced by the {self.priced_by}"] if self.priced_by else []
        gaps = self.gaps()
        if gaps:
            extra.append(
                "per phase (one device), model → measured: "
                + "; ".join(f"{p} {fmt_time(m)} → {fmt_time(x)}" for p, m, x in gaps)
            )
        return BokehTimelineView(
            self.timelines,
            fallback=self,
            notes=(*extra, *self.notes),
            stage_of=self.stage_of,
            schedule_html=schedule_html(self.pipeline) if self.pipeline is not None else "",
        )

    def _ipython_display_(self) -> None:
        from IPython.display import display

        try:
            view = self.bokeh()
        except ImportError:  # no bokeh: the SVG view alone
            display(self._repr_mimebundle_(), raw=True)
            return
        view._ipython_display_()  # type: ignore[attr-defined]


def timeline(
    plan_or_fn: Any,
    *args: Any,
    mesh: Any = None,
    in_shardings: Any = None,
    measured: bool = True,
    device: Any = None,
) -> TimelineView:
    """The compute/communication timeline of one step.

    Args:
        plan_or_fn: a ``Plan`` (its function, arguments, mesh and shardings are used) or a
            function, with ``args``, ``mesh`` and ``in_shardings``.
        measured: also run the program under ``jax.profiler`` and show the measured timeline
            (not over a ``shardlab.target``: its devices are abstract; a note says so).
        device: the device profile for the model (default: the plan's own, else the
            target's the mesh is over, else by backend).

    A plan with pipeline stages (``plan.pipeline``) is drawn one lane per stage: the pipeline
    simulator's forward and backward of every microbatch, the transfers and the bubble.
    """
    fn = plan_or_fn
    if isinstance(plan_or_fn, Plan) and plan_or_fn.pipeline is not None:
        return _pipelined(plan_or_fn, measured=measured, device=device)
    if isinstance(plan_or_fn, Plan):  # its function with the intermediate constraints inserted
        fn, mesh, in_shardings = plan_or_fn.function(), plan_or_fn.mesh, plan_or_fn.in_shardings
        assert plan_or_fn.binding is not None  # function() raises for an unbound plan
        args = tuple(plan_or_fn.binding.args)
    if mesh is None:
        raise ValueError("timeline(fn, *args, mesh=..., in_shardings=...) needs a mesh")
    notes: list[str] = []
    if device is None and isinstance(plan_or_fn, Plan):
        device = plan_or_fn.cost.device
    profile = resolve_profile(device, mesh)
    views = [schedule(fn, *args, mesh=mesh, in_shardings=in_shardings, device=profile)]
    measured = measured and _measurable(mesh, notes)
    if measured:
        try:
            views.append(measure(fn, *args, mesh=mesh, in_shardings=in_shardings))
        except Exception as error:  # the model timeline stands on its own
            notes.append(f"no measured timeline: {type(error).__name__}: {error}")
    if len(views) == 2:
        from shardlab.widgets.timeline.bokeh import difference_note

        notes.append(difference_note(views[0], views[1], platform=_platform()))
    return TimelineView(views, notes=notes, priced_by=profile.priced_by)


def stage_of_devices(mesh: Any, axis: str) -> dict[int, int]:
    """Per device id, its coordinate on the mesh's stage axis."""
    import numpy as np

    names = [str(a) for a in mesh.axis_names]
    position = names.index(axis)
    return {int(d.id): int(index[position]) for index, d in np.ndenumerate(mesh.devices)}


def _pipelined(plan: Plan, *, measured: bool, device: Any) -> TimelineView:
    """The timeline of a pipelined plan: the simulated schedule, one lane per stage, and the
    measured trace (``plan.function()`` runs the pipelined program) with each lane's stage."""
    spec = plan.pipeline
    assert spec is not None and plan.binding is not None
    mesh = plan.mesh
    profile = resolve_profile(device if device is not None else plan.cost.device, mesh)
    cost = predict_pipeline(plan, spec, device=profile)
    views = [stage_timeline(cost, devices=int(mesh.size))]
    notes: list[str] = []
    measured = measured and _measurable(mesh, notes)
    if measured:
        try:
            views.append(
                measure(
                    plan.function(), *plan.binding.args, mesh=mesh, in_shardings=plan.in_shardings
                )
            )
        except Exception as error:  # the model timeline stands on its own
            notes.append(f"no measured timeline: {type(error).__name__}: {error}")
    if len(views) == 2:
        notes.append(
            "measured: the compiled program runs the pipeline as GPipe in one SPMD loop (every "
            "stage steps together, bubbles included), so its lanes show the loop's "
            f"{spec.microbatches + spec.stages - 1} iterations per scan, not the schedule's boxes"
        )
    return TimelineView(
        views,
        notes=notes,
        priced_by=profile.priced_by,
        pipeline=cost,
        stage_of=stage_of_devices(mesh, spec.axis),
    )


def _measurable(mesh: Any, notes: list[str]) -> bool:
    """False, with a note saying so and what to do, for a mesh over a ``shardlab.target``:
    its devices are abstract, so nothing can run and be measured in this process."""
    from shardlab.parallel.targets.target import target_of

    t = target_of(mesh)
    if t is None:
        return True
    notes.append(
        f"nothing measured: the mesh is over {t.description}, devices this process does not "
        "have. The timeline is the cost model's; to measure one, run plan.to_code() on that "
        "machine under jax.profiler, or make the plan on shardlab.mesh(...) without devices=."
    )
    return False


def _platform() -> str:
    import jax

    return str(jax.devices()[0].platform)
