"""The strategy editor in JupyterLab, in a real browser: choose a split in a dropdown, see
the figures change, press Auto; the communication graph and timeline render."""

from __future__ import annotations

import re
import time

import pytest
from lab import REPO, open_and_run, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


def test_editor_notebook_edits_live_in_the_browser(lab_server, lab_page):
    name = lab_server.add(REPO / "notebooks" / "03_strategy_editor.ipynb")
    page = open_and_run(lab_page, lab_server.base_url, lab_server.token, name, timeout=240)
    notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")
    figures = notebook.locator(".shardlab.sl-editor").first
    figures.wait_for()
    # stock ipywidgets dropdowns, one per dimension of every input leaf
    selects = notebook.locator(".widget-dropdown select")
    assert selects.count() > 20

    def generation() -> int:
        found = re.search(r"strategy #(\d+)", figures.inner_text())
        return int(found.group(1)) if found else -1

    before = generation()
    selects.first.select_option(label="model")  # a user edit in the browser
    # Lab replaces the output's DOM node on each update: poll through the locator.
    deadline = time.monotonic() + 30
    while generation() <= before and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    assert generation() > before, figures.inner_text()
    assert "changed:" in figures.inner_text() or "invalid choice" in figures.inner_text()
    # the compiled figures follow in the background
    figures.locator(".sl-compile", has_text="compiled in").wait_for(timeout=90_000)
    # the other views of the notebook
    notebook.locator(".shardlab.sl-commgraph").first.wait_for()
    assert notebook.locator(".shardlab.sl-commgraph").count() == 2  # commgraph + plan.show()
    # the timeline: a bokeh plot over its SVG view (the SVG shows where BokehJS does not)
    notebook.locator(".shardlab.sl-bokeh-timeline.sl-bokeh-live canvas").first.wait_for()
    notebook.locator(".jp-OutputArea-output", has_text="megatron+dp").wait_for()
    figures.scroll_into_view_if_needed()
    screenshot(page, "lab_03_strategy_editor")
