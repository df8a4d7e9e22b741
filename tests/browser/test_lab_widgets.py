"""The widget views render in JupyterLab in a real browser: layouts, communication graph,
memory panel (with a click on Release), watch — notebook 02 executed by Lab itself."""

from __future__ import annotations

import pytest
from lab import REPO, open_and_run, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]


def test_layouts_notebook_views_render_and_respond(lab_server, lab_page):
    name = lab_server.add(REPO / "notebooks" / "02_sharding_layouts.ipynb")
    page = open_and_run(lab_page, lab_server.base_url, lab_server.token, name)
    notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")
    # layout views: SVG tiles and mesh devices, with hover titles
    layouts = notebook.locator(".shardlab.sl-layout")
    assert layouts.count() >= 5
    assert notebook.locator(".sl-layout svg.sl-mesh g.sl-device").count() >= 8
    tile = notebook.locator(".sl-layout svg.sl-array g.sl-tile").first
    assert "devices" in (tile.locator("title").text_content() or "")
    assert (
        notebook.locator(".sl-layout .sl-error", has_text="which the mesh does not have").count()
        == 1
    )
    # communication graph: strip of collectives and the per-kind table
    graph = notebook.locator(".shardlab.sl-commgraph")
    graph.wait_for()
    assert graph.locator("table.sl-summary-table tr").count() >= 2
    assert graph.locator("svg.sl-strip g.sl-collective").count() >= 1
    # memory panel: stock ipywidgets buttons + the live HTML view
    memory = notebook.locator(".shardlab.sl-memory")
    memory.wait_for()
    assert memory.locator(".sl-bar-row").count() == 8
    release = notebook.locator("button.jupyter-button", has_text="Release")
    release.wait_for()
    release.click()
    notebook.locator(".sl-memory .sl-release-note", has_text="released:").wait_for(timeout=30_000)
    # watch: refreshed when the last cell rebound x2d
    watch = notebook.locator(".shardlab.sl-watch")
    watch.wait_for()
    assert "P(None, 'model')" in watch.inner_text()
    screenshot(page, "lab_02_sharding_layouts")
