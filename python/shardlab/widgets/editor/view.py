"""The strategy editor's figures: predicted beside compiled, in human units, compact.

The view is pinned above the controls. One table puts the predicted and compiled figures
side by side (step time, communication per kind with its colour, memory per device), a line
says what the last edit changed, and the strategy itself (grouped by layer) and XLA's
compiler messages sit in collapsed sections, so the figures stay one short block. With
pipeline stages, the simulated schedule (one lane per stage, the bubble labelled) follows the
figures.
"""

from __future__ import annotations

from jax.sharding import PartitionSpec

from shardlab.parallel.cost.profiles import comm_time, describe_profile
from shardlab.parallel.display import plural
from shardlab.parallel.labels import spec_label
from shardlab.parallel.records import COLLECTIVE_KINDS
from shardlab.parallel.specs import make_spec
from shardlab.widgets._base.html import (
    KIND_COLORS,
    Raw,
    View,
    esc,
    fmt_bytes,
    fmt_time,
    panel,
    table,
)
from shardlab.widgets.editor.model import CompileResult, Evaluation
from shardlab.widgets.timeline.pipeline import schedule_html, summary_lines

# What the controls do, as code: the static form (a saved or exported notebook, a front end
# without a widget manager) says it where the dropdowns and buttons would be.
ACTIONS = (
    "dropdowns: .edit(label, dim, axes) (a layer group's row: .edit_group(group, dim, axes)) · "
    "pipeline: .set_pipeline(stages, microbatches, schedule) · remat: .set_remat(policy, group) · "
    "Auto: shardlab.search(...) then .apply(plan) · Reset: .reset() · Export code: .export()"
)
MAX_STRATEGY_ROWS = 24  # sharded leaves (groups) listed one by one
OPEN_STRATEGY_ROWS = 6  # a list this short is shown open, beside the figures
# The background compile's bar, once it has run past the progress delay: indeterminate (an
# XLA compile reports no fraction), moving by CSS alone; the figures replace it when done.
INDETERMINATE = (
    "<style>@keyframes sl-indeterminate{from{left:-40%}to{left:100%}}</style>"
    "<span class='sl-progress-indeterminate' role='progressbar' aria-label='compiling' "
    "style='display:inline-block;position:relative;overflow:hidden;width:120px;height:8px;"
    "margin-right:8px;border-radius:4px;background:#e0e0e0;vertical-align:middle'>"
    "<span style='position:absolute;top:0;left:-40%;width:40%;height:100%;border-radius:4px;"
    "background:#0072B2;animation:sl-indeterminate 1.2s ease-in-out infinite'></span></span>"
)


def spec_text(spec: PartitionSpec) -> str:
    return spec_label(spec)


def _is_sharded(spec: PartitionSpec) -> bool:
    return any(e is not None and e != () for e in tuple(spec))


class EditorView(View):
    """The editor's figures: a record view of the current evaluation and compile.

    Args:
        labels: per input leaf, its label (``Plan.input_labels``), in the order of
            ``evaluation.specs``; ``groups``: per leaf, its layer group's label.
        source: ``"plan ilp"`` when the figures are an applied plan's own, else "".
    """

    def __init__(
        self,
        evaluation: Evaluation | None,
        *,
        changes: list[str],
        compiled: CompileResult | None,
        compiling: bool,
        error: str | None,
        code: str | None = None,
        status: str = "",
        labels: tuple[str, ...] = (),
        groups: tuple[str, ...] = (),
        source: str = "",
        compile_elapsed: float | None = None,
        stages: tuple[str, ...] = (),
    ) -> None:
        self.evaluation = evaluation
        self.labels = labels
        self.groups = groups or labels
        self.changes = changes
        self.compiled = compiled
        self.compiling = compiling
        self.compile_elapsed = compile_elapsed
        self.error = error
        self.code = code
        self.status = status
        self.source = source
        self.stages = stages

    # -- pieces ----------------------------------------------------------------------------
    def _compile_line(self) -> str:
        if self.compiling:
            if self.compile_elapsed is not None:  # past the progress bar's delay
                return f"compiling in the background… {self.compile_elapsed:.0f} s"
            return "compiling in the background…"
        if self.compiled is None:
            return "not compiled"
        if self.compiled.error:
            return f"compile failed: {self.compiled.error}"
        report = self.compiled.report
        assert report is not None
        what = "verify()" if self.source else "compiled"
        return (
            f"{what} in {self.compiled.seconds:.2f} s: {plural(len(report.collectives), 'collective')}, "
            f"{fmt_bytes(report.total_comm_bytes)} on the wire, memory "
            f"{fmt_bytes(report.memory.total)} per device"
        )

    def _compiled_report(self):  # type: ignore[no-untyped-def]
        if self.compiling or self.compiled is None or self.compiled.error:
            return None
        return self.compiled.report

    def strategy(self) -> tuple[list[tuple[str, str, int]], int]:
        """(label, spec, how many leaves) of the sharded leaves, layer groups whose members
        share a spec folded into one row (``params["blocks"][*]["w1"]`` ×4); and how many
        leaves are replicated."""
        if self.evaluation is None or not self.labels:
            return [], 0
        by_group: dict[str, list[tuple[str, str]]] = {}
        replicated = 0
        plan = self.evaluation.plan  # with stages: the layers split over the stage axis
        specs = (
            [make_spec(layout) for layout in plan.input_specs]
            if plan is not None
            else self.evaluation.specs
        )
        for label, group, spec in zip(self.labels, self.groups, specs, strict=False):
            if _is_sharded(spec):
                by_group.setdefault(group, []).append((label, spec_text(spec)))
            else:
                replicated += 1
        rows: list[tuple[str, str, int]] = []
        for group, members in by_group.items():
            specs = {s for _, s in members}
            if len(members) > 1 and len(specs) == 1:
                rows.append((group, members[0][1], len(members)))
            else:
                rows.extend((label, s, 1) for label, s in members)
        return rows, replicated

    # -- text ------------------------------------------------------------------------------
    def text(self) -> str:
        lines = []
        if self.error:
            lines.append(f"invalid choice (last valid strategy kept): {self.error}")
        if self.evaluation is not None:
            cost = self.evaluation.cost
            origin = f" ({self.source}: its own figures)" if self.source else ""
            lines.append(
                f"strategy #{self.evaluation.generation}{origin}: predicted step "
                f"{fmt_time(cost.time)} (compute {fmt_time(cost.compute_time)}, "
                f"{cost.comm_words(fmt_time)}), memory {fmt_bytes(cost.memory.peak)} per device"
            )
            lines.append(f"  priced by the {describe_profile(cost.device)}")
            report = self._compiled_report()
            for kind in COLLECTIVE_KINDS:
                value = cost.comm_bytes.get(kind, 0)
                actual = report.comm_bytes.get(kind, 0) if report is not None else None
                if value or actual:
                    compiled = f" (compiled {fmt_bytes(actual)})" if actual is not None else ""
                    lines.append(f"  {kind}: {fmt_bytes(value)}{compiled}")
            lines.extend("  " + line for line in self.stages)
            if self.evaluation.pipeline is not None:
                lines.extend("  " + line for line in summary_lines(self.evaluation.pipeline))
            lines.extend("  changed: " + c for c in self.changes)
            sharded, replicated = self.strategy()
            if sharded or replicated:
                n = sum(k for _, _, k in sharded)
                lines.append(f"  strategy: {n} leaves sharded, {replicated} replicated")
                lines.extend(
                    f"    {label}: {spec}" + (f" ×{k}" if k > 1 else "")
                    for label, spec, k in sharded[:MAX_STRATEGY_ROWS]
                )
        lines.append(self._compile_line())
        if self.compiled is not None and self.compiled.messages.strip():
            lines.append("compiler messages:\n" + self.compiled.messages.rstrip())
        if self.status:
            lines.append(self.status)
        if self.code:
            lines.append(self.code)
        return "\n".join(lines)

    # -- HTML ------------------------------------------------------------------------------
    def _figures_table(self) -> str:
        assert self.evaluation is not None
        cost = self.evaluation.cost
        report = self._compiled_report()
        pending = "…" if self.compiling else "—"

        def compiled(value: float | None, fmt) -> str:  # type: ignore[no-untyped-def]
            return pending if value is None else fmt(value)

        peak = max([cost.total_comm_bytes, report.total_comm_bytes if report else 0.0, 1.0])
        rows: list[list[object]] = [
            [
                "step time (cost model)",
                fmt_time(cost.time),
                compiled(
                    cost.compute_time
                    + comm_time(report.collectives, cost.device) * cost.exposed_share
                    if report
                    else None,
                    fmt_time,
                ),
            ],
            [
                "memory per device",
                fmt_bytes(cost.memory.peak),
                compiled(report.memory.total if report else None, fmt_bytes),
            ],
            [
                "communication per device",
                fmt_bytes(cost.total_comm_bytes),
                compiled(report.total_comm_bytes if report else None, fmt_bytes),
            ],
        ]
        for kind in COLLECTIVE_KINDS:
            value = cost.comm_bytes.get(kind, 0)
            actual = report.comm_bytes.get(kind, 0) if report is not None else None
            if not value and not actual:
                continue
            width = max(2, int(80 * max(value, actual or 0) / peak))
            swatch = (
                f"<span style='display:inline-block;width:{width}px;height:8px;"
                f"background:{KIND_COLORS[kind]};margin-right:4px'></span>"
            )
            rows.append(
                [Raw(f"{swatch}{esc(kind)}"), fmt_bytes(value), compiled(actual, fmt_bytes)]
            )
        return table(["", "predicted", "compiled"], rows, cls="sl-figures")

    def _strategy_html(self) -> str:
        sharded, replicated = self.strategy()
        if not (sharded or replicated):
            return ""
        n = sum(k for _, _, k in sharded)
        rows = [
            [Raw(f"<code>{esc(label)}</code>"), Raw(f"<code>{esc(spec)}</code>"), f"×{k}"]
            for label, spec, k in sharded[:MAX_STRATEGY_ROWS]
        ]
        more = len(sharded) - MAX_STRATEGY_ROWS
        opened = " open" if len(rows) <= OPEN_STRATEGY_ROWS else ""  # short: beside the table
        return (
            f"<details class='sl-strategy'{opened}><summary>strategy: {n} leaves sharded, "
            f"{replicated} replicated <code>P()</code></summary>"
            + (table(["leaf", "spec", "leaves"], rows, left=2) if rows else "")
            + (f"<div class='sl-note'>{more} more sharded rows</div>" if more > 0 else "")
            + "</details>"
        )

    def html(self) -> str:
        parts = []
        if self.error:
            parts.append(
                f"<div class='sl-error sl-edit-error'>invalid choice (last valid strategy kept):"
                f" {esc(self.error)}</div>"
            )
        if self.evaluation is not None:
            cost = self.evaluation.cost
            origin = f" — {esc(self.source)}: its own predicted figures" if self.source else ""
            timing = (
                f"; predicted in {self.evaluation.seconds * 1e3:.0f} ms" if not self.source else ""
            )
            parts.append(
                f"<div class='sl-time'>strategy #{self.evaluation.generation}{origin}: "
                f"predicted step <b>{fmt_time(cost.time)}</b> (compute "
                f"{fmt_time(cost.compute_time)}, {cost.comm_words(fmt_time, 'communication')}"
                f"{timing})</div>"
                f"<div class='sl-note sl-priced-by'>priced by the "
                f"{esc(describe_profile(cost.device))}</div>"
            )
            parts.append(
                "<div style='display:flex;gap:16px;align-items:flex-start'>"
                # the table keeps its width (a long 'changed' line wraps beside it instead)
                + f"<div style='flex:0 0 auto'>{self._figures_table()}</div>"
                + "<div class='sl-side' style='flex:1 1 0;min-width:200px'>"
                + (
                    "<div class='sl-diff'><b>changed:</b> "
                    + "; ".join(esc(c) for c in self.changes)
                    + "</div>"
                    if self.changes
                    else ""
                )
                + self._strategy_html()
                + "</div></div>"
            )
            if self.stages:
                parts.append(
                    "<div class='sl-stages'>" + " · ".join(esc(t) for t in self.stages) + "</div>"
                )
            if self.evaluation.pipeline is not None:
                parts.append(
                    "<details open class='sl-editor-schedule'><summary>pipeline schedule "
                    "(cost model, one lane per stage)</summary>"
                    f"{schedule_html(self.evaluation.pipeline)}</details>"
                )
        if self.compiling and self.compile_elapsed is not None:
            parts.append(
                f"<div class='sl-compile sl-compiling'>{INDETERMINATE}"
                f"{esc(self._compile_line())}</div>"
            )
        else:
            parts.append(f"<div class='sl-compile'>{esc(self._compile_line())}</div>")
        if self.compiled is not None and self.compiled.messages.strip():
            lines = self.compiled.messages.strip().splitlines()
            parts.append(
                f"<details class='sl-compiler-messages'><summary>compiler messages "
                f"({len(lines)} lines, from this editor's compile)</summary>"
                f"<pre style='white-space:pre-wrap'>{esc(self.compiled.messages)}</pre></details>"
            )
        if self.labels:  # the live editor's view: say what its controls do, as code
            parts.append(f"<div class='sl-actions sl-note'>{esc(ACTIONS)}</div>")
        if self.status:
            parts.append(f"<div class='sl-status'>{esc(self.status)}</div>")
        if self.code:
            parts.append(
                "<details open class='sl-export'><summary>exported code</summary>"
                f"<pre class='sl-code'>{esc(self.code)}</pre></details>"
            )
        return panel("sl-editor", "".join(parts), title="strategy editor")
