"""The strategy editor in JupyterLab, in a real browser: the 4-layer GPT editor fits one
screen with its figures on top; a choice in a layer group's row changes all four layers and
the pinned figures; the per-layer rows open; the communication graph and timeline render.

Screenshots: test-artifacts/browser/lab_03_editor_*.png (and a copy under /tmp).
"""

from __future__ import annotations

import re
import shutil
import time

import pytest
from lab import REPO, open_and_run, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(360)]

W1 = 'params["blocks"][*]["w1"]'


def _shot(page, name: str) -> None:
    path = screenshot(page, name)
    shutil.copyfile(path, f"/tmp/{name}.png")


def test_editor_notebook_edits_live_in_the_browser(lab_server, lab_page):
    name = lab_server.add(REPO / "notebooks" / "03_strategy_editor.ipynb")
    page = open_and_run(lab_page, lab_server.base_url, lab_server.token, name, timeout=300)
    notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")
    figures = notebook.locator(".shardlab.sl-editor").first
    figures.wait_for()
    cell = notebook.locator(".jp-Cell", has=page.locator(".shardlab.sl-editor")).first
    tabs = cell.locator(".widget-tab")
    tabs.wait_for()
    # the figures are pinned above the controls
    assert figures.bounding_box()["y"] < tabs.bounding_box()["y"]
    # a tab per argument, labelled as written; the four layers are one row
    tab_text = tabs.inner_text()
    for title in ("params (42)", "momentum (42)", "batch (2)"):
        assert title in tab_text, tab_text
    row = cell.locator(".widget-gridbox", has=page.locator("code", has_text=W1)).first
    assert "×4 per layer" in row.inner_text()
    assert cell.locator("code", has_text='params["embed"]').count() >= 1
    # one screen: from the figures' top to the controls' bottom
    outputs = cell.locator(".jp-OutputArea").first
    outputs.scroll_into_view_if_needed()
    box = outputs.bounding_box()
    viewport = page.viewport_size
    assert box["height"] <= viewport["height"] - 120, (box, viewport)
    page.evaluate("(y) => window.scrollTo(0, y)", 0)
    outputs.evaluate("el => el.scrollIntoView({block: 'start'})")
    _shot(page, "lab_03_editor_open")

    def generation() -> int:
        found = re.search(r"strategy #(\d+)", figures.inner_text())
        return int(found.group(1)) if found else -1

    def wait_generation(before: int) -> None:
        # Lab replaces the output's DOM node on each update: poll through the locator.
        deadline = time.monotonic() + 30
        while generation() <= before and time.monotonic() < deadline:
            page.wait_for_timeout(200)
        assert generation() > before, figures.inner_text()

    before, step_before = generation(), figures.locator(".sl-time").inner_text()
    dim1 = row.locator("select").nth(1)  # w1's columns, every layer at once
    current = dim1.evaluate("el => el.options[el.selectedIndex].text")
    choice = "data" if current != "data" else "model"
    dim1.select_option(label=choice)
    wait_generation(before)
    text = figures.text_content()
    assert "changed:" in text or "invalid choice" in text
    spec = "P(None, 'data')" if choice == "data" else "P(None, 'model')"
    # the strategy lists the group once: all four layers have the new spec
    assert f"{W1}: {spec}" in text.replace("&quot;", '"') or f"{W1}{spec}×4" in text, text
    assert figures.locator(".sl-time").inner_text() != step_before  # the pinned figures moved
    # per layer: four rows, each showing the group's new choice
    row.locator("button", has_text="per layer").click()
    layer_rows = cell.locator(".widget-gridbox", has=page.locator("code", has_text='["w1"]'))
    deadline = time.monotonic() + 20
    while layer_rows.count() < 5 and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    assert layer_rows.count() == 5  # the group row and its four layers
    for k in range(1, 5):
        chosen = layer_rows.nth(k).locator("select").nth(1)
        assert chosen.evaluate("el => el.options[el.selectedIndex].text") == choice
    # the compiled figures follow in the background
    figures.locator(".sl-compile", has_text="compiled in").wait_for(timeout=120_000)
    outputs.evaluate("el => el.scrollIntoView({block: 'start'})")
    _shot(page, "lab_03_editor_group_edit")
    # the other views of the notebook
    notebook.locator(".shardlab.sl-commgraph").first.wait_for()
    assert notebook.locator(".shardlab.sl-commgraph").count() == 2  # commgraph + plan.show()
    # the timeline: a bokeh plot over its SVG view (the SVG shows where BokehJS does not)
    notebook.locator(".shardlab.sl-bokeh-timeline.sl-bokeh-live canvas").first.wait_for()
    notebook.locator(".jp-OutputArea-output", has_text="megatron+dp").wait_for()
    # the plan's rich display: summary first
    plan_view = notebook.locator(".shardlab.sl-plan").first
    plan_view.wait_for()
    assert "predicted step" in plan_view.inner_text() and "optimality" in plan_view.inner_text()
    plan_view.scroll_into_view_if_needed()
    _shot(page, "lab_03_plan_display")


def _wait_text(locator, needle: str, timeout_s: float = 60) -> str:
    """The locator's text once it contains ``needle`` (Lab re-renders the output's DOM)."""
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        text = locator.inner_text()
        if needle in text:
            return text
        locator.page.wait_for_timeout(250)
    raise AssertionError(f"{needle!r} not shown; the view says:\n{text}")


def _box(locator, timeout_s: float = 30) -> dict:
    """The locator's bounding box once it is laid out: Lab re-renders an output's DOM after a
    widget update, and Playwright answers ``None`` for an element between two renders."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        locator.wait_for(state="visible", timeout=timeout_s * 1000)
        box = locator.bounding_box()
        if box is not None:
            return box
        locator.page.wait_for_timeout(250)
    raise AssertionError(f"{locator} was never laid out")


def _options(select) -> list[str]:
    # ipywidgets writes an option's spaces as no-break spaces
    return select.evaluate("el => [...el.options].map(o => o.text.replace(/\u00a0/g, ' '))")


def _choose(select, label: str) -> None:
    select.select_option(index=_options(select).index(label))


def test_editor_sets_stages_and_remat_in_the_browser(lab_server, lab_page):
    """A scanned GPT on a stage × data mesh: the pipeline and remat dropdowns (labelled by
    the user's lax.scan line) change the plan, the figures and the schedule; the timeline of
    a pipelined plan draws one lane per stage."""
    page = open_and_run(
        lab_page, lab_server.base_url, lab_server.token, "pipeline_editor.ipynb", timeout=300
    )
    notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")
    cell = notebook.locator(".jp-Cell", has=page.locator(".shardlab.sl-editor")).first
    figures = cell.locator(".shardlab.sl-editor").first
    figures.wait_for()
    stages = cell.locator(".widget-dropdown", has_text="pipeline").locator("select")
    remat = cell.locator(".widget-dropdown", has_text="remat").locator("select")
    # only the valid stage counts; the remat row names the user's scan
    assert _options(stages) == ["off", "4 stages"]
    assert "lax.scan at shardlab/examples/transformer.py:212 (4 layers)" in cell.inner_text()
    _choose(remat, "nothing: recompute all")
    text = _wait_text(figures, "remat 'nothing'")
    assert "memory per device:" in text  # the change line: memory fell
    _choose(stages, "4 stages")
    text = _wait_text(figures, "pipeline: 4 stages × 4 microbatches")
    schedule = figures.locator(".sl-editor-schedule svg")
    assert schedule.locator("text", has_text=re.compile(r"^stage \d$")).count() == 4
    assert "bubble:" in text
    micro = cell.locator(".widget-dropdown select").nth(1)
    _choose(micro, "8 microbatches")
    _wait_text(figures, "pipeline: 4 stages × 8 microbatches")
    assert schedule.locator("text", has_text="F7").count() == 4  # every stage's 8th forward
    output = cell.locator(".jp-OutputArea").first
    output.evaluate("el => el.scrollIntoView({block: 'start'})")
    # one screen: the figures, the schedule and the pipeline/remat controls together
    top, bottom = _box(figures), _box(remat)
    assert bottom["y"] + bottom["height"] - top["y"] <= page.viewport_size["height"] - 60
    _shot(page, "lab_pipeline_editor")
    # the timeline of a pipelined plan: the bokeh plot, and the labelled schedule under it
    timeline = notebook.locator(".shardlab.sl-bokeh-timeline").first
    timeline.locator("canvas").first.wait_for(timeout=120_000)
    timeline.evaluate("el => el.scrollIntoView({block: 'start'})")
    _shot(page, "lab_pipeline_timeline")
    drawn = timeline.locator(".sl-timeline-schedule svg")
    assert drawn.locator("text", has_text=re.compile(r"^stage \d$")).count() == 4
    timeline.locator(".sl-timeline-schedule").evaluate("el => el.scrollIntoView({block: 'start'})")
    _shot(page, "lab_pipeline_schedule")
