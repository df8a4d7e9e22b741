"""Targets in the shardlab kernel: the compilers load without filling cells with their
native notes, and a plan for GPUs or TPUs is made from a notebook on this CPU machine."""

from __future__ import annotations

import pytest

from compilers import needs

pytestmark = pytest.mark.kernel


@pytest.fixture(autouse=True)
def _compilers():
    needs("cuda", "tpu")


def test_the_first_jax_cell_and_a_tpu_target_print_nothing_to_stderr(kernel):
    first = kernel.ok("import jax, jax.numpy as jnp\nprint(len(jax.devices()), jnp.ones(2).sum())")
    assert first.stdout == "8 2.0\n" and first.stderr == ""
    made = kernel.ok("import shardlab\nt = shardlab.target('tpu-v5e', topology='2x4')\nprint(t)")
    assert made.stdout == "8 × TPU v5e (slice 2x4, 2 hosts, ICI within a slice)\n"
    assert made.stderr == ""


def test_a_gpu_target_is_analysed_in_the_kernel_on_abstract_arguments(kernel):
    done = kernel.ok(
        "from jax.sharding import PartitionSpec as P\n"
        "g = shardlab.target('h100', hosts=2)\n"
        "m = shardlab.mesh(data=4, model=4, devices=g)\n"
        "w = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16)\n"
        "x = jax.ShapeDtypeStruct((64, 512), jnp.bfloat16)\n"
        "r = shardlab.analyze(jax.grad(lambda w, x: jnp.tanh(x @ w).sum()), w, x, mesh=m,\n"
        "                     in_shardings=(P(None, 'model'), P('data', None)))\n"
        "print(sorted({(c.kind, c.mesh_axes) for c in r.collectives}), r.flops > 0)"
    )
    assert done.stdout == "[('all-reduce', ('data',))] True\n"
    assert done.stderr == ""


def test_percent_target_lays_new_meshes_over_the_target_until_it_is_off(kernel):
    assert "no target" in kernel.ok("%target").stdout
    on = kernel.ok("%target h100 hosts=8")
    assert on.stdout.startswith("target: 64 × H100 SXM (8 hosts × 8, NVLink within a host")
    made = kernel.ok(
        "from shardlab.parallel.targets.target import target_of, mesh_layout\n"
        "m8 = shardlab.mesh(data=8, model=8)\n"
        "print(target_of(m8).description, '|', mesh_layout(m8).crossing)"
    )
    assert made.stdout.startswith("64 × H100 SXM") and "('data',)" in made.stdout
    assert "target: 64 × H100 SXM" in kernel.ok("%target").stdout
    kernel.ok("%target off")
    local = kernel.ok(
        "m2 = shardlab.mesh(data=2, model=4)\nprint(target_of(m2), m2.devices.flat[0].platform)"
    )
    assert local.stdout == "None cpu\n"


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("%target h900", "known kinds: h100, h200, a100, tpu-v5e, tpu-v5p, tpu-v6e"),
        ("%target h100 hosts=eight", "hosts='eight' must be a whole number"),
        ("%target h100 racks=2", "unknown argument 'racks'"),
        ("%target tpu-v5p topology=4x4", "'4x4x8'"),
        ("%target h100 topology=2x2", "give hosts= and gpus_per_host="),
        ("%target", None),
    ],
)
def test_percent_target_bad_input_is_one_line_and_the_kernel_stays(kernel, line, words):
    done = kernel.execute(line)
    if words is None:
        assert done.status == "ok"
        return
    # IPython prints a magic's UsageError as one line (no traceback) and fails the cell
    assert done.status == "error" and done.reply["content"]["ename"] == "UsageError"
    assert words in done.stderr and "Traceback" not in done.stderr
    assert kernel.ok("1 + 1").text == "2"
