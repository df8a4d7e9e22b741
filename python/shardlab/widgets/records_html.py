"""Rich notebook forms of ``Plan``, ``Report`` and ``CostBreakdown``: summary first, then
collapsible tables (``<details>``: no JavaScript, so VS Code and saved notebooks show them).

Registered as the ``html:plan|report|cost`` views (``_core/views.py``) on import; the
records' ``_repr_html_`` asks for them (the core never imports the views).
"""

from __future__ import annotations

from typing import Any

from shardlab._core.views import register_view
from shardlab.parallel.cost.profiles import describe_profile
from shardlab.parallel.display import human_flops, mesh_text, plural
from shardlab.parallel.labels import group_label, path_label
from shardlab.parallel.records import COLLECTIVE_KINDS, CostBreakdown, Report
from shardlab.widgets._base.html import (
    KIND_COLORS,
    Raw,
    esc,
    fmt_bytes,
    fmt_time,
    panel,
    source_label,
    table,
)


def _spec(layout: Any) -> str:
    parts = []
    for axes in layout:
        parts.append("None" if not axes else repr(axes[0]) if len(axes) == 1 else repr(tuple(axes)))
    while parts and parts[-1] == "None":
        parts.pop()
    return "P(" + ", ".join(parts) + ")"


def _shape(shape: Any) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _kinds(comm_bytes: dict[str, float]) -> str:
    shown = [
        f"<span style='color:{KIND_COLORS[k]}'>■</span> {esc(k)} {fmt_bytes(comm_bytes[k])}"
        for k in COLLECTIVE_KINDS
        if comm_bytes.get(k)
    ]
    return " · ".join(shown) or "none"


def _summary(rows: list[tuple[str, str]]) -> str:
    body = "".join(
        f"<tr><th class='sl-left'>{esc(k)}</th><td class='sl-left'>{v}</td></tr>" for k, v in rows
    )
    return f"<table class='sl-summary'>{body}</table>"


def layer_rows(paths: tuple[str, ...], shapes: Any, specs: Any) -> list[list[Any]]:
    """Input rows grouped by layer: a group whose layers share shape and spec is one row
    (``params["blocks"][*]["w1"]`` ×4); a group whose layers differ lists each."""
    groups: dict[tuple[str, tuple[int, ...]], list[int]] = {}
    for i, path in enumerate(paths):
        groups.setdefault((group_label(path), tuple(shapes[i])), []).append(i)
    rows: list[list[Any]] = []
    for (label, shape), members in groups.items():
        texts = {_spec(specs[i]) for i in members}
        if len(members) > 1 and len(texts) == 1:
            rows.append(
                [Raw(f"<code>{esc(label)}</code>"), _shape(shape), texts.pop(), f"×{len(members)}"]
            )
        else:
            rows.extend(
                [
                    Raw(f"<code>{esc(path_label(paths[i]))}</code>"),
                    _shape(shape),
                    _spec(specs[i]),
                    "",
                ]
                for i in members
            )
    return rows


def plan_html(plan: Any) -> str:
    cost = plan.cost
    summary = _summary(
        [
            ("method", esc(plan.method)),
            ("mesh", esc(mesh_text(plan.mesh_shape))),
            (
                "predicted step",
                f"<b>{fmt_time(cost.time)}</b> (compute {fmt_time(cost.compute_time)}, "
                f"{cost.comm_words(fmt_time, 'communication')})",
            ),
            (
                "communication",
                f"{fmt_bytes(cost.total_comm_bytes)} per device: {_kinds(cost.comm_bytes)}",
            ),
            (
                "memory per device",
                f"{fmt_bytes(cost.memory.peak)} peak (parameters "
                f"{fmt_bytes(cost.memory.parameters)}, activations "
                f"{fmt_bytes(cost.memory.activations)})",
            ),
            ("optimality", esc(plan.optimality())),
            ("search", f"{plan.search_time:.2f} s"),
            ("priced by", esc(describe_profile(cost.device))),
        ]
    )
    inputs = layer_rows(plan.input_paths, plan.input_shapes, plan.input_specs)
    sharded = sum(1 for s in plan.input_specs if any(s))
    parts = [
        summary,
        f"<details class='sl-inputs'><summary>inputs by layer: {len(plan.input_paths)} leaves, "
        f"{sharded} sharded</summary>"
        + table(["input", "shape", "spec", "layers"], inputs, left=3)
        + "</details>",
    ]
    decisions = plan.table(limit=40)
    if decisions.rows:
        what = (
            f"decisions: {len(plan.rows)} operations, most expensive first"
            if plan.rows
            else f"{plan.method}: its collectives and layouts (a fixed strategy, no search)"
        )
        rows = "".join(
            "<tr>" + "".join(decisions.cell_html(i, c) for i, c in enumerate(r)) + "</tr>"
            for r in decisions.rows
        )
        head = "".join(f"<th style='text-align:left'>{esc(h)}</th>" for h in decisions.headers)
        parts.append(
            f"<details class='sl-decisions'><summary>{esc(what)}</summary>"
            f"<table><tr>{head}</tr>{rows}</table>"
            + (
                f"<div class='sl-note'>… {decisions.omitted} more</div>"
                if decisions.omitted
                else ""
            )
            + "</details>"
        )
    if plan.constraints or plan.operand_constraints:
        parts.append(
            f"<div class='sl-note'>{len(plan.constraints)} constraints inside the function "
            f"and {len(plan.operand_constraints)} reshards before operations (plan.jit() "
            "applies them; plan.to_code() lists them by source line)</div>"
        )
    parts += [f"<div class='sl-note'>note: {esc(n)}</div>" for n in plan.notes]
    return panel("sl-plan", "".join(parts), title="Plan")


def report_html(report: Report) -> str:
    memory = report.memory
    summary = _summary(
        [
            ("mesh", esc(mesh_text(report.mesh_shape))),
            (
                "communication",
                f"{plural(len(report.collectives), 'collective')}, {fmt_bytes(report.total_comm_bytes)} "
                f"per device on the wire: {_kinds(report.comm_bytes)}",
            ),
            (
                "memory per device",
                f"<b>{fmt_bytes(memory.total)}</b> (arguments {fmt_bytes(memory.argument)}, "
                f"outputs {fmt_bytes(memory.output)}, aliased {fmt_bytes(memory.alias)}, "
                f"temporaries {fmt_bytes(memory.temp)})",
            ),
            ("compute", f"{human_flops(report.flops)} per device"),
        ]
    )
    by_source: dict[tuple[str, str, tuple[str, ...]], list[float]] = {}
    for c in report.collectives:
        key = (source_label(c.source), c.kind, c.mesh_axes)
        entry = by_source.setdefault(key, [0, 0.0])
        entry[0] += c.count
        entry[1] += c.wire_bytes * c.count
    rows = [
        [src, kind, "+".join(axes) or "-", int(n), fmt_bytes(b)]
        for (src, kind, axes), (n, b) in sorted(by_source.items(), key=lambda kv: -kv[1][1])
    ]
    body = summary
    if rows:
        body += (
            "<details class='sl-collectives'><summary>collectives by source line</summary>"
            + table(["source", "kind", "axes", "times", "wire bytes"], rows, left=3)
            + "</details>"
        )
    return panel("sl-report", body, title="Report (compiled)")


def cost_html(cost: CostBreakdown) -> str:
    memory = cost.memory
    summary = _summary(
        [
            (
                "predicted step",
                f"<b>{fmt_time(cost.time)}</b> (compute {fmt_time(cost.compute_time)}, "
                f"{cost.comm_words(fmt_time, 'communication')})",
            ),
            (
                "communication",
                f"{fmt_bytes(cost.total_comm_bytes)} per device: {_kinds(cost.comm_bytes)}",
            ),
            (
                "memory per device",
                f"<b>{fmt_bytes(memory.peak)}</b> peak (parameters {fmt_bytes(memory.parameters)},"
                f" outputs {fmt_bytes(memory.outputs)}, activations {fmt_bytes(memory.activations)})",
            ),
            ("priced by", esc(describe_profile(cost.device))),
        ]
    )
    rows = [
        [
            "+".join([axis]) if axis else "-",
            fmt_bytes(b),
            fmt_time(cost.comm_time_per_axis.get(axis, 0.0)),
        ]
        for axis, b in cost.comm_bytes_per_axis.items()
    ]
    body = summary
    if rows:
        body += (
            "<details class='sl-axes'><summary>communication per mesh axis</summary>"
            + table(["axes", "wire bytes", "time"], rows)
            + "</details>"
        )
    body += "".join(f"<div class='sl-note'>warning: {esc(w)}</div>" for w in cost.warnings)
    return panel("sl-cost", body, title="CostBreakdown (predicted)")


register_view("html:plan", plan_html)
register_view("html:report", report_html)
register_view("html:cost", cost_html)
