"""engine.resources.live_memory: accounting and release, in-process."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardlab
from shardlab.engine.resources.live_memory import live_bytes_per_device, release


def test_live_bytes_per_device_follows_sharding():
    mesh = shardlab.mesh(data=8)
    gc.collect()  # arrays earlier tests dropped are freed now, not between the readings
    before = live_bytes_per_device()
    x = jax.device_put(jnp.ones((8, 1024)), NamedSharding(mesh, P("data")))
    after = live_bytes_per_device()
    grown = {d: after[d] - before.get(d, 0) for d in after}
    assert all(v == 1024 * 4 for v in grown.values()), grown
    views = [shard.data for shard in x.addressable_shards]  # views share x's buffers
    assert live_bytes_per_device() == after  # counted once
    del x, views


_SHARD_VIEWS = """
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import shardlab
from shardlab.engine.resources.live_memory import release
jax.config.update("jax_num_cpu_devices", 8)
mesh = shardlab.mesh(data=8)
x = jax.device_put(jnp.arange(64.0), NamedSharding(mesh, P("data")))
view = x.addressable_shards[0].data  # a separate array object sharing x's buffer
garbage = jnp.ones((256, 256)) * 3  # unreachable from the namespace
report = release({"x": x})
assert not x.is_deleted() and float(x.sum()) == 2016.0
assert not view.is_deleted()
assert garbage.is_deleted() and report.arrays_deleted >= 1, report
print("ok")
"""


def test_release_keeps_named_arrays_even_when_shard_views_are_alive():
    # In a fresh interpreter, as in a kernel: inside this test process, pytest's own state
    # (every collected test and its fixtures) is reachable from modules, and a walk that
    # large stops early, after which release rightly deletes nothing unreachable.
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", _SHARD_VIEWS], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_release_keeps_a_named_typed_prng_key():
    key = jax.random.key(0)  # a typed key wraps a uint32 array, which live_arrays() lists
    keys = {"rng": jax.random.split(key, 4)}
    release({"key": key, "state": keys})
    assert jax.random.key_data(key).tolist() == [0, 0]
    assert jax.random.key_data(keys["rng"]).shape == (4, 2)


def test_release_all_deletes_named_and_reports_names():
    y = jnp.ones(16)
    report = release({"y": y, "n": 3}, delete_named=True)
    assert report.named_arrays_deleted == ("y",) and y.is_deleted()


def test_release_without_namespace_deletes_nothing():
    z = jnp.ones(8)
    release(None)
    np.testing.assert_allclose(np.asarray(z), 1.0)


def test_reachable_arrays_walk_pytrees_with_one_array_leaf():
    """An object that is a pytree of one array leaf and compares like its value (a flax
    ``nnx.Param`` at module level, as a notebook or a test module leaves one): the walk
    compared that leaf with the object by value (an elementwise ``!=``) and ``release``
    raised "truth value of an array ... is ambiguous" in whatever ran after the module was
    imported."""
    from flax import nnx

    from shardlab.engine.resources.live_memory import reachable_array_ids

    param = nnx.Param(jnp.arange(8.0))
    found = reachable_array_ids([param])
    assert any(id(leaf) in found for leaf in jax.tree_util.tree_leaves(param))
