"""Re-evaluate an ``OpGraph`` equation by equation, constraining chosen variables' layouts.

The graph is flat (nested calls inlined) and topologically ordered, so evaluation is one pass:
bind each equation's primitive in the context it was traced in (``_core.jaxprs``, shared
with the compare tool's evaluator, so the compiled collectives still name the user's line) and apply ``with_sharding_constraint`` with a
``NamedSharding`` right after the equations the plan constrains. Under ``jax.jit`` this steers
the partitioner; numerically it is the original function.

A scan unrolled into the graph (``OpGraph.scan_groups``) is evaluated as one ``lax.scan``
again (same length, direction and unroll factor) whose body interprets the body's equations
with the constraints of one iteration (the middle one: the search ties iterations to equal
choices, ``search/scan_ties.py``), so the compiled program keeps its loop. A plan may run a
scan group another way — pipelined over a ``stage`` axis (``plan/pipeline.py``), or with its
residuals recomputed (``plan/remat.py``): ``runners`` maps the group's index to a function
with ``lax.scan``'s signature (``ScanRunner``) that is called in its place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from shardlab._core.jaxprs import bind, equation_context
from shardlab.parallel.graph.opgraph import OpGraph, ScanGroup

# ``runner(step, init, xs, *, length, reverse, unroll) -> (carry, ys)``: what runs a scan
# group instead of ``jax.lax.scan`` (``step(carry, x) -> (carry, y)`` with lists of arrays).
ScanRunner = Callable[..., tuple[Any, Any]]


def interpreter(
    graph: OpGraph,
    mesh: Mesh,
    constraints: Mapping[int, Sequence[PartitionSpec | None]],
    in_tree: Any,
    operand_constraints: Mapping[int, Mapping[int, PartitionSpec]] | None = None,
    runners: Mapping[int, ScanRunner] | None = None,
) -> Callable[..., Any]:
    """A function of the original arguments that evaluates ``graph`` with constraints.

    Args:
        graph: the op graph of the function.
        mesh: the mesh the specs refer to.
        constraints: ``{node index: spec per output}`` (``None`` entries: unconstrained).
        in_tree: the treedef of the argument tuple (``jax.tree_util.tree_structure(args)``).
        operand_constraints: ``{node index: {operand position: spec}}``: reshard an operand
            just before the node reads it (only for that use).
        runners: ``{scan group index: ScanRunner}``: groups run otherwise than by
            ``jax.lax.scan`` (pipelined, rematerialised).

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
        env: dict[int, Any] = dict(zip(graph.inputs, leaves, strict=True))
        _evaluate(graph, env, shardings, operand_shardings, runners or {})
        return tuple(_read(graph, env, v) for v in graph.outputs)

    return run


Shardings = Mapping[int, Sequence[NamedSharding | None]]
OperandShardings = Mapping[int, Mapping[int, NamedSharding]]


def _read(graph: OpGraph, env: dict[int, Any], v: int) -> Any:
    return env[v] if v in env else graph.literal[v]


def _constrain(x: Any, sharding: NamedSharding | None) -> Any:
    return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)


def _evaluate(
    graph: OpGraph,
    env: dict[int, Any],
    outs: Shardings,
    operands: OperandShardings,
    runners: Mapping[int, ScanRunner] | None = None,
) -> None:
    """Evaluate ``graph``'s nodes into ``env`` (inputs already there), constraining the
    outputs (``{node: sharding per output}``) and operands (``{node: {position: sharding}}``)
    the plan names."""
    i = 0
    while i < len(graph.nodes):
        node = graph.nodes[i]
        if node.origin is not None:  # the first node of an unrolled scan
            group = graph.scan_groups[node.origin[0]]
            runner = (runners or {}).get(node.origin[0], jax.lax.scan)
            _scan(graph, group, env, outs, operands, runner)
            i = group.end
            continue
        invals = [_read(graph, env, v) for v in node.inputs]
        specs = outs.get(node.index)
        reshards = operands.get(node.index, {})
        # The constraints are staged in the equation's source context: a collective the
        # partitioner inserts for them names the user's line, not this file.
        with equation_context(node.eqn):
            for k, sharding in reshards.items():
                invals[k] = _constrain(invals[k], sharding)
            results = bind(node.eqn, invals)
            for k, (v, x) in enumerate(zip(node.outputs, results, strict=True)):
                env[v] = _constrain(x, specs[k]) if specs is not None else x
        i += 1


def _scan(
    graph: OpGraph,
    group: ScanGroup,
    env: dict[int, Any],
    outs: Shardings,
    operands: OperandShardings,
    runner: ScanRunner = jax.lax.scan,
) -> None:
    """Run an unrolled scan as one ``lax.scan`` (or ``runner``) whose body applies the
    constraints of the middle iteration's nodes (by body position)."""
    body, base = group.body, group.iteration_starts[group.length // 2]
    body_outs = {k: outs[base + k] for k in range(len(body.nodes)) if base + k in outs}
    body_ins = {k: operands[base + k] for k in range(len(body.nodes)) if base + k in operands}
    n_fixed = group.num_consts + group.num_carry
    consts = [_read(graph, env, v) for v in group.inputs[: group.num_consts]]
    init = [_read(graph, env, v) for v in group.inputs[group.num_consts : n_fixed]]
    xs = [_read(graph, env, v) for v in group.inputs[n_fixed:]]
    slices, stacks = group.slices[group.length // 2], group.stacks[group.length // 2]
    with equation_context(group.eqn):
        xs = [_constrain(x, operands.get(n, {}).get(0)) for x, n in zip(xs, slices, strict=True)]
    x_specs = [(outs.get(n) or [None])[0] for n in slices]
    # a stack node's last operand is the iteration's output
    y_specs = [operands.get(n, {}).get(len(graph.nodes[n].inputs) - 1) for n in stacks]

    def step(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
        x = [_constrain(v, s) for v, s in zip(x, x_specs, strict=True)]
        inner = dict(zip(body.inputs, [*consts, *carry, *x], strict=True))
        _evaluate(body, inner, body_outs, body_ins)
        res = [_read(body, inner, v) for v in body.outputs]
        ys = [_constrain(y, s) for y, s in zip(res[group.num_carry :], y_specs, strict=True)]
        return res[: group.num_carry], ys

    p = group.eqn.params
    with equation_context(group.eqn):
        carry, ys = runner(
            step, init, xs, length=group.length, reverse=group.reverse, unroll=p.get("unroll", 1)
        )
        last = group.stacks[-1]
        ys = [_constrain(y, (outs.get(n) or [None])[0]) for y, n in zip(ys, last, strict=True)]
    for v, x in zip(group.outputs, [*carry, *ys], strict=True):
        env[v] = x
