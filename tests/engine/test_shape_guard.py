"""The array-size guard in-process: what it refuses, what it lets through, its messages.

The real kernel's view (the kernel survives, keeps its names) is
``tests/kernel/test_kernel_survives.py``; the sizes here stay far from anything XLA would
abort on when the guard is off, except where it is on.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from shardlab.engine.resources import shape_guard
from shardlab.engine.resources.shape_guard import ArrayTooLargeError

HUGE = 2**61  # float32: 2**63 bytes, one past int64


@pytest.fixture()
def guard():
    was = shape_guard.installed()
    assert shape_guard.install()
    yield
    if not was:
        shape_guard.uninstall()


def test_eager_ops_jit_and_lowering_are_refused_before_xla(guard):
    attempts = {
        "ones": lambda: jnp.ones((HUGE,)),
        "zeros int8 2**63-1 elements": lambda: jnp.zeros((2**63 - 1,), jnp.int8),
        "full": lambda: jnp.full((2**31, 2**30), 2.0),
        "arange": lambda: jnp.arange(HUGE, dtype=jnp.float32),
        "broadcast_to": lambda: jnp.broadcast_to(jnp.float32(1), (HUGE,)),
        "jit": lambda: jax.jit(lambda: jnp.empty((HUGE,)))(),
        "fused intermediate": lambda: jax.jit(lambda x: jnp.broadcast_to(x, (HUGE,)).sum())(1.0),
        "inside a scan body": lambda: jax.jit(
            lambda x: jax.lax.scan(lambda c, _: (c + jnp.ones((HUGE,)).sum(), None), x, None, 2)
        )(0.0),
        "lower and compile": lambda: jax.jit(lambda: jnp.zeros((HUGE,))).lower().compile(),
        "random": lambda: jax.random.normal(jax.random.key(0), (HUGE,)),
        "PRNG keys (uint32 words)": lambda: jax.random.split(jax.random.key(0), HUGE),
    }
    for name, attempt in attempts.items():
        with pytest.raises(ArrayTooLargeError) as refused:
            attempt()
        assert refused.value.refusal.why == "xla", name
        assert "more than XLA can compile" in str(refused.value), name
    with jax.disable_jit():  # %%eager cells
        with pytest.raises(ArrayTooLargeError, match=r"\(4611686018427387904,\)"):
            jnp.ones((2**62,))


def test_the_message_names_shape_size_line_and_what_fits(guard):
    with pytest.raises(ArrayTooLargeError) as refused:
        jnp.ones((HUGE,))  # the line the message names
    text = str(refused.value)
    assert text.startswith("Refused an array of shape (2305843009213693952,) and dtype float32")
    assert "8.0 EiB (9,223,372,036,854,775,808 bytes)" in text
    assert "test_shape_guard.py" in text and "jnp.ones((HUGE,))  # the line" in text
    assert "Nothing was compiled or allocated" in text
    assert "What fits: at most" in text and "float32 elements" in text
    # a line inside a jitted function is named, with its primitive
    with pytest.raises(ArrayTooLargeError, match=r"\(iota\): `jax.jit\(lambda: jnp.arange"):
        jax.jit(lambda: jnp.arange(HUGE, dtype=jnp.float32))()


def test_results_larger_than_memory_are_refused_at_run_not_at_compile(guard, monkeypatch):
    monkeypatch.setattr(shape_guard, "_memory_of", lambda device: (2**30, "this host's memory"))
    with pytest.raises(ArrayTooLargeError) as refused:
        jnp.zeros((2**29,))  # 2 GiB of float32
    assert refused.value.refusal.why == "memory"
    text = str(refused.value)
    assert "2.0 GiB is more than this host's memory (1.0 GiB)" in text
    assert "What fits: at most 268,435,456 float32 elements (1.0 GiB" in text
    # planning: lowering and compiling without running stays allowed
    assert jax.jit(lambda: jnp.zeros((2**29,))).lower().compile() is not None
    assert jax.eval_shape(lambda: jnp.zeros((HUGE,))).shape == (HUGE,)
    assert float(jnp.ones((1000,)).sum()) == 1000.0  # what fits runs


def test_an_accelerator_compares_one_devices_share(monkeypatch):
    """On an accelerator a result is compared per device: its shard when its sharding is
    known, else an even split over the program's devices."""

    class Gpu:
        platform = "gpu"

    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    memory = (2**20, "each gpu device's memory")
    monkeypatch.setattr(shape_guard, "_memory_of", lambda device: memory)
    monkeypatch.setattr(shape_guard, "_program_devices", lambda out, args: (Gpu(), 8))
    closed = jax.make_jaxpr(lambda: jnp.zeros((2**19,)))()  # 2 MiB in all
    shape_guard.check_results(closed, (NamedSharding(mesh, PartitionSpec("data")),), ())
    shape_guard.check_results(closed, (None,), ())  # unknown: 256 KiB each, fits
    with pytest.raises(ArrayTooLargeError) as refused:  # replicated: 2 MiB on every device
        shape_guard.check_results(closed, (NamedSharding(mesh, PartitionSpec()),), ())
    assert refused.value.refusal.per_device
    text = str(refused.value)
    assert "2.0 MiB per device is more than each gpu device's memory (1.0 MiB)" in text
    assert "at most 262,144 float32 elements per device" in text


def test_a_check_that_breaks_lets_the_program_run(guard, monkeypatch):
    def broken(*args):
        raise RuntimeError("a bug in the guard")

    monkeypatch.setattr(shape_guard, "check_results", broken)
    assert float(jnp.full((3,), 2.0).sum()) == 6.0


def test_uninstall_puts_jax_back():
    from jax._src import pjit
    from jax._src.interpreters import mlir

    was = shape_guard.installed()
    shape_guard.uninstall()
    original = (mlir.lower_jaxpr_to_module, pjit._pjit_call_impl_python)
    try:
        assert shape_guard.install() and shape_guard.install()  # idempotent
        assert mlir.lower_jaxpr_to_module is not original[0]
        shape_guard.uninstall()
        assert (mlir.lower_jaxpr_to_module, pjit._pjit_call_impl_python) == original
    finally:
        if was:
            shape_guard.install()
