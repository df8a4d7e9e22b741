"""The timeline as a bokeh plot: a lane per device, zoom and pan, hover, model and measured
figures with one linked time axis.

Each lane has a compute row and, under it, a communication row; compute and every collective
kind have their own colour (and legend entry: a click hides it); communication the compute
stream waits for (not hidden behind compute) has a red outline. Hover names the operation,
its source line, its bytes, its duration and when it ran. The wheel zooms time, dragging
pans it, and the model and measured figures share the range, so zooming one zooms both.
Up to ``MAX_INTERVALS`` intervals per timeline are drawn as they are (20,000 render and
respond interactively, docs/guide/views.md); beyond, adjacent intervals are aggregated with the
budget shared fairly between the lanes (``timeline_lanes``), and the plot says so.
"""

# bokeh's type annotations are stricter than its documented API (Range1d(start, end), a
# figure's title and ranges, renderer lists): pyright checks these calls against them.
# pyright: reportArgumentType=false, reportAttributeAccessIssue=false
# pyright: reportOptionalMemberAccess=false

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shardlab._core.units import time_unit
from shardlab._core.wording import time_ratio_text
from shardlab.parallel.cost.schedule import Timeline
from shardlab.widgets._base.bokeh import BokehView
from shardlab.widgets._base.html import KIND_COLORS, View, esc, fmt_bytes, fmt_time, source_label
from shardlab.widgets.timeline.lanes import Interval, Lanes, build_lanes

MAX_INTERVALS = 20_000
COMPUTE_COLOR = "#9ecae1"
EXPOSED_COLOR = "#b00020"
WIDTH = 960
ROW_PX = 30


def difference_note(model: Timeline, measured: Timeline, *, platform: str = "") -> str:
    """Why the measured step differs from the model's, in a few sentences."""
    ratio = time_ratio_text(measured.total, model.total)
    head = f"Measured {fmt_time(measured.total)} against the model's {fmt_time(model.total)}" + (
        f" ({ratio}). " if ratio else ". "
    )
    if platform != "cpu":
        return head + (
            "The model uses the device profile's peak rates and alpha-beta links; measured "
            "kernels rarely reach peak, and collective times include waiting for peers."
        )
    cores = os.cpu_count() or 1
    return head + (
        f"Here the {measured.devices} devices are simulated on the host CPU: they share "
        f"{cores} core{'s' if cores != 1 else ''}, so they take turns rather than run side by "
        "side, and a collective is a copy between threads whose time includes waiting for the "
        "slowest device (the model prices it as a link transfer). Read the measured plot for "
        "its shape — which collectives run, where compute waits — and the model for the step "
        "time on the profiled hardware."
    )


def _columns(items: Sequence[Interval], factor: float) -> dict[str, Any]:
    n = len(items)
    lane = np.fromiter((i.lane for i in items), float, n)
    comm = np.fromiter((i.stream == "communication" for i in items), bool, n)
    bottom = lane + np.where(comm, 0.02, -0.42)
    return {
        "left": np.fromiter((i.start for i in items), float, n) * factor,
        "right": np.fromiter((max(i.end, i.start) for i in items), float, n) * factor,
        "bottom": bottom,
        "top": bottom + 0.40,
        "line": [EXPOSED_COLOR if i.exposed > 0 else None for i in items],
        "label": [i.label for i in items],
        "kind": [i.kind for i in items],
        "source": [source_label(i.source) if i.source else "" for i in items],
        "bytes": [fmt_bytes(i.wire_bytes) if i.wire_bytes else "" for i in items],
        "duration": [
            fmt_time(i.end - i.start)
            + (f" (busy {fmt_time(i.busy)}, {i.count} intervals)" if i.count > 1 else "")
            for i in items
        ],
        "at": [fmt_time(i.start) for i in items],
        "exposed": [fmt_time(i.exposed) if i.exposed > 0 else "" for i in items],
    }


def _figure(lanes: Lanes, summary: str, x_range: Any, unit: str, factor: float) -> Any:
    from bokeh.models import ColumnDataSource, HoverTool, Legend, LegendItem, Range1d
    from bokeh.plotting import figure

    rows = len(lanes.lanes)
    fig = figure(
        title=summary,
        width=WIDTH,
        height=70 + ROW_PX * rows + 20,
        x_range=x_range,
        y_range=Range1d(rows - 0.5, -0.5),
        tools="xpan,xwheel_zoom,box_zoom,reset,save",
        active_scroll="xwheel_zoom",
        active_drag="xpan",
        x_axis_label=f"time ({unit})",
        toolbar_location="above",
    )
    fig.title.text_font_size = "12px"
    fig.title.text_font_style = "normal"
    fig.yaxis.ticker = list(range(rows))
    fig.yaxis.major_label_overrides = {i: name for i, name in enumerate(lanes.lanes)}
    fig.ygrid.grid_line_color = None
    fig.xaxis.axis_label_text_font_style = "normal"
    by_kind: dict[str, list[Interval]] = {}
    for item in lanes.intervals:
        by_kind.setdefault(item.kind, []).append(item)
    order = ["compute", *KIND_COLORS, *sorted(set(by_kind) - {"compute", *KIND_COLORS})]
    legend = []
    renderers = []
    for kind in order:
        items = by_kind.get(kind)
        if not items:
            continue
        color = COMPUTE_COLOR if kind == "compute" else KIND_COLORS.get(kind, "#888888")
        source = ColumnDataSource(_columns(items, factor))
        glyph = fig.quad(
            left="left",
            right="right",
            bottom="bottom",
            top="top",
            source=source,
            fill_color=color,
            line_color="line",
            line_width=2,
            hover_fill_color=color,
            hover_line_color="#222222",
        )
        glyph.name = kind
        renderers.append(glyph)
        legend.append(LegendItem(label=kind, renderers=[glyph]))
    if any(i.exposed > 0 for i in lanes.intervals):
        marker = fig.quad(
            left=[0], right=[0], bottom=[0], top=[0], fill_alpha=0, line_color=EXPOSED_COLOR
        )
        legend.append(LegendItem(label="red outline: compute waits", renderers=[marker]))
    fig.add_tools(
        HoverTool(
            renderers=renderers,
            tooltips=[
                ("op", "@label"),
                ("kind", "@kind"),
                ("source", "@source"),
                ("bytes", "@bytes"),
                ("duration", "@duration"),
                ("at", "@at"),
                ("exposed", "@exposed"),
            ],
        )
    )
    fig.add_layout(
        Legend(
            items=legend,
            click_policy="hide",
            label_text_font_size="11px",
            orientation="horizontal",
            padding=2,
            margin=2,
        ),
        "above",
    )
    return fig


class BokehTimelineView(BokehView):
    """Model and measured timelines as bokeh plots over the SVG ``TimelineView``."""

    view_class = "sl-bokeh-timeline"

    def __init__(
        self,
        timelines: Sequence[Timeline],
        *,
        fallback: View,
        notes: Sequence[str] = (),
        budget: int = MAX_INTERVALS,
        stage_of: Mapping[int, int] | None = None,
        schedule_html: str = "",
    ) -> None:
        self.timelines = tuple(timelines)
        self.fallback_view = fallback
        self.notes = tuple(notes)
        self.schedule_html = schedule_html  # a pipelined plan's labelled schedule (SVG)
        # a pipelined plan: the model a lane per stage, measured lanes named by their stage
        self.lanes = [build_lanes(t, budget=budget, stage_of=stage_of) for t in self.timelines]

    def fallback(self) -> View:
        return self.fallback_view

    def text(self) -> str:
        return self.fallback_view.text()

    def model(self) -> Any:
        from bokeh.layouts import column
        from bokeh.models import Range1d

        def time_range(longest: float) -> tuple[str, float, Any]:
            unit, factor = time_unit(longest or 1e-6)
            end = (longest or 1e-6) * factor
            return unit, factor, Range1d(0, end * 1.02, bounds=(0, end * 1.05))

        # One linked time axis; but a pipelined plan's model is the pipelined part of the
        # step only (the measured trace is the whole step): each keeps its own axis.
        linked = not any(t.stages for t in self.timelines)
        shared = time_range(max((t.total for t in self.timelines), default=1e-6))
        figures = []
        for t, lanes in zip(self.timelines, self.lanes, strict=True):
            unit, factor, x_range = shared if linked else time_range(t.total)
            summary = (
                f"{lanes.title}: {'pipelined part' if t.stages else 'step'} "
                f"{fmt_time(t.total)} · compute {fmt_time(t.compute)} · "
                f"communication {fmt_time(t.communication)}, {fmt_time(t.exposed)} of it not "
                "hidden behind compute"
            )
            figures.append(_figure(lanes, summary, x_range, unit, factor))
        return column(*figures)

    def extra_html(self) -> str:
        notes = [lanes.note() for lanes in self.lanes if lanes.reduced]
        notes += [t.note for t in self.timelines if t.note]
        notes.extend(self.notes)  # timeline() adds difference_note for model + measured
        linked = not any(t.stages for t in self.timelines)
        both = "both plots" if linked and len(self.timelines) > 1 else "each plot"
        notes.append(f"wheel: zoom time ({both}) · drag: pan · legend: click to hide a kind")
        schedule = (
            "<details open class='sl-timeline-schedule'><summary>pipeline schedule (cost "
            "model): each stage's forward (F) and backward (B) of every microbatch</summary>"
            f"{self.schedule_html}</details>"
            if self.schedule_html
            else ""
        )
        return schedule + "".join(
            f"<div class='sl-note sl-timeline-note'>{esc(n)}</div>" for n in notes
        )
