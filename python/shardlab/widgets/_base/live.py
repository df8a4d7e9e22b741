"""Live content as an updatable display, controls as stock ipywidgets.

A view's content is a ``display_data`` output with a ``display_id`` (text/html + text/plain)
that callbacks update in place: it is saved with the notebook, so the last state shows
without a kernel, and it renders in VS Code without any extension. Controls (buttons,
dropdowns) are stock ipywidgets 8.
"""

from __future__ import annotations

import uuid
from typing import Any

from shardlab.widgets._base.html import View


class LiveDisplay:
    """One updatable output area."""

    def __init__(self, prefix: str = "shardlab") -> None:
        self.display_id = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.shown = False

    def show(self, view: View) -> None:
        from IPython.display import display

        display(view, display_id=self.display_id)
        self.shown = True

    def update(self, view: View) -> None:
        from IPython.display import update_display

        if not self.shown:
            self.show(view)
        else:
            update_display(view, display_id=self.display_id)


def show_controls(widget: Any, text: str, html: str | None = None) -> None:
    """Displays stock ipywidgets ``widget`` with a readable fallback in the same bundle.

    A front end with a widget manager renders the widget; one without (GitHub, nbviewer, an
    export without widget state) shows ``text``/``html`` instead of ipywidgets' repr
    (``HBox(children=(Button(...``), saying what each control does and its code equivalent.
    """
    from IPython.display import display

    bundle = dict(widget._repr_mimebundle_())
    bundle["text/plain"] = text
    if html is not None:
        bundle["text/html"] = html
    display(bundle, raw=True)


def guarded(callback: Any, on_error: Any) -> Any:
    """Wraps a widget callback so that an exception shows inside the view, never in the void."""

    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return callback(*args, **kwargs)
        except Exception as error:  # shown to the user in the widget; the kernel keeps going
            on_error(f"{type(error).__name__}: {error}")
            return None

    return run
