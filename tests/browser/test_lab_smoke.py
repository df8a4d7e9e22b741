"""JupyterLab in headless Chromium runs a notebook on the shardlab kernel and renders it."""

from __future__ import annotations

import pytest
from lab import REPO, cell_outputs, open_and_run, open_notebook, run_all, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]


def test_smoke_notebook_renders_print_widget_and_html(lab_server, lab_page):
    page = open_and_run(lab_page, lab_server.base_url, lab_server.token, "smoke.ipynb")
    notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")

    # a %%graph cell's print, at run time
    notebook.locator(".jp-OutputArea-output", has_text="smoke graph sum 12.0").wait_for()
    # an ipywidgets slider, rendered by the widget manager (not its text/plain fallback)
    slider = notebook.locator(".jupyter-widgets.widget-slider")
    slider.wait_for()
    assert "smoke" in slider.inner_text()
    assert notebook.locator(".widget-readout", has_text="3").count() == 1
    # self-contained HTML
    html = notebook.locator("#shardlab-smoke-html")
    html.wait_for()
    assert html.inner_text() == "smoke html ok"

    outputs = cell_outputs(page)
    assert not any("IntSlider(value=3" in text for text in outputs), outputs
    screenshot(page, "lab_smoke")


def test_eager_jit_graph_notebook_runs_in_lab(lab_server, lab_page):
    name = lab_server.add(REPO / "notebooks" / "01_eager_jit_graph.ipynb")
    open_notebook(lab_page, lab_server.base_url, lab_server.token, name)
    state = run_all(lab_page, timeout=150)
    # Lab runs on past the cell tagged raises-exception (it sends stop_on_error=False).
    assert [(e["ename"], e["expected"]) for e in state["errors"]] == [("GraphStagingError", True)]
    text = "\n".join(cell_outputs(lab_page))
    assert "graph step: loss" in text
    assert "hidden mean" in text
    assert "cell line 3" in text
    screenshot(lab_page, "lab_01_eager_jit_graph")
