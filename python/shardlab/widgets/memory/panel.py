"""The memory panel: per-device live bytes, the largest arrays, and a Release button."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from shardlab._core.views import view_for
from shardlab.parallel.labels import spec_label
from shardlab.widgets._base.html import Raw, View, error_html, esc, fmt_bytes, panel, table
from shardlab.widgets._base.live import LiveDisplay, guarded, show_controls

TOP_ARRAYS = 12
# What the panel's buttons do, as code: the static form (a saved or exported notebook, a front
# end without a widget manager) says it where the buttons would be.
ACTIONS = "Release (run %release) · Refresh (run this cell again)"
ACTIONS_HTML = (
    "<div class='sl-actions sl-note'>Release (run <code>%release</code>) · "
    "Refresh (run this cell again)</div>"
)


@dataclass(frozen=True)
class ArrayEntry:
    name: str  # the namespace path, or "(unnamed)"
    shape: tuple[int, ...]
    dtype: str
    spec: str
    bytes_total: int
    bytes_per_device: int


@dataclass(frozen=True)
class MemorySnapshot:
    """Per-device live bytes and the largest arrays, with names where the namespace has them."""

    bytes_per_device: dict[str, int]
    arrays: tuple[ArrayEntry, ...]
    array_count: int
    rss: int


def snapshot(namespace: dict[str, Any] | None = None) -> MemorySnapshot:
    import jax

    from shardlab.engine.resources.live_memory import (
        array_names,
        buffers,
        live_bytes_per_device,
        process_rss,
        shard_nbytes,
    )

    # The user's names first: an array that Out (the output history) also holds is "x".
    names = array_names(namespace, max_leaves=sys.maxsize)
    entries = []
    _, views = buffers(prefer=names)  # a buffer a name holds is listed under that name
    arrays = [a for a in jax.live_arrays() if id(a) not in views]
    for array in arrays:
        try:
            if array.is_deleted():
                continue
            per_device = shard_nbytes(array)
            spec = (
                spec_label(sharded)
                if (sharded := getattr(array.sharding, "spec", None))
                else "single device"
            )
            entries.append(
                ArrayEntry(
                    names.get(id(array), "(unnamed)"),
                    tuple(array.shape),
                    str(array.dtype),
                    spec,
                    int(array.nbytes),
                    int(per_device),
                )
            )
        except Exception:  # deleted between listing and reading
            continue
    entries.sort(key=lambda e: -e.bytes_total)
    return MemorySnapshot(
        live_bytes_per_device(), tuple(entries[:TOP_ARRAYS]), len(arrays), process_rss()
    )


class MemoryView(View):
    def __init__(self, snap: MemorySnapshot, *, note: str = "") -> None:
        self.snap = snap
        self.note = note

    def text(self) -> str:
        total = sum(self.snap.bytes_per_device.values())
        lines = [
            f"live arrays: {self.snap.array_count}, {fmt_bytes(total)} on devices; "
            f"process RSS {fmt_bytes(self.snap.rss)}"
        ]
        lines += [f"  {d}: {fmt_bytes(b)}" for d, b in self.snap.bytes_per_device.items()]
        lines += [
            f"  {e.name} {e.dtype}{list(e.shape)} {e.spec} {fmt_bytes(e.bytes_total)}"
            for e in self.snap.arrays
        ]
        if self.note:
            lines.append(self.note)
        lines.append(ACTIONS)
        return "\n".join(lines)

    def html(self) -> str:
        per_device = self.snap.bytes_per_device
        peak = max(per_device.values(), default=0) or 1
        bars = "".join(
            f"<div class='sl-bar-row' title='{esc(d)}: {b:,} bytes'>"
            f"<span style='display:inline-block;width:60px'>{esc(d)}</span>"
            f"<span class='sl-bar' style='display:inline-block;height:10px;width:"
            f"{max(1, int(240 * b / peak))}px;background:#0072B2'></span> {fmt_bytes(b)}</div>"
            for d, b in per_device.items()
        )
        rows = [
            [
                e.name,
                f"{e.dtype}{list(e.shape)}",
                Raw(f"<code>{esc(e.spec)}</code>"),
                fmt_bytes(e.bytes_total),
                fmt_bytes(e.bytes_per_device),
            ]
            for e in self.snap.arrays
        ]
        largest = table(["name", "array", "sharding", "total", "per device"], rows, left=3)
        total = sum(per_device.values())
        head = (
            f"<div>{self.snap.array_count} live arrays, {fmt_bytes(total)} on devices; "
            f"process RSS {fmt_bytes(self.snap.rss)}</div>"
        )
        note = f"<div class='sl-release-note sl-note'>{esc(self.note)}</div>" if self.note else ""
        return panel(
            "sl-memory",
            ACTIONS_HTML
            + head
            + f"<div class='sl-bars'>{bars}</div><b>largest arrays</b>{largest}{note}",
            title="memory per device",
        )


class MemoryPanel:
    """``shardlab.memory()``: a live view of device memory with a Release button."""

    def __init__(self) -> None:
        import ipywidgets

        self.display = LiveDisplay("shardlab-memory")
        self.release_button = ipywidgets.Button(
            description="Release", tooltip="%release: free what no name holds", icon="recycle"
        )
        self.refresh_button = ipywidgets.Button(description="Refresh", icon="refresh")
        self.release_button.on_click(guarded(lambda _: self.release(), self._error))
        self.refresh_button.on_click(guarded(lambda _: self.refresh(), self._error))
        self.controls = ipywidgets.HBox([self.release_button, self.refresh_button])
        self.history: Any = None  # bokeh_memory.MemoryHistory, once displayed

    def _namespace(self) -> dict[str, Any]:
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython else None
        return dict(shell.user_ns) if shell is not None else {}

    def _error(self, message: str) -> None:
        self.display.update(_ErrorView("sl-memory", message))

    def view(self, note: str = "") -> MemoryView:
        return MemoryView(snapshot(self._namespace()), note=note)

    def refresh(self) -> None:
        self.display.update(self.view())

    def release(self) -> None:
        """What ``%release`` does where the kernel registered it (``_core/views.py``: the
        views never import the kernel); elsewhere the engine's release (caches, heap)."""
        kernel_release = view_for("release")
        if kernel_release is not None:
            report = kernel_release()
        else:
            from shardlab.engine.resources.live_memory import release

            report = release(None)
        if self.history is not None:
            self.history.mark("release", "Release button")
            self.history.refresh()
        self.display.update(self.view(note="released: " + report.text().replace("\n", "; ")))

    def _ipython_display_(self) -> None:
        show_controls(self.controls, f"[Release] [Refresh]: {ACTIONS}", ACTIONS_HTML)
        self.display.show(self.view())
        self._show_history()

    def _show_history(self) -> None:
        """Live bytes per device over time (``bokeh_memory``), streaming while cells run."""
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython else None
        if shell is None or not hasattr(shell, "events"):
            return
        try:
            from shardlab.widgets.memory.history import history
        except ImportError:  # no bokeh: the panel without its history
            return
        self.history = history(shell)
        self.history.show()


class _ErrorView(View):
    def __init__(self, cls: str, message: str) -> None:
        self.cls, self.message = cls, message

    def html(self) -> str:
        return error_html(self.cls, self.message)

    def text(self) -> str:
        return self.message


def memory() -> MemoryPanel:
    """Per-device live bytes, the largest arrays with names and shardings, and Release."""
    return MemoryPanel()
