"""The user's source line, in one format wherever a person reads it: errors, conversion
notes, compare and bisect reports, plan tables, the editor, exported code.

``In [8], line 2`` for notebook code (IPython compiles each cell to a file it maps to the
execution count; the map is read through ``sys.modules``, never by importing IPython),
``a notebook cell, line 2`` for a cell of another session (a saved record), and
``pkg/module.py:44`` for a file — the path from its import root, the form editors and
terminals turn into a link. shardlab's own machinery is never named as the source of
anything (its ``examples/`` are user models and are named).
"""

from __future__ import annotations

import linecache
import os
import re
import sys
from typing import Any

from jax._src import source_info_util

__all__ = [
    "cell_number",
    "equation_source",
    "is_own_file",
    "line_label",
    "portable_source",
    "source_label",
    "user_frame_of_exception",
    "user_frame_of_stack",
    "user_frame_of_traceback",
]

_OWN = tuple(
    os.sep + os.path.join("shardlab", part) + os.sep
    for part in ("_core", "engine", "kernel", "parallel", "widgets", "cluster")
)
_OTHER_SESSION = re.compile(r"ipykernel_\d+")


def is_own_file(path: str) -> bool:
    """A file of shardlab's own machinery (not its ``examples/``, which are user models); a
    path relative to its import root (``shardlab/parallel/plan/pipeline.py``, as a plan file
    keeps it) included."""
    return any(own in os.sep + path for own in _OWN)


def _is_user_file(path: str) -> bool:
    if not path or path.startswith("<frozen") or is_own_file(path):
        return False
    return bool(source_info_util.is_user_filename(path))


def cell_number(path: str) -> int | None:
    """The execution count of the notebook cell IPython compiled to ``path`` (ipykernel
    names cells ``/tmp/ipykernel_<pid>/<hash>.py``), or None."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if callable(get) else None
    filenames = getattr(getattr(shell, "compile", None), "_filename_map", None)
    number = filenames.get(path) if isinstance(filenames, dict) else None
    return number if isinstance(number, int) else None


def line_label(path: str, line: int | str) -> str:
    """``In [5], line 3`` for a notebook cell, ``pkg/module.py:3`` for a file."""
    number = cell_number(path)
    if number is not None:
        return f"In [{number}], line {line}"
    if _OTHER_SESSION.search(path):
        return f"a notebook cell, line {line}"
    if path.startswith("<"):
        return f"{path}:{line}"
    best = _import_root(path)
    return f"{path[len(best) :] if best else path}:{line}"


def _import_root(path: str) -> str:
    """The longest of the working directory and ``sys.path`` that ``path`` lies under ('' for
    none), with its trailing separator."""
    roots = [r for r in (os.getcwd(), *sys.path) if r and os.path.isabs(r)]
    best = ""
    for root in roots:
        root = root.rstrip(os.sep) + os.sep
        if path.startswith(root) and len(root) > len(best):
            best = root
    return best


def portable_source(source: str) -> str:
    """A recorded ``file:line`` without this machine's absolute path, for records that
    travel (plan files): ``pkg/module.py:44`` from its import root or the working directory,
    as :func:`line_label` shows it; ``ipykernel_123/456.py:3`` for a notebook cell (read back
    as "a notebook cell, line 3"); else the file's name. Anything else is returned as it is,
    so the function is idempotent."""
    path, sep, line = source.rpartition(":")
    if not sep or not line.isdigit() or not os.path.isabs(path):
        return source
    session = _OTHER_SESSION.search(path)
    if session is not None:
        return f"{path[session.start() :]}:{line}"
    root = _import_root(path)
    return f"{path[len(root) :] if root else os.path.basename(path)}:{line}"


def source_label(source: str, *, missing: str = "?") -> str:
    """A recorded ``file:line`` as a person reads it (:func:`line_label`).

    ``missing`` is what an empty source reads (a collective no user line asked for); a
    source inside shardlab's own machinery reads the same (it is never the user's line).
    """
    if not source:
        return missing
    path, sep, line = source.rpartition(":")
    if not sep or not line.isdigit():
        return source
    if is_own_file(path):
        return missing
    return line_label(path, line)


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
    return line_label(path, line), linecache.getline(path, line).strip()


def user_frame_of_stack() -> tuple[str, str] | None:
    """The innermost user frame of the running Python stack: its label and line text (the
    line that called into JAX, for a check that runs inside the call)."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if _is_user_file(path):
            line = frame.f_lineno
            return line_label(path, line), linecache.getline(path, line).strip()
        frame = frame.f_back
    return None


def user_frame_of_exception(error: BaseException) -> tuple[str, str] | None:
    """The innermost user frame of an exception's traceback: its label and line text."""
    import traceback

    frames = [f for f in traceback.extract_tb(error.__traceback__) if _is_user_file(f.filename)]
    if not frames:
        return None
    last = frames[-1]
    return line_label(last.filename, last.lineno or 0), (last.line or "").strip()
