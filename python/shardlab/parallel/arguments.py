"""Example arguments as users pass them: which leaves are traced, which are static.

A function's example arguments are pytrees: a params dict, an equinox module, a dataclass.
Their leaves are split with the filter semantics equinox users know (``eqx.is_array``), with
one difference for Python numbers, which are traced as ``jax.jit`` traces them:

- **traced**: ``jax.Array`` (wherever it is placed, tracers included), ``np.ndarray`` and
  NumPy scalars, ``jax.ShapeDtypeStruct``, and Python ``int``/``float``/``complex``
  (weakly typed scalars, as under ``jax.jit``);
- **static**: everything else: functions (an ``eqx.nn.MLP``'s activation), strings,
  ``bool`` flags (``eqx.nn.Dropout(inference=True)``: Python branches on them), other
  hashable objects. They are closed over when tracing, as ``eqx.filter_jit`` does, so a plan
  is made for their values. A leaf that is neither (unhashable, or an unregistered
  dataclass holding arrays) raises ``ArgumentError`` naming its path.

Analysis never reads the arguments' placement: it traces and lowers on
``jax.ShapeDtypeStruct``s without a sharding (``abstract``), so arrays committed to another
mesh, another spec or a single device all work; ``in_shardings`` alone decides.

Everything downstream works on the *dynamic tree*: the arguments with every static leaf
replaced by ``None`` (``eqx.partition``'s convention), whose leaves are exactly the traced
ones. ``Traced.in_tree`` is its structure, ``Plan.in_shardings`` is shaped like it.
"""

from __future__ import annotations

import dataclasses
import inspect
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.core import Tracer
from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey

from shardlab.parallel.errors import ArgumentError

_ARRAYS = (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)


def is_traced(x: Any) -> bool:
    """Whether a pytree leaf is traced (an array, or a Python number other than ``bool``)."""
    if isinstance(x, _ARRAYS):
        return True
    return isinstance(x, (int, float, complex)) and not isinstance(x, bool)


def abstract(x: Any) -> jax.ShapeDtypeStruct:
    """A traced leaf as a ``jax.ShapeDtypeStruct`` without a sharding (weak type kept)."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type)
    aval = jax.typeof(x)
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


def abstract_args(args: Any) -> Any:
    """``args`` with every traced leaf as an unsharded ``jax.ShapeDtypeStruct`` (static
    leaves kept): what tracing and lowering take, whatever the arguments' placement."""
    return jax.tree_util.tree_map(lambda x: abstract(x) if is_traced(x) else x, args)


@dataclasses.dataclass(frozen=True)
class Split:
    """A pytree's leaves split into traced and static ones.

    Attributes:
        treedef: the structure of the whole tree.
        traced: per leaf, whether it is traced.
        statics: per leaf, its value when static (``None`` where traced).
        dynamic_treedef: the structure of the dynamic tree (static leaves ``None``).
        paths: per leaf, its path (``params/w1``), for messages.
    """

    treedef: Any
    traced: tuple[bool, ...]
    statics: tuple[Any, ...]
    dynamic_treedef: Any
    paths: tuple[str, ...]

    @property
    def has_statics(self) -> bool:
        return not all(self.traced)

    def dynamic(self, tree: Any) -> Any:
        """The dynamic tree of ``tree``: static leaves replaced by ``None``.

        ``tree`` is the whole tree (its static leaves must equal the ones split) or already a
        dynamic tree (``eqx.filter(model, eqx.is_array)``), returned as it is.

        Raises:
            TypeError: ``tree`` has another structure.
            ArgumentError: a static leaf differs from the one split (the plan was made for
                that value).
        """
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        if not self.has_statics and treedef == self.treedef:
            return tree
        if treedef == self.treedef:
            for i, (leaf, is_dyn) in enumerate(zip(leaves, self.traced, strict=True)):
                if not is_dyn and not _same(leaf, self.statics[i]):
                    raise ArgumentError(
                        f"argument {self.paths[i]} is static (not an array): it was "
                        f"{_short(self.statics[i])} when this was traced, got {_short(leaf)}; "
                        "trace (shardlab.search) again for the new value, or make it an array"
                    )
            kept = [x for x, is_dyn in zip(leaves, self.traced, strict=True) if is_dyn]
            return jax.tree_util.tree_unflatten(self.dynamic_treedef, kept)
        if treedef == self.dynamic_treedef:
            return tree
        raise TypeError(
            f"expected arguments of structure {self.treedef}, got {treedef}; trace "
            "(shardlab.search) again for these arguments"
        )

    def combine(self, dynamic: Any) -> Any:
        """The whole tree from a dynamic tree: its leaves in the traced places, the static
        leaves back in theirs."""
        if not self.has_statics:
            return dynamic
        return self.with_traced(jax.tree_util.tree_leaves(dynamic))

    def with_traced(self, leaves: Sequence[Any]) -> Any:
        """The whole tree with ``leaves`` (one per traced leaf) in the traced places."""
        it = iter(leaves)
        full = [
            next(it) if is_dyn else s for is_dyn, s in zip(self.traced, self.statics, strict=True)
        ]
        return jax.tree_util.tree_unflatten(self.treedef, full)


def split(tree: Any, fn: Callable[..., Any] | None = None, *, check: bool = True) -> Split:
    """Split ``tree`` (a tuple of positional arguments, or an output) into traced leaves and
    static ones.

    Args:
        tree: the pytree.
        fn: the function ``tree`` holds the positional arguments of (names paths in messages).
        check: raise for a leaf that can be neither traced nor static (arguments are checked;
            outputs are not, their static leaves are only put back).

    Raises:
        ArgumentError: a leaf is not an array and not hashable (so it cannot be static), or
            is an unregistered dataclass holding arrays (which would be baked in as
            constants); the message names the leaf and the fix.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    traced = tuple(is_traced(x) for x in leaves)
    if check:  # arguments: a tuple of positional arguments, whose paths messages name
        paths = tuple(path_text(p) for p in leaf_paths(fn, tree))
    else:
        paths = tuple(str(i) for i in range(len(leaves)))
    if check:
        for i, (x, is_dyn) in enumerate(zip(leaves, traced, strict=True)):
            if not is_dyn:
                _check_static(x, paths[i])
    statics = tuple(None if is_dyn else x for x, is_dyn in zip(leaves, traced, strict=True))
    dyn_leaves = [x if is_dyn else None for x, is_dyn in zip(leaves, traced, strict=True)]
    dynamic_treedef = (
        jax.tree_util.tree_structure(jax.tree_util.tree_unflatten(treedef, dyn_leaves))
        if not all(traced)
        else treedef
    )
    return Split(treedef, traced, statics, dynamic_treedef, paths)


def _check_static(x: Any, path: str) -> None:
    fix = (
        "register its type as a pytree (jax.tree_util.register_dataclass, or an eqx.Module) "
        "so its arrays are traced, or split it yourself (eqx.partition(model, eqx.is_array)) "
        "and close over the static part"
    )
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        held = [
            f.name
            for f in dataclasses.fields(x)
            if any(isinstance(v, _ARRAYS) for v in jax.tree_util.tree_leaves(getattr(x, f.name)))
        ]
        if held:
            raise ArgumentError(
                f"argument {path} is a {type(x).__name__} dataclass that is not a pytree but "
                f"holds arrays ({', '.join(held)}): they would be baked in as constants; {fix}"
            )
    try:
        hash(x)
    except TypeError:
        raise ArgumentError(
            f"argument {path} is a {type(x).__name__}, which is neither an array (traced) nor "
            f"hashable (static): {fix}"
        ) from None


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # an __eq__ that does not give a bool: not the same value
        return False


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def drop_static(tree: Any) -> Any:
    """``tree`` with every static leaf replaced by ``None`` (what a traced function returns)."""
    return jax.tree_util.tree_map(lambda x: x if is_traced(x) else None, tree)


# fn -> {(treedef, statics): wrapper}; weak on fn so a wrapper lives as long as its function,
# and the same wrapper (so JAX's compile cache) serves repeated analyses of one function.
_BOUND: weakref.WeakKeyDictionary[Any, dict[Any, Callable[..., Any]]] = weakref.WeakKeyDictionary()


def bind(fn: Callable[..., Any], parts: Split) -> Callable[..., Any]:
    """``fn`` as a function of the dynamic tree: static arguments closed over, static
    outputs dropped (``None``). The same function and split give the same wrapper."""
    key = (parts.treedef, parts.statics)
    try:
        per: dict[Any, Callable[..., Any]] | None = _BOUND.setdefault(fn, {})
        cached = per.get(key) if per is not None else None
    except TypeError:  # fn not weakly referenceable, or the statics not hashable: no cache
        per, cached = None, None
    if cached is not None:
        return cached
    ref = _reference(fn)

    def bound(*dynamic: Any) -> Any:
        f = ref()
        assert f is not None, "the function was collected while being traced"
        return drop_static(f(*parts.combine(dynamic)))

    # the user's name in jaxpr and HLO op names (``jit(layer)/dot_general``), not "bound"
    bound.__name__ = bound.__qualname__ = getattr(fn, "__name__", "fn")
    if per is not None:
        per[key] = bound
    return bound


def _reference(fn: Any) -> Callable[[], Any]:
    try:
        return weakref.ref(fn)
    except TypeError:
        return lambda: fn


def eval_shape(fn: Callable[..., Any], *args: Any) -> Any:
    """``jax.eval_shape`` for arguments as users pass them (placed anywhere, static leaves
    included); static outputs come back as they are."""
    parts = split(tuple(args), fn)
    seen: list[Split] = []

    def run(*dynamic: Any) -> Any:
        out = fn(*parts.combine(dynamic))
        seen.append(split(out, check=False))
        return drop_static(out)

    shapes = jax.eval_shape(run, *parts.dynamic(abstract_args(tuple(args))))
    return seen[-1].combine(shapes)


def place(leaf: Any, sharding: Any) -> Any:
    """``leaf`` on ``sharding``: moved only when it is an array placed otherwise (a tracer,
    a Python number or an array already there is returned as it is)."""
    if isinstance(leaf, Tracer) or sharding is None:
        return leaf
    if isinstance(leaf, jax.Array):
        current = leaf.sharding
        if current == sharding or current.is_equivalent_to(sharding, leaf.ndim):
            return leaf
        return jax.device_put(leaf, sharding)
    if isinstance(leaf, (np.ndarray, np.generic)):
        return jax.device_put(leaf, sharding)
    return leaf


# -- argument paths -------------------------------------------------------------------------
def _component(key: Any) -> str:
    if isinstance(key, DictKey):
        return str(key.key)
    if isinstance(key, SequenceKey):
        return str(key.idx)
    if isinstance(key, GetAttrKey):
        return key.name
    if isinstance(key, FlattenedIndexKey):
        return str(key.key)
    return str(key)


def leaf_paths(fn: Callable[..., Any] | None, args: Sequence[Any]) -> list[tuple[str, ...]]:
    """Per flat argument leaf, its path as strings; the first component is the parameter
    name of ``fn`` when known (else the position)."""
    try:
        names = [
            p.name
            for p in inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        names = []
    out = []
    for path, _ in jax.tree_util.tree_flatten_with_path(tuple(args))[0]:
        comps = [_component(k) for k in path]
        pos = int(comps[0])
        comps[0] = names[pos] if pos < len(names) else comps[0]
        out.append(tuple(comps))
    return out


def path_text(path: Sequence[str]) -> str:
    """``"params/w1"``."""
    return "/".join(path)
