"""The cell a kernel died in, told by the kernel that replaces it.

Some deaths happen below Python, where no error can be raised: native code aborting the
process (XLA on a program the array-size guard does not recognise), the OS killing it for
memory, a segfault in an extension. The notebook then only hears "the kernel died" and the
next cell runs in a fresh kernel with nothing said about why.

So the kernel notes which request it is running in a small file beside its connection file
(``kernel-<id>.json`` → ``kernel-<id>.shardlab-cell.json``) before it runs it, and removes
the note when the request ends or the kernel shuts down. A kernel that finds a note from
another process when it starts — Jupyter restarts a dead kernel on the same connection file —
knows its predecessor died in that cell: it logs it, and prints it above the output of the
first cell it runs. Writing the note costs one small file write per request.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUFFIX = ".shardlab-cell.json"
_FIRST_LINE_CHARS = 200


@dataclass(frozen=True)
class RunningCell:
    """What the note says about the request a kernel was running."""

    pid: int
    execution_count: int | None
    cell_id: str | None
    first_line: str
    silent: bool
    started: float  # time.time()

    def notice(self) -> str:
        """The sentence the next kernel prints."""
        which = f"In [{self.execution_count}]" if self.execution_count else "a cell"
        if self.silent:
            which = "a silent request from the front end"
        cell_id = f" (cell id {self.cell_id})" if self.cell_id else ""
        started = time.strftime("%H:%M:%S", time.localtime(self.started))
        return (
            f"[shardlab] The previous kernel (pid {self.pid}) died while running {which}"
            f"{cell_id}, started at {started}: `{self.first_line}`. Its variables are lost. "
            "A kernel dies without a Python error when native code aborts (XLA on a program "
            "it cannot compile) or the system kills it (out of memory); see "
            "docs/guide/kernel.md."
        )


def note_path(connection_file: str | os.PathLike[str] | None) -> Path | None:
    """Where a kernel with this connection file keeps its note (None without one)."""
    if not connection_file:
        return None
    path = Path(connection_file)
    return path.with_name(path.stem + SUFFIX)


def first_line(code: str) -> str:
    """The cell's first line with code (a mode line such as ``%%eager`` included)."""
    for line in code.splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= _FIRST_LINE_CHARS else line[:_FIRST_LINE_CHARS] + "…"
    return ""


class LastCell:
    """The note of one kernel process: written before each request, removed after it."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.pid = os.getpid()

    def take_predecessor(self) -> RunningCell | None:
        """The note a dead predecessor left (removed once read), or None."""
        if self.path is None:
            return None
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        with contextlib.suppress(OSError):
            self.path.unlink()
        try:
            found = RunningCell(
                pid=int(data["pid"]),
                execution_count=data.get("execution_count"),
                cell_id=data.get("cell_id"),
                first_line=str(data.get("first_line", "")),
                silent=bool(data.get("silent", False)),
                started=float(data.get("started", 0.0)),
            )
        except (KeyError, TypeError, ValueError):
            return None
        return None if found.pid == self.pid else found

    def begin(
        self, code: str, *, execution_count: int | None, cell_id: str | None, silent: bool
    ) -> None:
        """Notes the request about to run (written whole, then renamed into place)."""
        if self.path is None:
            return
        data: dict[str, Any] = {
            "pid": self.pid,
            "execution_count": execution_count,
            "cell_id": cell_id,
            "first_line": first_line(code),
            "silent": silent,
            "started": time.time(),
        }
        partial = self.path.with_name(self.path.name + ".partial")
        try:
            partial.write_text(json.dumps(data))
            os.replace(partial, self.path)
        except OSError:  # a read-only runtime folder: the kernel runs without notes
            self.path = None

    def end(self) -> None:
        """The request ended (or the kernel shuts down): no note."""
        if self.path is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
