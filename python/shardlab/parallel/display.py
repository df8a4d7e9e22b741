"""How records read: short ``repr`` text, human units, and the aligned plan table.

The core never imports a view library; records' ``_repr_html_`` asks ``_core.views`` for
the ``html:<kind>`` view (``shardlab.widgets``, loaded on first display) and falls back to
the escaped text in a ``<pre>``
(a notebook then still shows the short text, not the whole dataclass).
"""

from __future__ import annotations

import dataclasses
import functools
import html
import keyword
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from shardlab._core.units import human_bytes, human_time
from shardlab._core.views import view_for
from shardlab._core.wording import human_flops, plural, ratio_text

__all__ = [
    "PlanTable",
    "function_name",
    "html_of",
    "human_bytes",
    "human_flops",
    "human_time",
    "mesh_text",
    "plural",
    "ratio_text",
]


def mesh_text(mesh_shape: dict[str, int]) -> str:
    """``data=2 × model=4`` (``1 device`` for an empty or all-ones mesh of one device)."""
    if not mesh_shape:
        return "1 device"
    return " × ".join(f"{k}={v}" for k, v in mesh_shape.items())


def html_of(kind: str, record: Any) -> str:
    viewer = view_for(f"html:{kind}")
    if viewer is not None:
        try:
            return viewer(record)
        except Exception as error:  # a view bug must not hide the record
            return (
                f"<pre>{html.escape(repr(record))}\n(view failed: {html.escape(str(error))})</pre>"
            )
    return f"<pre>{html.escape(repr(record))}</pre>"


def function_name(fn: Any) -> str | None:
    """The name the user calls ``fn`` by, when one can be found: a global of the notebook
    (``__main__``) or of its own module bound to this very object. None for an expression
    (``jax.grad(loss)``) or a local function — a name that would call something else is
    worse than a placeholder."""
    if fn is None:
        return None
    candidates: list[str] = []
    name = getattr(fn, "__name__", None)
    for module_name in ("__main__", getattr(fn, "__module__", None)):
        module = sys.modules.get(module_name) if isinstance(module_name, str) else None
        space = getattr(module, "__dict__", None)
        if not isinstance(space, dict):
            continue
        if isinstance(name, str) and space.get(name) is fn:
            candidates.append(name)
        else:  # bound under another name (train = jax.grad(loss); step, args = case.fn, ...)
            candidates += [k for k, v in list(space.items()) if v is fn and not k.startswith("__")]
    for found in candidates:
        if found.isascii() and found.isidentifier() and not keyword.iskeyword(found):
            return found
    return None


@dataclasses.dataclass(frozen=True)
class PlanTable:
    """``plan.table()``: an HTML table in a notebook, aligned text in a terminal.

    Attributes:
        title: the plan's one-line summary.
        headers: column names.
        rows: one tuple of cell texts per row.
        notes: lines under the table.
        omitted: rows left out by ``limit``.
        nowrap: columns of specs: in HTML never broken inside a spec, and ``"; "``-separated
            entries one per line (a ``P(None, 'model')`` wrapped over lines is unreadable).
    """

    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = ()
    omitted: int = 0
    nowrap: tuple[int, ...] = ()

    def text(self) -> str:
        widths = [len(h) for h in self.headers]
        for row in self.rows:
            widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

        def line(cells: Sequence[str]) -> str:
            out = []
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True)):
                numeric = i > 0 and cell.replace(".", "", 1).replace(",", "").isdigit()
                out.append(cell.rjust(width) if numeric else cell.ljust(width))
            return "  ".join(out).rstrip()

        lines = [self.title, line(self.headers), "  ".join("-" * w for w in widths)]
        lines += [line(r) for r in self.rows]
        if self.omitted:
            lines.append(f"… {self.omitted} more rows (plan.table(limit=None) lists all)")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return self.text()

    def __contains__(self, item: str) -> bool:
        return item in self.text()

    def cell_html(self, column: int, text: str) -> str:
        """One ``<td>``: spec columns unbroken, their entries one per line."""
        if column not in self.nowrap:
            return f"<td style='text-align:left'>{html.escape(text)}</td>"
        lines = "<br>".join(
            f"<span style='white-space:nowrap'>{html.escape(part)}</span>"
            for part in text.split("; ")
        )
        return f"<td style='text-align:left;vertical-align:top'>{lines}</td>"

    def _repr_html_(self) -> str:
        esc = html.escape
        head = "".join(f"<th style='text-align:left'>{esc(h)}</th>" for h in self.headers)
        body = "".join(
            "<tr>" + "".join(self.cell_html(i, c) for i, c in enumerate(r)) + "</tr>"
            for r in self.rows
        )
        more = (
            f"<div>… {self.omitted} more rows (<code>plan.table(limit=None)</code>)</div>"
            if self.omitted
            else ""
        )
        notes = "".join(f"<div style='color:#666'>note: {esc(n)}</div>" for n in self.notes)
        return (
            f"<div class='shardlab sl-plan-table'><div><b>{esc(self.title)}</b></div>"
            f"<table><tr>{head}</tr>{body}</table>{more}{notes}</div>"
        )


def _per_kind(comm_bytes: dict[str, float]) -> str:
    parts = [f"{k} {human_bytes(v)}" for k, v in comm_bytes.items() if v]
    return ", ".join(parts) or "no communication"


def report_text(report: Any) -> str:
    """``Report(...)`` in one line: collectives, wire bytes per kind, memory, flops."""
    return (
        f"Report(compiled on {mesh_text(report.mesh_shape)}: "
        f"{plural(len(report.collectives), 'collective')}, "
        f"{human_bytes(report.total_comm_bytes)} on the wire per device "
        f"({_per_kind(report.comm_bytes)}); memory {human_bytes(report.memory.total)} per "
        f"device; {human_flops(report.flops)} per device)"
    )


def cost_text(cost: Any) -> str:
    """``CostBreakdown(...)`` in one line: step time, communication, memory, profile."""
    return (
        f"CostBreakdown(predicted {human_time(cost.time)}: compute "
        f"{human_time(cost.compute_time)} + {cost.comm_words(human_time)}; "
        f"{human_bytes(cost.total_comm_bytes)} on the wire per device "
        f"({_per_kind(cost.comm_bytes)}); peak {human_bytes(cost.memory.peak)} per device; "
        f"profile {cost.device})"
    )


# -- long work: the default progress display --------------------------------------------------
# ``what -> bar``: a bar is a context manager and a ``(fraction, message)`` callback with
# ``done(message)``. Empty: the ``progress`` view (``_core/views.py``: an ipywidgets bar in a
# notebook, a text bar in a terminal, none elsewhere); a caller may push its own.
PROGRESS_FACTORY: list[Callable[[str], Any]] = []


class _NoBar:
    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __call__(self, fraction: float, message: str) -> None:
        return None

    def done(self, message: str) -> None:
        return None


_ACTIVE = threading.local()


class _Nested:
    """A bar marks its thread busy: long work inside long work (the search compiling its
    candidates with ``verify()``) shows on the outer bar only."""

    def __init__(self, bar: Any) -> None:
        self.bar = bar

    def __enter__(self) -> Any:
        _ACTIVE.depth = getattr(_ACTIVE, "depth", 0) + 1
        return self.bar.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        _ACTIVE.depth -= 1
        return self.bar.__exit__(*exc)


def progress_bar(what: str) -> Any:
    """The registered progress display for ``what`` (a silent one when none is, or when
    this thread already shows a bar)."""
    if getattr(_ACTIVE, "depth", 0):
        return _NoBar()
    factory = PROGRESS_FACTORY[-1] if PROGRESS_FACTORY else view_for("progress")
    if factory is None:
        return _NoBar()
    try:
        return _Nested(factory(what))
    except Exception:  # a display problem never stops the work
        return _NoBar()


def with_progress(what: str, finish: Callable[[Any], str]) -> Callable[[Any], Any]:
    """Decorates a function taking ``progress=``: called without one, it gets the default
    bar (after about a second), and ``finish(result)`` is the bar's last words."""

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def run(*args: Any, progress: Callable[[float, str], None] | None = None, **kw: Any) -> Any:
            if progress is not None:  # the caller shows progress: nothing nested does
                with _Nested(_NoBar()):
                    return func(*args, progress=progress, **kw)
            with progress_bar(what) as bar:
                result = func(*args, progress=bar, **kw)
                bar.done(finish(result))
                return result

        return run

    return wrap


def search_finish(plan: Any) -> str:
    """A search's last words on its bar: done, or interrupted with the best plan so far."""
    if not getattr(plan, "complete", True):
        return "interrupted: returned the best plan found so far (plan.complete is False)"
    return f"done: {getattr(plan, 'method', '')}"
