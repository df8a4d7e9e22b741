"""``shardlab.explore``: every strategy the search priced, as step time against memory.

Each point is one plan (``explore_candidates``): the search's plan per method, each
baseline, and plans searched under a sweep of memory budgets, at its predicted step time and
per-device memory. The Pareto front (no other plan is both faster and smaller) is drawn as a
line. Hover gives a strategy's summary; a click shows its decision table and its code below
the plot (in the page itself, so a saved or exported notebook does it too). With
``editor=`` an open strategy editor gets an "Apply to editor" control, since a click in the
plot stays in the browser.
"""

# bokeh's type annotations are stricter than its documented API (Range1d(start, end), a
# figure's title and ranges, renderer lists): pyright checks these calls against them.
# pyright: reportArgumentType=false, reportAttributeAccessIssue=false
# pyright: reportOptionalMemberAccess=false

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from shardlab._core.units import byte_unit, time_unit
from shardlab.parallel.plan.plan import Plan
from shardlab.parallel.specs import make_spec
from shardlab.widgets._base.bokeh import BokehView
from shardlab.widgets._base.html import View, esc, fmt_bytes, fmt_time, panel, table
from shardlab.widgets.explore.candidates import (
    BUDGETS,
    METHODS,
    Candidate,
    Collected,
    collect,
    pareto_front,
)

ORIGIN_COLORS = {"method": "#0072B2", "baseline": "#E69F00", "budget": "#009E73", "plan": "#CC79A7"}
ORIGIN_NAMES = {
    "method": "search (per method)",
    "baseline": "baseline",
    "budget": "search within a memory budget",
    "plan": "this plan",
}
SVG_W, SVG_H, PAD = 560, 300, 50
SUMMARY_SPECS = 4
HOVER_SPECS = 1  # a tooltip does not wrap: the details below the plot list more
SCROLL = "max-height:320px;max-width:100%;overflow:auto;margin:2px 0"


def summary(c: Candidate, *, specs: int = SUMMARY_SPECS) -> str:
    """One line about a candidate's strategy: how it was found, its figures, its inputs."""
    text = (
        f"{c.name}: {fmt_time(c.time)} per step, {fmt_bytes(c.memory)} per device, "
        f"{fmt_bytes(c.comm_bytes)} on the wire"
    )
    if c.also:
        text += f"; also found by {', '.join(c.also)}"
    plan = c.plan
    if plan is not None:
        labels = getattr(plan, "input_labels", plan.input_paths)
        sharded = [
            f"{label} {make_spec(spec)}"
            for label, spec in zip(labels, plan.input_specs, strict=False)
            if any(spec)
        ]
        more = f" (+{len(sharded) - specs} more)" if len(sharded) > specs else ""
        text += "; inputs: " + ("; ".join(sharded[:specs]) + more if sharded else "all replicated")
    return text


def details_html(c: Candidate) -> str:
    """What a click shows: the summary, the decision table and the plan's code."""
    plan = c.plan
    body = f"<div><b>{esc(c.name)}</b></div><div>{esc(summary(c))}</div>"
    if plan is not None:
        decisions = plan.table()
        rich = getattr(decisions, "_repr_html_", None)
        table_html = rich() if callable(rich) else f"<pre>{esc(str(decisions))}</pre>"
        body += (
            f"<details open><summary>decisions</summary><div class='sl-plan-table' "
            f"style='{SCROLL}'>{table_html}</div></details>"
            f"<details><summary>code</summary><pre class='sl-plan-code' style='{SCROLL}'>"
            f"{esc(str(plan.to_code()))}</pre></details>"
        )
    return body


class ExplorerSVG(View):
    """The static form: the same scatter in SVG, and the table of candidates."""

    def __init__(self, candidates: Sequence[Candidate], notes: Sequence[str] = ()) -> None:
        self.candidates = tuple(candidates)
        self.notes = tuple(notes)
        self.front = pareto_front([(c.memory, c.time) for c in self.candidates])

    def text(self) -> str:
        lines = [f"{len(self.candidates)} strategies priced (time per step, memory per device):"]
        for i, c in sorted(enumerate(self.candidates), key=lambda ic: ic[1].time):
            mark = "*" if i in self.front else " "
            lines.append(f" {mark} {summary(c)}")
        lines.append(" * on the Pareto front (no other plan is both faster and smaller)")
        lines.extend(self.notes)
        return "\n".join(lines)

    def _svg(self) -> str:
        if not self.candidates:
            return ""
        xs = [c.memory for c in self.candidates]
        ys = [c.time for c in self.candidates]
        x0, x1 = 0.0, max(xs) * 1.08 or 1.0
        y0, y1 = 0.0, max(ys) * 1.08 or 1.0

        def at(x: float, y: float) -> tuple[float, float]:
            return (
                PAD + (x - x0) / (x1 - x0) * (SVG_W - PAD - 10),
                SVG_H - PAD + 10 - (y - y0) / (y1 - y0) * (SVG_H - PAD),
            )

        front = sorted(self.front, key=lambda i: xs[i])
        path = " ".join(
            f"{'M' if k == 0 else 'L'}{at(xs[i], ys[i])[0]:.1f},{at(xs[i], ys[i])[1]:.1f}"
            for k, i in enumerate(front)
        )
        dots = []
        for i, c in enumerate(self.candidates):
            x, y = at(c.memory, c.time)
            dots.append(
                f"<g class='sl-candidate'><title>{esc(summary(c))}</title><circle cx='{x:.1f}' "
                f"cy='{y:.1f}' r='6' fill='{ORIGIN_COLORS.get(c.origin, '#888')}' "
                f"stroke='{'#222' if i in self.front else 'none'}' stroke-width='1.5'/></g>"
            )
        axes = (
            f"<text x='{SVG_W / 2}' y='{SVG_H - 4}' text-anchor='middle' font-size='11'>memory "
            f"per device (0 – {fmt_bytes(x1)})</text><text x='12' y='{SVG_H / 2}' font-size='11' "
            f"transform='rotate(-90 12 {SVG_H / 2})' text-anchor='middle'>time per step (0 – "
            f"{fmt_time(y1)})</text><line x1='{PAD}' y1='{SVG_H - PAD + 10}' x2='{SVG_W - 10}' "
            f"y2='{SVG_H - PAD + 10}' stroke='#888'/><line x1='{PAD}' y1='10' x2='{PAD}' "
            f"y2='{SVG_H - PAD + 10}' stroke='#888'/>"
        )
        return (
            f"<svg class='sl-explorer-svg' width='{SVG_W}' height='{SVG_H}'>{axes}"
            f"<path d='{path}' fill='none' stroke='#222' stroke-dasharray='4 3'/>{''.join(dots)}</svg>"
        )

    def table_html(self) -> str:
        rows = [
            [
                c.name,
                fmt_time(c.time),
                fmt_bytes(c.memory),
                fmt_bytes(c.comm_bytes),
                "✓" if i in self.front else "",
            ]
            for i, c in sorted(enumerate(self.candidates), key=lambda ic: ic[1].time)
        ]
        return table(["strategy", "time / step", "memory / device", "wire bytes", "Pareto"], rows)

    def html(self) -> str:
        legend = " ".join(
            f"<span style='color:{ORIGIN_COLORS[o]}'>●</span> {esc(n)}"
            for o, n in ORIGIN_NAMES.items()
        )
        notes = "".join(f"<div class='sl-note'>{esc(n)}</div>" for n in self.notes)
        return panel(
            "sl-explorer",
            f"{self._svg()}<div class='sl-note'>{legend}; dashed line: the Pareto front</div>"
            f"{self.table_html()}{notes}",
            title="plan explorer: time per step against memory per device",
        )


class ExplorerView(BokehView):
    """The candidates as an interactive scatter over ``ExplorerSVG``."""

    view_class = "sl-bokeh-explorer"

    def __init__(self, collected: Collected) -> None:
        self.collected = collected
        self.candidates = tuple(collected.candidates)
        self.svg = ExplorerSVG(self.candidates, collected.notes)
        self.details_id = ""

    def fallback(self) -> View:
        return self.svg

    def text(self) -> str:
        return self.svg.text()

    def model(self) -> Any:
        import uuid

        from bokeh.models import ColumnDataSource, CustomJS, HoverTool, TapTool
        from bokeh.plotting import figure

        self.details_id = f"sl-explorer-details-{uuid.uuid4().hex[:10]}"
        cs = self.candidates
        t_unit, t_factor = time_unit(max((c.time for c in cs), default=1e-6))
        m_unit, m_factor = byte_unit(max((c.memory for c in cs), default=1))
        fig = figure(
            width=760,
            height=420,
            title="plan explorer: predicted time per step against memory per device",
            x_axis_label=f"memory per device ({m_unit})",
            y_axis_label=f"time per step ({t_unit})",
            tools="pan,wheel_zoom,box_zoom,reset,tap,save",
            active_scroll="wheel_zoom",
            toolbar_location="above",
        )
        front = sorted(self.svg.front, key=lambda i: cs[i].memory)
        fig.line(
            [cs[i].memory * m_factor for i in front],
            [cs[i].time * t_factor for i in front],
            line_dash="dashed",
            line_color="#222222",
            legend_label="Pareto front",
        )
        renderers = []
        for origin, name in ORIGIN_NAMES.items():
            mine = [(i, c) for i, c in enumerate(cs) if c.origin == origin]
            if not mine:
                continue
            source = ColumnDataSource(
                {
                    "x": [c.memory * m_factor for _, c in mine],
                    "y": [c.time * t_factor for _, c in mine],
                    "name": [c.name for _, c in mine],
                    "time": [fmt_time(c.time) for _, c in mine],
                    "memory": [fmt_bytes(c.memory) for _, c in mine],
                    "wire": [fmt_bytes(c.comm_bytes) for _, c in mine],
                    "summary": [summary(c, specs=HOVER_SPECS) for _, c in mine],
                    "pareto": ["yes" if i in front else "no" for i, _ in mine],
                    "details": [details_html(c) for _, c in mine],
                    "line": ["#222222" if i in front else ORIGIN_COLORS[origin] for i, _ in mine],
                }
            )
            glyph = fig.scatter(
                "x",
                "y",
                source=source,
                size=13,
                fill_color=ORIGIN_COLORS[origin],
                line_color="line",
                line_width=2,
                legend_label=name,
                selection_line_color="#b00020",
                nonselection_fill_alpha=0.35,
            )
            source.selected.js_on_change(
                "indices",
                CustomJS(
                    args={"source": source, "target": self.details_id},
                    code="const i = source.selected.indices[0];"
                    "const box = document.getElementById(target);"
                    "if (box && i !== undefined) { box.innerHTML = source.data.details[i]; }",
                ),
            )
            renderers.append(glyph)
        fig.add_tools(
            HoverTool(
                renderers=renderers,
                tooltips=[
                    ("strategy", "@name"),
                    ("time / step", "@time"),
                    ("memory / device", "@memory"),
                    ("wire bytes", "@wire"),
                    ("Pareto front", "@pareto"),
                    ("", "@summary"),
                ],
            )
        )
        fig.select_one(TapTool).renderers = renderers
        fig.legend.location = "top_right"
        fig.legend.label_text_font_size = "11px"
        fig.x_range.start = 0
        fig.y_range.start = 0
        return fig

    def extra_html(self) -> str:
        fastest = min(
            range(len(self.candidates)), key=lambda i: self.candidates[i].time, default=None
        )
        first = details_html(self.candidates[fastest]) if fastest is not None else ""
        notes = "".join(f"<div class='sl-note'>{esc(n)}</div>" for n in self.collected.notes)
        return (
            f"<div class='sl-note'>click a point: its decisions and code below (shown: the "
            f"fastest) · wheel: zoom · drag: pan</div>{notes}"
            f"<div class='sl-explorer-details' id='{self.details_id}'>{first}</div>"
        )

    def html(self) -> str:
        from shardlab.widgets._base.bokeh import embed_html

        model = self.model()  # sets details_id, which extra_html uses
        return embed_html(model, self.svg.html(), extra_html=self.extra_html(), cls=self.view_class)


class Explorer:
    """What ``explore`` returns: the candidates, their view, and apply-to-editor."""

    def __init__(self, collected: Collected, *, editor: Any = None) -> None:
        self.collected = collected
        self.candidates = tuple(collected.candidates)
        self.editor = editor
        self.view = ExplorerView(collected)

    @property
    def plans(self) -> dict[str, Plan]:
        return {c.name: c.plan for c in self.candidates if c.plan is not None}

    @property
    def pareto(self) -> list[Candidate]:
        return [self.candidates[i] for i in self.view.svg.front]

    def apply(self, name: str, editor: Any = None) -> None:
        """Applies the candidate ``name`` to ``editor`` (default: the one given to explore)."""
        target = editor if editor is not None else self.editor
        if target is None:
            raise ValueError("apply(name, editor): no editor given (explore(..., editor=ed))")
        plans = self.plans
        if name not in plans:
            raise ValueError(f"no candidate {name!r}; choose one of {', '.join(plans)}")
        target.apply(plans[name])

    def text(self) -> str:
        return self.view.text()

    def __repr__(self) -> str:
        return self.view.text()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return self.view._repr_mimebundle_()

    def _ipython_display_(self) -> None:
        self.view._ipython_display_()
        if self.editor is not None:
            self._apply_controls()

    def _apply_controls(self) -> None:
        import ipywidgets

        from shardlab.widgets._base.live import guarded, show_controls

        names = list(self.plans)
        choose = ipywidgets.Dropdown(options=names, description="strategy")
        button = ipywidgets.Button(description="Apply to editor", icon="check")
        status = ipywidgets.Label()

        def apply(_: Any) -> None:
            self.apply(str(choose.value))
            status.value = f"applied {choose.value}"

        button.on_click(guarded(apply, lambda message: setattr(status, "value", message)))
        text = "[strategy ▾] [Apply to editor]: explorer.apply(name) applies a candidate"
        show_controls(ipywidgets.HBox([choose, button, status]), text)


def explore(
    fn_or_plan: Any,
    *args: Any,
    mesh: Any = None,
    methods: Sequence[str] = METHODS,
    budgets: int = BUDGETS,
    device: Any = None,
    editor: Any = None,
    progress: Callable[[float, str], None] | None = None,
) -> Explorer:
    """Every strategy the search prices for ``fn(*args)`` on ``mesh``, as step time against
    per-device memory, the Pareto front drawn.

    Args:
        fn_or_plan: the function, or a ``Plan`` (its function, arguments and mesh; the plan
            itself is a point too).
        methods: the search methods to run (each one plan).
        budgets: how many memory budgets to search under, spread between the smallest and
            the largest per-device memory of the other plans.
        device: the device profile for the cost model.
        editor: an open ``shardlab.editor``: a control to apply a chosen candidate to it.
        progress: ``callback(fraction, message)``; default: a bar after about a second.
            An interrupt keeps the candidates so far, marked as not complete.
    """
    plan = fn_or_plan if isinstance(fn_or_plan, Plan) else None
    fn: Any = fn_or_plan
    if plan is not None:
        if plan.binding is None:
            raise ValueError(
                "explore(plan) needs a plan bound to its function (plan.bind(fn, *args, mesh=m))"
            )
        fn, args, mesh = plan.binding.fn, tuple(plan.binding.args), plan.mesh
    if mesh is None:
        raise ValueError("explore(fn, *args, mesh=...) needs a mesh, e.g. shardlab.mesh(data=8)")
    if progress is not None:
        collected = collect(
            fn,
            *args,
            mesh=mesh,
            methods=methods,
            budgets=budgets,
            device=device,
            plan=plan,
            progress=progress,
        )
    else:
        from shardlab.widgets._base.progress import ProgressBar

        with ProgressBar("explore") as bar:
            collected = collect(
                fn,
                *args,
                mesh=mesh,
                methods=methods,
                budgets=budgets,
                device=device,
                plan=plan,
                progress=bar,
            )
            bar.done(f"{len(collected.candidates)} strategies priced")
    return Explorer(collected, editor=editor)


def _plan_explore(self: Plan, **kwargs: Any) -> Explorer:
    """``plan.explore()``: ``shardlab.explore(plan)``."""
    return explore(self, **kwargs)


if not hasattr(Plan, "explore"):  # Plan (parallel/plan) may define it itself; until then
    Plan.explore = _plan_explore  # type: ignore[attr-defined]
