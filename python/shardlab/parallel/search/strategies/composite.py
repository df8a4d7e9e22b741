"""Hand-made five-dimensional baselines: pipeline stages, data and tensor splits, ZeRO and
rematerialisation combined into one plan.

Each is a plain baseline (``baselines.py``) with the layer scans pipelined
(``plan/pipeline.py: with_pipeline``) and/or rematerialised (``plan/remat.py: with_remat``):

- ``pipeline_data``: stages over the ``stage`` axis, the batch split over the other axes;
- ``pipeline_tensor``: stages over ``stage``, Megatron over the model axis, the batch over
  the rest;
- ``zero3_remat``: data × tensor × ZeRO-3 (parameters and optimizer state split over the
  data axes) × remat (by default ``nothing``: only each layer's input is kept).

They are what the strategy search's pipeline and remat choices are measured against
(issue 15), and what a user reaches for by hand. Errors come from the parts: a mesh without
the stage axis, stages that do not divide the layers, microbatches that do not divide the
batch, a model without a layer scan, each naming the value and what would be valid.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from jax.sharding import Mesh

from shardlab.parallel.errors import SearchError
from shardlab.parallel.plan.pipeline import with_pipeline
from shardlab.parallel.plan.plan import Plan
from shardlab.parallel.plan.remat import with_remat
from shardlab.parallel.records import PipelineSpec, RematSpec
from shardlab.parallel.search.strategies.baselines import data_parallel, megatron, zero


def _stage_axis(mesh: Mesh, axis: str, what: str) -> int:
    names = [str(a) for a in mesh.axis_names]
    if axis not in names:
        raise SearchError(
            f"{what}: the mesh has no {axis!r} axis (axes {names}); make one, e.g. "
            f"shardlab.mesh({axis}=2, data={max(1, mesh.size // 2)}), or pass axis= one of {names}"
        )
    return int(mesh.shape[axis])


def _finish(plan: Plan, name: str, spec: PipelineSpec | None, remat: str | None) -> Plan:
    # remat first: with_pipeline prices the stages with the plan's remat policy, where
    # with_remat's own pricing knows nothing of stages
    if remat is not None and remat != "none":
        plan = with_remat(plan, RematSpec(remat))
    if spec is not None:
        plan = with_pipeline(plan, spec)
    return dataclasses.replace(plan, method=name)


def pipeline_data(
    fn: Callable[..., Any],
    *args: Any,
    mesh: Mesh,
    microbatches: int,
    axis: str = "stage",
    schedule: str = "gpipe",
    remat: str | None = None,
    batch_argnums=None,
    device=None,
    traced=None,
) -> Plan:
    """Pipeline stages over ``axis`` (its size), the batch split over every other axis.

    Args:
        fn, args: the train step and example arguments.
        mesh: a mesh with ``axis``.
        microbatches: per step (divides the batch).
        schedule: ``gpipe`` or ``1f1b`` (priced; runs as GPipe).
        remat: a remat policy for the layer scans (``dots``, ``nothing``), or ``None``.
    """
    stages = _stage_axis(mesh, axis, "pipeline_data")
    data = tuple(str(a) for a in mesh.axis_names if a != axis)
    base = data_parallel(
        fn, *args, mesh=mesh, axes=data, batch_argnums=batch_argnums, device=device, traced=traced
    )
    spec = PipelineSpec(stages, microbatches, axis=axis, schedule=schedule)
    return _finish(base, "pipeline+data", spec, remat)


def pipeline_tensor(
    fn: Callable[..., Any],
    *args: Any,
    mesh: Mesh,
    microbatches: int,
    model_axis: str | None = None,
    axis: str = "stage",
    schedule: str = "gpipe",
    remat: str | None = None,
    batch_argnums=None,
    device=None,
    traced=None,
) -> Plan:
    """Pipeline stages over ``axis``, Megatron over ``model_axis`` (default: the last other
    axis), the batch over the remaining axes."""
    stages = _stage_axis(mesh, axis, "pipeline_tensor")
    others = [str(a) for a in mesh.axis_names if a != axis]
    if not others:
        raise SearchError(
            f"pipeline_tensor: the mesh has only the {axis!r} axis; add a model axis, e.g. "
            f"shardlab.mesh({axis}={stages}, model=2)"
        )
    model_axis = model_axis or others[-1]
    if model_axis not in others:
        raise SearchError(f"pipeline_tensor: model_axis {model_axis!r} not among {others}")
    data = tuple(a for a in others if a != model_axis)
    base = megatron(
        fn,
        *args,
        mesh=mesh,
        model_axis=model_axis,
        data_axes=data,
        batch_argnums=batch_argnums,
        device=device,
        traced=traced,
    )
    spec = PipelineSpec(stages, microbatches, axis=axis, schedule=schedule)
    return _finish(base, "pipeline+tensor", spec, remat)


def zero3_remat(
    fn: Callable[..., Any],
    *args: Any,
    mesh: Mesh,
    model_axis: str | None = None,
    policy: str = "nothing",
    batch_argnums=None,
    device=None,
    traced=None,
) -> Plan:
    """Data × tensor × ZeRO-3 × remat: the batch, parameters and optimizer state split over
    every axis but ``model_axis`` (Megatron there, if given), the layer scans
    rematerialised with ``policy``."""
    base = zero(
        fn,
        *args,
        mesh=mesh,
        model_axis=model_axis,
        batch_argnums=batch_argnums,
        device=device,
        traced=traced,
        stage=3,
    )
    name = "zero3+remat" if model_axis is None else "zero3+megatron+remat"
    return _finish(base, name, None, policy)
