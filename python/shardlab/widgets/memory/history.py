"""Memory over time: per-device live bytes, a line per device, with markers at releases,
mode switches and device switches — the history part of ``shardlab.memory()``.

The samples and markers are the shell's recorder's (``engine/resources/memory_history.py``, shared with
the lab extension's panel); this module draws them.

The recorder (started by the first ``shardlab.memory()`` or the panel) samples
``engine.resources.live_memory.live_bytes_per_device`` when a cell starts and ends and, while a cell runs,
every ``SAMPLE_S`` seconds from a background thread, so the plot streams during a long cell
(a ``MemoryHistory``'s outputs are updated in place by display id, at most every ``UPDATE_S``
seconds). Markers:
a release (``%release``, ``shardlab.release()`` or the panel's button), a cell mode different
from the previous cell's (read from the shardlab session where one is loaded), and a change
of the device set (``%devices``). Past ``MAX_SAMPLES`` samples, every other old one is dropped
(the newest half kept at full rate); markers are always kept.
"""

# bokeh's type annotations are stricter than its documented API (Range1d(start, end), a
# figure's title and ranges, renderer lists): pyright checks these calls against them.
# pyright: reportArgumentType=false, reportAttributeAccessIssue=false
# pyright: reportOptionalMemberAccess=false

from __future__ import annotations

import time
import uuid
from typing import Any

from shardlab._core.units import byte_unit
from shardlab.engine.resources.memory_history import (
    MemoryMarker,
    MemoryRecorder,
    MemorySample,
    recorder,
)
from shardlab.widgets._base.bokeh import BokehView, ensure_loader
from shardlab.widgets._base.html import PALETTE, View, esc, fmt_bytes, panel

UPDATE_S = 1.0
MARKER_COLORS = {"release": "#009E73", "mode": "#CC79A7", "devices": "#D55E00"}
SVG_W, SVG_H = 640, 180


class MemoryHistory:
    """The displays of a shell's memory recorder (``engine/resources/memory_history.py``, which
    keeps the samples and markers): they update in place after each sample, at most every
    ``UPDATE_S`` seconds while a cell runs."""

    def __init__(
        self,
        shell: Any = None,
        *,
        sampler: Any = None,
        recorder: MemoryRecorder | None = None,
    ) -> None:
        if recorder is None:
            kwargs = {"sampler": sampler} if sampler is not None else {}
            recorder = MemoryRecorder(shell, **kwargs)
        self.recorder = recorder
        self.shell = shell
        self.displays: list[str] = []  # display ids of the plots shown
        self._last_update = 0.0
        recorder.listeners.append(self._on_sample)

    @property
    def samples(self) -> list[MemorySample]:
        return self.recorder.samples

    @property
    def markers(self) -> list[MemoryMarker]:
        return self.recorder.markers

    def sample(self) -> MemorySample:
        return self.recorder.sample()

    def mark(self, kind: str, text: str) -> None:
        self.recorder.mark(kind, text)

    def _on_sample(self, final: bool) -> None:
        if final or time.perf_counter() - self._last_update >= UPDATE_S:
            self.refresh()

    # -- display ---------------------------------------------------------------------------
    def view(self) -> MemoryTimelineView:
        with self.recorder.lock:
            return MemoryTimelineView(tuple(self.samples), tuple(self.markers))

    def show(self) -> None:
        from IPython.display import display

        # The bundle itself, not the view: a view's _ipython_display_ would ignore the id.
        display_id = f"shardlab-memory-history-{uuid.uuid4().hex[:12]}"
        ensure_loader()
        display(self.view()._repr_mimebundle_(), raw=True, display_id=display_id)
        self.displays.append(display_id)

    def refresh(self) -> None:
        self._last_update = time.perf_counter()
        if not self.displays:
            return
        from IPython.display import update_display

        bundle = self.view()._repr_mimebundle_()
        for display_id in self.displays:
            update_display(bundle, raw=True, display_id=display_id)

    def stop(self) -> None:
        if self._on_sample in self.recorder.listeners:
            self.recorder.listeners.remove(self._on_sample)
        self.recorder.stop()


_HISTORY: dict[int, MemoryHistory] = {}


def history(shell: Any) -> MemoryHistory:
    """The kernel's memory history: its displays over the shell's recorder (started, and
    hooked into cells, on first use; shared with the lab extension's panel)."""
    found = _HISTORY.get(id(shell))
    rec = recorder(shell)
    if found is None or found.shell is not shell or found.recorder is not rec:
        found = MemoryHistory(shell, recorder=rec)
        _HISTORY[id(shell)] = found
    return found


def _series(samples: tuple[MemorySample, ...]) -> dict[str, tuple[list[float], list[int]]]:
    out: dict[str, tuple[list[float], list[int]]] = {}
    for s in samples:
        for device, nbytes in s.bytes_per_device:
            ts, bs = out.setdefault(device, ([], []))
            ts.append(s.t)
            bs.append(nbytes)
    return out


class MemorySVG(View):
    """The static form: a polyline per device."""

    def __init__(self, samples: tuple[MemorySample, ...], markers: tuple[MemoryMarker, ...]):
        self.samples, self.markers = samples, markers

    def text(self) -> str:
        last = self.samples[-1] if self.samples else None
        peak = max((b for s in self.samples for _, b in s.bytes_per_device), default=0)
        lines = [
            f"memory over {last.t if last else 0:.1f} s, {len(self.samples)} samples; peak on a "
            f"device {fmt_bytes(peak)}"
        ]
        lines += [f"  {m.t:7.1f} s {m.kind}: {m.text}" for m in self.markers]
        return "\n".join(lines)

    def html(self) -> str:
        series = _series(self.samples)
        t1 = max((s.t for s in self.samples), default=1.0) or 1.0
        b1 = max((b for _, bs in series.values() for b in bs), default=1) or 1
        lines = []
        for k, (device, (ts, bs)) in enumerate(series.items()):
            points = " ".join(
                f"{40 + t / t1 * (SVG_W - 50):.1f},{SVG_H - 20 - b / b1 * (SVG_H - 30):.1f}"
                for t, b in zip(ts, bs, strict=True)
            )
            lines.append(
                f"<polyline class='sl-memory-line' fill='none' stroke='{PALETTE[k % len(PALETTE)]}' "
                f"stroke-width='1.5' points='{points}'><title>{esc(device)}</title></polyline>"
            )
        for m in self.markers:
            x = 40 + m.t / t1 * (SVG_W - 50)
            lines.append(
                f"<line x1='{x:.1f}' x2='{x:.1f}' y1='10' y2='{SVG_H - 20}' stroke-dasharray='3 2' "
                f"stroke='{MARKER_COLORS.get(m.kind, '#888')}'><title>{esc(m.text)}</title></line>"
            )
        axis = (
            f"<text x='2' y='14' font-size='10'>{fmt_bytes(b1)}</text><text x='2' "
            f"y='{SVG_H - 20}' font-size='10'>0</text><text x='{SVG_W - 10}' y='{SVG_H - 4}' "
            f"font-size='10' text-anchor='end'>{t1:.1f} s</text>"
        )
        body = (
            f"<svg class='sl-memory-history-svg' width='{SVG_W}' height='{SVG_H}'>{axis}"
            f"{''.join(lines)}</svg><div class='sl-note'>{esc(self.text())}</div>"
        )
        return panel("sl-memory-history", body, title="live bytes per device over time")


class MemoryTimelineView(BokehView):
    """A line per device over time, markers as vertical lines with hover."""

    view_class = "sl-bokeh-memory"

    def __init__(self, samples: tuple[MemorySample, ...], markers: tuple[MemoryMarker, ...]):
        self.samples, self.markers = samples, markers
        self.svg = MemorySVG(samples, markers)

    def fallback(self) -> View:
        return self.svg

    def text(self) -> str:
        return self.svg.text()

    def model(self) -> Any:
        from bokeh.models import ColumnDataSource, HoverTool, Span
        from bokeh.plotting import figure

        series = _series(self.samples)
        peak = max((b for _, bs in series.values() for b in bs), default=1) or 1
        unit, factor = byte_unit(peak)
        fig = figure(
            width=760,
            height=300,
            title="live bytes per device over time",
            x_axis_label="time since shardlab.memory() started (s)",
            y_axis_label=f"live bytes per device ({unit})",
            tools="xpan,xwheel_zoom,box_zoom,reset,save",
            active_scroll="xwheel_zoom",
            toolbar_location="above",
        )
        lines = []
        for k, (device, (ts, bs)) in enumerate(series.items()):
            source = ColumnDataSource(
                {
                    "t": ts,
                    "b": [b * factor for b in bs],
                    "device": [device] * len(ts),
                    "bytes": [fmt_bytes(b) for b in bs],
                }
            )
            lines.append(
                fig.line(
                    "t",
                    "b",
                    source=source,
                    line_width=2,
                    legend_label=device,
                    color=PALETTE[k % len(PALETTE)],
                )
            )
        fig.add_tools(
            HoverTool(
                renderers=lines,
                tooltips=[("device", "@device"), ("at", "@t{0.0} s"), ("live", "@bytes")],
            )
        )
        if self.markers:
            top = peak * factor * 1.05
            for m in self.markers:
                fig.add_layout(
                    Span(
                        location=m.t,
                        dimension="height",
                        line_dash="dashed",
                        line_color=MARKER_COLORS.get(m.kind, "#888888"),
                    )
                )
            source = ColumnDataSource(
                {
                    "t": [m.t for m in self.markers],
                    "y": [top] * len(self.markers),
                    "text": [m.text for m in self.markers],
                    "color": [MARKER_COLORS.get(m.kind, "#888888") for m in self.markers],
                }
            )
            marks = fig.scatter(
                "t", "y", source=source, marker="inverted_triangle", size=12, color="color"
            )
            fig.add_tools(
                HoverTool(renderers=[marks], tooltips=[("", "@text"), ("at", "@t{0.0} s")])
            )
        fig.y_range.start = 0
        fig.legend.location = "top_left"
        fig.legend.click_policy = "hide"
        fig.legend.label_text_font_size = "10px"
        return fig

    def extra_html(self) -> str:
        kinds = " ".join(
            f"<span style='color:{c}'>▼</span> {esc(k)}" for k, c in MARKER_COLORS.items()
        )
        return f"<div class='sl-note'>markers: {kinds} (hover for details) · wheel: zoom time</div>"
