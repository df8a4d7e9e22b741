"""``shardlab.watch("params", "x")``: live layout views that refresh after every cell that
rebinds one of the names.
"""

from __future__ import annotations

from typing import Any

from shardlab.widgets._base.html import View, esc, panel
from shardlab.widgets._base.live import LiveDisplay
from shardlab.widgets.layout import LayoutView, show


class _WatchView(View):
    def __init__(self, parts: list[tuple[str, list[LayoutView] | str]], count: int | None):
        self.parts = parts
        self.count = count

    def text(self) -> str:
        lines = [f"watching (after cell {self.count})"]
        for name, part in self.parts:
            if isinstance(part, str):
                lines.append(f"{name}: {part}")
            else:
                lines.extend(view.text() for view in part)
        return "\n".join(lines)

    def html(self) -> str:
        body = []
        for name, part in self.parts:
            if isinstance(part, str):
                body.append(f"<div class='sl-note'><code>{esc(name)}</code>: {esc(part)}</div>")
            else:
                body.extend(view.html() for view in part)
        when = f" (after cell {self.count})" if self.count is not None else ""
        return panel("sl-watch", "".join(body), title=f"watching{when}")


def _views_of(name: str, value: Any, limit: int = 8) -> list[LayoutView] | str:
    import jax

    leaves = jax.tree_util.tree_flatten_with_path(value)[0]
    arrays = [(name + jax.tree_util.keystr(p), v) for p, v in leaves if isinstance(v, jax.Array)]
    if not arrays:
        return f"not an array ({type(value).__name__})"
    views = [show(v, name=label) for label, v in arrays[:limit]]
    if len(arrays) > limit:
        views.append(LayoutView(None, error=f"{len(arrays) - limit} more arrays in {name}"))
    return views


class Watch:
    """A pinned live view; ``stop()`` detaches it."""

    def __init__(self, shell: Any, names: tuple[str, ...]) -> None:
        self.shell = shell
        self.names = names
        self.display = LiveDisplay("shardlab-watch")
        self._seen: dict[str, int | None] = {}
        self.refreshes = 0

    def _view(self, cell: int | None) -> _WatchView:
        ns = self.shell.user_ns
        parts: list[tuple[str, list[LayoutView] | str]] = []
        for name in self.names:
            parts.append((name, _views_of(name, ns[name]) if name in ns else "not defined yet"))
            self._seen[name] = id(ns[name]) if name in ns else None
        return _WatchView(parts, cell)

    def _running_cell(self) -> int | None:
        """The number of the cell running now. IPython counts ``execution_count`` up when a
        cell starts (before ``pre_run_cell``), so while cell N runs, and in its
        ``post_run_cell``, ``shell.execution_count`` is N + 1."""
        count = getattr(self.shell, "execution_count", None)
        return count - 1 if isinstance(count, int) and count > 0 else None

    def post_run_cell(self, result: Any) -> None:
        ns = self.shell.user_ns
        changed = any((id(ns[n]) if n in ns else None) != self._seen.get(n) for n in self.names)
        if changed:
            self.refreshes += 1
            cell = getattr(result, "execution_count", None)  # the cell that just ran
            self.display.update(self._view(cell if cell is not None else self._running_cell()))

    def stop(self) -> None:
        try:
            self.shell.events.unregister("post_run_cell", self.post_run_cell)
        except ValueError:
            pass

    def _ipython_display_(self) -> None:
        self.display.show(self._view(self._running_cell()))


def watch(*names: str) -> Watch:
    """Pins live layout views of ``names``; each refreshes after a cell rebinds its name."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("shardlab.watch needs an IPython kernel (a notebook)")
    bad = [n for n in names if not isinstance(n, str) or not n.isidentifier()]
    if bad or not names:
        raise ValueError(
            f"watch() takes variable names as strings, e.g. watch('params'); got {bad or names}"
        )
    handle = Watch(shell, tuple(names))
    shell.events.register("post_run_cell", handle.post_run_cell)
    return handle
