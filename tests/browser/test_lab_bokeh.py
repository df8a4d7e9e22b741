"""The bokeh plots in a real browser: in JupyterLab (tests/browser/notebooks/bokeh_plots.ipynb
run by Lab: BokehJS loaded once, each plot's canvas drawn, a hover shows a tooltip, a wheel
zoom changes the x range, a click in the explorer shows that plan, the memory plot streams
and marks the release), 20,000 timeline intervals in a page (render time), and the
notebook executed, saved (under 5 MB) and exported to HTML, opened with no network.
Screenshots: test-artifacts/browser/lab_bokeh_*.png, bokeh_20k.png, static_bokeh_plots.png.
"""

from __future__ import annotations

import time
from typing import Any

import nbformat
import pytest
from lab import ARTIFACTS, REPO, open_and_run, screenshot
from test_static_export import TEMPLATE_URLS, export_html, open_offline

pytestmark = [pytest.mark.browser, pytest.mark.timeout(420)]

NOTEBOOK = REPO / "tests" / "browser" / "notebooks" / "bokeh_plots.ipynb"
PLOTS = ("sl-bokeh-timeline", "sl-bokeh-explorer", "sl-bokeh-memory")
MAX_SAVED_BYTES = 5 * 2**20

X_RANGE_JS = """(id) => {
  const views = (window.shardlabBokeh || {})[id];  // a ViewManager: its roots are views
  const root = views.roots.map((v) => v.model).find((m) => m.children || m.x_range);
  const fig = root.children ? root.children[0] : root;
  return [fig.x_range.start, fig.x_range.end];
}"""


def _tooltip(page: Any) -> str:
    """The visible tooltip's rows as 'label: value' lines ('' when none shows). Bokeh draws
    it in shadow DOM (which Playwright's CSS locators pierce, but not ``inner_text``), and in
    Lab outside the plot's own element, so it is looked up in the whole page."""
    tips = page.locator(".bk-Tooltip")
    for i in range(tips.count()):
        tip = tips.nth(i)
        if tip.is_visible():
            labels = tip.locator(".bk-tooltip-row-label").all_inner_texts()
            values = tip.locator(".bk-tooltip-row-value").all_inner_texts()
            return "\n".join(f"{k} {v}" for k, v in zip(labels, values, strict=False))
    return ""


def _hover_until(page: Any, box: Any, label: str, *, rows: int = 24, cols: int = 40) -> Any:
    """Moves the mouse over the largest canvas in ``box`` on a grid until a tooltip with a
    row ``label`` shows; returns (x, y, the tooltip's text)."""
    canvases = box.locator("canvas")
    areas = [canvases.nth(i).bounding_box() for i in range(canvases.count())]
    area = max((a for a in areas if a), key=lambda a: a["width"] * a["height"])
    for r in range(rows):
        for c in range(cols):
            x = area["x"] + area["width"] * (0.08 + 0.86 * c / cols)
            y = area["y"] + area["height"] * (0.1 + 0.8 * r / rows)
            page.mouse.move(x, y)
            text = _tooltip(page)
            if f"{label}:" in text:
                return x, y, text
    raise AssertionError(f"no tooltip with {label!r} anywhere over the plot")


def test_bokeh_plots_render_and_respond_in_lab(lab_server, lab_page):
    name = lab_server.add(NOTEBOOK)
    page = open_and_run(lab_page, lab_server.base_url, lab_server.token, name, timeout=300)
    notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")
    assert notebook.locator(".sl-bokeh-loader").count() == 1  # BokehJS once, not per plot
    boxes = {cls: notebook.locator(f".shardlab.{cls}") for cls in PLOTS}
    for cls, box in boxes.items():
        box.locator("canvas").first.wait_for(timeout=30_000)
        assert "sl-bokeh-live" in (box.first.get_attribute("class") or ""), cls
        assert not box.locator(".sl-bokeh-fallback").first.is_visible()

    timeline = boxes["sl-bokeh-timeline"].first
    timeline.scroll_into_view_if_needed()
    for d in range(8):
        assert f"device {d}" in timeline.inner_html()
    # the measured figure (the larger canvas): hover one of its kernels or collectives
    _, _, text = _hover_until(page, timeline, "duration")
    assert "op:" in text and "source:" in text and ("µs" in text or "ms" in text), text
    screenshot(page, "lab_bokeh_timeline_hover")
    box_id = timeline.get_attribute("id")
    before = page.evaluate(X_RANGE_JS, box_id)
    page.mouse.wheel(0, -400)
    page.wait_for_timeout(500)
    after = page.evaluate(X_RANGE_JS, box_id)
    assert after[1] - after[0] < before[1] - before[0], (before, after)  # zoomed in
    screenshot(page, "lab_bokeh_timeline_zoomed")

    explorer = boxes["sl-bokeh-explorer"].first
    explorer.scroll_into_view_if_needed()
    x, y, hovered = _hover_until(page, explorer, "strategy")
    assert "time / step:" in hovered and "memory / device:" in hovered, hovered
    screenshot(page, "lab_bokeh_explorer_hover")
    page.mouse.click(x, y)
    details = explorer.locator(".sl-explorer-details")
    details.locator(".sl-plan-code").wait_for(state="attached")
    chosen = details.locator("b").first.inner_text()
    assert chosen in hovered, (chosen, hovered)
    screenshot(page, "lab_bokeh_explorer_selected")

    memory = boxes["sl-bokeh-memory"].first
    memory.scroll_into_view_if_needed()
    html = memory.inner_html()
    assert "release (cell" in html  # the %release cell's marker
    assert html.count("sl-memory-line") == 8
    _, _, text = _hover_until(page, memory, "device")
    assert "live:" in text
    screenshot(page, "lab_bokeh_memory")


def test_twenty_thousand_intervals_render_interactively(chromium, tmp_path):
    from shardlab.parallel.cost.schedule import Event, Timeline
    from shardlab.widgets._base import bokeh as _bokeh
    from shardlab.widgets.timeline.bokeh import BokehTimelineView
    from shardlab.widgets.timeline.svg import TimelineView

    events = []
    for d in range(8):
        for i in range(2500):  # 8 × 2,500 = 20,000 intervals
            kind = "all-gather" if i % 7 == 0 else ""
            stream = "communication" if kind else "compute"
            events.append(Event(stream, i * 1e-6, i * 1e-6 + 0.8e-6, kind or "dot", kind, device=d))
    timeline = Timeline(tuple(events), 2.5e-3, 1, 1, 1, 8, measured=True)
    view = BokehTimelineView([timeline], fallback=TimelineView([timeline]))
    assert not view.lanes[0].reduced and len(view.lanes[0].intervals) == 20_000
    page_path = tmp_path / "bokeh_20k.html"
    page_path.write_text(
        "<html><head><meta charset='utf-8'></head><body>"
        + _bokeh.loader_html()
        + view.html()
        + "</body></html>",
        encoding="utf-8",
    )
    context, page, console, blocked = open_offline(chromium, page_path)
    try:
        page.locator(".sl-bokeh-live").wait_for(timeout=60_000)
        page.locator("canvas").first.wait_for()
        # from navigation start: BokehJS parsed, the document embedded, the canvas drawn
        rendered = page.evaluate("() => performance.now()") / 1000
        box_id = page.locator(".sl-bokeh").first.get_attribute("id")
        area = page.locator("canvas").first.bounding_box()
        assert area is not None
        page.mouse.move(area["x"] + area["width"] / 2, area["y"] + area["height"] / 2)
        before = page.evaluate(X_RANGE_JS, box_id)
        start = time.perf_counter()
        page.mouse.wheel(0, -400)
        page.wait_for_function(
            f"() => {{ const r = ({X_RANGE_JS})({box_id!r}); return r[1] - r[0] < "
            f"{before[1] - before[0]}; }}"
        )
        page.evaluate("() => new Promise(r => requestAnimationFrame(() => r(null)))")
        zoomed = time.perf_counter() - start
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "bokeh_20k.png"))
    finally:
        context.close()
    print(f"20,000 intervals: rendered in {rendered:.2f} s, wheel zoom in {zoomed:.3f} s")
    assert not blocked and not [c for c in console if c.startswith("pageerror")]
    assert rendered < 15 and zoomed < 2


def test_saved_notebook_with_the_plots_is_small_and_exports_offline(
    chromium, tmp_path, executed_notebook
):
    notebook = executed_notebook(NOTEBOOK)
    saved = tmp_path / NOTEBOOK.name
    nbformat.write(notebook, saved)
    size = saved.stat().st_size
    print(f"saved notebook with the three plots: {size / 2**20:.2f} MiB")
    assert size < MAX_SAVED_BYTES
    loaders = sum(
        "sl-bokeh-loader" in o.get("data", {}).get("text/html", "")
        for c in notebook.cells
        for o in c.get("outputs", [])
    )
    assert loaders == 1
    html_path = tmp_path / "bokeh_plots.html"
    export_html(nbformat.read(saved, as_version=4), html_path)
    context, page, console, blocked = open_offline(chromium, html_path)
    try:
        for cls in PLOTS:
            page.locator(f".{cls}.sl-bokeh-live canvas").first.wait_for(timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "static_bokeh_plots.png"), full_page=True)
    finally:
        context.close()
    assert [u for u in blocked if not TEMPLATE_URLS.match(u)] == []
    assert not [c for c in console if c.startswith("pageerror")]
