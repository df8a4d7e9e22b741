"""A pytree's array leaves and the rest: the one way shardlab takes a value apart to pass
its arrays through a program and rebuild it after (graph cells' inputs, outputs and
``print`` arguments, compare and bisect's functions of the arrays alone, the equivalence
rule's program length, converted control flow's operands).

``parallel/arguments.py`` splits a function's arguments differently on purpose: Python
numbers are traced there, as ``jax.jit`` traces them, and static leaves are checked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

__all__ = [
    "Parts",
    "apply_order",
    "as_numpy",
    "dynamic_part",
    "is_array",
    "is_jax_array",
    "order_of",
    "split",
]


def is_array(leaf: object) -> bool:
    """A leaf a program takes as an argument: a JAX array or a numeric NumPy array."""
    if isinstance(leaf, jax.Array):
        return True
    return isinstance(leaf, np.ndarray) and leaf.dtype != object


def is_jax_array(leaf: object) -> bool:
    """An array leaf of a value made while tracing (outputs, ``print`` arguments)."""
    return isinstance(leaf, jax.Array)


def as_numpy(value: Any) -> np.ndarray:
    """A leaf as a NumPy array on the host (a PRNG key as its key data; bfloat16 kept)."""
    if isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        value = jax.random.key_data(value)
    return np.asarray(value)


@dataclass(frozen=True)
class Parts:
    """A pytree taken apart: its structure, where its array leaves were, the other leaves
    (``None`` where an array goes) and its dicts' key order where it is not the sorted one."""

    treedef: Any
    array_positions: tuple[int, ...]
    static_leaves: tuple[Any, ...]
    order: Any = None

    def rebuild(self, arrays: Sequence[Any]) -> Any:
        """The pytree again, with ``arrays`` (one per array position, in order) put back."""
        leaves = list(self.static_leaves)
        for position, array in zip(self.array_positions, arrays, strict=True):
            leaves[position] = array
        return apply_order(jax.tree_util.tree_unflatten(self.treedef, leaves), self.order)


def split(tree: Any, is_leaf_array: Callable[[object], bool] = is_array) -> tuple[Parts, list[Any]]:
    """Takes ``tree`` apart: its parts, and its leaves for which ``is_leaf_array`` holds."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    positions = tuple(i for i, leaf in enumerate(leaves) if is_leaf_array(leaf))
    arrays_at = set(positions)  # a big pytree is split on every run: no tuple scans
    static_leaves = tuple(None if i in arrays_at else leaf for i, leaf in enumerate(leaves))
    return Parts(treedef, positions, static_leaves, order_of(tree)), [leaves[i] for i in positions]


def order_of(tree: Any) -> Any:
    """The key order of the plain dicts in ``tree`` (a skeleton through dicts, lists and
    tuples), or None where every dict's keys are sorted: JAX rebuilds dicts with sorted
    keys, and code that iterates over a dict must see the order the user wrote."""
    kind = type(tree)
    if kind is dict:
        children = tuple(order_of(v) for v in tree.values())
        keys = tuple(tree)
        try:
            ordered = keys == tuple(sorted(keys))
        except TypeError:
            ordered = False
        if ordered and all(c is None for c in children):
            return None
        return ("dict", keys, children)
    if kind is list or kind is tuple:
        children = tuple(order_of(v) for v in tree)
        return None if all(c is None for c in children) else ("seq", children)
    return None


def apply_order(value: Any, order: Any) -> Any:
    """``value`` with its dicts' keys in the ``order`` :func:`order_of` recorded."""
    if order is None:
        return value
    if order[0] == "dict" and type(value) is dict and len(value) == len(order[1]):
        return {k: apply_order(value[k], c) for k, c in zip(order[1], order[2], strict=True)}
    if order[0] == "seq" and type(value) in (list, tuple) and len(value) == len(order[1]):
        return type(value)(apply_order(v, c) for v, c in zip(value, order[1], strict=True))
    return value


def dynamic_part(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
) -> tuple[Callable[..., Any], list[Any]]:
    """``fn`` as a function of the array leaves of its arguments (the rest closed over),
    and those arrays."""
    parts, arrays = split((tuple(args), kwargs))

    def dynamic(*values: Any) -> Any:
        a, k = parts.rebuild(values)
        return fn(*a, **k)

    dynamic.__name__ = getattr(fn, "__name__", "fn")
    return dynamic, arrays
