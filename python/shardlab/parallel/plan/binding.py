"""A plan's binding: the traced function, its example arguments and the mesh it runs on.

A plan made by the search or a baseline is bound to the ``Traced`` record they worked on; a
plan loaded from JSON is bound with ``Plan.bind``, which traces the function again and checks
that it is the plan's (same mesh, argument shapes and graph fingerprint).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import Mesh, PartitionSpec

from shardlab.parallel.errors import SearchError
from shardlab.parallel.graph.interpret import ScanRunner, interpreter
from shardlab.parallel.graph.opgraph import OpGraph
from shardlab.parallel.graph.trace import Traced
from shardlab.parallel.mesh import mesh_shape_of


@dataclasses.dataclass(frozen=True)
class Binding:
    """What running a plan needs: the ``Traced`` function and the mesh."""

    traced: Traced
    mesh: Mesh

    @property
    def fn(self) -> Any:
        return self.traced.fn

    @property
    def args(self) -> tuple[Any, ...]:
        """The example arguments as ``jax.ShapeDtypeStruct`` pytrees (static leaves kept)."""
        return self.traced.args

    @property
    def graph(self) -> OpGraph:
        return self.traced.graph

    @property
    def in_tree(self) -> Any:
        return self.traced.in_tree

    @property
    def out_tree(self) -> Any:
        return self.traced.out_tree

    def constrained(
        self,
        outputs: Mapping[int, Sequence[PartitionSpec | None]],
        operands: Mapping[int, Mapping[int, PartitionSpec]] | None = None,
        *,
        dynamic: bool = False,
        runners: Mapping[int, ScanRunner] | None = None,
    ) -> Callable[..., Any]:
        """The traced function re-evaluated equation by equation with ``outputs``
        (``{node: spec per output}``) and ``operands`` (``{node: {position: spec}}``)
        constrained (not jitted).

        It takes the original pytrees (static leaves equal to the traced ones, or ``None``:
        ``parallel/arguments.py``) and returns the original output pytree, static leaves put
        back. ``dynamic``: it takes and returns the dynamic trees (static leaves ``None``),
        what ``jax.jit`` can take. ``runners``: scan groups run otherwise than by
        ``lax.scan`` (``graph/interpret.py``).
        """
        run = interpreter(
            self.graph, self.mesh, dict(outputs), self.in_tree, operands or {}, runners or {}
        )
        out_tree = self.out_tree

        def planned_dynamic(*args: Any) -> Any:
            return jax.tree_util.tree_unflatten(out_tree, list(run(*args)))

        arguments, results = self.traced.arguments, self.traced.outputs
        if dynamic or arguments is None or results is None:
            return planned_dynamic

        def planned(*args: Any) -> Any:
            return results.combine(planned_dynamic(*arguments.dynamic(tuple(args))))

        return planned


def checked_binding(
    traced: Traced,
    mesh: Mesh,
    *,
    mesh_shape: dict[str, int],
    input_shapes: tuple[tuple[int, ...], ...],
    fingerprint: str,
) -> Binding:
    """``traced`` on ``mesh`` as the binding of a plan with these fields, after checking
    that they are the plan's.

    Raises:
        SearchError: a different mesh, argument shapes that differ (naming the first leaf
            that does), or a function that traces to a different graph.
    """
    sizes = mesh_shape_of(mesh)
    if sizes != mesh_shape:
        raise SearchError(f"the plan is for mesh {mesh_shape}, got mesh {sizes}")
    shapes = tuple(tuple(s) for s in traced.input_shapes())
    if shapes != input_shapes:
        bad = next(
            (
                f"{p}: plan {a}, given {s}"
                for p, a, s in zip(traced.paths, input_shapes, shapes, strict=False)
                if a != s
            ),
            f"{len(input_shapes)} leaves in the plan, {len(shapes)} given",
        )
        raise SearchError(f"the arguments do not match the plan: {bad}")
    if fingerprint and traced.fingerprint != fingerprint:
        raise SearchError(
            "the function traces to a different graph than the plan was made for "
            "(fingerprints differ); run shardlab.search again"
        )
    return Binding(traced, mesh)
