"""The cost model predicts the collectives XLA's SPMD partitioner compiles (issue 17).

Measured on XLA:CPU (jax 0.10), where the partitioner decides what the plan leaves open:
- moving a tensor between two layouts (``layouts.reshard``) goes by tile counts per
  dimension: a refinement is a local slice plus a collective-permute, a coarsening a
  permute plus one all-gather per dimension, tiles moving between dimensions an all-to-all
  (after slicing the replicas when the target is fully tiled), each with a permute when
  the device order differs; a replicated target is gathered dimension by dimension;
- ZeRO × Megatron: a gradient is resharded once into the optimizer state's layout (Adam's
  two moments share it), the update runs in that layout, and a matmul's gradient the state
  wants split over the data axis is computed split over the model axis's devices instead,
  all-reduced in those pieces and permuted into place.
"""

from __future__ import annotations

import collections
import functools
import itertools

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from shardlab.bench.corpus import models
from shardlab.parallel.compiled.analyze import analyze
from shardlab.parallel.cost import layouts as L
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.search.baselines import baselines

AXES = ("data", "model")
SHAPE = (32, 64)


def _layouts() -> list[L.DimAxes]:
    """Every layout of a matrix on a two-axis mesh (each axis used at most once)."""
    out: set[L.DimAxes] = set()
    for where in itertools.product((None, 0, 1), repeat=2):
        dims: list[list[str]] = [[], []]
        for axis, d in zip(AXES, where, strict=True):
            if d is not None:
                dims[d].append(axis)
        for d in (0, 1):
            for order in itertools.permutations(dims[d]):
                lay = [tuple(x) for x in dims]
                lay[d] = tuple(order)
                out.add((lay[0], lay[1]))
    return sorted(out)


def _spec(lay: L.DimAxes) -> PartitionSpec:
    return PartitionSpec(*[(a if len(a) > 1 else a[0]) if a else None for a in lay])


def _kinds(items) -> list[tuple[str, int, int]]:
    return sorted(items)


@pytest.mark.parametrize("shape", [(2, 4), (4, 2)])
def test_reshard_predicts_the_partitioners_collectives_for_every_layout_pair(shape):
    """All 110 ordered pairs of distinct matrix layouts on the mesh: the predicted
    collectives (kind, result bytes per device, group size) are the compiled ones."""
    mesh = make_mesh(shape=shape, names=AXES)
    sizes = dict(zip(AXES, shape, strict=True))
    x = jax.ShapeDtypeStruct(SHAPE, jnp.float32)
    nbytes = SHAPE[0] * SHAPE[1] * 4
    wrong = []
    for src, dst in itertools.permutations(_layouts(), 2):
        target = NamedSharding(mesh, _spec(dst))

        def f(a, target=target):
            return jax.lax.with_sharding_constraint(a * 2, target) * 3

        report = analyze(
            f, x, mesh=mesh, in_shardings=(NamedSharding(mesh, _spec(src)),), out_shardings=target
        )
        compiled = _kinds((c.kind, c.bytes, c.group_size) for c in report.collectives)
        predicted = _kinds((k, b, g) for k, b, g, _ in L.reshard(src, dst, nbytes, sizes))
        if compiled != predicted:
            wrong.append((src, dst, compiled, predicted))
    assert not wrong, wrong


def test_reshard_gathers_a_replicated_target_dimension_by_dimension():
    sizes = {"data": 2, "model": 4}
    got = L.reshard((("data",), ("model",)), ((), ()), 8192, sizes)
    assert got == [("all-gather", 4096, 4, ("model",)), ("all-gather", 8192, 2, ("data",))]


def test_reshard_between_axes_of_one_dimension_permutes_instead_of_gathering():
    """ZeRO's optimizer state split over ``data`` where Megatron splits the weight over
    ``model`` on the same dimension: a permute and a gather over the factor between them
    (model → data), or a local slice and a permute (data → model); never a full gather."""
    sizes = {"data": 2, "model": 4}
    to_state = L.reshard((("model",), ()), (("data",), ()), 8192, sizes)
    assert to_state == [
        ("collective-permute", 2048, 2, ("model", "data")),
        ("all-gather", 4096, 2, ("model",)),
    ]
    to_param = L.reshard((("data",), ()), (("model",), ()), 8192, sizes)
    assert to_param == [("collective-permute", 2048, 2, ("data", "model"))]


@functools.cache
def _equinox_mlp():
    return models.equinox_mlp()


def _per_kind(collectives) -> dict[str, tuple[int, int]]:
    out: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for c in collectives:
        out[c.kind][0] += c.count
        out[c.kind][1] += c.count * c.bytes
    return {k: (n, b) for k, (n, b) in sorted(out.items())}


def test_zero_megatron_step_predicts_the_compiled_collectives():
    """The equinox MLP's ZeRO × Megatron step on 2×4: per kind, the predicted collectives'
    count and bytes are the compiled program's (the old model gathered the gradient for
    each Adam moment and the update over whole axes: 1.48× the compiled time)."""
    case = _equinox_mlp()
    mesh = make_mesh(shape=(2, 4), names=AXES)
    plan = baselines(case.fn, *case.args, mesh=mesh)["zero+megatron"]
    report = plan.verify()
    assert _per_kind(plan.cost.collectives) == _per_kind(report.collectives)
    assert plan.cost.comm_time == pytest.approx(plan.compiled_comm_time(report), rel=1e-6)
