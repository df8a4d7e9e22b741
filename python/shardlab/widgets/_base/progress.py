"""A progress bar for long work: an ipywidgets bar in a notebook, a text bar in a terminal.

Both appear only after ``DELAY_S`` (work that ends sooner shows nothing) and say what is
being done. ``bar(fraction, message)`` is the ``progress=`` callback shardlab's long calls
take. A view that draws progress itself (the editor's background compile) passes ``show``:
it is called with ``(fraction, message, elapsed_s)`` instead, past the same delay.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from shardlab.widgets._base.html import esc

DELAY_S = 1.0
TEXT_WIDTH = 30


def _in_notebook() -> bool:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and getattr(shell, "kernel", None) is not None


class ProgressBar:
    """``with ProgressBar("explore") as bar: bar(0.5, "searching: ilp")``."""

    def __init__(
        self,
        what: str,
        *,
        delay: float = DELAY_S,
        stream: Any = None,
        show: Callable[[float, str, float], None] | None = None,
    ) -> None:
        self.what = what
        self.show = show
        self.delay = delay
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.perf_counter()
        self.widget: Any = None
        self.display_id = ""
        self.label: Any = None
        self.shown_text = False
        self.fraction = 0.0
        self.message = ""

    def __enter__(self) -> ProgressBar:
        self.started = time.perf_counter()
        return self

    def __call__(self, fraction: float, message: str) -> None:
        self.fraction = max(0.0, min(1.0, float(fraction)))
        self.message = message
        elapsed = time.perf_counter() - self.started
        if elapsed < self.delay:
            return
        if self.show is not None:
            self.show(self.fraction, message, elapsed)
        elif _in_notebook():
            self._widget_update()
        else:
            self._text_update()

    def _widget_update(self) -> None:
        if self.widget is None:
            import ipywidgets
            from IPython.display import display

            bar = ipywidgets.FloatProgress(min=0.0, max=1.0, description=self.what)
            self.label = ipywidgets.Label()
            self.widget = ipywidgets.HBox([bar, self.label])
            bundle = dict(self.widget._repr_mimebundle_())
            bundle["text/plain"] = f"{self.what}: in progress"
            self.display_id = f"shardlab-progress-{uuid.uuid4().hex[:12]}"
            display(bundle, raw=True, display_id=self.display_id)
        bar = self.widget.children[0]
        bar.value = self.fraction
        self.label.value = f"{self.fraction:.0%} {self.message}"

    def _text_update(self) -> None:
        filled = round(TEXT_WIDTH * self.fraction)
        line = f"\r{self.what} [{'#' * filled}{'.' * (TEXT_WIDTH - filled)}] "
        line += f"{self.fraction:4.0%} {self.message[:60]:<60}"
        self.stream.write(line)
        self.stream.flush()
        self.shown_text = True

    def done(self, message: str) -> None:
        """The final state: the bar's output becomes ``message`` (text, what a saved
        notebook keeps), a text bar ends with it."""
        if self.widget is not None:
            from IPython.display import update_display

            text = f"{self.what}: {message}"
            update_display(
                {"text/plain": text, "text/html": f"<div class='sl-note'>{esc(text)}</div>"},
                raw=True,
                display_id=self.display_id,
            )
        elif self.shown_text:
            self.stream.write(f"\r{self.what}: {message:<{TEXT_WIDTH + 70}}\n")
            self.stream.flush()
            self.shown_text = False  # the line is finished

    def __exit__(self, *exc: Any) -> None:
        if self.widget is not None:
            self.widget.close()  # the result replaces it
            self.widget = None
        elif self.shown_text:
            self.stream.write("\n")
            self.stream.flush()
