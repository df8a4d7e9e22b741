"""``shardlab.editor(fn, *args, mesh=m)``: edit a sharding strategy and see it change live.

For each input leaf, one dropdown per dimension chooses the mesh axes it is split over.
Every edit updates, within the prediction's time (no compile): communication per kind,
per-device memory, estimated step time and what changed since the previous strategy. The
compiled figures follow from a background thread; a newer edit supersedes a stale compile.
Auto runs ``shardlab.search`` with a progress bar (Stop returns the best plan so far),
Reset goes back to the initial strategy, Export code shows the PartitionSpecs.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from ..parallel.plan.plan import Plan
from ..parallel.records import COLLECTIVE_KINDS
from ..parallel.search.driver import search
from ..parallel.specs import ShardingSpecError, make_spec, spec_entries
from ._html import KIND_COLORS, Raw, View, esc, fmt_bytes, fmt_time, panel, table
from ._live import LiveDisplay, guarded, show_controls
from .editor_model import CompileResult, EditorModel, Evaluation, diff

MAX_STRATEGY_ROWS = 24  # sharded leaves the static form lists one by one
# What the controls do, as code: the static form (a saved or exported notebook, a front end
# without a widget manager) says it where the dropdowns and buttons would be.
ACTIONS = (
    "dropdowns: .edit(leaf, dim, axes) · Auto: shardlab.search(...) then .apply(plan) · "
    "Reset: .reset() · Export code: .export()"
)


class EditorView(View):
    """The editor's figures: a record view of the current evaluation and compile."""

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
    ) -> None:
        self.evaluation = evaluation
        self.labels = labels  # the input leaves' labels, in the order of evaluation.specs
        self.changes = changes
        self.compiled = compiled
        self.compiling = compiling
        self.error = error
        self.code = code
        self.status = status

    def _compile_line(self) -> str:
        if self.compiling:
            return "compiling in the background…"
        if self.compiled is None:
            return "not compiled"
        if self.compiled.error:
            return f"compile failed: {self.compiled.error}"
        report = self.compiled.report
        assert report is not None
        return (
            f"compiled in {self.compiled.seconds:.2f} s: {len(report.collectives)} collectives, "
            f"{report.total_comm_bytes:,.0f} wire bytes, memory {report.memory.total:,} B per "
            "device"
        )

    def _strategy(self) -> tuple[list[tuple[str, str]], int]:
        """(label, spec) of the sharded leaves (what their dropdowns show), and how many
        leaves are replicated."""
        if self.evaluation is None or not self.labels:
            return [], 0
        sharded = []
        for label, spec in zip(self.labels, self.evaluation.specs, strict=False):
            entries = tuple(spec)
            if any(e is not None and e != () for e in entries):
                sharded.append((label, "P(" + ", ".join(map(repr, entries)) + ")"))
        return sharded, len(self.evaluation.specs) - len(sharded)

    def text(self) -> str:
        lines = []
        if self.error:
            lines.append(f"invalid choice (last valid strategy kept): {self.error}")
        if self.evaluation is not None:
            cost = self.evaluation.cost
            lines.append(
                f"strategy #{self.evaluation.generation}: predicted step "
                f"{cost.time * 1e3:.3f} ms (compute {cost.compute_time * 1e3:.3f}, comm "
                f"{cost.comm_time * 1e3:.3f}), peak memory {cost.memory.peak:,} B per device"
            )
            for kind, value in cost.comm_bytes.items():
                if value:
                    lines.append(f"  {kind}: {value:,.0f} B")
            lines.extend("  changed: " + c for c in self.changes)
            sharded, replicated = self._strategy()
            if sharded or replicated:
                lines.append(f"  strategy: {len(sharded)} leaves sharded, {replicated} replicated")
                lines.extend(f"    {label}: {spec}" for label, spec in sharded[:MAX_STRATEGY_ROWS])
        lines.append(self._compile_line())
        if self.status:
            lines.append(self.status)
        if self.code:
            lines.append(self.code)
        return "\n".join(lines)

    def html(self) -> str:
        parts = []
        if self.error:
            parts.append(
                f"<div class='sl-error sl-edit-error'>invalid choice (last valid strategy kept):"
                f" {esc(self.error)}</div>"
            )
        if self.evaluation is not None:
            cost = self.evaluation.cost
            rows = [
                [kind, f"{cost.comm_bytes.get(kind, 0):,.0f}"]
                for kind in COLLECTIVE_KINDS
                if cost.comm_bytes.get(kind, 0)
            ] or [["none", "0"]]
            memory = cost.memory
            peak = max(memory.peak, 1)
            bars = "".join(
                f"<div>{esc(name)} <span style='display:inline-block;height:10px;width:"
                f"{max(1, int(200 * value / peak))}px;background:{color}'></span> "
                f"{fmt_bytes(value)}</div>"
                for name, value, color in (
                    ("parameters", memory.parameters, "#0072B2"),
                    ("activations", memory.activations, "#E69F00"),
                    ("peak", memory.peak, "#D55E00"),
                )
            )
            parts.append(
                f"<div class='sl-time'>strategy #{self.evaluation.generation}: predicted step "
                f"<b>{fmt_time(cost.time)}</b> (compute {fmt_time(cost.compute_time)}, "
                f"communication {fmt_time(cost.comm_time)}; predicted in "
                f"{self.evaluation.seconds * 1e3:.0f} ms)</div>"
                "<div style='display:flex;gap:24px'><div><b>communication per kind</b> "
                "(bytes per device on the wire)"
                + table(["kind", "bytes"], rows, cls="sl-comm")
                + f"</div><div class='sl-membars'><b>memory per device</b>{bars}</div></div>"
            )
            if self.changes:
                parts.append(
                    "<div class='sl-diff'><b>changed:</b> "
                    + "; ".join(esc(c) for c in self.changes)
                    + "</div>"
                )
            sharded, replicated = self._strategy()
            if sharded or replicated:
                more = len(sharded) - MAX_STRATEGY_ROWS
                rows = [[label, Raw(f"<code>{esc(spec)}</code>")] for label, spec in sharded]
                parts.append(
                    f"<div class='sl-strategy'><b>strategy</b> ({len(sharded)} leaves sharded,"
                    f" {replicated} replicated <code>P()</code>)"
                    + (table(["leaf", "spec"], rows[:MAX_STRATEGY_ROWS], left=2) if rows else "")
                    + (f"<div class='sl-note'>{more} more sharded leaves</div>" if more > 0 else "")
                    + "</div>"
                )
            legend = " ".join(
                f"<span style='color:{KIND_COLORS[k]}'>■</span>{esc(k)}" for k in COLLECTIVE_KINDS
            )
            parts.append(f"<div class='sl-note'>{legend}</div>")
        parts.append(f"<div class='sl-compile'>{esc(self._compile_line())}</div>")
        if self.labels:  # the live editor's view: say what its controls do, as code
            parts.append(f"<div class='sl-actions sl-note'>{esc(ACTIONS)}</div>")
        if self.status:
            parts.append(f"<div class='sl-status'>{esc(self.status)}</div>")
        if self.code:
            parts.append(f"<pre class='sl-code'>{esc(self.code)}</pre>")
        return panel("sl-editor", "".join(parts), title="strategy editor")


def _choices(axes: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    options: list[tuple[str, tuple[str, ...]]] = [("—", ())]
    options += [(a, (a,)) for a in axes]
    options += [("+".join(p), p) for p in itertools.permutations(axes, 2)]
    return options


class StrategyEditor:
    """The editor widget: controls (stock ipywidgets) over a live figures display."""

    def __init__(
        self,
        fn: Any,
        *args: Any,
        mesh: Any,
        in_shardings: Any = None,
        device: Any = None,
        compile: bool = True,
    ) -> None:
        import ipywidgets as w

        self.model = EditorModel(fn, args, mesh, device)
        self.display = LiveDisplay("shardlab-editor")
        self.compile_in_background = compile
        self.error: str | None = None
        self.status = ""
        self.code: str | None = None
        self.compiled: CompileResult | None = None
        self.compiling = False
        self._stop = threading.Event()
        self._syncing = False
        options = _choices(self.model.axes)
        self.dropdowns: list[list[Any]] = []
        rows = []
        for index, leaf in enumerate(self.model.leaves):
            per_dim = self._dim_dropdowns(
                leaf.shape, options, lambda d, i=index: self._on_change(i, d)
            )
            self.dropdowns.append(per_dim)
            label = w.HTML(f"<code>{esc(leaf.label)}</code> {esc(leaf.dtype)}{list(leaf.shape)}")
            rows.append(w.HBox([label, *per_dim]))
        self.constraint_dropdowns: list[list[Any]] = []
        constraint_rows = []
        for position, item in enumerate(self.model.intermediates):
            per_dim = self._dim_dropdowns(
                item.shape, options, lambda d, p=position: self._on_constraint(p, d)
            )
            self.constraint_dropdowns.append(per_dim)
            constraint_rows.append(w.HBox([w.HTML(f"<code>{esc(item.label)}</code>"), *per_dim]))
        self.intermediates = w.Accordion(
            children=[w.VBox(constraint_rows or [w.HTML("no matmuls to constrain")])],
            titles=(f"constraints on intermediates ({len(constraint_rows)} matmul outputs)",),
            selected_index=None,
        )
        self.auto_button = w.Button(description="Auto", icon="magic", tooltip="shardlab.search")
        self.stop_button = w.Button(description="Stop", icon="stop", disabled=True)
        self.reset_button = w.Button(description="Reset", icon="undo")
        self.export_button = w.Button(description="Export code", icon="code")
        self.progress = w.FloatProgress(value=0.0, min=0.0, max=1.0, description="search")
        self.auto_button.on_click(guarded(lambda _: self.auto(), self._show_error))
        self.stop_button.on_click(guarded(lambda _: self._stop.set(), self._show_error))
        self.reset_button.on_click(guarded(lambda _: self.reset(), self._show_error))
        self.export_button.on_click(guarded(lambda _: self.export(), self._show_error))
        buttons = w.HBox(
            [
                self.auto_button,
                self.stop_button,
                self.reset_button,
                self.export_button,
                self.progress,
            ]
        )
        self.controls = w.VBox([*rows, self.intermediates, buttons])
        initial = self._initial_specs(in_shardings)
        self.initial = initial
        self.model.set_all(initial)
        self._sync_dropdowns()
        self._after_edit()

    def _dim_dropdowns(self, shape: tuple[int, ...], options: Any, handler_for: Any) -> list[Any]:
        """One dropdown per dimension; ``handler_for(dim)`` gives its change handler."""
        import ipywidgets as w

        dropdowns = []
        for dim in range(len(shape)):
            dropdown = w.Dropdown(
                options=options,
                value=(),
                description=f"dim {dim} ({shape[dim]})",
                style={"description_width": "initial"},
                layout=w.Layout(width="170px"),
            )
            dropdown.observe(guarded(handler_for(dim), self._show_error), names="value")
            dropdowns.append(dropdown)
        return dropdowns

    # -- state -----------------------------------------------------------------------------
    def _initial_specs(self, in_shardings: Any) -> list[PartitionSpec]:
        if in_shardings is None:
            return [PartitionSpec() for _ in self.model.leaves]
        from ..parallel.specs import resolve_shardings

        resolved = resolve_shardings(
            in_shardings, self.model.args, self.model.mesh, what="in_shardings"
        )
        specs: list[PartitionSpec] = []
        for _, _, sharding in resolved:
            spec = getattr(sharding, "spec", sharding)
            specs.append(spec if isinstance(spec, PartitionSpec) else PartitionSpec())
        return specs

    def _sync_dropdowns(self) -> None:
        self._syncing = True
        try:
            for per_dim, spec in zip(self.dropdowns, self.model.specs, strict=True):
                entries = spec_entries(spec)
                for dim, dropdown in enumerate(per_dim):
                    value = tuple(entries[dim]) if dim < len(entries) else ()
                    if value not in [v for _, v in dropdown.options]:
                        dropdown.options = [*dropdown.options, ("+".join(value), value)]
                    dropdown.value = value
            for item, per_dim in zip(
                self.model.intermediates, self.constraint_dropdowns, strict=True
            ):
                entries = spec_entries(self.model.constraints.get(item.node, PartitionSpec()))
                for dim, dropdown in enumerate(per_dim):
                    value = tuple(entries[dim]) if dim < len(entries) else ()
                    if value not in [v for _, v in dropdown.options]:
                        dropdown.options = [*dropdown.options, ("+".join(value), value)]
                    dropdown.value = value
        finally:
            self._syncing = False

    def _on_change(self, index: int, dim: int) -> Any:
        def handler(change: dict[str, Any]) -> None:
            if self._syncing:
                return
            self.edit(index, dim, tuple(change["new"]))

        return handler

    def _on_constraint(self, position: int, dim: int) -> Any:
        def handler(change: dict[str, Any]) -> None:
            if self._syncing:
                return
            self.constrain(self.model.intermediates[position].node, dim, tuple(change["new"]))

        return handler

    # -- actions ---------------------------------------------------------------------------
    def constrain(self, node: int, dim: int, axes: tuple[str, ...]) -> None:
        """Constrains an intermediate (a matmul output, by graph node index)."""
        self._change(self.model.constrain, node, dim, axes)

    def edit(self, index: int, dim: int, axes: tuple[str, ...]) -> None:
        """What a dropdown change does (also callable from code and tests)."""
        self._change(self.model.edit, index, dim, axes)

    def _change(self, apply: Any, *args: Any) -> None:
        """Applies a model change; an invalid one shows its error and keeps the last state."""
        try:
            apply(*args)
        except ShardingSpecError as error:
            self.error = str(error)
            self._refresh()
            return
        self.error = None
        self._after_edit()

    def _after_edit(self) -> None:
        self.code = None
        if self.compile_in_background:
            self.compiling = True
            self.model.compile(self._on_compiled)
        self._refresh()

    def _on_compiled(self, result: CompileResult) -> None:
        if result.superseded:
            return  # a newer edit is compiling; its result will come
        self.compiled, self.compiling = result, False
        self._refresh()

    def apply(self, plan_or_specs: Plan | Any, *, refresh: bool = True) -> None:
        """Shows a plan's input layouts and constraints (or a pytree of PartitionSpecs or
        NamedShardings) in the editor."""
        if isinstance(plan_or_specs, Plan):
            specs = [make_spec(layout) for layout in plan_or_specs.input_specs]
        else:
            leaves = jax.tree_util.tree_leaves(
                plan_or_specs, is_leaf=lambda x: isinstance(x, (PartitionSpec, NamedSharding))
            )
            specs = [s.spec if isinstance(s, NamedSharding) else s for s in leaves]
        if len(specs) != len(self.model.leaves):
            raise ValueError(
                f"the plan has {len(specs)} input shardings but the editor has "
                f"{len(self.model.leaves)} leaves; was it made for another function?"
            )
        if isinstance(plan_or_specs, Plan):  # the plan's constraints inside the function
            self.model.constraints = {
                node: outs[0]
                for node, outs in plan_or_specs.intermediate_specs().items()
                if outs and outs[0]
            }
        self.model.set_all(specs)
        self.error = None
        self._sync_dropdowns()
        if refresh:
            self._after_edit()

    def reset(self) -> None:
        self.model.constraints = {}
        self._syncing = True
        try:
            for per_dim in self.constraint_dropdowns:
                for dropdown in per_dim:
                    dropdown.value = ()
        finally:
            self._syncing = False
        self.model.set_all(list(self.initial))
        self.error, self.status = None, "reset to the initial strategy"
        self._sync_dropdowns()
        self._after_edit()

    def export(self) -> None:
        self.code = self.model.code()
        self._refresh()

    def auto(self) -> threading.Thread:
        """Runs the strategy search in the background; Stop keeps the best plan so far."""
        self._stop.clear()
        self.auto_button.disabled, self.stop_button.disabled = True, False
        self.status = "searching…"
        self._refresh()
        interrupted = threading.Event()

        def progress(fraction: float, message: str) -> None:
            self.progress.value = max(0.0, min(1.0, float(fraction)))
            self.progress.description = "search"
            # Once: the search returns its best plan so far and reports on to the end.
            if self._stop.is_set() and not interrupted.is_set():
                interrupted.set()
                raise KeyboardInterrupt

        def job() -> None:
            try:
                plan = search(
                    self.model.fn,
                    *self.model.args,
                    mesh=self.model.mesh,
                    method="auto",
                    device=self.model.device,
                    progress=progress,
                )
                self.apply(plan, refresh=False)
                partial = "" if plan.complete else " (stopped early: best plan so far)"
                self.status = f"Auto: plan from method {plan.method!r}{partial}"
                self.progress.value = 1.0
                self._after_edit()
            except KeyboardInterrupt:  # stopped before the search had a plan
                self.status = "Auto: stopped before the search had a plan"
                self._refresh()
            except Exception as error:  # shown in the editor
                self._show_error(f"{type(error).__name__}: {error}")
            finally:
                self.auto_button.disabled, self.stop_button.disabled = False, True

        thread = threading.Thread(target=job, name="shardlab-editor-search", daemon=True)
        thread.start()
        return thread

    # -- display ---------------------------------------------------------------------------
    def view(self) -> EditorView:
        current, previous = self.model.current, self.model.previous
        changes = diff(previous.cost if previous else None, current.cost) if current else []
        return EditorView(
            current,
            changes=changes,
            compiled=self.compiled,
            compiling=self.compiling,
            error=self.error,
            code=self.code,
            status=self.status,
            labels=tuple(leaf.label for leaf in self.model.leaves),
        )

    def _refresh(self) -> None:
        if self.display.shown:
            self.display.update(self.view())

    def _show_error(self, message: str) -> None:
        self.error = message
        self._refresh()

    def close(self) -> None:
        """Closes the editor's widgets, so the kernel lets go of them, their callbacks and
        the model's arguments (ipywidgets keeps every open widget alive)."""
        stack = [self.controls]
        while stack:
            widget = stack.pop()
            stack.extend(getattr(widget, "children", ()))
            widget.close()

    def _ipython_display_(self) -> None:
        show_controls(
            self.controls,
            f"[one dropdown per dimension of every input] [Auto] [Stop] [Reset] [Export code]: "
            f"{ACTIONS}",
            f"<div class='shardlab sl-actions sl-note'>{esc(ACTIONS)}</div>",
        )
        self.display.show(self.view())


def editor(
    fn: Any,
    *args: Any,
    mesh: Any,
    in_shardings: Any = None,
    device: Any = None,
    compile: bool = True,
) -> StrategyEditor:
    """An interactive sharding-strategy editor for ``fn(*args)`` on ``mesh``."""
    return StrategyEditor(
        fn, *args, mesh=mesh, in_shardings=in_shardings, device=device, compile=compile
    )
