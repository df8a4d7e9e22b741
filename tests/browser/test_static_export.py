"""Every notebook, executed with its widget state and exported to HTML, reads well offline.

What VS Code users, a saved notebook and ``jupyter nbconvert --to html`` show: no lab
extension, no widget JavaScript (the exported page fetches ipywidgets' html-manager from a
CDN, and this page has no network), only the outputs' own HTML and text. Each notebook runs
with nbclient on the shardlab kernel (``store_widget_state=True``), is exported with
nbconvert's ``HTMLExporter`` and opened from a file in headless Chromium with every request
that is not ``file:`` or ``data:`` aborted. Then: no output is empty (a widget's output may
be, offline, but its cell must say in text what its controls do), the names the notebook's
code wrote appear in the views, no page errors and nothing but nbconvert's own template asks
the network. Screenshots: test-artifacts/browser/static_<notebook>.png (the whole page).
"""

from __future__ import annotations

import pathlib
import re
from typing import Any

import pytest
from lab import ARTIFACTS, REPO

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# The only URLs an exported page may ask for: nbconvert's template (require.js, MathJax, the
# widget html-manager). A shardlab view asking the network would show up here.
TEMPLATE_URLS = re.compile(
    r"^https://(cdnjs\.cloudflare\.com/ajax/libs/(require\.js|mathjax)/"
    r"|unpkg\.com/@jupyter-widgets/html-manager@|cdn\.jsdelivr\.net/npm/@jupyter-widgets/)"
)
# ipywidgets' own text/plain (``HBox(children=(Button(...``): says nothing to a reader.
WIDGET_REPR = re.compile(r"^[A-Z]\w*\((children|description|value|options)=")
MIN_HEIGHT_PX = 10


def _slow_if(path: pathlib.Path) -> Any:
    # the editor notebook compiles, searches and profiles a 4-layer transformer (~50 s)
    marks = [pytest.mark.slow] if path.name.startswith("03_") else []
    return pytest.param(path, id=path.stem, marks=marks)


def export_html(notebook: Any, target: pathlib.Path) -> str:
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(notebook)
    target.write_text(body, encoding="utf-8")
    return body


OUTPUTS_JS = """() => [...document.querySelectorAll('.jp-Cell')].map(cell => ({
    code: cell.classList.contains('jp-CodeCell'),
    text: (cell.querySelector('.jp-OutputArea') || {innerText: ''}).innerText || '',
    outputs: [...cell.querySelectorAll('.jp-OutputArea-child')].map(child => {
        const out = child.querySelector('.jp-OutputArea-output') || child;
        const box = out.getBoundingClientRect();
        return {text: (out.innerText || '').trim(), width: box.width, height: box.height,
                right: box.right, scroll: out.scrollWidth, client: out.clientWidth,
                widget: out.classList.contains('jupyter-widgets')};
    }),
}))"""


def open_offline(chromium: Any, html_path: pathlib.Path) -> tuple[Any, Any, list[str], list[str]]:
    context = chromium.new_context(viewport={"width": 1200, "height": 900})
    context.set_default_timeout(30_000)
    page = context.new_page()
    console: list[str] = []
    blocked: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))

    def route(request_route: Any) -> None:
        url = request_route.request.url
        if url.startswith(("file:", "data:")):
            request_route.continue_()
        else:
            blocked.append(url)
            request_route.abort()

    page.route("**/*", route)
    page.goto(html_path.as_uri())
    page.wait_for_load_state("load")
    return context, page, console, blocked


def expected_names(notebook: Any) -> dict[int, list[str]]:
    """Per code cell index: strings a reader must find in that cell's outputs: the names the
    cell's code gave and the ``In [n]`` labels the views show."""
    cells = notebook.cells
    expect: dict[int, list[str]] = {}

    def cell_with(snippet: str) -> tuple[int, Any]:
        found = [
            (i, c) for i, c in enumerate(cells) if c.cell_type == "code" and snippet in c.source
        ]
        assert found, f"no cell contains {snippet!r}: the notebook changed, update the test"
        return found[0]

    for i, cell in enumerate(cells):
        if cell.cell_type != "code":
            continue
        for name in re.findall(r"shardlab\.show\([^\n]*name='([^']+)'", cell.source):
            expect.setdefault(i, []).append(name)
        if cell.source.strip() == "%mode":  # the modes of the cells before it, by number
            numbers = [c.execution_count for c in cells[:i] if c.cell_type == "code"]
            expect.setdefault(i, []).extend(f"[{n}]" for n in numbers[-3:])
    names = [c.source for c in cells if c.cell_type == "code"]
    if any("shardlab.memory()" in s for s in names):
        i, _ = cell_with("shardlab.memory()")
        bound = [n for s in names for n in re.findall(r"^(\w+) = jax\.device_put", s, re.M)]
        expect.setdefault(i, []).extend([*bound, "Release (run %release)"])
    if any("shardlab.watch(" in s for s in names):
        i, _ = cell_with("shardlab.watch(")
        _, rebinding = cell_with("# the view above updates")
        expect.setdefault(i, []).extend(["x2d", f"after cell {rebinding.execution_count}"])
    if any("shardlab.commgraph(layer" in s for s in names):
        i, cell = cell_with("shardlab.commgraph(layer")
        line = 1 + cell.source.splitlines().index("    return jnp.tanh(x @ w)")
        expect.setdefault(i, []).extend(
            [f"In [{cell.execution_count}], line {line}", "layer/dot_general"]
        )
    if any("shardlab.editor(" in s for s in names):
        i, _ = cell_with("shardlab.editor(")
        expect.setdefault(i, []).extend(
            ["batch[0]", "strategy: ", ".edit(label, dim, axes)", ".export()"]
        )
        i, _ = cell_with("shardlab.commgraph(step")
        expect.setdefault(i, []).append("shardlab/examples/transformer.py:")
    return expect


@pytest.mark.parametrize("path", [_slow_if(p) for p in NOTEBOOKS])
def test_exported_notebook_reads_well_offline(path, chromium, tmp_path, executed_notebook):
    notebook = executed_notebook(path.name)
    assert notebook.metadata.get("widgets") or not any(
        WIDGET_VIEW in o.get("data", {}) for c in notebook.cells for o in c.get("outputs", [])
    ), "nbclient stored no widget state"
    html_path = tmp_path / f"{path.stem}.html"
    export_html(notebook, html_path)
    context, page, console, blocked = open_offline(chromium, html_path)
    try:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"static_{path.stem}.png"), full_page=True)
        shown = page.evaluate(OUTPUTS_JS)
        page_width = page.evaluate("() => document.documentElement.clientWidth")
    finally:
        context.close()

    assert len(shown) == len(notebook.cells), (len(shown), len(notebook.cells))
    problems: list[str] = []
    for index, (cell, dom) in enumerate(zip(notebook.cells, shown, strict=True)):
        if cell.cell_type != "code":
            continue
        where = f"cell {index} ({cell.source.splitlines()[0][:60]!r})"
        outputs = cell.get("outputs", [])
        if len(dom["outputs"]) != len(outputs):
            problems.append(f"{where}: {len(outputs)} outputs, {len(dom['outputs'])} on the page")
            continue
        for output, box in zip(outputs, dom["outputs"], strict=True):
            data = output.get("data", {})
            if box["widget"] or WIDGET_VIEW in data:
                # Offline the widget draws nothing; its bundle and its cell must say in text
                # what the controls are and do.
                plain = data.get("text/plain", "")
                if not plain or WIDGET_REPR.match(plain):
                    problems.append(f"{where}: widget with no readable text/plain: {plain[:80]!r}")
                if len(dom["text"].strip()) < 20:
                    problems.append(f"{where}: a widget and no readable text beside it")
                continue
            if output.output_type == "stream" and not output.get("text", "").strip():
                # ipykernel flushed a print's newline apart from its text (a slow loop
                # between prints): a blank line on the page, as in Lab, not an empty view
                continue
            if not box["text"] or box["height"] < MIN_HEIGHT_PX or box["width"] <= 0:
                problems.append(
                    f"{where}: an empty output on the page ({output.output_type}, "
                    f"{box['width']:.0f}×{box['height']:.0f} px, {sorted(data)})"
                )
            if box["right"] > page_width + 1:
                problems.append(f"{where}: output wider than the page ({box['right']:.0f} px)")
    for index, names in expected_names(notebook).items():
        text = shown[index]["text"]
        missing = [n for n in names if n not in text]
        if missing:
            problems.append(f"cell {index}: {missing} not on the page; it shows:\n{text[:1500]}")
    errors = [c for c in console if c.startswith("pageerror") or "shardlab" in c.lower()]
    errors += [c for c in console if c.startswith("error:") and "Failed to load resource" not in c]
    if errors:
        problems.append("console errors: " + "; ".join(errors))
    stray = [url for url in blocked if not TEMPLATE_URLS.match(url)]
    if stray:
        problems.append(f"requests beyond nbconvert's template (a view wants the network): {stray}")
    assert not problems, "\n".join(problems)


def test_widget_fallback_text_without_widget_state(tmp_path, executed_notebook):
    """Without stored widget state (a notebook saved by a front end that keeps none, GitHub,
    nbviewer), nbconvert shows each widget's fallback: the memory panel's says what its
    buttons do, not ``HBox(children=(Button(...``."""
    notebook = executed_notebook("02_sharding_layouts.ipynb")
    notebook.metadata.pop("widgets", None)  # as saved by a front end that keeps no state
    html = export_html(notebook, tmp_path / "no_state.html")
    assert "Release (run <code>%release</code>)" in html
    assert "HBox(children=" not in html
