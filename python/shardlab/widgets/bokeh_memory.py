"""Memory over time: per-device live bytes, a line per device, with markers at releases,
mode switches and device switches — the history part of ``shardlab.memory()``.

A ``MemoryHistory`` (one per kernel, started by the first ``shardlab.memory()``) samples
``engine.memory.live_bytes_per_device`` when a cell starts and ends and, while a cell runs,
every ``SAMPLE_S`` seconds from a background thread, so the plot streams during a long cell
(its output is updated in place by display id, at most every ``UPDATE_S`` seconds). Markers:
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

import dataclasses
import re
import threading
import time
import uuid
from typing import Any

from ._bokeh import BokehView, ensure_loader
from ._html import PALETTE, View, esc, fmt_bytes, panel
from .bokeh_explorer import byte_unit

SAMPLE_S = 0.5
UPDATE_S = 1.0
MAX_SAMPLES = 4000
MARKER_COLORS = {"release": "#009E73", "mode": "#CC79A7", "devices": "#D55E00"}
_RELEASE = re.compile(r"(^|\n)\s*%release\b|\brelease\(")
SVG_W, SVG_H = 640, 180


@dataclasses.dataclass(frozen=True)
class MemorySample:
    t: float  # seconds since the history started
    cell: int | None
    bytes_per_device: tuple[tuple[str, int], ...]


@dataclasses.dataclass(frozen=True)
class MemoryMarker:
    t: float
    kind: str  # "release" | "mode" | "devices"
    text: str


def _sample_bytes() -> tuple[tuple[str, int], ...]:
    from ..engine.memory import live_bytes_per_device

    return tuple(live_bytes_per_device().items())


class MemoryHistory:
    """Samples and markers, and the displays that show them."""

    def __init__(self, shell: Any = None, *, sampler: Any = _sample_bytes) -> None:
        self.shell = shell
        self.sampler = sampler
        self.started = time.perf_counter()
        self.samples: list[MemorySample] = []
        self.markers: list[MemoryMarker] = []
        self.displays: list[str] = []  # display ids of the plots shown
        self.lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._cell: int | None = None
        self._last_mode: str | None = None
        self._last_update = 0.0
        self._code = ""
        self.sample()

    # -- recording -------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter() - self.started

    def sample(self) -> MemorySample:
        values = self.sampler()
        with self.lock:
            previous = self.samples[-1] if self.samples else None
            sample = MemorySample(self.now(), self._cell, values)
            self.samples.append(sample)
            if previous is not None:
                before = {d for d, _ in previous.bytes_per_device}
                after = {d for d, _ in values}
                if before != after:
                    self.markers.append(
                        MemoryMarker(sample.t, "devices", f"devices {len(before)} → {len(after)}")
                    )
            if len(self.samples) > MAX_SAMPLES:
                half = len(self.samples) // 2
                self.samples = self.samples[:half:2] + self.samples[half:]
        return sample

    def mark(self, kind: str, text: str) -> None:
        with self.lock:
            self.markers.append(MemoryMarker(self.now(), kind, text))

    def pre_run_cell(self, info: Any) -> None:
        # IPython counts execution_count up before pre_run_cell: cell N runs with N + 1
        count = getattr(self.shell, "execution_count", None)
        self._cell = count - 1 if isinstance(count, int) and count > 0 else None
        self._code = getattr(info, "raw_cell", "") or ""
        session = getattr(self.shell, "_shardlab_session", None)  # the kernel's, if loaded
        mode = getattr(getattr(session, "current", None), "mode", None)
        if isinstance(mode, str):
            if self._last_mode is not None and mode != self._last_mode:
                self.mark("mode", f"mode {self._last_mode} → {mode} (cell {self._cell})")
            self._last_mode = mode
        self.sample()
        self._start_sampler()

    def post_run_cell(self, result: Any) -> None:
        self._stop_sampler()
        if _RELEASE.search(self._code):
            self.mark("release", f"release (cell {self._cell})")
        self.sample()
        self.refresh()

    def _start_sampler(self) -> None:
        if self._thread is not None:
            return
        stopped = self._stopped = threading.Event()

        def run() -> None:
            while not stopped.wait(SAMPLE_S):
                try:
                    self.sample()
                    if time.perf_counter() - self._last_update >= UPDATE_S:
                        self.refresh()
                except Exception:  # e.g. a sample between a device switch's steps: next time
                    continue

        self._thread = threading.Thread(target=run, name="shardlab-memory", daemon=True)
        self._thread.start()

    def _stop_sampler(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stopped.set()
            thread.join(timeout=2 * SAMPLE_S)

    # -- display ---------------------------------------------------------------------------
    def view(self) -> MemoryTimelineView:
        with self.lock:
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
        self._stop_sampler()
        if self.shell is not None:
            for name, hook in (
                ("pre_run_cell", self.pre_run_cell),
                ("post_run_cell", self.post_run_cell),
            ):
                try:
                    self.shell.events.unregister(name, hook)
                except ValueError:
                    pass


_HISTORY: dict[int, MemoryHistory] = {}


def history(shell: Any) -> MemoryHistory:
    """The kernel's memory history, started (and hooked into cells) on first use."""
    found = _HISTORY.get(id(shell))
    if found is None or found.shell is not shell:
        found = MemoryHistory(shell)
        shell.events.register("pre_run_cell", found.pre_run_cell)
        shell.events.register("post_run_cell", found.post_run_cell)
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
