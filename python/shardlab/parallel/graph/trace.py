"""Tracing, once: a function and example arguments become one frozen ``Traced`` record.

Everything downstream (the search, the baselines, ``predict``, ``plan.bind``, the editor)
takes a ``Traced`` instead of tracing again: the closed jaxpr, the output shapes, the
``OpGraph`` built from it, which outputs are updated arguments (``ties``), every argument
leaf's path as the user would name it, the argument and output trees, and a fingerprint of
the graph's primitives and shapes (to tell a plan's function apart).
"""

from __future__ import annotations

import dataclasses
import hashlib
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from shardlab.parallel.arguments import (
    Split,
    abstract_args,
    drop_static,
    leaf_paths,
    path_text,
    split,
)
from shardlab.parallel.errors import SearchError
from shardlab.parallel.graph.opgraph import OpGraph, build_from_jaxpr


@dataclasses.dataclass(frozen=True)
class Traced:
    """A function traced with example arguments.

    Attributes:
        fn: the function.
        args: the arguments, traced leaves as ``jax.ShapeDtypeStruct`` (no data is kept),
            static leaves (functions, strings, bools: ``parallel/arguments.py``) as given.
        jaxpr: the closed jaxpr of ``fn(*args)``: its inputs are the traced leaves.
        out_shape: the output pytree of ``jax.ShapeDtypeStruct`` (static outputs ``None``).
        graph: the ``OpGraph`` of ``jaxpr`` (scans unrolled when ``unroll_scans``).
        ties: ``{flat output position: flat input position}`` of outputs that are updated
            arguments (``find_ties``).
        paths: per traced argument leaf, its path (``params/w1``, see ``leaf_paths``).
        arg_of_leaf: per traced argument leaf, the position of the argument it belongs to.
        in_tree: the tree structure of ``dynamic_args`` (static leaves ``None``).
        out_tree: the tree structure of the output.
        fingerprint: a digest of the graph's primitives and shapes.
        unroll_scans: whether the graph unrolls top-level scans (the search's graph does).
        arguments: the arguments split into traced and static leaves.
        outputs: the output split likewise (its static leaves are put back by ``Plan``).
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    jaxpr: Any
    out_shape: Any
    graph: OpGraph
    ties: Mapping[int, int]
    paths: tuple[str, ...]
    arg_of_leaf: tuple[int, ...]
    in_tree: Any
    out_tree: Any
    fingerprint: str
    unroll_scans: bool = True
    arguments: Split | None = None
    outputs: Split | None = None

    @property
    def dynamic_args(self) -> tuple[Any, ...]:
        """``args`` with the static leaves ``None``: its leaves are the graph's inputs."""
        return self.args if self.arguments is None else self.arguments.dynamic(self.args)

    def input_shapes(self) -> list[tuple[int, ...]]:
        """Per flat argument leaf, its shape."""
        return [self.graph.shapes[v] for v in self.graph.inputs]


# The jaxprs of functions traced before, by function (weakly) and argument signature: a
# search, its baselines and a second search of the same step trace once, as
# ``jax.make_jaxpr`` of one function object would be cached (the wrapper that closes over
# static leaves is new each call, so JAX's own cache cannot see the repeat).
_MEMO: weakref.WeakKeyDictionary[Any, dict[Any, Any]] = weakref.WeakKeyDictionary()
_MEMO_PER_FUNCTION = 8


def _memo_of(fn: Any) -> dict[Any, Any] | None:
    try:
        return _MEMO.setdefault(fn, {})
    except TypeError:  # not weakly referenceable
        return None


def _memo_key(parts: Any, dynamic: Any) -> Any:
    leaves, treedef = jax.tree_util.tree_flatten(dynamic)
    signature = tuple(
        (tuple(x.shape), str(x.dtype), bool(getattr(x, "weak_type", False))) for x in leaves
    )
    key = (parts.treedef, parts.statics, treedef, signature, _config_state())
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _config_state() -> Any:
    """JAX settings that change what a trace produces."""
    return (bool(jax.config.read("jax_enable_x64")), str(jax.sharding.get_abstract_mesh()))


def trace(fn: Callable[..., Any], *args: Any, unroll_scans: bool = True) -> Traced:
    """Trace ``fn(*args)`` once (``jax.make_jaxpr``) and build its ``OpGraph``.

    Args:
        fn: the function.
        *args: example arguments: pytrees of arrays (placed anywhere), ``ShapeDtypeStruct``s
            and static leaves (functions, strings, bools), split as ``arguments.split`` says.
        unroll_scans: unroll top-level ``lax.scan`` loops into the graph (the search, its
            plans and the editor do; ``predict`` and ``analyze`` take the loop as one node).

    Raises:
        SearchError: the function does not trace with these arguments (the message names the
            function and the original error).
        ArgumentError: a leaf can be neither traced nor static (the message names it).
    """
    args = tuple(args)
    parts = split(args, fn)  # ArgumentError (a SearchError) for a leaf that cannot be either
    abstract = abstract_args(args)  # traced on shapes: the arguments' placement is not read
    dynamic = parts.dynamic(abstract)
    outputs: list[Split] = []
    memo_key = _memo_key(parts, dynamic)
    per_fn = _memo_of(fn)
    hit = None if per_fn is None or memo_key is None else per_fn.get(memo_key)
    if hit is not None:
        closed, out_shape, out_split, graphs = hit
        outputs.append(out_split)
    else:
        graphs = {}

        def traced_fn(*dyn: Any) -> Any:
            out = fn(*parts.combine(dyn))
            outputs.append(split(out, check=False))
            return drop_static(out)

        traced_fn.__name__ = traced_fn.__qualname__ = getattr(fn, "__name__", "fn")
        try:
            closed, out_shape = jax.make_jaxpr(traced_fn, return_shape=True)(*dynamic)
        except Exception as e:  # any tracing failure is the user's function's
            raise SearchError(
                f"{getattr(fn, '__name__', fn)!r} does not trace with the given arguments: "
                f"{type(e).__name__}: {e}"
            ) from e
        if per_fn is not None and memo_key is not None:
            if len(per_fn) >= _MEMO_PER_FUNCTION:
                per_fn.pop(next(iter(per_fn)))
            per_fn[memo_key] = (closed, out_shape, outputs[-1], graphs)
    # The op graph is read-only once built: one per jaxpr and unrolling, like the jaxpr.
    graph = graphs.get(unroll_scans)
    if graph is None:
        graph = graphs[unroll_scans] = build_from_jaxpr(closed, unroll_scans=unroll_scans)
    counts = [len(jax.tree_util.tree_leaves(a)) for a in dynamic]
    return Traced(
        fn=fn,
        args=abstract,
        jaxpr=closed,
        out_shape=out_shape,
        graph=graph,
        ties=find_ties(dynamic, out_shape),
        paths=tuple(path_text(p) for p in leaf_paths(fn, dynamic)),
        arg_of_leaf=tuple(i for i, n in enumerate(counts) for _ in range(n)),
        in_tree=jax.tree_util.tree_structure(dynamic),
        out_tree=jax.tree_util.tree_structure(out_shape),
        fingerprint=fingerprint(graph),
        unroll_scans=unroll_scans,
        arguments=parts,
        outputs=outputs[-1],
    )


def fingerprint(graph: OpGraph) -> str:
    """A digest of the graph's primitives and shapes, to tell a plan's function apart."""
    h = hashlib.sha1()
    for n in graph.nodes:
        h.update(n.primitive.encode())
        for v in n.outputs:
            h.update(str(graph.shapes[v]).encode())
    for v in graph.inputs:
        h.update(str(graph.shapes[v]).encode())
    return h.hexdigest()[:16]


def find_ties(args: tuple[Any, ...], out_shape: Any) -> dict[int, int]:
    """``{flat output position: flat input position}`` for outputs that are updated inputs.

    An output subtree (the output itself or a top-level element of an output tuple) with the
    same structure, shapes and dtypes as an argument is taken to be its new value (updated
    parameters, optimizer state), so it keeps the argument's layout across steps.
    """

    def spans(children: list[Any]) -> list[tuple[Any, int, int]]:
        out, start = [], 0
        for c in children:
            n = len(jax.tree_util.tree_leaves(c))
            out.append((c, start, n))
            start += n
        return out

    def sig(x: Any) -> Any:
        leaves, tree = jax.tree_util.tree_flatten(x)
        return tree, tuple((tuple(np.shape(v)), str(getattr(v, "dtype", ""))) for v in leaves)

    arg_spans = spans(list(args))
    outs = list(out_shape) if isinstance(out_shape, (tuple, list)) else [out_shape]
    ties: dict[int, int] = {}
    taken: set[int] = set()
    for o, o_start, n in spans(outs):
        if n == 0:
            continue
        for k, (a, a_start, m) in enumerate(arg_spans):
            if k not in taken and m == n and sig(a) == sig(o):
                taken.add(k)
                ties.update({o_start + i: a_start + i for i in range(n)})
                break
    return ties
