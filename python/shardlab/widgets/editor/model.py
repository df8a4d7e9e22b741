"""The strategy editor's model: a strategy being edited, its predicted cost, and the diff.

No widgets here: ``EditorModel`` holds the per-leaf specs, validates an edit (an invalid
choice keeps the last valid strategy and returns the error naming dimension and axis),
predicts the cost with a function traced once (fast: no compile), and compiles in the
background on request, where a newer edit supersedes a stale compile. The strategy as a
record is a hand-specified ``Plan`` (``EditorModel.plan``): its code export and its function
with the constraints applied are the plan's, as for a searched one.

Pipeline stages and rematerialisation (``set_pipeline``, ``set_remat``; the choices in
``editor_stages.py``) are applied to that plan with ``with_pipeline`` / ``with_remat``: the
figures are then the pipeline simulator's (``predict_pipeline``, with its schedule for the
view) or the remat prediction, and the compile is the staged plan's ``verify()``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
from jax.sharding import Mesh, PartitionSpec

from shardlab.parallel.compiled.analyze import analyze
from shardlab.parallel.cost import layouts as L
from shardlab.parallel.cost.pipeline import PipelineCost, predict_pipeline
from shardlab.parallel.cost.predict import predict
from shardlab.parallel.cost.remat import POLICIES, layer_scans
from shardlab.parallel.display import human_bytes, human_time
from shardlab.parallel.errors import SearchError

# ``_source``: the graph builder's one way to name an equation's user line (a scan's, here).
from shardlab.parallel.graph.opgraph import OpGraph
from shardlab.parallel.graph.opgraph import _source as equation_source
from shardlab.parallel.graph.trace import Traced, trace
from shardlab.parallel.labels import group_label, path_label, source_label
from shardlab.parallel.plan.binding import Binding
from shardlab.parallel.plan.fixed import fixed_plan
from shardlab.parallel.plan.pipeline import PipelineChoices, pipeline_choices, with_pipeline
from shardlab.parallel.plan.plan import Plan
from shardlab.parallel.plan.remat import with_remat
from shardlab.parallel.records import CostBreakdown, PipelineSpec, RematSpec, Report
from shardlab.parallel.specs import ShardingSpecError, check_spec, make_spec, spec_entries
from shardlab.widgets._base.capture import captured_stderr


@dataclass(frozen=True)
class Leaf:
    """One array argument of the function: its path (``params/blocks/3/w1``, as
    ``Plan.input_paths`` stores it), its label as the user indexes it
    (``params["blocks"][3]["w1"]``, ``Plan.input_labels``), its layer group's label
    (``params["blocks"][*]["w1"]``), shape and dtype."""

    path: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def label(self) -> str:
        return path_label(self.path)

    @property
    def group(self) -> str:
        return group_label(self.path)

    @property
    def argument(self) -> str:
        """The top-level argument's name (``params``, ``batch``)."""
        return path_label(self.path.split("/", 1)[0])


@dataclass(frozen=True)
class Intermediate:
    """An intermediate value the editor offers to constrain (a matmul's output)."""

    node: int
    label: str
    shape: tuple[int, ...]


MAX_INTERMEDIATES = 24
SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class LayerGroup:
    """A forward layer scan the editor offers to rematerialise, labelled in the user's terms:
    ``lax.scan at In [3], line 7 (4 layers)``."""

    scan: int  # its ``OpGraph.scan_groups`` index
    label: str
    layers: int


@dataclass(frozen=True)
class Evaluation:
    """The figures of one valid strategy.

    ``pipeline``: the simulated schedule when the strategy has pipeline stages; ``plan``:
    the strategy as a plan when it has stages or remat (what is compiled); ``remat``: the
    policy per layer group (scan index), as evaluated."""

    generation: int
    specs: tuple[PartitionSpec, ...]
    cost: CostBreakdown
    seconds: float  # how long the prediction took
    pipeline: PipelineCost | None = None
    plan: Plan | None = None
    remat: tuple[tuple[int, str], ...] = ()


@dataclass
class CompileResult:
    generation: int
    report: Report | None = None
    error: str | None = None
    seconds: float = 0.0
    superseded: bool = False
    messages: str = ""  # what XLA's C++ wrote to stderr while compiling (warnings)


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
    # The plan last applied (``set_plan``) while no edit has followed: its own figures are
    # shown and compiled, not a re-prediction of its input layouts.
    applied: Plan | None = field(default=None, init=False)
    # Pipeline stages (None: off) and the remat policy per forward layer scan.
    pipeline: PipelineSpec | None = field(default=None, init=False)
    remat: dict[int, str] = field(default_factory=dict, init=False)

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
        self.layer_groups, self.remat_note = self._layer_groups()
        self.remat = {group.scan: "none" for group in self.layer_groups}
        self.choices: PipelineChoices = pipeline_choices(self.graph, self.mesh)

    def _layer_groups(self) -> tuple[tuple[LayerGroup, ...], str]:
        """The forward layer scans (``cost/remat.layer_scans``), each named by the line of
        the user's ``lax.scan``; and why there are none, when there are none."""
        try:
            found = layer_scans(self.graph)
        except SearchError as error:  # a residual read elsewhere: remat cannot apply
            return (), str(error)
        groups = []
        for scan in sorted(found):
            group = self.graph.scan_groups[scan]
            where = source_label(equation_source(group.eqn), missing="(no source line)")
            label = f"lax.scan at {where} ({group.length} layers)"
            groups.append(LayerGroup(scan, label, group.length))
        note = "" if groups else "no layer scan (one lax.scan over stacked parameters)"
        return tuple(groups), note

    def _intermediates(self) -> tuple[Intermediate, ...]:
        """Matmul outputs in program order (the values whose layout decides communication).
        Inside a scan, one iteration's (the middle one, which the plan's scan body applies to
        every iteration)."""
        out = []
        groups = self.graph.scan_groups
        for node in self.graph.nodes:
            if node.primitive != "dot_general" or not node.outputs:
                continue
            where = source_label(node.source, missing="(no source line)")
            if node.origin is not None:
                if node.origin[1] != groups[node.origin[0]].length // 2:
                    continue
                where += " (scan body, every iteration)"
            shape = tuple(self.graph.shapes[node.outputs[0]])
            out.append(Intermediate(node.index, f"matmul at {where}", shape))
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

    def index(self, label: str) -> int:
        """The leaf index of a label (``params["blocks"][0]["w1"]``) or a path
        (``params/blocks/0/w1``).

        Raises:
            KeyError: no such leaf; the message lists a few valid labels.
        """
        for i, leaf in enumerate(self.leaves):
            if label in (leaf.label, leaf.path):
                return i
        some = ", ".join(leaf.label for leaf in self.leaves[:4])
        raise KeyError(f"no argument leaf {label!r}; leaves are labelled like {some}")

    def members(self, group: str) -> list[int]:
        """The leaf indices of a layer group (``params["blocks"][*]["w1"]``) or one label."""
        found = [i for i, leaf in enumerate(self.leaves) if leaf.group == group]
        return found or [self.index(group)]

    def edit(self, leaf_index: int, dim: int, axes: tuple[str, ...]) -> Evaluation:
        """Splits dimension ``dim`` of leaf ``leaf_index`` over ``axes`` (``()``: none).

        Raises:
            ShardingSpecError: the choice does not fit (the dimension is not divisible, an
                axis is already used by another dimension...). The strategy is unchanged.
        """
        return self.edit_many([(leaf_index, dim, axes)])

    def edit_many(self, edits: list[tuple[int, int, tuple[str, ...]]]) -> Evaluation:
        """Several edits as one strategy change (a layer group's control): validated
        together, predicted once.

        Raises:
            ShardingSpecError: one choice does not fit; the strategy is unchanged.
        """
        specs = list(self.specs)
        for leaf_index, dim, axes in edits:
            leaf = self.leaves[leaf_index]
            entries = spec_entries(specs[leaf_index])
            entries += [()] * (len(leaf.shape) - len(entries))
            entries[dim] = tuple(axes)
            spec = PartitionSpec(*[(e[0] if len(e) == 1 else (e or None)) for e in entries])
            check_spec(spec, leaf.shape, self.mesh, where=f"argument {leaf.label}")
            specs[leaf_index] = spec
        return self._evaluate(specs)

    def set_plan(self, plan: Plan) -> Evaluation:
        """Shows ``plan`` itself: its input layouts and first-output constraints in the
        controls, its own predicted cost as the figures, and ``plan.verify()`` as the
        compile — until the next edit makes the strategy a hand-specified one.

        (Re-predicting from the input layouts alone would drop what else the plan fixes —
        output layouts, reshards before operations, constraints on later outputs — and show
        the figures of another strategy.)

        Raises:
            ValueError: the plan was made for other arguments.
        """
        if len(plan.input_specs) != len(self.leaves):
            raise ValueError(
                f"the plan has {len(plan.input_specs)} input shardings but the editor has "
                f"{len(self.leaves)} leaves; was it made for another function?"
            )
        specs = [make_spec(layout) for layout in plan.input_specs]
        for leaf, spec in zip(self.leaves, specs, strict=True):
            check_spec(spec, leaf.shape, self.mesh, where=f"argument {leaf.label}")
        self.constraints = {
            node: outs[0] for node, outs in plan.intermediate_specs().items() if outs and outs[0]
        }
        remat = plan.remat
        policies = {
            g.scan: (
                remat.policy if remat and (not remat.scans or g.scan in remat.scans) else "none"
            )
            for g in self.layer_groups
        }
        schedule = (
            predict_pipeline(plan, plan.pipeline, device=self.device) if plan.pipeline else None
        )
        with self._lock:
            self.generation += 1
            self.specs = specs
            self.applied = plan
            self.pipeline, self.remat = plan.pipeline, policies
            evaluation = Evaluation(
                self.generation,
                tuple(specs),
                plan.cost,
                0.0,
                schedule,
                plan,
                tuple(sorted(policies.items())),
            )
            self.previous, self.current = self.current, evaluation
            return self.current

    # -- pipeline stages and remat -----------------------------------------------------------
    def clear_stages(self) -> None:
        """No pipeline, remat ``none`` everywhere (Reset); takes effect at the next edit."""
        self.pipeline = None
        self.remat = {group.scan: "none" for group in self.layer_groups}

    def set_pipeline(
        self, stages: int, microbatches: int | None = None, schedule: str | None = None
    ) -> Evaluation:
        """Pipelines the layer scans over ``stages`` (0: off) with ``microbatches`` and
        ``schedule`` (defaults: the current ones, else the smallest microbatch count that
        fills the stages, and ``gpipe``).

        Raises:
            SearchError: a stage count, microbatch count or schedule that is not valid here
                (the message names the valid ones); the strategy is unchanged.
        """
        choices = self.choices
        if not stages:
            return self._staged_change(None, self.remat)
        if stages not in choices.stages:
            if choices.reason:
                raise SearchError(f"stages={stages}: {choices.reason}; use 0 (no pipeline)")
            raise SearchError(
                f"stages={stages}: the {choices.axis!r} mesh axis has {choices.axis_size} "
                f"devices, one stage each: use stages={choices.axis_size}, or 0 (no pipeline)"
            )
        current = self.pipeline
        if microbatches is None:
            before = current.microbatches if current else 0
            fill = [m for m in choices.microbatches if m >= stages]
            microbatches = before or (fill[0] if fill else choices.microbatches[-1])
        if microbatches not in choices.microbatches:
            raise SearchError(
                f"microbatches={microbatches} does not divide the batch of "
                f"{choices.microbatches[-1]}: use one of {list(choices.microbatches)}"
            )
        schedule = schedule or (current.schedule if current else "gpipe")
        if schedule not in SCHEDULES:
            raise SearchError(f"schedule {schedule!r}: use one of {list(SCHEDULES)}")
        spec = PipelineSpec(stages, microbatches, axis=choices.axis, schedule=schedule)
        return self._staged_change(spec, self.remat)

    def set_remat(self, scan: int | None, policy: str) -> Evaluation:
        """Sets layer group ``scan``'s remat policy (``none``, ``dots``, ``nothing``; ``scan``
        None: every layer group's).

        Raises:
            SearchError: an unknown policy or layer group, or two groups with different
                policies other than ``none`` (a plan has one policy); the strategy is
                unchanged.
        """
        if policy not in POLICIES:
            raise SearchError(f"remat policy {policy!r}: use one of {list(POLICIES)}")
        if not self.remat:
            raise SearchError(f"nothing to rematerialise: {self.remat_note}")
        if scan is not None and scan not in self.remat:
            labels = "; ".join(f"{g.scan}: {g.label}" for g in self.layer_groups)
            raise SearchError(f"scan group {scan} is not a layer group here ({labels})")
        remat = {k: policy for k in self.remat} if scan is None else {**self.remat, scan: policy}
        return self._staged_change(self.pipeline, remat)

    def remat_spec(self, remat: dict[int, str] | None = None) -> RematSpec | None:
        """The ``RematSpec`` of the per-group policies (None: every group ``none``).

        Raises:
            SearchError: two groups with different policies other than ``none``.
        """
        remat = self.remat if remat is None else remat
        chosen = {scan: p for scan, p in remat.items() if p != "none"}
        if not chosen:
            return None
        policies = sorted(set(chosen.values()))
        if len(policies) > 1:
            label = {g.scan: g.label for g in self.layer_groups}
            which = "; ".join(f"{label[s]}: {p!r}" for s, p in sorted(chosen.items()))
            raise SearchError(
                f"one remat policy per plan, but the layer groups ask for {which}: set them "
                f"to the same policy (e.g. all {policies[0]!r}) or the others to 'none'"
            )
        scans = () if len(chosen) == len(remat) else tuple(sorted(chosen))
        return RematSpec(policies[0], scans)

    def _staged_change(self, pipeline: PipelineSpec | None, remat: dict[int, str]) -> Evaluation:
        """Re-evaluates with new stages/remat; they are kept only if it succeeds."""
        return self._evaluate(list(self.specs), staging=(pipeline, dict(remat)))

    def _stage(
        self, plan: Plan, pipeline: PipelineSpec | None, remat: RematSpec | None
    ) -> tuple[Plan, PipelineCost | None]:
        """``plan`` with ``remat`` and ``pipeline`` applied, its cost the prediction of both
        (the pipeline simulator prices the remat policy too); and the schedule."""
        if remat is not None:
            plan = with_remat(plan, remat)
        if pipeline is None:
            return plan, None
        plan = with_pipeline(plan, pipeline)
        priced = predict_pipeline(plan, pipeline, device=self.device)
        plan = dataclasses.replace(plan, cost=priced.cost, notes=(*plan.notes, *priced.notes))
        return plan, priced

    def _evaluate(
        self,
        specs: list[PartitionSpec],
        staging: tuple[PipelineSpec | None, dict[int, str]] | None = None,
    ) -> Evaluation:
        """Predicts ``specs`` (with ``staging``'s pipeline and remat, default the current
        ones); the model's state changes only when the prediction succeeds (a view drawn
        meanwhile from another thread shows the last evaluation, consistently)."""
        start = time.perf_counter()
        pipeline, remat = staging if staging is not None else (self.pipeline, dict(self.remat))
        remat_spec = self.remat_spec(remat)  # refuses mixed policies
        staged: Plan | None = None
        schedule: PipelineCost | None = None
        if pipeline is not None or remat_spec is not None:
            hand = self._hand_plan(specs, dict(self.constraints))
            staged, schedule = self._stage(hand, pipeline, remat_spec)
            cost = staged.cost
        else:
            cost = predict(
                self.fn,
                *self.args,
                mesh=self.mesh,
                in_shardings=self.in_shardings(specs),
                constraints=dict(self.constraints) or None,
                device=self.device,
                traced=self.traced,
            )
        seconds = time.perf_counter() - start
        with self._lock:
            self.generation += 1
            self.specs = specs
            self.applied = None
            self.pipeline, self.remat = pipeline, remat
            evaluation = Evaluation(
                self.generation,
                tuple(specs),
                cost,
                seconds,
                schedule,
                staged,
                tuple(sorted(remat.items())),
            )
            self.previous, self.current = self.current, evaluation
            return self.current

    def compile(self, on_done: Callable[[CompileResult], None] | None = None) -> threading.Thread:
        """Compiles the current strategy in a background thread.

        ``on_done`` receives the result; a result whose strategy is no longer current is
        marked ``superseded`` (the view ignores it).
        """
        generation, specs = self.generation, list(self.specs)
        constraints, applied = dict(self.constraints), self.applied
        if applied is None and self.current is not None:  # stages or remat: that plan
            applied = self.current.plan

        def job() -> None:
            start = time.perf_counter()
            result = CompileResult(generation)
            try:
                # XLA's C++ warnings ("Involuntary full rematerialization...") belong to
                # this view, not to whichever cell runs next.
                with captured_stderr() as messages:
                    if applied is not None:  # an applied plan: its own verify()
                        result.report = applied.verify()
                    else:
                        # The hand plan's function: the traced graph re-evaluated with the
                        # constraints inserted. Output layouts are left to XLA.
                        fn = self._function(constraints)
                        result.report = analyze(
                            fn, *self.args, mesh=self.mesh, in_shardings=self.in_shardings(specs)
                        )
            except Exception as error:  # shown in the editor; the kernel keeps running
                result.error = f"{type(error).__name__}: {error}"
            result.messages = messages.text
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
        if self.applied is not None:  # no edit since: the plan itself
            return self.applied
        if self.current is not None and self.current.plan is not None:  # stages or remat
            return self.current.plan
        return self._hand_plan(list(self.specs), dict(self.constraints))

    def _hand_plan(self, specs: list[PartitionSpec], constraints: dict[int, PartitionSpec]) -> Plan:
        graph = self.graph
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


def _stages_text(evaluation: Evaluation) -> str:
    if evaluation.pipeline is None:
        return "off"
    spec = evaluation.pipeline.spec
    return f"{spec.stages} stages × {spec.microbatches} microbatches ({spec.schedule})"


def stage_diff(
    before: Evaluation | None, after: Evaluation, groups: tuple[LayerGroup, ...] = ()
) -> list[str]:
    """What an edit changed in the pipeline and the remat policies, in words."""
    if before is None:
        return []
    out = []
    if _stages_text(before) != _stages_text(after):
        out.append(f"pipeline: {_stages_text(before)} → {_stages_text(after)}")
    old, new = dict(before.remat), dict(after.remat)
    for group in groups:
        a, b = old.get(group.scan, "none"), new.get(group.scan, "none")
        if a != b:
            where = f" ({group.label})" if len(groups) > 1 else ""
            out.append(f"remat{where}: {a} → {b}")
    return out


def diff(before: CostBreakdown | None, after: CostBreakdown) -> list[str]:
    """What changed between two predictions, in words and human units."""
    if before is None:
        return []
    out = []
    for kind in after.comm_bytes:
        b, a = before.comm_bytes.get(kind, 0.0), after.comm_bytes[kind]
        if abs(a - b) > 0.5:
            out.append(f"{kind}: {human_bytes(b)} → {human_bytes(a)}")
    if before.memory.peak != after.memory.peak:
        out.append(
            f"memory per device: {human_bytes(before.memory.peak)} → "
            f"{human_bytes(after.memory.peak)}"
        )
    if abs(before.time - after.time) > 1e-9:
        out.append(f"step time: {human_time(before.time)} → {human_time(after.time)}")
    return out or ["no change in the predicted figures"]


__all__ = ["EditorModel", "Evaluation", "Leaf", "ShardingSpecError", "diff", "stage_diff"]
