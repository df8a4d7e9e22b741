"""Notebook 05 (a model over a per-device memory budget; ZeRO-3, remat, pipeline stages and
the budgeted search) run by JupyterLab in headless Chromium: no cell raises, the views render
(layouts, the memory panel's bars, the timelines' lanes, the pipeline schedule's stage lanes)
and the printed memory bars end with the searched plan within the budget.
Screenshots: test-artifacts/browser/lab_05_*.png."""

from __future__ import annotations

from typing import Any

import pytest
from lab import REPO, cell_outputs, open_and_run, screenshot

# The notebook compiles about twenty plans and runs a budgeted search: minutes on 2 cores.
pytestmark = [pytest.mark.browser, pytest.mark.timeout(960)]


def _show(page: Any, locator: Any, name: str) -> None:
    """Scrolls ``locator`` to the top of the notebook and saves a screenshot."""
    locator.evaluate("el => el.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    screenshot(page, name)


def test_memory_budget_notebook_runs_and_its_views_render(lab_server, lab_page):
    name = lab_server.add(REPO / "notebooks" / "05_memory_budget.ipynb")
    page = open_and_run(lab_page, lab_server.base_url, lab_server.token, name, timeout=900)
    notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")
    outputs = cell_outputs(page)
    assert not any("Traceback" in text for text in outputs)
    # layouts: the ZeRO-3, pipelined and searched weights, each tile with a hover title
    layouts = notebook.locator(".shardlab.sl-layout")
    assert layouts.count() >= 3
    assert "devices" in (layouts.first.locator("svg.sl-array g.sl-tile title").first.text_content())
    # the memory panel: one bar per device
    memory = notebook.locator(".shardlab.sl-memory")
    memory.wait_for()
    assert memory.locator(".sl-bar-row").count() == 8
    # timelines (ZeRO-3 and remat): lanes of compute and communication
    timelines = notebook.locator(".shardlab.sl-timeline-view")
    assert timelines.count() >= 2
    for i in range(2):
        assert timelines.nth(i).locator("svg.sl-timeline-svg g.sl-compute").count() > 0
        assert timelines.nth(i).locator("svg.sl-timeline-svg g.sl-comm").count() > 0
    # the pipeline schedule: a lane per stage, every microbatch's forward and backward
    schedule = notebook.locator(".shardlab.sl-pipeline svg.sl-pipeline-svg")
    schedule.wait_for()
    lanes = schedule.locator("text").all_text_contents()
    assert [t for t in lanes if t.startswith("stage ")] == [f"stage {s}" for s in range(4)]
    assert schedule.locator("g.sl-stage-forward").count() == 16  # 4 stages × 4 microbatches
    assert schedule.locator("g.sl-stage-backward").count() == 16
    # the printed bars: data parallel over the budget, the searched plan within it
    bars = [text for text in outputs if "▏budget" in text]
    assert len(bars) == 5
    first = next(line for line in bars[0].splitlines() if line.startswith("data parallel "))
    assert "over by" in first
    searched = next(line for line in bars[-1].splitlines() if line.startswith("searched plan"))
    assert searched.rstrip().endswith("fits")
    assert any("new parameters within" in text for text in outputs)

    cells = notebook.locator(".jp-CodeCell")
    _show(page, cells.filter(has_text="budget: ").first, "lab_05_budget")
    _show(page, notebook.locator(".shardlab.sl-memory").first, "lab_05_zero3_memory")
    _show(page, cells.filter(has_text="shardlab.timeline(zero3)").first, "lab_05_zero3_timeline")
    _show(page, cells.filter(has=page.locator(".sl-pipeline")).first, "lab_05_pipeline")
    _show(page, cells.filter(has_text="shardlab.search(").first, "lab_05_search")
    _show(page, cells.filter(has_text="searched plan").first, "lab_05_search_bars")
