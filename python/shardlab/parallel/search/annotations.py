"""Annotations: the shardings a user fixes before the search, keyed by argument paths.

A path is ``"params/w1"`` (the first component is a parameter name of ``fn`` or a position)
or a tuple like ``(0, "w1")``. A path to a subtree fixes every array leaf under it. Every error
names the offending key and lists what would be valid.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from shardlab.parallel.cost import layouts as L
from shardlab.parallel.errors import SearchError
from shardlab.parallel.graph.trace import leaf_paths, path_text
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
            valid = [path_text(p) for p in paths]
            close = difflib.get_close_matches(path_text(comps), valid, n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise SearchError(
                f"annotation {key!r} names no argument; valid paths are "
                f"{', '.join(map(repr, valid))}{hint}"
            )
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
