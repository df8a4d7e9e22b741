"""What C++ code writes to stderr during a background compile, kept for the view.

XLA's warnings (``Involuntary full rematerialization...``) go to file descriptor 2, which
ipykernel forwards to whichever cell runs next, so a background compile's warnings appear
as red text in an unrelated cell. ``captured_stderr`` points descriptor 2 at a temporary
file for the duration and hands the text to the view that started the compile.

Descriptor 2 is process-wide: anything else written there at the same time (by another
thread's C++ code) lands in the same capture. Captures are serialised by a lock.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Iterator

_LOCK = threading.Lock()
MAX_CHARS = 4000  # a view shows the start of a long log


class Captured:
    """The captured text (set when the block ends)."""

    text: str = ""


@contextlib.contextmanager
def captured_stderr() -> Iterator[Captured]:
    """Redirects descriptor 2 into ``Captured.text`` for the block (a no-op where the
    descriptor cannot be duplicated)."""
    out = Captured()
    with _LOCK:
        saved: int | None = None
        tmp = None
        try:
            sys.stderr.flush()
            tmp = tempfile.TemporaryFile()
            saved = os.dup(2)
            os.dup2(tmp.fileno(), 2)
        except (OSError, ValueError, AttributeError):  # no real descriptor 2: do not capture
            if saved is not None:
                os.close(saved)
                saved = None
        try:
            yield out
        finally:
            if saved is not None and tmp is not None:
                os.dup2(saved, 2)
                os.close(saved)
                tmp.seek(0)
                text = tmp.read().decode("utf-8", errors="replace")
                out.text = text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + "\n…"
            if tmp is not None:
                tmp.close()
