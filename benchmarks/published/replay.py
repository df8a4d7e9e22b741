"""Replaying a published run on the cost model: its train step traced at the published shape
(abstract arguments), its published degrees as layouts on a deviceless target, the pipeline
through ``predict_pipeline``, the recompute through the remat policy.

Each model is traced once per (batch, sequence) and each plan priced once per (trace, mesh,
layout); a plan's per-layer times are computed once per remat policy and shared by the
pipeline specs priced on it (Fig. 12's and torchtitan's schedule pairs).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from benchmarks.published.record import Run
from shardlab.examples.gpt3 import GPTConfig, gpt
from shardlab.examples.llama import llama
from shardlab.parallel.records import PipelineSpec


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The cost model's step for one run.

    Attributes:
        seconds: the predicted step time.
        compute: seconds computing (pipelined: the stages' busy time and bubbles, and the
            part outside the pipeline).
        communication: seconds of exposed communication.
        bubble: the pipeline bubble over the ideal (Megatron's definition), or ``None``.
        recompute: seconds of recomputed forward per device (one stage's, pipelined).
        attention: unpipelined rows: seconds (per device, without recompute) of the
            operations reading or writing a (…, seq, seq) attention tensor, which a fused
            (flash) attention kernel keeps out of memory; ``None`` for pipelined rows.
        spec: the pipeline priced, or ``None``.
        wall: seconds this row took to replay (tracing and pricing what was not cached).
    """

    seconds: float
    compute: float
    communication: float
    bubble: float | None
    recompute: float
    spec: PipelineSpec | None
    wall: float
    attention: float | None = None


class Replayer:
    """Traces, targets, plans and layer times, cached across rows."""

    def __init__(self) -> None:
        self._traced: dict[Any, Any] = {}
        self._targets: dict[Any, Any] = {}
        self._plans: dict[Any, Any] = {}
        self._layers: dict[Any, Any] = {}

    def traced(self, run: Run) -> tuple[Any, Any]:
        """``(case, traced)`` of the run's train step at its batch and sequence."""
        key = (run.model, run.batch, run.seq)
        if key not in self._traced:
            from shardlab.parallel.graph.trace import trace

            if isinstance(run.model, GPTConfig):
                case = gpt(run.model, batch=run.batch, seq=run.seq)
            else:
                case = llama(run.model, batch=run.batch, seq=run.seq)
            self._traced[key] = (case, trace(case.fn, *case.args))
        return self._traced[key]

    def mesh(self, run: Run) -> Any:
        import shardlab

        if run.kind.startswith("tpu"):
            key: Any = (run.kind, run.topology, run.slices)
            if key not in self._targets:
                self._targets[key] = shardlab.target(
                    run.kind, topology=run.topology, slices=run.slices
                )
        else:
            key = (run.kind, run.devices // 8)
            if key not in self._targets:
                self._targets[key] = shardlab.target(run.kind, hosts=run.devices // 8)
        return shardlab.mesh(dict(run.mesh), devices=self._targets[key])

    def layouts(self, run: Run) -> tuple[Any, Any, list[Any], dict[int, Any]]:
        """``(traced, mesh, argument layouts, {node: layout})``: the run's published
        strategy, once per (trace, mesh, layout)."""
        key = (run.model, run.batch, run.seq, run.kind, run.mesh, run.layout)
        if key in self._plans:
            return self._plans[key]
        from shardlab.parallel.search.strategies.baselines import baseline_layouts

        _, traced = self.traced(run)
        mesh = self.mesh(run)
        axes = [name for name, _ in run.mesh]
        batch_axes = tuple(a for a in axes if a in ("replica", "data"))
        tensor = "model" if run.layout in ("megatron", "fsdp+tp") else None
        fsdp = ("data",) if run.layout in ("zero3", "fsdp+tp") else ()
        layouts, constraints = baseline_layouts(
            traced,
            mesh,
            data_axes=batch_axes,
            model_axis=tensor,
            zero_axes=fsdp,
            zero_stage=3 if fsdp else 1,
            name=run.layout,
        )
        if fsdp:
            # FSDP gathers every parameter where it is used, the embedding, positions, head
            # and final norm too: the baselines constrain the layer scan's reads only
            # (scan_slice), and a feature-split positions table would otherwise win over the
            # batch split and every device compute the whole batch (measured on the GPT).
            plain, _ = baseline_layouts(
                traced, mesh, data_axes=batch_axes, model_axis=tensor, name=run.layout
            )
            constraints = {**_gathered_uses(traced, mesh, layouts, plain), **constraints}
        if tensor and isinstance(run.model, GPTConfig):
            # Megatron's vocab-parallel embedding (the output layer is the same matrix): the
            # vocabulary split over the tensor axis. The baselines' Megatron rule finds
            # matmul pairs and leaves the tied embedding replicated.
            vocab = (run.model.vocab, run.model.d)
            layouts = [
                ((tensor,), ()) if tuple(shape) == vocab else lay
                for shape, lay in zip(traced.input_shapes(), layouts, strict=True)
            ]
        self._plans[key] = (traced, mesh, layouts, constraints)
        return self._plans[key]

    def plan(self, run: Run) -> Any:
        """The run's layouts as a plan, priced once (unpipelined rows: pipelined ones are
        priced from their layer times alone)."""
        key = (run.model, run.batch, run.seq, run.kind, run.mesh, run.layout, "plan")
        if key not in self._plans:
            from shardlab.parallel.plan.fixed import fixed_plan

            traced, mesh, layouts, constraints = self.layouts(run)
            self._plans[key] = fixed_plan(
                traced,
                mesh,
                layouts,
                method=f"published {run.layout}",
                constraints=constraints or None,
            )
        return self._plans[key]

    def layer_times(self, run: Run) -> Any:
        """``cost/pipeline.layer_times`` of the run's layouts under its remat policy, once
        per policy (the stage axis taken out)."""
        key = (run.model, run.batch, run.seq, run.kind, run.mesh, run.layout, run.remat)
        if key not in self._layers:
            from shardlab.parallel.cost.compilers import held_graph
            from shardlab.parallel.cost.pipeline import layer_times
            from shardlab.parallel.cost.profiles import resolve_profile
            from shardlab.parallel.mesh import mesh_shape_of

            traced, mesh, layouts, constraints = self.layouts(run)
            profile = resolve_profile(None, mesh)
            graph = held_graph(traced.graph, profile.compiler)
            inside = {graph.nodes[i].outputs[0]: lay for i, lay in constraints.items()}
            self._layers[key] = layer_times(
                graph,
                layouts,
                mesh_shape_of(mesh),
                profile,
                policy=run.remat,
                constraints=inside or None,
            )
        return self._layers[key]

    def predict(self, run: Run) -> Prediction:
        start = time.perf_counter()
        if run.schedule:
            from shardlab.parallel.cost.pipeline import predict_pipeline
            from shardlab.parallel.cost.profiles import resolve_profile
            from shardlab.parallel.plan.binding import Binding

            traced, mesh, layouts, _ = self.layouts(run)
            spec = PipelineSpec(
                run.stages,
                run.microbatches,
                schedule=run.schedule,
                virtual_stages=run.virtual,
            )
            layers = self.layer_times(run)
            got = predict_pipeline(
                Binding(traced, mesh),
                spec,
                input_layouts=layouts,
                device=resolve_profile(None, mesh),
                policy=run.remat,
                assignment=run.assignment,
                layers=layers,
            )
            per_stage = max(1, layers[0].layers // run.stages)
            return Prediction(
                got.time,
                got.cost.compute_time,
                got.time - got.cost.compute_time,
                got.schedule.bubble_over_ideal,
                sum(layers[0].recompute[:per_stage]),
                spec,
                time.perf_counter() - start,
            )
        plan = self.plan(run)
        recompute = 0.0
        if run.remat != "none":
            from shardlab.parallel.plan.remat import with_remat

            before = plan.cost.compute_time
            plan = with_remat(plan, run.remat)
            recompute = plan.cost.compute_time - before
        cost = plan.cost
        return Prediction(
            cost.time,
            cost.compute_time,
            cost.time - cost.compute_time,
            None,
            recompute,
            None,
            time.perf_counter() - start,
            self.attention(run),
        )

    def attention(self, run: Run) -> float:
        """Seconds the unpipelined plan spends on operations over (…, seq, seq) tensors."""
        key = (run.model, run.batch, run.seq, run.kind, run.mesh, run.layout, "attention")
        if key not in self._plans:
            from shardlab.parallel.cost.predict import layout_cost
            from shardlab.parallel.cost.profiles import resolve_profile
            from shardlab.parallel.mesh import mesh_shape_of

            traced, mesh, layouts, constraints = self.layouts(run)
            g = traced.graph
            inside = {g.nodes[i].outputs[0]: lay for i, lay in constraints.items()}
            profile = resolve_profile(None, mesh)
            _, prop = layout_cost(
                g, layouts, mesh_shape_of(mesh), profile, constraints=inside or None
            )
            square = (run.seq, run.seq)

            def touches(index: int) -> bool:
                node = g.nodes[index]
                return any(
                    len(g.shapes[v]) > 2 and g.shapes[v][-2:] == square
                    for v in (*node.inputs, *node.outputs)
                )

            self._plans[key] = sum(s for i, _, _, s in prop.spans if touches(i))
        return self._plans[key]


def _gathered_uses(traced: Any, mesh: Any, layouts: list[Any], plain: list[Any]) -> dict[int, Any]:
    """``{node: layout}`` for each use of a parameter the ZeRO-3 layouts split (outside the
    layer scan's reads and the update that writes it back): the layout the use has when the
    parameter is whole (``plain``'s propagation)."""
    from shardlab.parallel.cost.profiles import resolve_profile
    from shardlab.parallel.cost.propagate import propagate
    from shardlab.parallel.mesh import mesh_shape_of

    g = traced.graph
    split = [g.inputs[i] for i, (a, b) in enumerate(zip(layouts, plain, strict=True)) if a != b]
    outputs = set(g.outputs)
    uses = {
        c
        for v in split
        for c in g.consumers(v)
        if g.nodes[c].primitive != "scan_slice" and g.nodes[c].outputs[0] not in outputs
    }
    if not uses:
        return {}
    sizes = mesh_shape_of(mesh)
    prop = propagate(g, list(plain), sizes, resolve_profile(None, mesh))
    return {
        c: prop.layouts[g.nodes[c].outputs[0]]
        for c in sorted(uses)
        if prop.layouts[g.nodes[c].outputs[0]] is not None
    }
