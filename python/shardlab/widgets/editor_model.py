"""The strategy editor's model: a strategy being edited, its predicted cost, and the diff.

No widgets here: ``EditorModel`` holds the per-leaf specs, validates an edit (an invalid
choice keeps the last valid strategy and returns the error naming dimension and axis),
predicts the cost with a function traced once (fast: no compile), and compiles in the
background on request, where a newer edit supersedes a stale compile. The strategy as a
record is a hand-specified ``Plan`` (``EditorModel.plan``): its code export and its function
with the constraints applied are the plan's, as for a searched one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
from jax.sharding import Mesh, PartitionSpec

from ..parallel import analyze, predict
from ..parallel.cost import layouts as L
from ..parallel.graph.opgraph import OpGraph
from ..parallel.graph.trace import Traced, trace
from ..parallel.plan.binding import Binding
from ..parallel.plan.fixed import fixed_plan
from ..parallel.plan.plan import Plan
from ..parallel.records import CostBreakdown, Report
from ..parallel.specs import ShardingSpecError, check_spec, spec_entries


@dataclass(frozen=True)
class Leaf:
    """One array argument of the function: its path label (``params/w1``, as plans name
    it) and shape."""

    label: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Intermediate:
    """An intermediate value the editor offers to constrain (a matmul's output)."""

    node: int
    label: str
    shape: tuple[int, ...]


MAX_INTERMEDIATES = 24


@dataclass(frozen=True)
class Evaluation:
    """The figures of one valid strategy."""

    generation: int
    specs: tuple[PartitionSpec, ...]
    cost: CostBreakdown
    seconds: float  # how long the prediction took


@dataclass
class CompileResult:
    generation: int
    report: Report | None = None
    error: str | None = None
    seconds: float = 0.0
    superseded: bool = False


@dataclass
class EditorModel:
    """Strategy state for ``fn(*args)`` on ``mesh``."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    mesh: Mesh
    device: Any = None
    leaves: tuple[Leaf, ...] = field(init=False)
    specs: list[PartitionSpec] = field(init=False)
    generation: int = field(default=0, init=False)
    current: Evaluation | None = field(default=None, init=False)
    previous: Evaluation | None = field(default=None, init=False)
    constraints: dict[int, PartitionSpec] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        # Traced once; every edit reuses it. Scans are unrolled as the search does, so a
        # plan's constraints (by node) apply here too.
        self.traced: Traced = trace(self.fn, *self.args, unroll_scans=True)
        self.leaves = tuple(
            Leaf(path, tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", "")))
            for path, x in zip(
                self.traced.paths, jax.tree_util.tree_leaves(self.traced.dynamic_args), strict=True
            )
        )
        self.specs = [PartitionSpec() for _ in self.leaves]
        self._lock = threading.Lock()
        self._latest_compile: CompileResult | None = None
        self._functions: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self.intermediates = self._intermediates()

    def _intermediates(self) -> tuple[Intermediate, ...]:
        """Matmul outputs in program order (the values whose layout decides communication).
        Inside a scan, one iteration's (the middle one, which the plan's scan body applies to
        every iteration)."""
        out = []
        groups = self.graph.scan_groups
        for node in self.graph.nodes:
            if node.primitive != "dot_general" or not node.outputs:
                continue
            where = node.source.rsplit("/", 1)[-1] if node.source else "?"
            if node.origin is not None:
                if node.origin[1] != groups[node.origin[0]].length // 2:
                    continue
                where += " (scan body, every iteration)"
            shape = tuple(self.graph.shapes[node.outputs[0]])
            out.append(Intermediate(node.index, f"#{node.index} dot_general @ {where}", shape))
            if len(out) >= MAX_INTERMEDIATES:
                break
        return tuple(out)

    @property
    def graph(self) -> OpGraph:
        """The traced function's ``OpGraph`` (scans unrolled)."""
        return self.traced.graph

    def constrain(self, node: int, dim: int, axes: tuple[str, ...]) -> Evaluation:
        """Constrains dimension ``dim`` of intermediate ``node`` to ``axes`` (``()``: none;
        an intermediate with no split dimension is unconstrained again).

        Raises:
            ShardingSpecError: the choice does not fit; the strategy is unchanged.
        """
        shape = tuple(self.graph.shapes[self.graph.nodes[node].outputs[0]])
        entries = spec_entries(self.constraints.get(node, PartitionSpec()))
        entries += [()] * (len(shape) - len(entries))
        entries[dim] = tuple(axes)
        spec = PartitionSpec(*[(e[0] if len(e) == 1 else (e or None)) for e in entries])
        check_spec(spec, shape, self.mesh, where=f"intermediate #{node}")
        constraints = dict(self.constraints)
        if any(entries):
            constraints[node] = spec
        else:
            constraints.pop(node, None)
        previous = self.constraints
        self.constraints = constraints
        try:
            return self._evaluate(list(self.specs))
        except Exception:
            self.constraints = previous
            raise

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(str(a) for a in self.mesh.axis_names)

    def in_shardings(self, specs: list[PartitionSpec] | None = None) -> Any:
        return jax.tree_util.tree_unflatten(self.traced.in_tree, list(specs or self.specs))

    def set_all(self, specs: list[PartitionSpec]) -> Evaluation:
        """Replaces the whole strategy (e.g. from a plan); validated like an edit."""
        for leaf, spec in zip(self.leaves, specs, strict=True):
            check_spec(spec, leaf.shape, self.mesh, where=f"argument {leaf.label}")
        return self._evaluate(list(specs))

    def edit(self, leaf_index: int, dim: int, axes: tuple[str, ...]) -> Evaluation:
        """Splits dimension ``dim`` of leaf ``leaf_index`` over ``axes`` (``()``: none).

        Raises:
            ShardingSpecError: the choice does not fit (the dimension is not divisible, an
                axis is already used by another dimension...). The strategy is unchanged.
        """
        leaf = self.leaves[leaf_index]
        entries = spec_entries(self.specs[leaf_index])
        entries += [()] * (len(leaf.shape) - len(entries))
        entries[dim] = tuple(axes)
        spec = PartitionSpec(*[(e[0] if len(e) == 1 else (e or None)) for e in entries])
        check_spec(spec, leaf.shape, self.mesh, where=f"argument {leaf.label}")
        specs = list(self.specs)
        specs[leaf_index] = spec
        return self._evaluate(specs)

    def _evaluate(self, specs: list[PartitionSpec]) -> Evaluation:
        start = time.perf_counter()
        cost = predict(
            self.fn,
            *self.args,
            mesh=self.mesh,
            in_shardings=self.in_shardings(specs),
            constraints=dict(self.constraints) or None,
            device=self.device,
            traced=self.traced,
        )
        with self._lock:
            self.generation += 1
            self.specs = specs
            self.previous, self.current = (
                self.current,
                Evaluation(self.generation, tuple(specs), cost, time.perf_counter() - start),
            )
            return self.current

    def compile(self, on_done: Callable[[CompileResult], None] | None = None) -> threading.Thread:
        """Compiles the current strategy in a background thread.

        ``on_done`` receives the result; a result whose strategy is no longer current is
        marked ``superseded`` (the view ignores it).
        """
        generation, specs = self.generation, list(self.specs)
        constraints = dict(self.constraints)

        def job() -> None:
            start = time.perf_counter()
            result = CompileResult(generation)
            try:
                # The plan's function: the traced graph re-evaluated with the constraints
                # inserted. Output layouts are left to XLA (in_shardings only).
                fn = self._function(constraints)
                result.report = analyze(
                    fn, *self.args, mesh=self.mesh, in_shardings=self.in_shardings(specs)
                )
            except Exception as error:  # shown in the editor; the kernel keeps running
                result.error = f"{type(error).__name__}: {error}"
            result.seconds = time.perf_counter() - start
            with self._lock:
                result.superseded = generation != self.generation
                if not result.superseded:
                    self._latest_compile = result
            if on_done is not None:
                on_done(result)

        thread = threading.Thread(target=job, name="shardlab-editor-compile", daemon=True)
        thread.start()
        return thread

    def plan(self) -> Plan:
        """The current strategy as a hand-specified plan (no search): the argument layouts
        and intermediate constraints as edited, outputs as the partitioner propagates them.

        Its cost is the cost model's for this strategy (the figures the editor shows);
        ``plan.jit()``, ``plan.verify()`` and ``plan.to_code()`` work as for a searched plan.
        """
        graph, specs, constraints = self.graph, list(self.specs), dict(self.constraints)
        return fixed_plan(
            self.traced,
            self.mesh,
            [L.from_spec(s, len(leaf.shape)) for leaf, s in zip(self.leaves, specs, strict=True)],
            method="hand",
            device=self.device,
            constraints={
                node: L.from_spec(spec, len(graph.shapes[graph.nodes[node].outputs[0]]))
                for node, spec in constraints.items()
            },
            tie_outputs=False,
            notes=("set by hand in the strategy editor (shardlab.editor)",),
        )

    def _function(self, constraints: dict[int, PartitionSpec]) -> Callable[..., Any]:
        """The plan's function (``Binding.constrained``, what ``plan.function()`` runs), one
        per set of constraints: it does not depend on the argument layouts, and the same
        function lets JAX reuse its compile of a strategy compiled before (Reset, an edit
        undone)."""
        key = tuple(sorted(constraints.items()))
        with self._lock:
            fn = self._functions.get(key)
        if fn is None:
            binding = Binding(self.traced, self.mesh)
            fn = binding.constrained({node: (spec,) for node, spec in constraints.items()})
            with self._lock:
                fn = self._functions.setdefault(key, fn)
        return fn

    def code(self) -> str:
        """Python source with the PartitionSpecs of the current strategy, ready to paste
        (``plan().to_code()``: the mesh, ``in_shardings``/``out_shardings`` with the
        structure of the arguments and outputs, and the constraints on intermediates)."""
        return self.plan().to_code()


def diff(before: CostBreakdown | None, after: CostBreakdown) -> list[str]:
    """What changed between two predictions, in words."""
    if before is None:
        return []
    out = []
    for kind in after.comm_bytes:
        b, a = before.comm_bytes.get(kind, 0.0), after.comm_bytes[kind]
        if abs(a - b) > 0.5:
            out.append(f"{kind}: {b:,.0f} → {a:,.0f} B")
    if before.memory.peak != after.memory.peak:
        out.append(f"peak memory per device: {before.memory.peak:,} → {after.memory.peak:,} B")
    if abs(before.time - after.time) > 1e-9:
        out.append(f"step time: {before.time * 1e3:.3f} → {after.time * 1e3:.3f} ms")
    return out or ["no change in the predicted figures"]


__all__ = ["EditorModel", "Evaluation", "Leaf", "ShardingSpecError", "diff"]
