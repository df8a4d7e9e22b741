"""The communication graph: which collectives a program contains, and which line caused each.

``shardlab.commgraph(fn, *args, mesh=m, in_shardings=...)`` compiles the program
(``shardlab.analyze``) and asks the cost model (``shardlab.predict``), then draws:
a strip of the collectives in program order (height ∝ bytes, colour = kind, hover = source
line and jaxpr op), a summary per kind and mesh axis with predicted and actual side by side,
and the collectives grouped by source line with repeats collapsed (a 12-layer model whose
layers come from one loop shows each line once, ×12).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from shardlab._core.units import human_time
from shardlab._core.views import register_view
from shardlab.parallel.display import plural
from shardlab.parallel.plan.plan import Plan
from shardlab.parallel.records import COLLECTIVE_KINDS, Collective, CostBreakdown, Report
from shardlab.parallel.targets.target import placement_note
from shardlab.widgets._base.html import (
    KIND_COLORS,
    Raw,
    View,
    error_html,
    esc,
    fmt_bytes,
    panel,
    source_label,
    table,
)

MAX_STRIP = 600  # collectives drawn one by one; beyond this the strip is summarised


def _axes(c: Collective) -> str:
    return "+".join(c.mesh_axes) or "—"


def _scope(op_name: str) -> str:
    """The user-meaningful part of a jaxpr op name: named scopes, transforms unwrapped.

    ``jit(step)/transpose(jvp(layer1))/dot_general`` → ``layer1/dot_general (backward)``;
    combined collectives list their distinct scopes.
    """
    names = []
    backward = "transpose(" in op_name
    for piece in re.split(r"[/:()]+", op_name):
        if not piece or piece in ("jit", "pjit", "jvp", "transpose", "vmap", "remat"):
            continue
        if piece in names:
            continue
        names.append(piece)
    # drop the outer function name (first piece after jit) when more follow
    if len(names) > 2 and op_name.startswith(("jit(", "pjit(")):
        names = names[1:]
    text = "/".join(names)
    return text + (" (backward)" if backward else "")


def _summary(collectives: Sequence[Collective]) -> dict[tuple[str, str], list[float]]:
    out: dict[tuple[str, str], list[float]] = {}
    for c in collectives:
        row = out.setdefault((c.kind, _axes(c)), [0, 0.0, 0.0])
        row[0] += c.count
        row[1] += c.bytes * c.count
        row[2] += c.wire_bytes * c.count
    return out


def _grouped(collectives: Sequence[Collective]) -> list[tuple[Collective, int]]:
    """Collectives with the same source line, kind, size and axes collapsed, in first order."""
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for c in collectives:
        key = (c.source, c.kind, c.bytes, c.mesh_axes)
        if key in groups:
            groups[key][1] += c.count
        else:
            groups[key] = [c, c.count]
    return [(c, n) for c, n in groups.values()]


class CommGraphView(View):
    """Predicted (cost model) and actual (compiled HLO) communication of one program."""

    def __init__(
        self,
        actual: Report | None,
        predicted: CostBreakdown | None,
        *,
        title: str = "communication",
        notes: Sequence[str] = (),
    ) -> None:
        self.actual = actual
        self.predicted = predicted
        self.title = title
        self.notes = tuple(notes)

    # -- text ---------------------------------------------------------------------------
    def text(self) -> str:
        lines = [self.title]
        for label, record in (("predicted", self.predicted), ("actual", self.actual)):
            if record is None:
                continue
            total = sum(c.wire_bytes * c.count for c in record.collectives)
            lines.append(
                f"{label}: {plural(len(record.collectives), 'collective')}, {total:,.0f} wire bytes"
            )
            for (kind, axes), (count, nbytes, wire) in sorted(_summary(record.collectives).items()):
                lines.append(
                    f"  {kind:<18} over {axes:<12} ×{count:<4.0f} {nbytes:>12,.0f} B "
                    f"({wire:,.0f} on the wire)"
                )
        if self.actual is not None:
            lines.append("by source line (actual):")
            for c, n in _grouped(self.actual.collectives)[:40]:
                lines.append(
                    f"  {source_label(c.source)}: {c.kind} {c.bytes:,} B over {_axes(c)} ×{n} "
                    f"[{_scope(c.op_name)}]"
                )
        lines.extend(self.notes)
        return "\n".join(lines)

    # -- html ---------------------------------------------------------------------------
    def _strip(self, collectives: Sequence[Collective], label: str) -> str:
        if not collectives:
            return f"<div class='sl-note'>{esc(label)}: no collectives</div>"
        if len(collectives) > MAX_STRIP:
            return (
                f"<div class='sl-note sl-summary'>{esc(label)}: {plural(len(collectives), 'collective')}, "
                f"more than the {MAX_STRIP} the strip draws one by one; see the tables.</div>"
            )
        peak = max(c.bytes for c in collectives) or 1
        width = max(4, min(14, 900 // len(collectives)))
        height = 60
        bars = []
        for i, c in enumerate(collectives):
            h = max(3, height * math.log1p(c.bytes) / math.log1p(peak))
            title = (
                f"{c.kind} over {_axes(c)}: {c.bytes:,} B per device ({c.wire_bytes:,.0f} on "
                f"the wire), group {c.group_size}\nsource: {source_label(c.source)}\nop: {c.op_name}"
            )
            bars.append(
                f"<g class='sl-collective' data-kind='{esc(c.kind)}'><title>{esc(title)}</title>"
                f"<rect x='{i * width}' y='{height - h:.1f}' width='{width - 1}' height='{h:.1f}'"
                f" fill='{KIND_COLORS.get(c.kind, '#888')}'/></g>"
            )
        return (
            f"<div>{esc(label)}</div><svg class='sl-strip' style='display:block' "
            f"width='{len(collectives) * width}' height='{height}'>{''.join(bars)}</svg>"
        )

    def html(self) -> str:
        parts = []
        legend = " ".join(
            f"<span style='color:{KIND_COLORS[k]}'>■</span> {esc(k)}" for k in COLLECTIVE_KINDS
        )
        parts.append(f"<div class='sl-legend'>{legend}</div>")
        if self.actual is not None:
            parts.append(self._strip(self.actual.collectives, "compiled program, in order"))
        keys = set()
        sums = {}
        for label, record in (("predicted", self.predicted), ("actual", self.actual)):
            if record is not None:
                sums[label] = _summary(record.collectives)
                keys |= set(sums[label])
        rows = []
        for kind, axes in sorted(keys):
            p = sums.get("predicted", {}).get((kind, axes))
            a = sums.get("actual", {}).get((kind, axes))
            ratio = f"{p[2] / a[2]:.3f}" if p and a and a[2] else "—"
            rows.append(
                [
                    Raw(
                        f"<span style='color:{KIND_COLORS.get(kind, '#888')}'>■</span> {esc(kind)}"
                    ),
                    axes,
                    f"{p[0]:.0f}" if p else "—",
                    fmt_bytes(p[2]) if p else "—",
                    f"{a[0]:.0f}" if a else "—",
                    fmt_bytes(a[2]) if a else "—",
                    ratio,
                ]
            )
        parts.append(
            "<b>per kind and mesh axis</b> (bytes per device on the wire)"
            + table(
                ["kind", "axes", "predicted #", "predicted", "actual #", "actual", "ratio"],
                rows,
                left=2,
                cls="sl-summary-table",
            )
        )
        if self.actual is not None and self.actual.collectives:
            group_rows = [
                [
                    source_label(c.source),
                    _scope(c.op_name) or c.op_name.split("/")[-1] or "?",
                    Raw(
                        f"<span style='color:{KIND_COLORS.get(c.kind, '#888')}'>■</span> "
                        f"{esc(c.kind)}"
                    ),
                    _axes(c),
                    fmt_bytes(c.bytes),
                    f"×{n}",
                ]
                for c, n in _grouped(self.actual.collectives)
            ]
            parts.append(
                "<b>by source line</b> (repeats collapsed)"
                + table(["source", "scope", "kind", "axes", "bytes", "times"], group_rows, left=4)
            )
        if self.actual is not None:
            m = self.actual.memory
            parts.append(
                f"<div>compiled memory per device: arguments {fmt_bytes(m.argument)}, output "
                f"{fmt_bytes(m.output)}, temp {fmt_bytes(m.temp)}, total {fmt_bytes(m.total)}"
                "</div>"
            )
        if self.predicted is not None:
            parts.append(
                f"<div>predicted step {human_time(self.predicted.time)}: compute "
                f"{human_time(self.predicted.compute_time)} + "
                f"{esc(self.predicted.comm_words(human_time, 'communication'))} "
                f"({esc(self.predicted.device)})</div>"
            )
        parts.extend(f"<div class='sl-note'>{esc(n)}</div>" for n in self.notes)
        return panel("sl-commgraph", "".join(parts), title=self.title)


def commgraph(
    fn: Callable[..., Any],
    *args: Any,
    mesh: Any,
    in_shardings: Any = None,
    out_shardings: Any = None,
    predict: bool = True,
    device: Any = None,
) -> View:
    """The collectives of ``fn`` compiled with these shardings, and what the model predicted.

    A bad spec shows as an error in the view (naming argument, dimension and sizes).
    """
    from shardlab.parallel.compiled.analyze import analyze
    from shardlab.parallel.cost.predict import predict as predict_cost
    from shardlab.parallel.specs import ShardingSpecError

    notes = []
    try:
        actual = analyze(
            fn, *args, mesh=mesh, in_shardings=in_shardings, out_shardings=out_shardings
        )
    except ShardingSpecError as error:
        return _Error(str(error))
    predicted = None
    if predict:
        try:
            predicted = predict_cost(
                fn,
                *args,
                mesh=mesh,
                in_shardings=in_shardings,
                out_shardings=out_shardings,
                device=device,
            )
            notes.extend(predicted.warnings)
        except Exception as error:  # the compiled figures still stand on their own
            notes.append(f"no prediction: {type(error).__name__}: {error}")
    placed = placement_note(mesh, collectives=True)
    return CommGraphView(actual, predicted, notes=[*notes, placed] if placed else notes)


def plan_view(plan: Plan) -> CommGraphView:
    """``plan.show()``: the plan's predicted cost beside its compiled program."""
    notes = [*plan.notes]
    try:
        actual = plan.verify()
    except Exception as error:  # the prediction still stands on its own
        actual = None
        notes.append(f"not compiled: {type(error).__name__}: {error}")
    placed = placement_note(plan.mesh, collectives=True)
    if placed:
        notes.append(placed)
    return CommGraphView(actual, plan.cost, title=f"plan ({plan.method})", notes=notes)


register_view("plan", plan_view)


class _Error(View):
    def __init__(self, message: str) -> None:
        self.message = message

    def html(self) -> str:
        return error_html("sl-commgraph", self.message)

    def text(self) -> str:
        return self.message
