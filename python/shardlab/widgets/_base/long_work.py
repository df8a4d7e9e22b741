"""The default progress display of long calls (``search``, ``plan.verify()``).

Registered as the ``progress`` view (``_core/views.py``) on import: an ipywidgets bar in a
notebook, a text bar on a terminal (stderr a tty), nothing in a log or a test run. Work that
ends within about a second shows nothing. A ticker thread re-offers the last state, so a
bar appears even while the caller is blocked in C++ (XLA compiling) and cannot call it.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from shardlab._core.views import register_view
from shardlab.widgets._base.progress import ProgressBar, _in_notebook

TICK_S = 0.25


class TickingBar:
    """A ``ProgressBar`` whose state is re-offered every ``TICK_S`` from a daemon thread
    (``show``: a view's own drawing of it, see ``ProgressBar``)."""

    def __init__(self, what: str, *, show: Any = None) -> None:
        self.bar = ProgressBar(what, show=show)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last: tuple[float, str] = (0.0, what)
        self._thread = threading.Thread(target=self._tick, name=f"shardlab-{what}", daemon=True)

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            with self._lock:
                if not self._stop.is_set():
                    self.bar(*self._last)

    def __enter__(self) -> TickingBar:
        self.bar.__enter__()
        self._thread.start()
        return self

    def __call__(self, fraction: float, message: str) -> None:
        with self._lock:
            self._last = (fraction, message)
            self.bar(fraction, message)

    def done(self, message: str) -> None:
        with self._lock:
            self._stop.set()
            self.bar.done(message)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        with self._lock:
            if exc and exc[0] is KeyboardInterrupt:
                self.bar.done("interrupted")
            self.bar.__exit__(*exc)


def default_bar(what: str) -> Any:
    """A ticking bar in a notebook or on a terminal; None elsewhere (no display)."""
    stream = sys.stderr
    if _in_notebook() or (hasattr(stream, "isatty") and stream.isatty()):
        return TickingBar(what)
    raise LookupError("no display for progress here")  # progress_bar() falls back to none


register_view("progress", default_bar)
