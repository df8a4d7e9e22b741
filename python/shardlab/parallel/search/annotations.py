"""Annotations: the shardings a user fixes before the search, keyed by argument paths.

A path is ``"params/w1"`` (the first component is a parameter name of ``fn`` or a position)
or a tuple like ``(0, "w1")``. A path to a subtree fixes every array leaf under it. Every error
names the offending key and what would be valid: every path when there are few, else the
closest few, some near paths and how many there are (the message stays short).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from shardlab.parallel.arguments import leaf_paths, path_text
from shardlab.parallel.cost import layouts as L
from shardlab.parallel.errors import SearchError
from shardlab.parallel.specs import ShardingSpecError, check_spec


def _normalise(key: Any, paths: list[tuple[str, ...]]) -> tuple[str, ...]:
    if isinstance(key, str):
        comps = tuple(c for c in key.split("/") if c)
    elif isinstance(key, (tuple, list)):
        comps = tuple(str(c) for c in key)
    elif isinstance(key, int):
        comps = (str(key),)
    else:
        raise SearchError(
            f"annotation key {key!r}: use a path string like 'params/w1' or a tuple like (0, 'w1')"
        )
    if comps and comps[0].isdigit():  # a position: map it to the name the paths use
        pos = int(comps[0])
        firsts = list(dict.fromkeys(p[0] for p in paths))
        if pos < len(firsts):
            comps = (firsts[pos], *comps[1:])
    return comps


LIST_ALL_UP_TO = 12  # paths: list every valid path when there are at most this many
NEAR_PATHS = 5
MAX_MESSAGE = 400  # characters, when near paths are listed (they are dropped to fit)


def unknown_path_message(key: Any, comps: tuple[str, ...], paths: list[tuple[str, ...]]) -> str:
    """Why ``key`` names no argument: every valid path when there are few; otherwise the
    closest (``difflib``, up to 3), up to ``NEAR_PATHS`` paths that share the longest
    existing prefix, and how many paths there are (a message of bounded length)."""
    typed = path_text(comps)
    # Subtree paths are valid keys too ("params/blocks/3"): offer them as suggestions.
    valid = list(dict.fromkeys(path_text(p[:k]) for p in paths for k in range(1, len(p) + 1)))
    leaves = [path_text(p) for p in paths]
    same_depth = [v for v in valid if v.count("/") == typed.count("/")]
    close = difflib.get_close_matches(typed, same_depth, n=3) or difflib.get_close_matches(
        typed, valid, n=3
    )
    hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
    if len(leaves) <= LIST_ALL_UP_TO:
        listed = ", ".join(map(repr, leaves))
        return f"annotation {key!r} names no argument; valid paths are {listed}{hint}"
    depth = 0  # the longest prefix of the typo that some path has
    while depth < len(comps) and any(p[: depth + 1] == comps[: depth + 1] for p in paths):
        depth += 1
    prefix = comps[:depth]
    under = [t for p, t in zip(paths, leaves, strict=True) if p[:depth] == prefix]
    if depth:  # siblings at the first level that differs, not every leaf under the prefix
        level = list(dict.fromkeys(path_text(p[: depth + 1]) for p in paths if p[:depth] == prefix))
        near_pool = level if len(level) > 1 else under
    else:
        near_pool = list(dict.fromkeys(path_text(p[:1]) for p in paths))
    near_pool = [t for t in near_pool if t not in close]
    near = difflib.get_close_matches(typed, near_pool, n=NEAR_PATHS, cutoff=0.0)
    where = f"under {path_text(prefix)!r}" if depth else "at the top level"
    total = f" {len(leaves)} array paths in all (a plan's input_paths lists them)."
    did = f" Did you mean {_alternatives(close)}?" if close else ""
    while True:
        more = len(near_pool) - len(near)
        listed = ", ".join(map(repr, near)) + (f" (+{more} more)" if more else "")
        near_text = f" Near paths {where}: {listed}." if near else ""
        message = f"annotation {key!r} names no argument.{did}{near_text}{total}"
        if len(message) <= MAX_MESSAGE or not near:
            return message
        near = near[:-1]


def _alternatives(options: list[str]) -> str:
    quoted = [repr(o) for o in options]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def resolve_annotations(
    annotations: Mapping[Any, Any] | None,
    fn: Callable[..., Any],
    args: Sequence[Any],
    mesh: Mesh,
) -> dict[int, L.DimAxes]:
    """``{flat input position: layout}`` from user annotations.

    Raises:
        SearchError: an unknown path, or two annotations that disagree on one leaf.
        ShardingSpecError: a spec names an unknown mesh axis or does not divide its dimension.
    """
    if not annotations:
        return {}
    paths = leaf_paths(fn, args)
    shapes = [tuple(getattr(x, "shape", ())) for x in jax.tree_util.tree_leaves(tuple(args))]
    fixed: dict[int, tuple[L.DimAxes, Any]] = {}
    for key, spec in annotations.items():
        comps = _normalise(key, paths)
        hits = [i for i, p in enumerate(paths) if p[: len(comps)] == comps and comps]
        if not hits:
            raise SearchError(unknown_path_message(key, comps, paths))
        if isinstance(spec, NamedSharding):
            spec = spec.spec
        if spec is None:
            spec = PartitionSpec()
        if not isinstance(spec, PartitionSpec):
            raise SearchError(
                f"annotation {key!r}: expected a PartitionSpec, NamedSharding or None, got {spec!r}"
            )
        for i in hits:
            where = f"annotations[{key!r}] ({path_text(paths[i])})"
            try:
                check_spec(spec, shapes[i], mesh, where=where)
            except ShardingSpecError:
                raise
            lay = L.from_spec(spec, len(shapes[i]))
            if i in fixed and fixed[i][0] != lay:
                raise SearchError(
                    f"contradictory annotations for {path_text(paths[i])!r}: {fixed[i][1]!r} "
                    f"says {PartitionSpec(*fixed[i][0])}, {key!r} says {spec}; keep one"
                )
            fixed[i] = (lay, key)
    return {i: lay for i, (lay, _) in fixed.items()}
