"""``shardlab.target``: GPU hosts and TPU slices, compiled for deviceless by their own compilers.

The validation tests need no compiler. The others need the ``targets`` extra (libtpu, the CUDA
plugin and ptxas), which ``make setup`` installs; without it they are skipped locally and
fail in CI (``CI`` set), where a skip would hide that the compilers were never tried.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardlab
from compilers import needs as _needs
from shardlab.parallel.targets.catalog import KINDS, TargetError, parse_target
from shardlab.parallel.targets.layout import split_axes
from shardlab.parallel.targets.target import mesh_layout, target_of

# -- validation, no compiler ---------------------------------------------------------------


def test_an_unknown_kind_lists_the_kinds():
    with pytest.raises(TargetError) as info:
        parse_target("h900", hosts=2)
    message = str(info.value)
    assert "'h900'" in message
    for name in KINDS:
        assert name in message


@pytest.mark.parametrize(
    ("kind", "topology", "example"),
    [("tpu-v5p", "4x4", "'4x4x8'"), ("tpu-v5e", "4x4x4", "'16x16'"), ("tpu-v6e", "axb", "'2x4'")],
)
def test_a_topology_of_the_wrong_shape_names_valid_ones_for_that_kind(kind, topology, example):
    with pytest.raises(TargetError) as info:
        parse_target(kind, topology=topology)
    assert repr(topology) in str(info.value) and example in str(info.value)


@pytest.mark.parametrize(
    ("kind", "kwargs", "words"),
    [
        ("h100", {"topology": "2x2"}, "hosts="),
        ("tpu-v5e", {"hosts": 4}, "topology="),
        ("h100", {"hosts": 0}, "between 1 and"),
        ("h100", {"hosts": True}, "whole number"),
        ("a100", {"gpus_per_host": 16}, "between 1 and 8"),
        ("tpu-v5e", {"topology": "2x4", "slices": 0}, "slices"),
        ("tpu-v5p", {}, "topology='AxBxC'"),
    ],
)
def test_arguments_that_do_not_fit_the_kind_say_what_does(kind, kwargs, words):
    with pytest.raises(TargetError, match=words.replace("(", r"\(")):
        parse_target(kind, **kwargs)


def test_gpu_and_tpu_specs_count_devices_before_any_compiler_loads():
    gpu = parse_target("h100", hosts=8)
    assert (gpu.topology, gpu.device_count, gpu.per_host) == ("1x8x8", 64, 8)
    tpu = parse_target("tpu-v5p", topology="4x4x8", slices=2)
    assert (tpu.topology, tpu.device_count, tpu.slices) == ("v5p:4x4x8", 256, 2)
    assert parse_target("v5e", topology="v5e:16x16").device_count == 256  # aliases


@pytest.mark.parametrize(
    ("shape", "granule", "count", "inner", "outer"),
    [
        ((8, 8), 8, 8, (1, 8), (8, 1)),  # data across hosts, model inside one
        ((16, 4), 8, 8, (2, 4), (8, 1)),  # data 2 inside × 8 hosts
        ((4, 4, 4), 8, 8, (1, 2, 4), (4, 2, 1)),
        ((6, 4), 8, 3, (2, 4), (3, 1)),  # 3 hosts
        ((64,), 8, 8, (8,), (8,)),
        ((2, 4), 8, 1, (2, 4), (1, 1)),  # one host: nothing crosses
    ],
)
def test_axes_fill_a_host_or_slice_from_the_innermost(shape, granule, count, inner, outer):
    split = split_axes(shape, granule, count)
    assert (split.inner, split.outer) == (inner, outer)
    assert all(i * o == s for i, o, s in zip(split.inner, split.outer, shape, strict=True))


# -- devices and meshes, with the compilers ----------------------------------------------


@pytest.mark.parametrize(
    ("kind", "kwargs", "count", "hosts"),
    [
        ("h100", {"hosts": 1}, 8, 1),
        ("h100", {"hosts": 2}, 16, 2),
        ("h100", {"hosts": 8}, 64, 8),
        ("h100", {"hosts": 32}, 256, 32),
        ("a100", {"hosts": 4}, 32, 4),
        ("tpu-v5e", {"topology": "2x4"}, 8, 2),
        ("tpu-v5e", {"topology": "8x8"}, 64, 16),
        ("tpu-v5e", {"topology": "16x16"}, 256, 64),
        ("tpu-v5p", {"topology": "4x4x4"}, 64, 16),
        ("tpu-v5p", {"topology": "8x8x8"}, 512, 128),
    ],
)
def test_a_target_has_the_devices_of_its_hosts_and_slices(kind, kwargs, count, hosts):
    _needs(KINDS[kind].platform)
    t = shardlab.target(kind, **kwargs)
    assert t.device_count == len(t.devices) == count
    assert t.hosts == hosts and t.per_host * t.hosts == count
    assert str(count) in t.description and KINDS[kind].label in t.description
    assert {d.platform for d in t.devices} == {"gpu" if kind[0] in "ha" else "tpu"}
    assert shardlab.target(kind, **kwargs) is t  # made once
    # the process keeps its own simulated CPU devices
    assert jax.devices()[0].platform == "cpu" and len(jax.devices()) == 8


def test_a_gpu_mesh_keeps_the_last_axis_inside_a_host():
    _needs("cuda")
    t = shardlab.target("h100", hosts=8)
    mesh = shardlab.mesh(data=8, model=8, devices=t)
    hosts = np.vectorize(lambda d: d.process_index)(mesh.devices)
    assert all(len(set(row)) == 1 for row in hosts)  # each model group is one host
    assert len(set(hosts[:, 0])) == 8  # data runs across the 8 hosts
    layout = mesh_layout(mesh)
    assert layout is not None and layout.crossing == ("data",)
    assert layout.describe().startswith("data across 8 hosts; model within a host")
    assert target_of(mesh) is t
    assert target_of(shardlab.mesh(data=8)) is None  # the process's own devices

    wide = shardlab.mesh(data=16, model=4, devices=t)
    hosts = np.vectorize(lambda d: d.process_index)(wide.devices)
    assert mesh_layout(wide).inner == (2, 4)
    # each host holds 2 data rows × 4 model columns: a block of the grid
    assert all(len(set(hosts[r : r + 2].ravel())) == 1 for r in range(0, 16, 2))


def test_a_mesh_stays_on_its_target_after_many_other_targets():
    # Devices are cached for 16 specs at a time; a made target keeps its own, so a mesh
    # over an early target is still known as that target (and priced by its profile, not
    # the process's cpu-sim) after more than 16 others (the paper replay makes ~40).
    _needs("cuda")
    first = shardlab.target("a100", hosts=3)
    mesh = shardlab.mesh(data=3, model=8, devices=first)
    for hosts in range(4, 22):
        shardlab.target("a100", hosts=hosts, gpus_per_host=1)
    assert target_of(mesh) is first and mesh_layout(mesh) is not None
    assert shardlab.mesh(data=3, model=8, devices=first).devices.flat[0] is first.devices[0]


def test_a_tpu_mesh_over_two_slices_crosses_slices_only_on_the_outer_axis():
    _needs("tpu")
    t = shardlab.target("tpu-v5e", topology="4x4", slices=2)
    mesh = shardlab.mesh(data=4, fsdp=8, devices=t)
    slices = np.vectorize(lambda d: d.slice_index)(mesh.devices)
    assert all(len(set(row)) == 1 for row in slices)
    assert set(slices[:, 0]) == {0, 1}
    assert mesh_layout(mesh).crossing == ("data",)
    assert "data 2 within × 2 slices; fsdp within a slice" in mesh_layout(mesh).describe()


def test_a_mesh_that_does_not_fit_the_target_gives_shapes_that_do():
    _needs("cuda")
    t = shardlab.target("h100", hosts=2)
    with pytest.raises(ValueError) as info:
        shardlab.mesh(data=3, model=8, devices=t)
    message = str(info.value)
    assert "16" in message and "mesh(data=2, model=8)" in message
    assert t.description in message


def _mlp_step(width: int = 256, hidden: int = 512, batch: int = 64):
    def loss(p, x):
        return ((jnp.tanh(x @ p["w1"]) @ p["w2"]) ** 2).mean()

    def step(p, x):
        g = jax.grad(loss)(p, x)
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, g)

    params = {
        "w1": jax.ShapeDtypeStruct((width, hidden), jnp.bfloat16),
        "w2": jax.ShapeDtypeStruct((hidden, width), jnp.bfloat16),
    }
    x = jax.ShapeDtypeStruct((batch, width), jnp.bfloat16)
    specs = ({"w1": P(None, "model"), "w2": P("model", None)}, P("data", None))
    return step, params, x, specs


@pytest.mark.parametrize(
    ("kind", "kwargs"), [("h100", {"hosts": 1}), ("tpu-v5e", {"topology": "2x4"})]
)
def test_analyze_compiles_for_the_target_from_shapes_or_arrays_alike(kind, kwargs):
    _needs(KINDS[kind].platform)
    t = shardlab.target(kind, **kwargs)
    mesh = shardlab.mesh(data=2, model=4, devices=t)
    step, params, x, specs = _mlp_step()
    report = shardlab.analyze(
        step, params, x, mesh=mesh, in_shardings=specs, out_shardings=specs[0]
    )
    # Megatron: one all-reduce of the hidden activations' gradient over model (64/2 × 256
    # bf16 = 16 KiB), the weight gradients over data (256×512/4 bf16 twice = 128 KiB) — in
    # whatever combination the compiler chose, every byte is there
    by_axes: dict[tuple[str, ...], int] = {}
    for c in report.collectives:
        assert c.kind == "all-reduce"
        by_axes[c.mesh_axes] = by_axes.get(c.mesh_axes, 0) + c.bytes * c.count
    assert by_axes == {("model",): 32 * 256 * 2, ("data",): 2 * 256 * 128 * 2}
    assert report.flops > 0  # XLA:GPU's deviceless executable has no cost analysis of its own
    assert report.memory.argument == (256 * 128 * 2) * 2 + 32 * 256 * 2
    arrays = jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), (params, x))
    again = shardlab.analyze(step, *arrays, mesh=mesh, in_shardings=specs, out_shardings=specs[0])
    assert again.collectives == report.collectives and again.memory == report.memory


def test_without_the_compiler_a_target_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "libtpu", None)  # as if it were not installed
    with pytest.raises(TargetError, match=r'pip install "shardlab\[targets\]"'):
        shardlab.target("tpu-v6e", topology="4x8")


@pytest.mark.parametrize(
    ("kind", "kwargs", "shape"),
    [
        ("h100", {"hosts": 4}, {"data": 2, "fsdp": 4, "model": 4}),
        ("tpu-v5e", {"topology": "4x4"}, {"data": 4, "model": 4}),
        ("tpu-v5e", {"topology": "2x4", "slices": 2}, {"data": 4, "model": 4}),
    ],
)
def test_a_mesh_over_real_accelerators_is_laid_out_as_over_their_target(kind, kwargs, shape):
    """``plan.to_code()`` writes ``shardlab.mesh(data=..., model=...)``: on the cluster's own
    GPUs or TPUs (passed here as a plain list of the target's devices, as ``jax.devices()``
    lists them there) it must lay the axes as the plan was made."""
    _needs(KINDS[kind].platform)
    t = shardlab.target(kind, **kwargs)
    planned = shardlab.mesh(shape, devices=t)
    on_cluster = shardlab.mesh(shape, devices=list(t.devices))
    assert [d.id for d in on_cluster.devices.flat] == [d.id for d in planned.devices.flat]
    assert on_cluster.devices.shape == tuple(shape.values())


def test_a_tpu_mesh_inside_a_slice_follows_the_torus():
    _needs("tpu")
    t = shardlab.target("tpu-v5e", topology="4x4")
    # the compiler numbers chips host by host (2x2 blocks): row-major order would put a
    # 2x2 block on one model group; each group must be a ring along one ICI dimension
    assert [tuple(d.coords[:2]) for d in t.devices[:4]] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    mesh = shardlab.mesh(data=4, model=4, devices=t)
    for row in mesh.devices:
        coords = [tuple(d.coords[:2]) for d in row]
        assert len({y for _, y in coords}) == 1 and sorted(x for x, _ in coords) == [0, 1, 2, 3]


def test_predict_and_search_on_a_target_are_priced_by_its_profile_and_compiled_by_its_compiler():
    _needs("cuda")
    from shardlab.parallel.targets.target import TargetRunError

    t = shardlab.target("h100", hosts=1)
    mesh = shardlab.mesh(data=2, model=4, devices=t)
    # big enough that one H100 computing it all loses to sharding it (3.3 TFLOP a step)
    step, params, x, specs = _mlp_step(width=2048, hidden=8192, batch=16384)
    cost = shardlab.predict(step, params, x, mesh=mesh, in_shardings=specs)
    assert cost.device == t.profile == "h100-nvlink"
    plan = shardlab.search(step, params, x, mesh=mesh)
    assert plan.cost.device == "h100-nvlink" and plan.cost.comm_time > 0
    report = plan.verify()  # compiled by XLA:GPU: its collectives are async start/done pairs
    assert report.collectives and "all-reduce-start" in report.hlo
    code = plan.to_code()
    assert "step = jax.jit(" in code
    assert "# planned for 8 × H100 SXM: data within a host; model within a host" in code
    run = plan.jit()
    with pytest.raises(TargetRunError, match=r"plan\.verify\(\).*plan\.to_code\(\)"):
        run(*jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), (params, x)))
    with pytest.raises(TargetRunError, match="8 × H100 SXM"):
        plan.shard(params, x)


def test_two_processes_describe_tpu_slices_at_once():
    """libtpu locks the machine for one process unless told there are no TPUs to share (a
    kernel, a second notebook and the test workers all describe slices)."""
    _needs("tpu")
    import subprocess

    shardlab.target("tpu-v5e", topology="2x4")  # this process has libtpu loaded
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            "import shardlab; print(shardlab.target('tpu-v5p', topology='2x2x2').device_count)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        # the child's own shardlab must allow sharing: nothing inherited says so
        env={
            **{k: v for k, v in os.environ.items() if k != "ALLOW_MULTIPLE_LIBTPU_LOAD"},
            "JAX_PLATFORMS": "cpu",
        },
    )
    assert other.returncode == 0, other.stderr[-2000:]
    assert other.stdout.strip() == "8"


def test_a_search_on_a_target_must_fit_the_devices_memory():
    _needs("cuda")
    from shardlab.parallel.errors import SearchError

    t = shardlab.target("h100", hosts=1, gpus_per_host=1)
    mesh = shardlab.mesh(data=1, devices=t)
    w = jax.ShapeDtypeStruct((220_000, 220_000), jnp.bfloat16)  # 90 GiB: more than an H100
    x = jax.ShapeDtypeStruct((8, 220_000), jnp.bfloat16)

    def step(w, x):
        return w - 0.1 * jax.grad(lambda w: (x @ w).sum())(w)

    with pytest.raises(SearchError, match="memory_budget"):
        shardlab.search(step, w, x, mesh=mesh)
    # a budget the user gives wins over the device's
    plan = shardlab.search(step, w, x, mesh=mesh, memory_budget=10 * 2**40, confirm=False)
    assert plan.cost.memory.peak > 80 * 2**30


def test_the_llama_example_counts_its_parameters_and_trains_when_small():
    from shardlab.examples.llama import LLAMA_8B, LLAMA_70B, LLAMA_TINY, llama

    # Llama 3.1's published sizes: 8.03B and 70.6B parameters
    assert round(LLAMA_8B.parameter_count() / 1e9, 2) == 8.03
    assert round(LLAMA_70B.parameter_count() / 1e9, 1) == 70.6
    abstract = llama(LLAMA_8B, batch=2, seq=16)
    leaves = jax.tree.leaves(abstract.args)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    assert sum(x.size for x in jax.tree.leaves(abstract.args[0])) == LLAMA_8B.parameter_count()
    case = llama(LLAMA_TINY, batch=4, seq=16, abstract=False, dtype=jnp.float32)
    params, momentum, batch = case.args
    step = jax.jit(case.fn)
    loss0 = step(params, momentum, batch)[2]
    for _ in range(3):
        params, momentum, loss = step(params, momentum, batch)
    assert float(loss) < float(loss0)  # it learns
