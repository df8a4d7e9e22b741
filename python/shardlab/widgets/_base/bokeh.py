"""Bokeh plots in a notebook, offline: BokehJS inline once per notebook, plots that embed into
it, and the SVG view underneath for every front end that runs no script.

A plot's output is one ``text/html`` (plus ``text/plain``): the existing SVG view, a
placeholder for the plot, the plot's document as JSON and a short script that embeds it with
``Bokeh.embed.embed_item`` and then hides the SVG. BokehJS itself (``bokeh.min.js``, about
1.2 MiB, the core bundle only: no widgets, tables, WebGL or MathJax bundles) is published
once per kernel session, as its own small output before the first plot ("BokehJS 3.9.2
loaded"), not in every output — ``bokeh.io.output_notebook(INLINE)`` would publish about
7.9 MB and a load mimetype VS Code does not handle (JAX_NOTES). Where that loader ran
(JupyterLab, VS Code, a notebook exported to HTML, all without network), plots are
interactive; where no script runs (an untrusted notebook, GitHub, a text-only front end) the
SVG view stays. The loader is published again when the cell that holds it runs again (its
output would be replaced) and after a kernel restart (a new session).

``bokeh`` is imported here and in the ``bokeh_*`` views only, on first use: the parallel core
and ``import shardlab`` never load it (tests/core/test_architecture.py).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import uuid
from typing import Any

from shardlab.widgets._base.html import STYLE, View, esc

# Seconds a plot's script waits for BokehJS (published by an output above it) before it
# leaves the SVG view in place.
WAIT_FOR_BOKEHJS_S = 10


@functools.cache
def bokeh_version() -> str:
    import bokeh

    return str(bokeh.__version__)


@functools.cache
def bokehjs_source() -> str:
    """``bokeh.min.js`` of the installed bokeh (the core bundle), read from the package."""
    import bokeh

    path = os.path.join(os.path.dirname(bokeh.__file__), "server", "static", "js", "bokeh.min.js")
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    return source.replace("</script", "<\\/script")  # never the case in 3.9; cheap to be sure


def loader_html() -> str:
    """The one output that loads BokehJS: the library inline (no network), guarded so that a
    page that already has this version does not load it twice."""
    version = bokeh_version()
    return (
        f"{STYLE}<div class='shardlab sl-bokeh-loader sl-note'>BokehJS {esc(version)} loaded "
        "inline (no network) for shardlab's interactive plots in this notebook</div>"
        f"<script>if (!(window.Bokeh && window.Bokeh.version === {json.dumps(version)})) "
        f"{{ (function () {{\n{bokehjs_source()}\n}}).call(window); }}</script>"
    )


class _Loader:
    """Whether this kernel session published the loader, and in which cell."""

    published = False
    cell_id: str | None = None
    execution: Any = None


def _current_cell() -> tuple[str | None, Any]:
    """(JupyterLab's cell id of the running execute request, the request's message id)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    kernel = getattr(shell, "kernel", None)
    try:
        parent = kernel.get_parent() if kernel is not None else {}
    except Exception:  # no parent outside an execute request
        parent = {}
    metadata = (parent or {}).get("metadata") or {}
    header = (parent or {}).get("header") or {}
    cell_id = metadata.get("cellId") if isinstance(metadata, dict) else None
    return (cell_id if isinstance(cell_id, str) else None), header.get("msg_id")


def ensure_loader() -> bool:
    """Publishes the BokehJS loader unless this session already did (in another cell).

    Returns whether it published now. Outside IPython it does nothing.
    """
    ipython = sys.modules.get("IPython")
    if ipython is None or ipython.get_ipython() is None:
        return False
    cell_id, execution = _current_cell()
    rerun = _Loader.published and cell_id is not None and cell_id == _Loader.cell_id
    same_run = _Loader.published and execution is not None and execution == _Loader.execution
    if _Loader.published and (same_run or not rerun):
        return False
    from IPython.display import display

    display(
        {"text/html": loader_html(), "text/plain": f"BokehJS {bokeh_version()} loaded"}, raw=True
    )
    _Loader.published, _Loader.cell_id, _Loader.execution = True, cell_id, execution
    return True


def reset_loader() -> None:
    """Forget the published loader (tests; a front end that lost it)."""
    _Loader.published, _Loader.cell_id, _Loader.execution = False, None, None


_EMBED_JS = """(function () {
  var id = %(id)s, version = %(version)s, waited = 0;
  function run() {
    var box = document.getElementById(id);
    if (!box) return;
    if (!(window.Bokeh && window.Bokeh.embed && window.Bokeh.version === version)) {
      waited += 100;
      if (waited < %(wait_ms)d) { setTimeout(run, 100); }
      return;
    }
    var item = JSON.parse(document.getElementById(id + '-item').textContent);
    var done = window.Bokeh.embed.embed_item(item, id + '-plot');
    Promise.resolve(done).then(function (views) {
      (window.shardlabBokeh = window.shardlabBokeh || {})[id] = views;  // for tests, devtools
      box.classList.add('sl-bokeh-live');
      var fallback = box.querySelector('.sl-bokeh-fallback');
      if (fallback) fallback.style.display = 'none';
    });
  }
  run();
})();"""


def embed_html(model: Any, fallback_html: str, *, extra_html: str = "", cls: str = "") -> str:
    """``model`` (a bokeh layout or figure) as self-contained HTML over ``fallback_html``.

    ``extra_html`` goes below the plot (notes, a details box a callback fills); it stays
    visible in the static form too.
    """
    from bokeh.core.types import ID
    from bokeh.embed import json_item

    box = f"sl-bokeh-{uuid.uuid4().hex[:12]}"
    item = json.dumps(json_item(model, ID(f"{box}-plot")), separators=(",", ":"))
    item = item.replace("</", "<\\/")  # a string in the document must not close the script
    script = _EMBED_JS % {
        "id": json.dumps(box),
        "version": json.dumps(bokeh_version()),
        "wait_ms": WAIT_FOR_BOKEHJS_S * 1000,
    }
    return (
        f"{STYLE}<div class='shardlab sl-bokeh {esc(cls)}' id='{box}'>"
        f"<div class='sl-bokeh-plot' id='{box}-plot'></div>"
        f"<div class='sl-bokeh-fallback'>{fallback_html}</div>{extra_html}"
        f"<script type='application/json' id='{box}-item'>{item}</script>"
        f"<script>{script}</script></div>"
    )


class BokehView(View):
    """A view drawn as a bokeh plot where BokehJS runs, as its SVG view elsewhere.

    Subclasses give ``model()`` (the bokeh layout), ``fallback()`` (the SVG ``View``),
    ``text()`` and optionally ``extra_html()``.
    """

    view_class = ""

    def model(self) -> Any:
        raise NotImplementedError

    def fallback(self) -> View:
        raise NotImplementedError

    def extra_html(self) -> str:
        return ""

    def html(self) -> str:
        return embed_html(
            self.model(), self.fallback().html(), extra_html=self.extra_html(), cls=self.view_class
        )

    def _ipython_display_(self) -> None:
        from IPython.display import display

        ensure_loader()
        display(self._repr_mimebundle_(), raw=True)
