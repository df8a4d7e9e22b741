"""Validate sharding spec pytrees against arguments, before anything is compiled.

Every error names the argument path, the dimension and sizes, and the nearest valid spec.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jax.tree_util import keystr, tree_flatten, tree_flatten_with_path

from shardlab.parallel.arguments import is_traced
from shardlab.parallel.errors import ShardingSpecError

SpecLeaf = PartitionSpec | NamedSharding | None


def _is_spec_leaf(x: Any) -> bool:
    return x is None or isinstance(x, (PartitionSpec, NamedSharding))


def spec_entries(spec: PartitionSpec) -> list[tuple[str, ...]]:
    """Per dimension, the mesh axes of a ``PartitionSpec`` (``()`` for unsplit)."""
    out: list[tuple[str, ...]] = []
    for entry in spec:
        if entry is None or entry is PartitionSpec.UNCONSTRAINED:
            out.append(())
        elif isinstance(entry, str):
            out.append((entry,))
        else:
            out.append(tuple(entry))
    return out


def make_spec(dim_axes: Sequence[Sequence[str]]) -> PartitionSpec:
    """A ``PartitionSpec`` from per-dimension axes, trailing unsplit dims dropped."""
    entries: list[Any] = [
        None if not axes else axes[0] if len(axes) == 1 else tuple(axes) for axes in dim_axes
    ]
    while entries and entries[-1] is None:
        entries.pop()
    return PartitionSpec(*entries)


def _one_level(x: Any) -> tuple[list[Any], Any]:
    return tree_flatten(x, is_leaf=lambda y: y is not x)


def broadcast_specs(specs: Any, args: Any, *, what: str) -> list[tuple[str, Any, SpecLeaf]]:
    """Match a spec pytree (or a prefix of one) to ``args``.

    Returns:
        ``(path, leaf, spec)`` for every array leaf of ``args``.

    Raises:
        ShardingSpecError: when the structures differ; names the first differing path.
    """
    out: list[tuple[str, Any, SpecLeaf]] = []

    def walk(spec: Any, arg: Any, path: str) -> None:
        if _is_spec_leaf(spec):
            for sub_path, leaf in tree_flatten_with_path(arg)[0]:
                out.append((path + keystr(sub_path), leaf, spec))
            return
        spec_children, spec_def = _one_level(spec)
        arg_children, arg_def = _one_level(arg)
        if isinstance(spec, (list, tuple)) and isinstance(arg, (list, tuple)):
            same = len(spec) == len(arg)
        elif isinstance(spec, dict) and isinstance(arg, dict):
            same = sorted(map(str, spec)) == sorted(map(str, arg))
            if same:
                spec_children = [spec[k] for k in sorted(spec, key=str)]
                arg_children = [arg[k] for k in sorted(arg, key=str)]
        else:
            same = spec_def == arg_def
        if not same or len(spec_children) != len(arg_children):
            raise ShardingSpecError(
                f"{what}{path or ''}: the spec pytree does not match the arguments: spec has "
                f"{_describe(spec)}, the argument has {_describe(arg)}. Give one PartitionSpec "
                f"(or None) per array, or one spec for a whole subtree; e.g. {what}{path} = "
                f"{_suggest_tree(arg)}"
            )
        keys = _child_keys(arg)
        for key, s, a in zip(keys, spec_children, arg_children, strict=True):
            walk(s, a, path + key)

    walk(specs, args, "")
    return out


def _child_keys(x: Any) -> list[str]:
    if isinstance(x, dict):
        return [f"[{k!r}]" for k in sorted(x, key=str)]
    paths = tree_flatten_with_path(x, is_leaf=lambda y: y is not x)[0]
    return [keystr(p) for p, _ in paths]


def _describe(x: Any) -> str:
    if isinstance(x, dict):
        return f"dict keys {sorted(map(str, x))}"
    if isinstance(x, (list, tuple)):
        return f"{type(x).__name__} of length {len(x)}"
    if hasattr(x, "shape"):
        return f"an array of shape {tuple(x.shape)}"
    return type(x).__name__


def _suggest_tree(arg: Any) -> str:
    if isinstance(arg, dict):
        return "{" + ", ".join(f"{k!r}: P()" for k in arg) + "}"
    if isinstance(arg, (list, tuple)):
        inner = ", ".join("P()" for _ in arg)
        return f"({inner},)" if isinstance(arg, tuple) and len(arg) == 1 else f"({inner})"
    return "P()"


def check_spec(spec: PartitionSpec, shape: Sequence[int], mesh: Mesh, *, where: str) -> None:
    """Raise ``ShardingSpecError`` unless ``spec`` is valid for ``shape`` on ``mesh``."""
    sizes = {str(k): int(v) for k, v in mesh.shape.items()}
    entries = spec_entries(spec)
    problems: list[str] = []
    if len(entries) > len(shape):
        problems.append(
            f"the spec has {len(entries)} entries but the array has {len(shape)} dimensions "
            f"(shape {tuple(shape)})"
        )
    seen: set[str] = set()
    fixed: list[list[str]] = []
    written = {a for axes in entries for a in axes if a in sizes}  # valid axes the spec names
    for dim, axes in enumerate(entries[: len(shape)]):
        keep: list[str] = []
        for axis in axes:
            if axis not in sizes:
                sub, hint = _replacement(axis, int(shape[dim]), keep, sizes, written | seen)
                problems.append(
                    f"dimension {dim} names mesh axis {axis!r}, which the mesh does not have; "
                    f"mesh axes are {sizes}{hint}"
                )
                if sub is None:
                    continue
                axis = sub
            if axis in seen:
                problems.append(f"mesh axis {axis!r} is used twice (again in dimension {dim})")
                continue
            seen.add(axis)
            keep.append(axis)
        product = math.prod(sizes[a] for a in keep)
        if keep and shape[dim] % product:
            problems.append(
                f"dimension {dim} has size {shape[dim]}, not divisible by {product} = "
                + " × ".join(f"{a}={sizes[a]}" for a in keep)
            )
            while keep and shape[dim] % math.prod(sizes[a] for a in keep):
                keep.pop()
        fixed.append(keep)
    if problems:
        raise ShardingSpecError(
            f"{where}: spec {spec} does not fit the array of shape {tuple(shape)} on mesh "
            f"{sizes}: " + "; ".join(problems) + f". Nearest valid spec: {make_spec(fixed)}"
        )


def _replacement(
    axis: str, size: int, keep: Sequence[str], sizes: dict[str, int], taken: set[str]
) -> tuple[str | None, str]:
    """For a mesh axis name the mesh lacks: the axis the nearest valid spec puts in its
    place, and a hint saying why. The closest name (``difflib``) when it is free and
    divides ``size`` (with the axes ``keep`` already on the dimension), else the free axis
    that divides with the most similar name, else ``None`` (the dimension stays unsplit)."""
    base = math.prod(sizes[a] for a in keep)
    free = [a for a in sizes if a not in taken and a not in keep and size % (base * sizes[a]) == 0]
    lowered = {a.lower(): a for a in sizes}
    close = [lowered[c] for c in difflib.get_close_matches(axis.lower(), list(lowered), n=1)]
    if close and close[0] in free:
        return close[0], f" (did you mean {close[0]!r}?)"
    ranked = sorted(
        free, key=lambda a: -difflib.SequenceMatcher(None, axis.lower(), a.lower()).ratio()
    )
    if close:
        why = (
            "is already used"
            if close[0] in taken or close[0] in keep
            else f"does not divide size {size}"
        )
        head = f" (did you mean {close[0]!r}? it {why}"
    else:
        head = " (no mesh axis has a similar name"
    if ranked:
        return ranked[0], f"{head}; {ranked[0]!r} is free and divides size {size})"
    return None, f"{head}; no free mesh axis divides size {size}, so leave it unsplit)"


def resolve_shardings(
    specs: Any, args: Sequence[Any], mesh: Mesh, *, what: str = "in_shardings"
) -> list[tuple[str, tuple[int, ...], NamedSharding | None]]:
    """Validate a spec pytree against ``args`` and turn every leaf into a ``NamedSharding``.

    Args:
        specs: ``None`` (all left to the partitioner), or a pytree (prefix) of
            ``PartitionSpec``/``NamedSharding``/``None`` matching ``args``.
        args: the positional arguments (arrays or ``jax.ShapeDtypeStruct``).
        mesh: the mesh the specs name axes of.
        what: the argument name used in messages.

    Returns:
        ``(path, shape, sharding or None)`` per traced leaf of ``args`` (arrays and Python
        numbers; static leaves such as an activation function are skipped, whatever spec
        they were given: ``parallel/arguments.py``).
    """
    if specs is None:
        specs = tuple(None for _ in args)
    elif not _is_spec_leaf(specs) and len(args) == 1:
        if not (isinstance(specs, (list, tuple)) and len(specs) == 1):
            specs = (specs,)
    out = []
    for path, leaf, spec in broadcast_specs(specs, tuple(args), what=what):
        if not is_traced(leaf):
            continue
        shape = tuple(int(d) for d in getattr(leaf, "shape", ()))
        if spec is None:
            out.append((path, shape, None))
            continue
        if isinstance(spec, NamedSharding):
            if dict(spec.mesh.shape) != dict(mesh.shape):
                raise ShardingSpecError(
                    f"{what}{path}: NamedSharding is on mesh {dict(spec.mesh.shape)}, not on "
                    f"the analysis mesh {dict(mesh.shape)}; use NamedSharding(mesh, "
                    f"{spec.spec}) or the bare PartitionSpec"
                )
            spec = spec.spec
        check_spec(spec, shape, mesh, where=f"{what}{path}")
        out.append((path, shape, NamedSharding(mesh, spec)))
    return out


def unflatten_like(args: Sequence[Any], flat: Sequence[Any]) -> tuple[Any, ...]:
    """Rebuild the ``args`` tuple structure with ``flat`` leaves."""
    treedef = jax.tree_util.tree_structure(tuple(args))
    return jax.tree_util.tree_unflatten(treedef, list(flat))
