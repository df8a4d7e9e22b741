"""The strategy editor's pipeline and remat controls: stages, microbatches, schedule, and a
remat policy per layer group.

Only valid choices are offered (``EditorModel.choices``: the stage axis' size when it divides
the layers, the divisors of the batch); when the mesh or the model rules pipelining out, the
stages dropdown is disabled and a line says why and what to change. Each forward layer scan
is one row, labelled by the line of the user's ``lax.scan``. A change goes through the
editor (``StrategyEditor.set_pipeline``, ``set_remat``), so an invalid combination shows its
message in the editor and keeps the last valid strategy.
"""

from __future__ import annotations

from typing import Any

from shardlab.widgets._base.html import esc
from shardlab.widgets._base.live import guarded

REMAT_OPTIONS = [
    ("none: keep every residual", "none"),
    ("dots: keep matmul outputs", "dots"),
    ("nothing: recompute all", "nothing"),
]
SCHEDULE_OPTIONS = [("GPipe", "gpipe"), ("1F1B", "1f1b")]


class StageControls:
    """The controls (``widget``) of one editor; ``sync()`` shows the model's state. None are
    made (``widget`` None) when the mesh has no stage axis and the model no layer scan."""

    def __init__(self, editor: Any) -> None:
        import ipywidgets as w

        self.editor = editor
        model = editor.model
        choices = model.choices
        self.widget: Any = None
        self.remat: dict[int, Any] = {}
        self._syncing = False
        if not self.useful:
            return
        small = w.Layout(width="170px")
        style = {"description_width": "84px"}
        self.stages = w.Dropdown(
            options=[("off", 0), *[(f"{n} stages", n) for n in choices.stages]],
            value=0,
            description="pipeline",
            disabled=not choices.stages,
            layout=w.Layout(width="190px"),
            style=style,
        )
        self.microbatches = w.Dropdown(
            options=[(f"{m} microbatches", m) for m in choices.microbatches],
            value=choices.microbatches[0],
            layout=small,
        )
        self.schedule = w.Dropdown(
            options=SCHEDULE_OPTIONS, value="gpipe", layout=w.Layout(width="90px")
        )
        why = choices.reason or (
            f"over the {choices.axis!r} axis (the stacked layers split over it)"
        )
        row: list[Any] = [
            self.stages,
            self.microbatches,
            self.schedule,
            w.HTML(f"<span class='sl-note'>{esc(why)}</span>"),
        ]
        self.stages.observe(guarded(self._on_pipeline, editor.show_error), names="value")
        self.microbatches.observe(guarded(self._on_pipeline, editor.show_error), names="value")
        self.schedule.observe(guarded(self._on_pipeline, editor.show_error), names="value")
        rows: list[Any] = [w.HBox(row)]
        for group in model.layer_groups:
            dropdown = w.Dropdown(
                options=REMAT_OPTIONS,
                value="none",
                description="remat",
                layout=w.Layout(width="290px"),
                style=style,
            )
            dropdown.observe(guarded(self._on_remat(group.scan), editor.show_error), names="value")
            self.remat[group.scan] = dropdown
            rows.append(w.HBox([dropdown, w.HTML(f"<code>{esc(group.label)}</code>")]))
        if not model.layer_groups:
            rows.append(w.HTML(f"<span class='sl-note'>remat: {esc(model.remat_note)}</span>"))
        self.widget = w.VBox(rows)
        self.sync()

    @property
    def useful(self) -> bool:
        """Whether there is anything to set (a stage axis or a layer scan)."""
        model = self.editor.model
        return bool(model.choices.stages or model.layer_groups)

    def sync(self) -> None:
        """The dropdowns as the model has it (after an edit, an error, Reset, apply)."""
        model = self.editor.model
        spec = model.pipeline
        if self.widget is None:
            return
        self._syncing = True
        try:
            self.stages.value = spec.stages if spec is not None else 0
            if spec is not None:
                self.microbatches.value = spec.microbatches
                self.schedule.value = spec.schedule
            self.microbatches.disabled = self.schedule.disabled = spec is None
            for scan, dropdown in self.remat.items():
                dropdown.value = model.remat.get(scan, "none")
        finally:
            self._syncing = False

    def _on_pipeline(self, change: dict[str, Any]) -> None:
        if self._syncing:
            return
        stages = self.stages.value
        if change.get("owner") is self.stages:  # stages on: the model picks microbatches
            self.editor.set_pipeline(stages)
        else:
            self.editor.set_pipeline(stages, self.microbatches.value, self.schedule.value)

    def _on_remat(self, scan: int) -> Any:
        def handler(change: dict[str, Any]) -> None:
            if not self._syncing:
                self.editor.set_remat(change["new"], scan)

        return handler
