"""Timelines: the cost model's schedule (overlap, exposure) and a measured profiler trace."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import shardlab
from shardlab.parallel.cost.schedule import measure, schedule
from shardlab.widgets.timeline.svg import TimelineView


def loss(params, x):
    for w1, w2 in params:
        x = jnp.tanh(x @ w1) @ w2
    return (x**2).mean()


@pytest.fixture(scope="module")
def case():
    mesh = shardlab.mesh(data=2, model=4)
    params = [(jnp.ones((64, 256)) * 0.01, jnp.ones((256, 64)) * 0.01) for _ in range(4)]
    return mesh, jax.grad(loss), params, jnp.ones((128, 64))


@pytest.mark.parametrize(
    "specs",
    [
        ([(P(), P())] * 4, P("data")),  # data parallel
        ([(P(None, "model"), P("model", None))] * 4, P("data")),  # + megatron
    ],
    ids=["dp", "dp+megatron"],
)
def test_schedule_totals_agree_with_predict(case, specs):
    mesh, fn, params, x = case
    tl = schedule(fn, params, x, mesh=mesh, in_shardings=specs)
    cost = shardlab.predict(fn, params, x, mesh=mesh, in_shardings=specs)
    assert tl.compute == pytest.approx(cost.compute_time, rel=1e-6)
    comm = [e for e in tl.events if e.stream == "communication"]
    # the same bytes as the prediction; the time is predict's or more (no combining here)
    assert sum(e.wire_bytes for e in comm) == pytest.approx(cost.total_comm_bytes, rel=1e-9)
    assert tl.communication >= cost.comm_time * (1 - 1e-9)
    assert 0 <= tl.exposed <= tl.communication + 1e-12
    assert tl.total == pytest.approx(tl.compute + tl.exposed, rel=1e-6)
    compute = sorted((e for e in tl.events if e.stream == "compute"), key=lambda e: e.start)
    for a, b in itertools.pairwise(compute):  # one in-order compute stream
        assert b.start >= a.end - 1e-12


def test_data_parallel_gradient_reduction_overlaps_backward_where_collectives_are_async(case):
    """XLA:GPU and XLA:TPU run collectives asynchronously: early layers' gradients reduce
    while later backward computes. XLA:CPU runs each collective between two operations: all
    of it is exposed."""
    mesh, fn, params, x = case
    specs = ([(P(), P())] * 4, P("data"))
    gpu = schedule(fn, params, x, mesh=mesh, in_shardings=specs, device="h100-nvlink")
    assert gpu.hidden > 0
    assert gpu.exposed > 0  # the last gradient cannot hide
    cpu = schedule(fn, params, x, mesh=mesh, in_shardings=specs)  # cpu-sim: XLA:CPU
    assert cpu.hidden == pytest.approx(0, abs=1e-12)
    assert cpu.exposed == pytest.approx(cpu.communication)
    assert cpu.total == pytest.approx(cpu.compute + cpu.communication)


def test_replicated_has_no_communication(case):
    mesh, fn, params, x = case
    tl = schedule(fn, params, x, mesh=mesh, in_shardings=([(P(), P())] * 4, P()))
    assert tl.communication == 0 and tl.exposed == 0
    assert tl.total == pytest.approx(tl.compute)


def test_measured_trace_has_every_device_and_collectives(case):
    mesh, fn, params, x = case
    specs = ([(P(None, "model"), P("model", None))] * 4, P("data"))
    tl = measure(fn, params, x, mesh=mesh, in_shardings=specs)
    assert tl.measured and tl.devices == 8
    assert {e.device for e in tl.events} == set(range(8))
    assert any(e.kind == "all-reduce" for e in tl.events)
    assert tl.total > 0 and tl.compute > 0


def test_timeline_view_marks_exposed_communication(case):
    mesh, fn, params, x = case
    specs = ([(P(None, "model"), P("model", None))] * 4, P("data"))
    view = shardlab.timeline(fn, params, x, mesh=mesh, in_shardings=specs, measured=False)
    assert isinstance(view, TimelineView)
    html = view.html()
    assert "sl-exposed" in html and "sl-compute" in html and "sl-model" in html
    assert "not overlapped with compute" in view.text()
    assert "<script" not in html
