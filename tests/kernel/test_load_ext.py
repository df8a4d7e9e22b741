"""``%load_ext shardlab`` in a stock IPython kernel gives the same modes and magics."""

from __future__ import annotations

import pytest

from kernelclient import Kernel

pytestmark = pytest.mark.kernel


def test_stock_kernel_with_extension():
    kernel = Kernel("python3")
    try:
        kernel.ok("import jax, jax.numpy as jnp\nx = jnp.arange(4.)")
        loaded = kernel.ok("%load_ext shardlab")
        assert "too late" in loaded.stdout and "%devices cpu:N" in loaded.stdout
        graph = kernel.ok("%%graph\ny = x * 3\nprint('sum', y.sum())\ny.sum()")
        assert graph.text == "Array(18., dtype=float32)" and "sum 18.0" in graph.stdout
        eager = kernel.ok(
            "%%eager\n@jax.jit\ndef f(v):\n    print('concrete', v)\n    return v\nf(x)"
        )
        assert "concrete [0. 1. 2. 3.]" in eager.stdout
        kernel.ok("%mode graph")
        traced = kernel.ok("t = isinstance(x + 0, jax.core.Tracer)\nt")
        assert traced.text == "True"
        # a cell run from inside a jit cell is part of it: not routed to the default (graph)
        nested = kernel.ok(
            "%%jit\nget_ipython().run_cell('inner = isinstance(x + 0, jax.core.Tracer)')\ninner"
        )
        assert nested.text == "False"
        after = kernel.ok("t2 = isinstance(x + 0, jax.core.Tracer)\nt2")
        assert after.text == "True"  # the next top-level cell is routed again
        kernel.ok("%mode jit")
        moded = kernel.ok("%%mode graph\nw = x * 2\nprint('w', w.sum())")
        assert "w 12.0" in moded.stdout
        error = kernel.execute("%%graph\nz = float(x.sum())")
        assert error.status == "error" and error.errors[0]["ename"] == "GraphStagingError"
        assert "%devices" in kernel.ok("%lsmagic").text
    finally:
        kernel.shutdown()
