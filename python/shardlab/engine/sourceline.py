"""The user's source line of a jaxpr equation or a frame, as a person reads it.

``In [5], line 3`` for notebook code (IPython compiles each cell to a file it maps to the
execution count; the map is read through ``sys.modules``, never by importing IPython), a
path and line for a file, and never a frame of JAX or of shardlab's own machinery.
"""

from __future__ import annotations

import linecache
import os
import sys
from typing import Any

from jax._src import source_info_util

__all__ = ["equation_source", "label", "user_frame_of_traceback"]

_OWN = tuple(
    os.sep + os.path.join("shardlab", part) + os.sep
    for part in ("engine", "kernel", "parallel", "widgets", "bench")
)


def _is_user_file(path: str) -> bool:
    if not path or path.startswith("<frozen") or any(own in path for own in _OWN):
        return False
    return bool(source_info_util.is_user_filename(path))


def _cell_number(path: str) -> int | None:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    filenames = getattr(getattr(shell, "compile", None), "_filename_map", None)
    number = filenames.get(path) if isinstance(filenames, dict) else None
    return number if isinstance(number, int) else None


def label(path: str, line: int) -> str:
    """``In [5], line 3`` for a notebook cell, ``pkg/module.py, line 3`` for a file."""
    number = _cell_number(path)
    if number is not None:
        return f"In [{number}], line {line}"
    if path.startswith("<"):
        return f"{path}, line {line}"
    roots = [r for r in (os.getcwd(), *sys.path) if r and os.path.isabs(r)]
    best = ""
    for root in roots:
        root = root.rstrip(os.sep) + os.sep
        if path.startswith(root) and len(root) > len(best):
            best = root
    return f"{path[len(best) :] if best else path}, line {line}"


def user_frame_of_traceback(traceback: Any) -> tuple[str, int] | None:
    """The innermost user frame (file, line) of a JAX source traceback, or None."""
    for frame in source_info_util.user_frames(traceback):  # innermost first
        if _is_user_file(frame.file_name):
            return frame.file_name, int(frame.start_line)
    return None


def equation_source(eqn: Any) -> tuple[str, str]:
    """The label and the text of the user line that made ``eqn`` ('' when unknown)."""
    try:
        found = user_frame_of_traceback(eqn.source_info.traceback)
    except Exception:  # source info is best-effort
        found = None
    if found is None:
        return "", ""
    path, line = found
    return label(path, line), linecache.getline(path, line).strip()


def user_frame_of_exception(error: BaseException) -> tuple[str, str] | None:
    """The innermost user frame of an exception's traceback: its label and line text."""
    import traceback

    frames = [f for f in traceback.extract_tb(error.__traceback__) if _is_user_file(f.filename)]
    if not frames:
        return None
    last = frames[-1]
    return label(last.filename, last.lineno or 0), (last.line or "").strip()
