"""Targets in the shardlab kernel: the compilers load without filling cells with their
native notes, and a plan for GPUs or TPUs is made from a notebook on this CPU machine."""

from __future__ import annotations

import pytest

from shardlab.parallel.targets.devices import compiler_missing

pytestmark = pytest.mark.kernel


@pytest.fixture(autouse=True)
def _compilers():
    for platform in ("cuda", "tpu"):
        missing = compiler_missing(platform)
        if missing is not None:
            import os

            if os.environ.get("CI"):
                pytest.fail(f"CI must install the targets extra: {missing}")
            pytest.skip(missing)


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
