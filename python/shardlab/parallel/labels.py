"""Names as the user wrote them: argument paths and source lines.

A plan stores argument paths as ``params/blocks/3/w1`` (stable, JSON-friendly, the keys of
annotations). Views show them as Python would index them — ``params["blocks"][3]["w1"]``,
``batch[0]`` — and fold repeated layers into one group (``params["blocks"][*]["w1"]``).
Source lines read ``In [8], line 2`` for a notebook cell (IPython's map from its compiled
cell files to execution counts, read through ``sys.modules``: the core never imports
IPython) and ``shardlab/examples/transformer.py:44`` for a file; shardlab's own files are
never named as the source of anything.
"""

from __future__ import annotations

import os
import re
import sys

__all__ = [
    "COMPILER_INSERTED",
    "group_label",
    "is_own_file",
    "layer_of",
    "path_label",
    "source_label",
]

COMPILER_INSERTED = "(compiler-inserted)"
_INDEX = re.compile(r"-?\d+")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OWN = tuple(
    os.sep + os.path.join("shardlab", part) + os.sep
    for part in ("engine", "kernel", "parallel", "widgets", "bench")
)


def _component(part: str) -> str:
    if part == "*" or _INDEX.fullmatch(part):
        return f"[{part}]"
    return "[" + repr(part).replace("'", '"') + "]"


def path_label(path: str) -> str:
    """``params/blocks/3/w1`` → ``params["blocks"][3]["w1"]``; ``batch/0`` → ``batch[0]``.

    The first component is the argument's name (or its position, ``arg0``-style when the
    function's signature was unknown); later ones index into it. A digit component is shown
    as a sequence index (a dict with string keys ``"3"`` would read the same: rare).
    """
    if not path:
        return "?"
    first, *rest = path.split("/")
    head = f"args[{first}]" if _INDEX.fullmatch(first) else first
    return head + "".join(_component(p) for p in rest)


def layer_of(path: str) -> tuple[str, str, str] | None:
    """``("params/blocks", "3", "w1")`` for a path with a layer index, else None: the
    prefix up to the last numeric component, that index, and the rest."""
    parts = path.split("/")
    for i in range(len(parts) - 1, 0, -1):
        if _INDEX.fullmatch(parts[i]) and i < len(parts) - 1:
            return "/".join(parts[:i]), parts[i], "/".join(parts[i + 1 :])
    return None


def group_label(path: str) -> str:
    """The label of a path's layer group: ``params["blocks"][*]["w1"]`` (the path itself
    when it has no layer index)."""
    found = layer_of(path)
    if found is None:
        return path_label(path)
    prefix, _, rest = found
    return path_label(f"{prefix}/*/{rest}")


def is_own_file(path: str) -> bool:
    """A file of shardlab's own machinery (not its ``examples/``, which are user models)."""
    return any(own in path for own in _OWN)


def _cell_number(path: str) -> int | None:
    """The execution count of the notebook cell IPython compiled to ``path`` (ipykernel
    names cells ``/tmp/ipykernel_<pid>/<hash>.py``), or None."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if callable(get) else None
    filenames = getattr(getattr(shell, "compile", None), "_filename_map", None)
    number = filenames.get(path) if isinstance(filenames, dict) else None
    return number if isinstance(number, int) else None


def source_label(source: str, *, missing: str = "?") -> str:
    """A ``file:line`` as a person reads it: ``In [8], line 2`` for a notebook cell, the path
    from its import root for a module (``shardlab/examples/transformer.py:44``).

    ``missing`` is what an empty source reads (``COMPILER_INSERTED`` for a collective, whose
    instruction no user line asked for); a source inside shardlab's own machinery reads the
    same (it is never the user's line).
    """
    if not source:
        return missing
    path, sep, line = source.rpartition(":")
    if not sep or not line.isdigit():
        return source
    if is_own_file(path):
        return missing
    cell = _cell_number(path)
    if cell is not None:
        return f"In [{cell}], line {line}"
    if re.search(r"ipykernel_\d+", path):  # a cell of another session (a saved record)
        return f"a notebook cell, line {line}"
    roots = [r for r in (*sys.path, os.getcwd()) if r and os.path.isabs(r)]
    best = ""
    for root in roots:
        root = root.rstrip(os.sep) + os.sep
        if path.startswith(root) and len(root) > len(best):
            best = root
    return f"{path[len(best) :]}:{line}" if best else source
