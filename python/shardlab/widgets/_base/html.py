"""Self-contained HTML/SVG building blocks shared by the views.

Everything a view draws is inline HTML + SVG with ``<title>`` tooltips: no JavaScript, no
CDN, so it renders in JupyterLab, in VS Code (offline too) and in a saved notebook.
"""

from __future__ import annotations

import html
from typing import Any

from shardlab.parallel.display import human_bytes, human_time
from shardlab.parallel.labels import COMPILER_INSERTED
from shardlab.parallel.labels import source_label as _source_label

# Colour-blind-friendly palette (Okabe-Ito, then Tableau 10) for device groups / kinds.
PALETTE = (
    "#E69F00",
    "#56B4E9",
    "#009E73",
    "#F0E442",
    "#0072B2",
    "#D55E00",
    "#CC79A7",
    "#4E79A7",
    "#F28E2B",
    "#59A14F",
    "#EDC948",
    "#B07AA1",
    "#FF9DA7",
    "#9C755F",
    "#76B7B2",
    "#BAB0AC",
)
KIND_COLORS = {
    "all-reduce": "#D55E00",
    "all-gather": "#0072B2",
    "reduce-scatter": "#009E73",
    "all-to-all": "#CC79A7",
    "collective-permute": "#E69F00",
}
STYLE = (
    "<style>.shardlab{font-family:var(--jp-ui-font-family,system-ui,sans-serif);"
    "font-size:12px;color:var(--jp-ui-font-color1,#222);}"
    ".shardlab table{border-collapse:collapse;margin:4px 0;}"
    ".shardlab td,.shardlab th{border:1px solid #ccc;padding:2px 6px;text-align:right;}"
    ".shardlab th{background:rgba(128,128,128,.12);}"
    ".shardlab .sl-left{text-align:left;}"
    ".shardlab .sl-error{color:#b00020;white-space:pre-wrap;font-family:monospace;}"
    ".shardlab .sl-note{color:#666;}</style>"
)


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


fmt_bytes = human_bytes
fmt_time = human_time


def source_label(source: str) -> str:
    """A collective's ``file:line`` as a person reads it (``In [8], line 2``,
    ``shardlab/examples/transformer.py:44``); "(compiler-inserted)" when no user line asked
    for it (no source, or only shardlab's own machinery)."""
    return _source_label(source, missing=COMPILER_INSERTED)


def panel(view_class: str, body: str, *, title: str = "") -> str:
    head = f"<div class='sl-title'><b>{esc(title)}</b></div>" if title else ""
    return f"{STYLE}<div class='shardlab {view_class}'>{head}{body}</div>"


def error_html(view_class: str, message: str) -> str:
    return panel(view_class, f"<div class='sl-error'>{esc(message)}</div>")


def table(headers: list[str], rows: list[list[Any]], *, left: int = 1, cls: str = "") -> str:
    head = "".join(
        f"<th class='{'sl-left' if i < left else ''}'>{esc(h)}</th>" for i, h in enumerate(headers)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f"<td class='{'sl-left' if i < left else ''}'>{c if isinstance(c, Raw) else esc(c)}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table class='{cls}'><tr>{head}</tr>{body}</table>"


class Raw(str):
    """HTML that ``table`` must not escape."""


class View:
    """A displayable record view: ``text/html`` and ``text/plain`` representations.

    Subclasses implement ``html()`` and ``text()``; a saved notebook keeps both, so it shows
    the last state without a kernel.
    """

    def html(self) -> str:
        raise NotImplementedError

    def text(self) -> str:
        raise NotImplementedError

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/html": self.html(), "text/plain": self.text()}

    def __repr__(self) -> str:
        return self.text()
