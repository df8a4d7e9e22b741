"""``shardlab.predict`` on arrays that already carry their shardings (JAX's current idioms:
``jax.device_put`` with a ``NamedSharding``, ``jax.sharding.reshard``, ``out_sharding=``)
takes those shardings when no ``in_shardings`` are given."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardlab


def _step(w, x):
    return jnp.tanh(x @ w).sum()


def test_predict_takes_the_arrays_own_shardings():
    mesh = shardlab.mesh({"data": 8})
    w = jnp.ones((64, 64))
    x = jax.device_put(jnp.ones((256, 64)), NamedSharding(mesh, P("data")))
    own = shardlab.predict(_step, w, x, mesh=mesh)
    given = shardlab.predict(_step, w, x, mesh=mesh, in_shardings=(P(), P("data")))
    replicated = shardlab.predict(_step, w, x, mesh=mesh, in_shardings=(P(), P()))
    assert own.comm_bytes == given.comm_bytes
    assert own.memory == given.memory
    assert own.memory != replicated.memory  # the batch's split was taken, not dropped
