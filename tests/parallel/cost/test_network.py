"""Network levels (issue 34): collectives priced by the links they cross — NVLink inside a
host, InfiniBand across hosts, ICI inside a TPU slice, DCN across slices — with bandwidth by
message size where it was measured (NCCL's curves)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import shardlab
from shardlab.parallel.cost.network import Link, hierarchical_time, message_bytes
from shardlab.parallel.cost.profiles import DEVICE_PROFILES, resolve_profile, wire_bytes

MiB = 1024**2
H100 = DEVICE_PROFILES["h100-nvlink"]
# NVIDIA/dgxc-benchmarking nccl/README.md: 8 x H100 all-reduce, (bytes, microseconds)
DGXC = [
    (8, 13.0),
    (1024, 16.2),
    (65536, 18.9),
    (MiB, 26.9),
    (16 * MiB, 123),
    (64 * MiB, 325),
    (256 * MiB, 1113),
    (1024 * MiB, 4016),
]


def _all_reduce(profile, nbytes, group=8, axes=("d",)):
    return profile.collective_time(
        "all-reduce", wire_bytes("all-reduce", nbytes, group), group, axes
    )


@pytest.mark.parametrize(("size", "us"), DGXC)
def test_an_h100_all_reduce_takes_what_nccl_measured_at_each_size(size, us):
    assert _all_reduce(H100, size) * 1e6 == pytest.approx(us, rel=0.01)


def test_between_measured_sizes_time_grows_and_bus_bandwidth_never_exceeds_the_link():
    sizes = [2**k for k in range(3, 35)]
    times = [_all_reduce(H100, s) for s in sizes]
    assert all(b >= a for a, b in itertools.pairwise(times))
    nvlink = H100.links[0]
    for s in sizes:
        assert nvlink.bus_bandwidth("all-gather", s) <= 370e9
        assert nvlink.bus_bandwidth("all-reduce", s) <= 480e9
    # a 1 MiB all-reduce: 27 us measured; the single latency-per-ring-step datasheet model
    # (5 us x 14 steps + bytes / 450 GB/s) priced it at 74 us
    assert _all_reduce(H100, MiB) < 30e-6


def test_kinds_other_than_all_reduce_reach_nvlinks_effective_bandwidth():
    t = H100.collective_time("all-gather", 7 / 8 * 1024 * MiB, 8, ("d",))
    assert 7 / 8 * 1024 * MiB / t == pytest.approx(370e9, rel=0.01)


def test_message_size_is_the_buffer_nccl_sizes_a_collective_by():
    assert message_bytes("all-reduce", wire_bytes("all-reduce", 100.0, 8), 8) == pytest.approx(100)
    assert message_bytes("all-gather", wire_bytes("all-gather", 100.0, 8), 8) == pytest.approx(100)
    # a reduce-scatter's message is its input: n x its result
    assert message_bytes("reduce-scatter", wire_bytes("reduce-scatter", 100.0, 8), 8) == (
        pytest.approx(800)
    )


def test_a_group_of_one_device_per_host_runs_on_infiniband():
    ib = H100.links[1]
    across = H100.on_layout({"data": (1, 8)})
    b = 256 * MiB
    t = _all_reduce(across, b, axes=("data",))
    assert t == pytest.approx(ib.latency + 2 * 7 / 8 * b / 47e9, rel=1e-6)
    assert t > 8 * _all_reduce(H100, b, axes=("data",))  # NVLink is ~9x faster at this size
    # an axis that stays inside is still NVLink on the same profile
    assert _all_reduce(across, b, axes=("model",)) == _all_reduce(H100, b, axes=("model",))


@pytest.mark.parametrize("kind", ["all-reduce", "all-gather", "reduce-scatter", "all-to-all"])
def test_a_group_spanning_hosts_runs_inside_then_across(kind):
    """16 GPUs on 2 hosts: the inside phase on NVLink, the across phase on InfiniBand with
    1/8 of the data per GPU (each GPU has its own NIC): slower than 16 inside one NVLink
    domain would be, far faster than 16 GPUs each on its own host."""
    nvlink, ib = H100.links
    result = 64 * MiB
    both = hierarchical_time(nvlink, ib, kind, result, 8, 2)
    alone = hierarchical_time(nvlink, ib, kind, result, 1, 16)
    inside = nvlink.time(kind, wire_bytes(kind, result, 16), 16)
    assert inside < both < alone
    spanning = H100.on_layout({"data": (8, 2)})
    wire = wire_bytes(kind, result, 16)
    assert spanning.collective_time(kind, wire, 16, ("data",)) == pytest.approx(both)


def test_a_link_without_a_curve_is_alpha_beta():
    link = Link("test", bandwidth=10e9, latency=5e-6, step_latency=1e-6)
    assert link.time("all-gather", 1e6, 4) == pytest.approx(5e-6 + 3e-6 + 1e6 / 10e9)
    assert link.time("all-gather", 1e6, 1) == 0.0


def test_resolve_profile_lays_a_target_profile_over_its_mesh():
    t = shardlab.target("h100", hosts=8)
    mesh = shardlab.mesh({"data": 8, "model": 8}, devices=t)
    profile = resolve_profile(None, mesh)
    assert profile.name == "h100-nvlink"
    assert dict(profile.axis_split) == {"data": (1, 8)}
    assert profile.hosts_spanned(8, ("data",)) == 8 and profile.hosts_spanned(8, ("model",)) == 1
    # a CPU mesh: no levels
    cpu = resolve_profile(None, shardlab.mesh({"data": 8}))
    assert cpu.links == () and dict(cpu.axis_split) == {}


def test_tpu_slices_are_joined_by_the_data_centre_network():
    t = shardlab.target("tpu-v5e", topology="4x4", slices=2)
    mesh = shardlab.mesh({"data": 2, "fsdp": 16}, devices=t)
    profile = resolve_profile(None, mesh)
    assert dict(profile.axis_split) == {"data": (1, 2)}
    ici, dcn = profile.links
    b = 64 * MiB
    across = profile.collective_time("all-reduce", wire_bytes("all-reduce", b, 2), 2, ("data",))
    assert across == pytest.approx(dcn.latency + b / 3.125e9, rel=1e-6)  # 2(n-1)/n = 1
    inside = profile.collective_time("all-reduce", wire_bytes("all-reduce", b, 16), 16, ("fsdp",))
    assert inside == pytest.approx(ici.time("all-reduce", wire_bytes("all-reduce", b, 16), 16))


def test_a_data_parallel_plan_across_hosts_pays_infiniband_for_its_gradients():
    def step(w, x):
        return jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)

    w = jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16)
    x = jax.ShapeDtypeStruct((512, 4096), jnp.bfloat16)
    specs = (P(), P("data"))
    one = shardlab.mesh({"data": 8}, devices=shardlab.target("h100", hosts=1))
    eight = shardlab.mesh({"data": 8}, devices=shardlab.target("h100", hosts=8, gpus_per_host=1))
    inside = shardlab.predict(step, w, x, mesh=one, in_shardings=specs)
    across = shardlab.predict(step, w, x, mesh=eight, in_shardings=specs)
    assert inside.comm_bytes == across.comm_bytes  # the same bytes, on other links
    ratio = sum(across.comm_time_per_axis.values()) / sum(inside.comm_time_per_axis.values())
    assert 5 < ratio < 12  # 47 GB/s InfiniBand against NVLink's 300-480 at 32 MiB


def test_a_searched_plan_across_hosts_says_what_each_network_level_carries():
    from shardlab.examples.dense import mlp

    case = mlp(64, 64, train=True)  # a train step: the weights' gradients are reduced
    # at a size where splitting pays: weights 4096 x 4096, batch 65536 (abstract)
    wide = {"w1": (4096, 4096), "w2": (4096, 4096)}
    params = {k: jax.ShapeDtypeStruct(v, jnp.bfloat16) for k, v in wide.items()}
    rows = jax.ShapeDtypeStruct((65536, 4096), jnp.bfloat16)
    args = (params, params, (rows, rows))
    assert jax.tree.structure(args) == jax.tree.structure(case.args)
    mesh = shardlab.mesh({"data": 16}, devices=shardlab.target("h100", hosts=2))
    plan = shardlab.search(case.fn, *args, mesh=mesh, confirm=False)
    assert plan.cost.collectives  # over 'data': 8 GPUs per host x 2 hosts
    note = next(n for n in plan.notes if n.startswith("communication by network level"))
    profile = resolve_profile(None, mesh)
    for c in plan.cost.collectives:
        assert profile.link_of(c.group_size, c.mesh_axes) == "InfiniBand NDR"
    assert note.startswith("communication by network level: InfiniBand NDR ")
    assert "(over data)" in note
    # one host: nothing crosses, no note
    one = shardlab.mesh({"data": 2, "model": 4}, devices=shardlab.target("h100", hosts=1))
    plan = shardlab.search(case.fn, *args, mesh=one, confirm=False)
    assert not any(n.startswith("communication by network level") for n in plan.notes)
