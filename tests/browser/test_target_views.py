"""Views of a program planned for 256 devices read well in a real browser.

A layout of an array over 256 H100s (32 hosts × 8) and over a 256-chip v5e slice, and the
communication graph of a train step compiled by XLA:GPU for the 256 H100s, shown as a
notebook shows them (the outputs of cells, exported with nbconvert and opened offline in
headless Chromium, as VS Code and a saved notebook show them). A person must be able to
read them: each fits the page's width and one screen's height, names the hosts its axes
cross, and the figures on the page are the figures of the records.
Screenshot: test-artifacts/browser/target_views_256.png.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P
from lab import ARTIFACTS
from test_static_export import OUTPUTS_JS, export_html, open_offline

import shardlab
from compilers import needs
from shardlab.widgets._base.html import fmt_bytes

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

SCREEN_HEIGHT = 900


def _cell(source: str, view) -> object:
    import nbformat

    cell = nbformat.v4.new_code_cell(source)
    cell.outputs = [nbformat.v4.new_output("display_data", data=view._repr_mimebundle_())]
    return cell


def test_views_of_256_devices_fit_one_screen_and_say_which_axes_cross_hosts(chromium, tmp_path):
    needs("cuda", "tpu")
    import nbformat

    gpus = shardlab.mesh(data=32, model=8, devices=shardlab.target("h100", hosts=32))
    chips = shardlab.mesh(data=16, model=16, devices=shardlab.target("tpu-v5e", topology="16x16"))
    w = jax.ShapeDtypeStruct((1024, 4096), jnp.bfloat16)
    x = jax.ShapeDtypeStruct((2048, 1024), jnp.bfloat16)

    def loss(w, x):
        return jnp.tanh(x @ w).sum()

    views = [
        (
            "shardlab.show((8192, 4096), P('data', 'model'), mesh=gpus)",
            shardlab.show((8192, 4096), P("data", "model"), mesh=gpus, dtype="bfloat16"),
        ),
        (
            "shardlab.show((8192, 4096), P('data', 'model'), mesh=chips)",
            shardlab.show((8192, 4096), P("data", "model"), mesh=chips, dtype="bfloat16"),
        ),
        (
            "shardlab.commgraph(jax.grad(loss), w, x, mesh=gpus, ...)",
            shardlab.commgraph(
                jax.grad(loss), w, x, mesh=gpus, in_shardings=(P(None, "model"), P("data", None))
            ),
        ),
    ]
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [_cell(source, view) for source, view in views]
    html_path = tmp_path / "target_views.html"
    export_html(notebook, html_path)
    context, page, console, _ = open_offline(chromium, html_path)
    try:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "target_views_256.png"), full_page=True)
        shown = page.evaluate(OUTPUTS_JS)
        page_width = page.evaluate("() => document.documentElement.clientWidth")
    finally:
        context.close()

    assert not [c for c in console if c.startswith("pageerror")], console
    assert len(shown) == len(views)
    for (source, view), cell in zip(views, shown, strict=True):
        (box,) = cell["outputs"]
        assert 0 < box["height"] <= SCREEN_HEIGHT, (source, box)
        assert box["right"] <= page_width + 1 and box["scroll"] <= box["client"] + 1, (source, box)
        # every size and time the view's text form gives is on the page, as written there
        figures = set(re.findall(r"\d[\d.,]* (?:[KMG]iB|[µm]?s)\b", view.text()))
        missing = [f for f in figures if f not in box["text"]]
        assert not missing, (source, missing, box["text"][:800])
    gpu_layout, tpu_layout, graph = (c["outputs"][0]["text"] for c in shown)
    assert "256 × H100 SXM: data across 32 hosts; model within a host" in gpu_layout
    assert "not drawn: data 9–29" in gpu_layout
    assert "256 × TPU v5e" in tpu_layout and "within a slice" in tpu_layout
    assert "collectives over data cross hosts (InfiniBand)" in graph
    assert "256.0 KiB per device" in gpu_layout and "256.0 KiB per device" in tpu_layout
    compiled = views[2][1].actual.collectives
    assert compiled and all(c.mesh_axes == ("data",) for c in compiled)
    # the weight gradient (1024 × 4096 bf16 / 8 = 1 MiB a device) all-reduced over 32 hosts
    wire = sum(c.wire_bytes * c.count for c in compiled)
    assert wire == pytest.approx(2 * 31 / 32 * 2**20)
    assert f"{fmt_bytes(wire)}" in graph and "1.000" in graph
