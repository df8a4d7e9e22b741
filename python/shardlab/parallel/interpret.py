"""Re-evaluate an ``OpGraph`` equation by equation, constraining chosen variables' layouts.

The graph is flat (nested calls inlined) and topologically ordered, so evaluation is one pass:
bind each equation's primitive (inside its ``eqn.ctx.manager`` and source context, so the
compiled collectives still name the user's line) and apply ``with_sharding_constraint`` with a
``NamedSharding`` right after the equations the plan constrains. Under ``jax.jit`` this steers
the partitioner; numerically it is the original function.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from shardlab.parallel.opgraph import OpGraph

try:  # keeps metadata={source_file, source_line} on the re-bound equations; private
    from jax._src import source_info_util as _siu
except ImportError:  # pragma: no cover - depends on the jax version
    _siu = None


def _context(eqn: Any) -> contextlib.AbstractContextManager[Any]:
    if _siu is None:
        return contextlib.nullcontext()
    try:
        return _siu.user_context(eqn.source_info.traceback, name_stack=eqn.source_info.name_stack)
    except Exception:  # best-effort metadata only
        return contextlib.nullcontext()


def _bind(eqn: Any, invals: Sequence[Any]) -> list[Any]:
    got = eqn.primitive.get_bind_params(eqn.params)
    subfuns, params = got if isinstance(got, tuple) else ((), got)
    with eqn.ctx.manager, _context(eqn):
        out = eqn.primitive.bind(*subfuns, *invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def interpreter(
    graph: OpGraph,
    mesh: Mesh,
    constraints: Mapping[int, Sequence[PartitionSpec | None]],
    in_tree: Any,
    operand_constraints: Mapping[int, Mapping[int, PartitionSpec]] | None = None,
) -> Callable[..., Any]:
    """A function of the original arguments that evaluates ``graph`` with constraints.

    Args:
        graph: the op graph of the function.
        mesh: the mesh the specs refer to.
        constraints: ``{node index: spec per output}`` (``None`` entries: unconstrained).
        in_tree: the treedef of the argument tuple (``jax.tree_util.tree_structure(args)``).
        operand_constraints: ``{node index: {operand position: spec}}``: reshard an operand
            just before the node reads it (only for that use).

    Returns:
        ``f(*args) -> flat tuple of outputs``.
    """
    shardings = {
        i: [None if s is None else NamedSharding(mesh, s) for s in specs]
        for i, specs in constraints.items()
    }
    operand_shardings = {
        i: {k: NamedSharding(mesh, s) for k, s in per.items()}
        for i, per in (operand_constraints or {}).items()
    }

    def run(*args: Any) -> tuple[Any, ...]:
        leaves, tree = jax.tree_util.tree_flatten(args)
        if tree != in_tree:
            raise TypeError(
                f"the plan was made for arguments of structure {in_tree}, got {tree}; call "
                "shardlab.search again for these arguments"
            )
        env: dict[int, Any] = {}
        for v, x in zip(graph.inputs, leaves, strict=True):
            env[v] = x

        def read(v: int) -> Any:
            if v in env:
                return env[v]
            return graph.literal[v]

        for node in graph.nodes:
            invals = [read(v) for v in node.inputs]
            for k, sharding in operand_shardings.get(node.index, {}).items():
                invals[k] = jax.lax.with_sharding_constraint(invals[k], sharding)
            outs = _bind(node.eqn, invals)
            for k, (v, x) in enumerate(zip(node.outputs, outs, strict=True)):
                specs = shardings.get(node.index)
                if specs is not None and specs[k] is not None:
                    x = jax.lax.with_sharding_constraint(x, specs[k])
                env[v] = x
        return tuple(read(v) for v in graph.outputs)

    return run
