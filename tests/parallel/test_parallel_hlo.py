"""The HLO reader: literal snippets for every form, and real compiled programs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardlab as sp
from shardlab._core.equivalence import assert_same_program
from shardlab.parallel.compiled.hlo import collectives_from_hlo, parse_replica_groups, shape_bytes

MESH_24 = {"data": 2, "model": 4}


def _module(*lines: str, partitions: int = 8) -> str:
    body = "\n".join(f"  {line}" for line in lines)
    return (
        f"HloModule m, num_partitions={partitions}\n\n"
        "%add (x: f32[], y: f32[]) -> f32[] {\n  %x = f32[] parameter(0)\n"
        "  %y = f32[] parameter(1)\n  ROOT %s = f32[] add(%x, %y)\n}\n\n"
        "ENTRY %main (p: f32[8,16]) -> f32[8,16] {\n"
        "  %p = f32[8,16]{1,0} parameter(0)\n" + body + "\n}\n"
    )


def test_explicit_replica_groups_model_axis():
    hlo = _module(
        "ROOT %all-reduce = f32[8,16]{1,0} all-reduce(%p), channel_id=1, "
        "replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add, "
        'metadata={op_name="jit(f)/dot_general" source_file="/u/model.py" source_line=12}'
    )
    (c,) = collectives_from_hlo(hlo, MESH_24)
    assert (c.kind, c.bytes, c.group_size, c.mesh_axes) == ("all-reduce", 512, 4, ("model",))
    assert c.wire_bytes == pytest.approx(2 * 3 / 4 * 512)
    assert c.source == "/u/model.py:12"
    assert c.op_name.endswith("dot_general")


def test_iota_replica_groups_with_transpose_span_data():
    # [4,2]<=[2,4]T(1,0): groups {0,4},{1,5},{2,6},{3,7} -> the 'data' axis of a (2,4) mesh.
    groups = parse_replica_groups("replica_groups=[4,2]<=[2,4]T(1,0), x", 8)
    assert groups == [[0, 4], [1, 5], [2, 6], [3, 7]]
    hlo = _module(
        "ROOT %ag = f32[8,16]{1,0} all-gather(%p), replica_groups=[4,2]<=[2,4]T(1,0), "
        "dimensions={0}"
    )
    (c,) = collectives_from_hlo(hlo, MESH_24)
    assert (c.kind, c.group_size, c.mesh_axes) == ("all-gather", 2, ("data",))
    assert c.wire_bytes == pytest.approx(0.5 * 512)


def test_plain_iota_groups():
    assert parse_replica_groups("replica_groups=[2,4]<=[8]", 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_mesh_form_with_and_without_device_ids():
    text = "replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=4] {'axis_0'}, x"
    assert parse_replica_groups(text, 8) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    text = "replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_0'}"
    # device ids 0,4,1,5,2,6,3,7 on a (4,2) grid; groups run along axis_0.
    assert parse_replica_groups(text, 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    text = "replica_groups=mesh['a'=2,'b'=4], device_ids=(7,6,5,4,3,2,1,0) {'b'}"
    assert parse_replica_groups(text, 8) == [[7, 6, 5, 4], [3, 2, 1, 0]]


def test_tuple_results_are_summed():
    hlo = _module(
        "%ar = (f32[], f32[8,16]{1,0}, bf16[4,4]{1,0}) all-reduce(%p, %p, %p), "
        "replica_groups={{0,4},{1,5},{2,6},{3,7}}, to_apply=%add",
        "ROOT %g = f32[8,16]{1,0} get-tuple-element(%ar), index=1",
    )
    (c,) = collectives_from_hlo(hlo, MESH_24)
    assert c.bytes == 4 + 512 + 32
    assert c.mesh_axes == ("data",)
    assert shape_bytes("(f32[2,1,4]{2,1,0}, pred[3], token[])") == 32 + 3


def test_async_start_done_counted_once_sized_by_done():
    hlo = _module(
        "%ags = (f32[2,16]{1,0}, f32[8,16]{1,0}) all-gather-start(%p), "
        "replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}, "
        'metadata={op_name="jit(f)/all_gather"}',
        "%agd = f32[8,16]{1,0} all-gather-done(%ags)",
        "%ars = f32[8,16]{1,0} all-reduce-start(%agd), replica_groups={}, to_apply=%add",
        "ROOT %ard = f32[8,16]{1,0} all-reduce-done(%ars)",
    )
    cs = collectives_from_hlo(hlo, MESH_24)
    assert [c.kind for c in cs] == ["all-gather", "all-reduce"]
    assert cs[0].bytes == 512 and cs[0].op_name == "jit(f)/all_gather"
    assert cs[1].group_size == 8 and cs[1].mesh_axes == ("data", "model")


def test_collective_permute_and_all_to_all_and_reduce_scatter():
    hlo = _module(
        "%cp = f32[8,16]{1,0} collective-permute(%p), "
        "source_target_pairs={{0,1},{1,2},{2,3},{3,0},{4,5},{5,6},{6,7},{7,4}}",
        "%a2a = (f32[2,16]{1,0}, f32[2,16]{1,0}, f32[2,16]{1,0}, f32[2,16]{1,0}) "
        "all-to-all(%cp, %cp, %cp, %cp), replica_groups=[2,4]<=[8]",
        "ROOT %rs = f32[2,16]{1,0} reduce-scatter(%p), replica_groups=[2,4]<=[8], "
        "dimensions={0}, to_apply=%add",
    )
    cp, a2a, rs = collectives_from_hlo(hlo, MESH_24)
    assert (cp.kind, cp.group_size, cp.mesh_axes, cp.wire_bytes) == (
        "collective-permute", 2, ("model",), 512.0)  # fmt: skip
    assert (a2a.bytes, a2a.wire_bytes) == (512, pytest.approx(3 / 4 * 512))
    assert (rs.kind, rs.bytes, rs.wire_bytes) == ("reduce-scatter", 128, 3 * 128)


def test_collectives_in_while_body_count_trip_count():
    hlo = (
        "HloModule m, num_partitions=8\n\n"
        "%add (x: f32[], y: f32[]) -> f32[] {\n  ROOT %s = f32[] add(%x, %y)\n}\n\n"
        "%body (t: f32[4]) -> f32[4] {\n  %t = f32[4]{0} parameter(0)\n"
        "  ROOT %ar = f32[4]{0} all-reduce(%t), replica_groups=[1,8]<=[8], to_apply=%add\n}\n\n"
        "%cond (t: f32[4]) -> pred[] {\n  ROOT %c = pred[] constant(true)\n}\n\n"
        "ENTRY %main (p: f32[4]) -> f32[4] {\n  %p = f32[4]{0} parameter(0)\n"
        "  ROOT %w = f32[4]{0} while(%p), condition=%cond, body=%body, "
        'backend_config={"known_trip_count":{"n":"6"}}\n}\n'
    )
    (c,) = collectives_from_hlo(hlo, MESH_24)
    assert c.count == 6
    assert sp.Report((c,), sp.MemoryBreakdown(0, 0, 0, 0), 0.0, (), (), MESH_24).comm_bytes[
        "all-reduce"
    ] == pytest.approx(6 * 2 * 7 / 8 * 16)


@pytest.fixture(scope="module")
def mesh24():
    return sp.mesh(data=2, model=4)


def test_analyze_all_gather_and_all_to_all_real(mesh24):
    x = jnp.arange(8 * 16, dtype=jnp.float32).reshape(8, 16)
    r = sp.analyze(
        lambda a: a * 2, x, mesh=mesh24, in_shardings=P("model", None), out_shardings=P()
    )
    assert [c.kind for c in r.collectives] == ["all-gather"]
    (c,) = r.collectives
    assert c.mesh_axes == ("model",) and c.group_size == 4 and c.bytes == 512
    r = sp.analyze(
        lambda a: a * 2, x, mesh=mesh24, in_shardings=P("model"), out_shardings=P(None, "model")
    )
    kinds = {c.kind for c in r.collectives}
    assert kinds == {"all-to-all"}
    assert r.comm_bytes["all-to-all"] == pytest.approx(3 / 4 * 128)
    assert r.output_shardings == ("P(None, 'model')",)


def test_analyze_row_parallel_matmul_source_memory_and_numbers(mesh24):
    x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 16)), jnp.float32)
    w = jnp.asarray(np.random.default_rng(1).normal(size=(16, 32)), jnp.float32)

    def f(x, w):
        return jnp.tanh(x @ w)  # the all-reduce comes from this line

    line = f.__code__.co_firstlineno + 1
    r = sp.analyze(f, x, w, mesh=mesh24, in_shardings=(P("data", "model"), P("model", None)))
    (c,) = [c for c in r.collectives if c.kind == "all-reduce"]
    assert c.mesh_axes == ("model",)
    assert c.bytes == 4 * 32 * 4  # (8/2) x 32 f32 per device
    assert c.source.endswith(f"test_parallel_hlo.py:{line}")
    assert r.memory.argument == (4 * 4 + 4 * 32) * 4
    assert r.memory.total == r.memory.argument + r.memory.output - r.memory.alias + r.memory.temp
    assert r.flops > 0
    assert "all-reduce" in r.hlo
    assert r.to_dict()["total_comm_bytes"] == pytest.approx(r.total_comm_bytes)
    # the sharded program computes what the unsharded one does
    sharded = jax.jit(
        f,
        in_shardings=(
            NamedSharding(mesh24, P("data", "model")),
            NamedSharding(mesh24, P("model", None)),
        ),
    )(x, w)
    assert_same_program(sharded, f(x, w), fn=f, args=(x, w))


def test_analyze_counts_every_trip_of_a_scan_in_its_flops():
    """XLA:CPU's cost analysis counts a scan body once (a 4-layer scan of matmuls reads as one
    layer); the report counts each trip."""
    import jax
    import jax.numpy as jnp

    import shardlab

    def f(w, x):
        return jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, w)[0]

    mesh = shardlab.mesh(data=8)
    w, x = jnp.ones((4, 256, 256)), jnp.ones((64, 256))
    report = shardlab.analyze(f, w, x, mesh=mesh)
    matmuls = 4 * 2 * 64 * 256 * 256  # every device computes all of it (nothing sharded)
    assert matmuls <= report.flops <= 1.02 * matmuls
