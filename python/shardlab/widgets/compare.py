"""Views of ``shardlab.compare`` and ``shardlab.bisect`` records: a table per output, the
equation found, in self-contained HTML (the records' ``text()`` is the plain form)."""

from __future__ import annotations

from shardlab._core.views import register_view
from shardlab.engine.compare.bisect import BisectReport
from shardlab.engine.compare.numerics import fmt
from shardlab.engine.compare.run import CompareReport
from shardlab.widgets._base.html import Raw, esc, panel, table

__all__ = ["bisect_html", "compare_html"]

_OK = "#1b7f3b"
_BAD = "#b00020"


def _badge(text: str, ok: bool) -> Raw:
    return Raw(f"<span style='color:{_OK if ok else _BAD};font-weight:600'>{esc(text)}</span>")


def compare_html(report: CompareReport) -> str:
    """The compare record as a table: one row per output leaf."""
    parts = [f"<div>{_badge(report.summary(), report.passed)}</div>"]
    if report.failure is not None:
        parts.append(f"<div class='sl-error'>{esc(report.failure.text())}</div>")
    if report.leaves:
        rows = []
        for leaf in report.leaves:
            d = leaf.difference
            shape = "×".join(map(str, d.shape)) or "scalar"
            closer = "—" if d.agree else d.closer
            rows.append(
                [
                    Raw(f"<code>{esc(leaf.label)}</code>"),
                    d.dtype,
                    shape,
                    fmt(d.max_abs),
                    fmt(d.max_rel),
                    fmt(d.eager_error),
                    fmt(d.compiled_error),
                    closer,
                    _badge(leaf.verdict, leaf.passed),
                ]
            )
        headers = [
            "output",
            "dtype",
            "shape",
            "max |compiled − eager|",
            "max relative",
            "max |eager − float64|",
            "max |compiled − float64|",
            "closer to float64",
            "verdict",
        ]
        parts.append(table(headers, rows, left=1))
        tol = {
            leaf.difference.dtype: leaf.difference.tolerance
            for leaf in report.leaves
            if leaf.difference.tolerance.rtol
        }
        if tol:
            rule = "; ".join(
                f"{k}: rtol {t.rtol:g}, atol {t.atol:g}·rms, margin ×{t.multiplier:g}"
                for k, t in tol.items()
            )
            parts.append(
                f"<div class='sl-note'>tolerance ({esc(rule)}; docs/guide/compare.md)</div>"
            )
    for note in report.notes:
        parts.append(f"<div class='sl-note'>note: {esc(note)}</div>")
    if report.seconds:
        timing = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in report.seconds.items())
        parts.append(f"<div class='sl-note'>time: {esc(timing)}</div>")
    if report.bisect_call:
        parts.append(
            "<div>to find the first diverging operation: "
            f"<code>{esc(report.bisect_call)}</code></div>"
        )
    return panel("sl-compare", "".join(parts), title="eager vs compiled vs float64")


def bisect_html(report: BisectReport) -> str:
    """The bisect record: the equation found, its line, the numbers and the prefixes tried."""
    parts = [f"<div>{_badge(report.summary(), report.fine)}</div>"]
    if report.failure is not None:
        parts.append(f"<div class='sl-error'>{esc(report.failure.text())}</div>")
    parts += [f"<div class='sl-finding'>{esc(f)}</div>" for f in report.findings()]
    if report.found:
        d = report.difference
        rows = [
            ["source", report.source or "?"],
            ["line", Raw(f"<code>{esc(report.line)}</code>")],
            ["equation", Raw(f"<code>{esc(report.equation)}</code>")],
            [
                "shapes",
                f"in {', '.join(report.input_shapes) or '—'}; out "
                f"{', '.join(report.output_shapes)}",
            ],
            ["max |compiled − eager|", fmt(d.max_abs if d else None)],
            ["largest eager value", fmt(d.magnitude if d else None)],
            ["max |eager − float64|", fmt(report.eager_vs_f64)],
            ["max |compiled − float64|", fmt(report.compiled_vs_f64)],
            ["alone on eager's inputs: |compiled − eager|", fmt(report.replay_f32)],
            ["alone on eager's inputs: |float64 − eager|", fmt(report.replay_f64)],
            ["inputs: max |compiled − eager|", fmt(report.inputs_max_abs)],
            ["cause", Raw(f"<b>{esc(report.cause)}</b> — {esc(report.explanation)}")],
        ]
        parts.append(table(["", ""], rows, left=2))
    for note in report.notes:
        parts.append(f"<div class='sl-note'>note: {esc(note)}</div>")
    if report.steps:
        tried = ", ".join(f"#{s.index} {'≠' if s.diverged else '='}" for s in report.steps)
        parts.append(f"<div class='sl-note'>prefixes compiled: {esc(tried)}</div>")
    return panel("sl-bisect", "".join(parts), title=report.title)


register_view("compare", compare_html)
register_view("bisect", bisect_html)
