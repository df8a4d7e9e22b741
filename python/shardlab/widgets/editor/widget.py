"""``shardlab.editor(fn, *args, mesh=m)``: edit a sharding strategy and see it change live.

The figures (``editor_view.py``) are pinned above the controls, so an edit's effect stays in
sight. Controls are an aligned grid per top-level argument (one tab each: ``params``,
``momentum``, ``batch``), rows labelled as the user indexes the leaf
(``params["embed"]``, ``batch[0]``: ``Plan.input_labels``), with one dropdown per dimension
choosing the mesh axes it is split over. Repeated layers are one row
(``params["blocks"][*]["w1"]`` ×4): a change there changes every layer, and "per layer"
opens (built on demand) one row per layer to override one. Every edit updates the predicted
figures at once (no compile); the compiled figures follow from a background thread, where a
newer edit supersedes a stale compile. Auto runs ``shardlab.search`` with a progress bar
(Stop keeps the best plan so far); ``apply(plan)`` shows the plan's own predicted cost and
its ``verify()``; Reset goes back to the initial strategy; Export code shows the plan's
``to_code()``. Above the tabs, pipeline stages, microbatches, schedule and a remat policy per
layer scan (``editor_stages.py``), when the mesh has a stage axis or the model a layer scan:
the figures, memory and the pipeline schedule (one lane per stage) follow them live.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from shardlab.parallel.errors import SearchError
from shardlab.parallel.plan.plan import Plan
from shardlab.parallel.search.driver import search
from shardlab.parallel.specs import ShardingSpecError, spec_entries
from shardlab.widgets._base.html import esc
from shardlab.widgets._base.live import LiveDisplay, guarded, show_controls
from shardlab.widgets._base.long_work import TickingBar
from shardlab.widgets.editor.model import CompileResult, EditorModel, diff, stage_diff
from shardlab.widgets.editor.stages import StageControls
from shardlab.widgets.editor.view import ACTIONS, EditorView

MIXED = "(mixed)"  # a group dropdown whose layers differ
LABEL_PX, SHAPE_PX, DIM_PX, TOGGLE_PX, ROW_PX = 8.0, 120, 112, 118, 28


def _choices(axes: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    options: list[tuple[str, tuple[str, ...]]] = [("—", ())]
    options += [(a, (a,)) for a in axes]
    options += [("+".join(p), p) for p in itertools.permutations(axes, 2)]
    return options


def _shape_text(dtype: str, shape: tuple[int, ...]) -> str:
    short = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int32": "i32"}
    return f"{short.get(dtype, dtype)}[{', '.join(map(str, shape))}]"


class _Row:
    """One control row: a layer group (``members`` > 1) or one leaf."""

    def __init__(self, editor: StrategyEditor, members: list[int], label: str, grid: str):
        import ipywidgets as w

        leaf = editor.model.leaves[members[0]]
        self.members = members
        self.grid = grid
        self.dropdowns = []
        for dim, size in enumerate(leaf.shape):
            dropdown = w.Dropdown(
                options=editor.options,
                value=(),
                tooltip=f"dim {dim} ({size})",
                layout=editor.shared("dropdown"),
                style=editor.shared("dropdown-style"),
            )
            dropdown.observe(
                guarded(editor.on_row_change(self, dim), editor.show_error), names="value"
            )
            self.dropdowns.append(dropdown)
        cells: list[Any] = [
            w.HTML(
                f"<code style='white-space:nowrap' title='{esc(label)}'>{esc(label)}</code>"
                f" <span class='sl-note'>{esc(_shape_text(leaf.dtype, leaf.shape))}</span>",
                layout=editor.shared("cell"),
                style=editor.shared("html-style"),
            ),
            *self.dropdowns,
        ]
        # one empty widget, shown in every padding cell (a model may have many views)
        cells += [editor.shared("empty")] * (editor.max_dims - len(leaf.shape))
        self.toggle = None
        self.expanded = None
        if len(members) > 1:
            self.toggle = w.ToggleButton(
                value=False,
                description=f"×{len(members)} per layer",
                tooltip="one row per layer, to override one",
                layout=editor.shared("toggle"),
                style=editor.shared("toggle-style"),
            )
            self.expanded = w.VBox([], layout=w.Layout(display="none"))
            self.toggle.observe(
                guarded(lambda change: editor.expand(self, change["new"]), editor.show_error),
                names="value",
            )
            cells.append(self.toggle)
        else:
            cells.append(editor.shared("empty"))
        self.widget = w.GridBox(cells, layout=editor.shared(f"grid {grid}"))
        self.children: list[_Row] = []

    def sync(self, specs: list[PartitionSpec]) -> None:
        for dim, dropdown in enumerate(self.dropdowns):
            values = set()
            for i in self.members:
                entries = spec_entries(specs[i])
                values.add(tuple(entries[dim]) if dim < len(entries) else ())
            value: Any = values.pop() if len(values) == 1 else MIXED
            known = [v for _, v in dropdown.options]
            if value not in known:
                label = value if value == MIXED else "+".join(value)
                dropdown.options = [*dropdown.options, (label, value)]
            dropdown.value = value
        for child in self.children:
            child.sync(specs)


class StrategyEditor:
    """The editor widget: figures pinned above stock ipywidgets controls."""

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
        # The background compile's progress (long_work's bar, drawn by the view): seconds it
        # has run, once past the bar's delay (about a second); None before and after.
        self.compile_shown_s: float | None = None
        self._compile_bar: TickingBar | None = None
        self._stop = threading.Event()
        self._syncing = False
        self.options = _choices(self.model.axes)
        self._shared: dict[str, Any] = {}
        self.max_dims = max((len(leaf.shape) for leaf in self.model.leaves), default=0)
        self.rows: list[_Row] = []
        tabs, titles = self._argument_tabs()
        self.arguments = w.Tab(children=tabs, titles=titles)
        self.arguments.observe(
            guarded(lambda change: self.open_tab(change["new"]), self.show_error),
            names="selected_index",
        )
        self.intermediates = w.Accordion(
            children=[w.VBox([])],
            titles=(
                f"constraints on intermediates ({len(self.model.intermediates)} matmul outputs)",
            ),
            selected_index=None,
        )
        self.constraint_rows: list[list[Any]] = []
        self.intermediates.observe(
            guarded(lambda _: self._build_constraints(), self.show_error), names="selected_index"
        )
        self.auto_button = w.Button(description="Auto", icon="magic", tooltip="shardlab.search")
        self.stop_button = w.Button(description="Stop", icon="stop", disabled=True)
        self.reset_button = w.Button(description="Reset", icon="undo")
        self.export_button = w.Button(description="Export code", icon="code")
        self.progress = w.FloatProgress(value=0.0, min=0.0, max=1.0, description="search")
        self.auto_button.on_click(guarded(lambda _: self.auto(), self.show_error))
        self.stop_button.on_click(guarded(lambda _: self._stop.set(), self.show_error))
        self.reset_button.on_click(guarded(lambda _: self.reset(), self.show_error))
        self.export_button.on_click(guarded(lambda _: self.export(), self.show_error))
        buttons = w.HBox(
            [
                self.auto_button,
                self.stop_button,
                self.reset_button,
                self.export_button,
                self.progress,
            ]
        )
        self.stage_controls = StageControls(self)
        stages = [self.stage_controls.widget] if self.stage_controls.widget else []
        self.controls = w.VBox([buttons, *stages, self.arguments, self.intermediates])
        self.initial = self._initial_specs(in_shardings)
        self.model.set_all(self.initial)
        self._sync_dropdowns()
        # The first compile starts once the editor is shown (or edited): started here, its
        # tracing would compete for the GIL with building and sending the controls.
        self._compile_pending = compile
        self.compiling = compile

    # -- building ------------------------------------------------------------------------
    def shared(self, kind: str) -> Any:
        """One Layout/style/empty cell per kind, shared by every control that uses it: a
        24-layer model opens a few hundred widget models instead of over a thousand."""
        import ipywidgets as w

        found = self._shared.get(kind)
        if found is None:
            if kind.startswith("grid "):
                found = w.Layout(grid_template_columns=kind[5:], grid_gap="2px 4px")
            elif kind == "dropdown":
                found = w.Layout(width=f"{DIM_PX - 4}px", height=f"{ROW_PX}px")
            elif kind == "toggle":
                found = w.Layout(width=f"{TOGGLE_PX}px", height=f"{ROW_PX}px")
            elif kind == "cell":
                found = w.Layout(overflow="hidden")
            elif kind == "dropdown-style":  # ipywidgets 8 does not re-export the styles
                from ipywidgets.widgets.widget_description import DescriptionStyle

                found = DescriptionStyle(description_width="0px")
            elif kind == "html-style":
                from ipywidgets.widgets.widget_string import HTMLStyle

                found = HTMLStyle()
            elif kind == "toggle-style":
                from ipywidgets.widgets.widget_bool import ToggleButtonStyle

                found = ToggleButtonStyle()
            elif kind == "empty":
                found = w.HTML("")
            else:  # pragma: no cover - a programming error
                raise KeyError(kind)
            self._shared[kind] = found
        return found

    def _grid(self, label_chars: int) -> str:
        label = min(460, max(160, int(label_chars * LABEL_PX) + SHAPE_PX))
        dims = " ".join([f"{DIM_PX}px"] * self.max_dims)
        return f"{label}px {dims} {TOGGLE_PX + 8}px"

    def _argument_tabs(self) -> tuple[list[Any], list[str]]:
        """One tab per top-level argument; in it, one row per layer group (members of the
        same shape and dtype) or leaf, in first-appearance order."""
        import ipywidgets as w

        by_argument: dict[str, dict[tuple[Any, ...], list[int]]] = {}
        for i, leaf in enumerate(self.model.leaves):
            groups = by_argument.setdefault(leaf.argument, {})
            groups.setdefault((leaf.group, leaf.shape, leaf.dtype), []).append(i)
        tabs, titles = [], []
        self._tab_groups = list(by_argument.values())
        for position, (argument, groups) in enumerate(by_argument.items()):
            # the first tab now; the others when first selected (a 24-layer model's
            # momentum tab is as big as its params tab)
            tabs.append(w.VBox(self._tab_rows(groups) if position == 0 else []))
            titles.append(f"{argument} ({sum(len(m) for m in groups.values())})")
        self._built_tabs = {0}
        return tabs, titles

    def _tab_rows(self, groups: dict[tuple[Any, ...], list[int]]) -> list[Any]:
        import ipywidgets as w

        labels = {
            key: key[0] if len(members) > 1 else self.model.leaves[members[0]].label
            for key, members in groups.items()
        }
        grid = self._grid(max(len(label) for label in labels.values()))
        header = w.GridBox(
            [
                w.HTML("<b>leaf</b> <span class='sl-note'>shape</span>"),
                *[w.HTML(f"<b>dim {d}</b>") for d in range(self.max_dims)],
                self.shared("empty"),
            ],
            layout=self.shared(f"grid {grid}"),
        )
        children: list[Any] = [header]
        for key, members in groups.items():
            row = _Row(self, members, labels[key], grid)
            self.rows.append(row)
            children.append(row.widget)
            if row.expanded is not None:
                children.append(row.expanded)
        return children

    def open_tab(self, index: int) -> None:
        """Builds a tab's rows the first time it is selected."""
        if index is None or index in self._built_tabs:
            return
        self._built_tabs.add(index)
        self.arguments.children[index].children = self._tab_rows(self._tab_groups[index])
        self._sync_dropdowns()

    def expand(self, row: _Row, show: bool) -> None:
        """Shows (building them the first time) or hides a group's per-layer rows."""
        assert row.expanded is not None
        if show and not row.children:
            row.children = [
                _Row(self, [i], self.model.leaves[i].label, row.grid) for i in row.members
            ]
            row.expanded.children = [child.widget for child in row.children]
            self._syncing = True
            try:
                for child in row.children:
                    child.sync(self.model.specs)
            finally:
                self._syncing = False
        row.expanded.layout.display = "" if show else "none"

    def _build_constraints(self) -> None:
        """The intermediates' rows, built the first time the section opens."""
        import ipywidgets as w

        if self.constraint_rows or self.intermediates.selected_index is None:
            return
        rows = []
        for position, item in enumerate(self.model.intermediates):
            per_dim = []
            for dim, size in enumerate(item.shape):
                dropdown = w.Dropdown(
                    options=self.options,
                    value=(),
                    tooltip=f"dim {dim} ({size})",
                    layout=self.shared("dropdown"),
                    style=self.shared("dropdown-style"),
                )
                dropdown.observe(
                    guarded(self._on_constraint(position, dim), self.show_error), names="value"
                )
                per_dim.append(dropdown)
            self.constraint_rows.append(per_dim)
            shape = "[" + ", ".join(map(str, item.shape)) + "]"
            rows.append(
                w.HBox(
                    [
                        w.HTML(
                            f"<code>{esc(item.label)}</code> <span class='sl-note'>{shape}</span>",
                            layout=w.Layout(width="360px"),
                        ),
                        *per_dim,
                    ]
                )
            )
        self.intermediates.children = [w.VBox(rows or [w.HTML("no matmuls to constrain")])]
        self._sync_dropdowns()

    # -- state -----------------------------------------------------------------------------
    def _initial_specs(self, in_shardings: Any) -> list[PartitionSpec]:
        if in_shardings is None:
            return [PartitionSpec() for _ in self.model.leaves]
        from shardlab.parallel.specs import resolve_shardings

        resolved = resolve_shardings(
            in_shardings, self.model.args, self.model.mesh, what="in_shardings"
        )
        specs: list[PartitionSpec] = []
        for _, _, sharding in resolved:
            spec = getattr(sharding, "spec", sharding)
            specs.append(spec if isinstance(spec, PartitionSpec) else PartitionSpec())
        return specs

    def _sync_dropdowns(self) -> None:
        self.stage_controls.sync()
        self._syncing = True
        try:
            for row in self.rows:
                row.sync(self.model.specs)
            for item, per_dim in zip(self.model.intermediates, self.constraint_rows, strict=False):
                entries = spec_entries(self.model.constraints.get(item.node, PartitionSpec()))
                for dim, dropdown in enumerate(per_dim):
                    value = tuple(entries[dim]) if dim < len(entries) else ()
                    if value not in [v for _, v in dropdown.options]:
                        dropdown.options = [*dropdown.options, ("+".join(value), value)]
                    dropdown.value = value
        finally:
            self._syncing = False

    def on_row_change(self, row: _Row, dim: int) -> Any:
        def handler(change: dict[str, Any]) -> None:
            if self._syncing or change["new"] == MIXED:
                return
            axes = tuple(change["new"])
            self._change(self.model.edit_many, [(i, dim, axes) for i in row.members])

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

    def edit(self, leaf: int | str, dim: int, axes: tuple[str, ...] | str) -> None:
        """What a dropdown change does (also callable from code and tests): split dimension
        ``dim`` of ``leaf`` (an index, a label as shown — ``params["blocks"][0]["w1"]`` — or
        a path) over ``axes`` (``()``: none; a single axis may be a string)."""
        index = leaf if isinstance(leaf, int) else self.model.index(leaf)
        self._change(self.model.edit, index, dim, (axes,) if isinstance(axes, str) else axes)

    def edit_group(self, group: str, dim: int, axes: tuple[str, ...] | str) -> None:
        """What a layer group's dropdown does: the same split for every layer of ``group``
        (``params["blocks"][*]["w1"]``)."""
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        members = self.model.members(group)
        self._change(self.model.edit_many, [(i, dim, axes) for i in members])

    def set_pipeline(
        self, stages: int, microbatches: int | None = None, schedule: str | None = None
    ) -> None:
        """What the pipeline dropdowns do: pipeline the layer scans over ``stages`` (0: off)
        with ``microbatches`` and ``schedule`` (``gpipe``, ``1f1b``)."""
        self._change(self.model.set_pipeline, stages, microbatches, schedule)

    def set_remat(self, policy: str, group: int | str | None = None) -> None:
        """What a layer group's remat dropdown does: ``policy`` (``none``, ``dots``,
        ``nothing``) for ``group`` — its scan index, its label as shown (``lax.scan at
        In [3], line 7 (4 layers)``) or a part of it — or every layer group (None)."""
        scan = group
        if isinstance(group, str):
            found = [g.scan for g in self.model.layer_groups if group in g.label]
            if len(found) != 1:
                labels = "; ".join(g.label for g in self.model.layer_groups)
                raise KeyError(f"{group!r} names {len(found)} layer groups; they are: {labels}")
            scan = found[0]
        self._change(self.model.set_remat, scan, policy)

    def _change(self, apply: Any, *args: Any) -> None:
        """Applies a model change; an invalid one shows its error and keeps the last state."""
        try:
            apply(*args)
        except (ShardingSpecError, SearchError) as error:
            self.error = str(error)
            self._sync_dropdowns()  # a group row may have half-moved in the browser
            self._refresh()
            return
        self.error = None
        self._sync_dropdowns()
        self._after_edit()

    def _after_edit(self) -> None:
        self.code = None
        self._compile_pending = False
        if self.compile_in_background:
            self.compiling = True
            self._start_compile_bar()
            self.model.compile(self._on_compiled)
        self._refresh()

    def _start_compile_bar(self) -> None:
        """One bar while compiles follow each other: a newer edit keeps the running one."""
        if self._compile_bar is None:
            self._compile_bar = TickingBar("compile", show=self._on_compile_progress).__enter__()

    def _on_compile_progress(self, fraction: float, message: str, elapsed: float) -> None:
        # The bar moves by itself (CSS): redrawn when it appears, then once a second.
        shown = self.compile_shown_s
        if shown is None or int(elapsed) > int(shown):
            self.compile_shown_s = elapsed
            self._refresh()

    def _stop_compile_bar(self) -> None:
        bar, self._compile_bar = self._compile_bar, None
        if bar is not None:
            bar.__exit__(None, None, None)  # no tick comes after this returns
        self.compile_shown_s = None

    def _on_compiled(self, result: CompileResult) -> None:
        if result.superseded:
            return  # a newer edit is compiling; its result will come
        self._stop_compile_bar()
        self.compiled, self.compiling = result, False
        self._refresh()

    def apply(self, plan_or_specs: Plan | Any, *, refresh: bool = True) -> None:
        """Shows a plan (its own predicted cost, and its ``verify()`` once compiled), or a
        pytree of PartitionSpecs or NamedShardings (predicted as a hand strategy)."""
        if isinstance(plan_or_specs, Plan):
            self.model.set_plan(plan_or_specs)
        else:
            leaves = jax.tree_util.tree_leaves(
                plan_or_specs, is_leaf=lambda x: isinstance(x, (PartitionSpec, NamedSharding))
            )
            specs = [s.spec if isinstance(s, NamedSharding) else s for s in leaves]
            if len(specs) != len(self.model.leaves):
                raise ValueError(
                    f"{len(specs)} shardings given but the editor has "
                    f"{len(self.model.leaves)} leaves; were they made for another function?"
                )
            self.model.set_all(specs)
        self.error = None
        self._sync_dropdowns()
        if refresh:
            self._after_edit()

    def reset(self) -> None:
        self.model.constraints = {}
        self.model.clear_stages()
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
                self.show_error(f"{type(error).__name__}: {error}")
            finally:
                self.auto_button.disabled, self.stop_button.disabled = False, True

        thread = threading.Thread(target=job, name="shardlab-editor-search", daemon=True)
        thread.start()
        return thread

    # -- display ---------------------------------------------------------------------------
    def view(self) -> EditorView:
        current, previous = self.model.current, self.model.previous
        changes = (
            stage_diff(previous, current, self.model.layer_groups)
            + diff(previous.cost if previous else None, current.cost)
            if current
            else []
        )
        applied = self.model.applied
        return EditorView(
            current,
            changes=changes,
            compiled=self.compiled,
            compiling=self.compiling,
            compile_elapsed=self.compile_shown_s if self.compiling else None,
            error=self.error,
            code=self.code,
            status=self.status,
            labels=tuple(leaf.label for leaf in self.model.leaves),
            groups=tuple(leaf.group for leaf in self.model.leaves),
            source=f"plan {applied.method}" if applied is not None else "",
            stages=self.stage_lines(),
        )

    def stage_lines(self) -> tuple[str, ...]:
        """The pipeline and remat settings of the figures shown (the current evaluation),
        in words."""
        model, lines = self.model, []
        current = model.current
        if current is None:
            return ()
        spec = current.pipeline.spec if current.pipeline is not None else None
        if spec is not None:
            lines.append(
                f"pipeline: {spec.stages} stages × {spec.microbatches} microbatches "
                f"({spec.schedule}) over the {spec.axis!r} axis"
            )
        elif model.choices.stages:
            lines.append("pipeline: off")
        remat = dict(current.remat)
        for group in model.layer_groups:
            policy = remat.get(group.scan, "none")
            if policy != "none":
                lines.append(f"remat {policy!r}: {group.label}")
        return tuple(lines)

    def _refresh(self) -> None:
        if self.display.shown:
            self.display.update(self.view())

    def show_error(self, message: str) -> None:
        self.error = message
        self._refresh()

    _show_error = show_error

    def close(self) -> None:
        """Closes the editor's widgets, so the kernel lets go of them, their callbacks and
        the model's arguments (ipywidgets keeps every open widget alive)."""
        stack = [self.controls]
        while stack:
            widget = stack.pop()
            stack.extend(getattr(widget, "children", ()))
            widget.close()

    def _ipython_display_(self) -> None:
        self.display.show(self.view())  # the figures first: pinned above the controls
        show_controls(
            self.controls,
            f"[Auto] [Stop] [Reset] [Export code] [pipeline, remat] [a tab per argument: one dropdown per "
            f"dimension, repeated layers as one row]: {ACTIONS}",
            f"<div class='shardlab sl-actions sl-note'>{esc(ACTIONS)}</div>",
        )
        if self._compile_pending:
            self._after_edit()


def editor(
    fn: Any,
    *args: Any,
    mesh: Any,
    in_shardings: Any = None,
    device: Any = None,
    compile: bool = True,
) -> StrategyEditor:
    """An interactive sharding-strategy editor for ``fn(*args)`` on ``mesh``.

    Returns:
        The editor; display it (a cell's last line) for the figures and controls.
        ``edit(label, dim, axes)``, ``edit_group(group, dim, axes)``, ``apply(plan)``,
        ``reset()``, ``export()`` do from code what the controls do.
    """
    return StrategyEditor(
        fn, *args, mesh=mesh, in_shardings=in_shardings, device=device, compile=compile
    )
