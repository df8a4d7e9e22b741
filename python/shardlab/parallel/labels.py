"""Names as the user wrote them: argument paths and source lines.

A plan stores argument paths as ``params/blocks/3/w1`` (stable, JSON-friendly, the keys of
annotations). Views show them as Python would index them — ``params["blocks"][3]["w1"]``,
``batch[0]`` — and fold repeated layers into one group (``params["blocks"][*]["w1"]``).
Source lines (``In [8], line 2``, ``shardlab/examples/transformer.py:44``) have one format
everywhere: ``_core/source.py``, re-exported here for the views.
"""

from __future__ import annotations

import re
from typing import Any

from shardlab._core.source import is_own_file, source_label

__all__ = [
    "COMPILER_INSERTED",
    "group_label",
    "is_own_file",
    "layer_of",
    "path_label",
    "source_label",
    "spec_label",
    "typed_shape",
]

COMPILER_INSERTED = "(compiler-inserted)"
_INDEX = re.compile(r"-?\d+")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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


def _entry(entry: Any) -> str:
    if entry is None or entry == ():
        return "None"
    if isinstance(entry, str):
        return repr(entry)
    if isinstance(entry, (tuple, list)):
        names = [str(a) for a in entry]
        return repr(names[0]) if len(names) == 1 else "(" + ", ".join(map(repr, names)) + ")"
    return str(entry)  # P.UNCONSTRAINED and the like


def spec_label(spec: Any) -> str:
    """A layout as users write it: ``P('data')``, ``P(('data', 'model'))``,
    ``P('data', None)``, ``P()`` — not JAX's ``P('data',)``.

    ``spec`` is a ``PartitionSpec``, a ``NamedSharding`` (its spec), per-dimension mesh axes
    (``(('data',), ())``, kept as long as given), or the text of a spec (JAX's one-entry
    ``P('data',)`` loses its comma).
    """
    if isinstance(spec, str):
        text = spec.strip()
        if text.startswith(("P(", "PartitionSpec(")) and text.endswith(",)"):
            text = text[:-2] + ")"
        return "P(" + text.split("(", 1)[1] if text.startswith("PartitionSpec(") else text
    spec = getattr(spec, "spec", spec)
    if spec is None:
        return "P()"
    return "P(" + ", ".join(_entry(e) for e in tuple(spec)) + ")"


def typed_shape(dtype: Any, shape: Any, dim_axes: Any = ()) -> str:
    """JAX's type notation of a sharded array: ``float32[8@data,256]``,
    ``float32[64@(data,model),16]`` (a dimension split over mesh axes carries them after
    ``@``; ``jax.typeof`` prints explicit shardings this way)."""
    dims = []
    axes = list(dim_axes) + [()] * (len(shape) - len(tuple(dim_axes)))
    for size, entry in zip(shape, axes, strict=False):
        names = (entry,) if isinstance(entry, str) else tuple(entry or ())
        if not names:
            dims.append(str(size))
        elif len(names) == 1:
            dims.append(f"{size}@{names[0]}")
        else:
            dims.append(f"{size}@({','.join(map(str, names))})")
    name = getattr(dtype, "name", None) or str(dtype)
    return f"{name}[{','.join(dims)}]"
