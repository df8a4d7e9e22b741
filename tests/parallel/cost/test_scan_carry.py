"""A scan's carry has one layout on every trip, as XLA's loop has one sharding per carried
value (``_Propagator._scan_body``): checked against XLA:CPU's compiled collectives on a
recurrent cell, a model shape no rule was derived from (the rule came from the loop's
semantics)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import shardlab

T, D, B = 5, 64, 32


def _rnn_loss(w, u, xs):
    def cell(h, x):
        h = jnp.tanh(h @ w + x @ u)
        return h, h.sum()

    h, ys = jax.lax.scan(cell, jnp.zeros((B, D)), xs)
    return jnp.mean(h**2) + ys.sum()


def _rnn_step(w, u, xs):
    gw, gu = jax.grad(_rnn_loss, argnums=(0, 1))(w, u, xs)
    return w - 0.1 * gw, u - 0.1 * gu


SPECS = {
    # the hidden state leaves each trip split over "model" and is gathered in the next
    "column": (P(None, "model"), P(None, "model"), P(None, "data")),
    # each trip's contraction over "model" is summed: one all-reduce per trip
    "row": (P("model", None), P("model", None), P(None, "data", None)),
}


@pytest.fixture(scope="module")
def mesh():
    return shardlab.mesh({"data": 2, "model": 4})


def _args():
    w = jnp.full((D, D), 0.01)
    return w, w * 2, jnp.ones((T, B, D))


@pytest.mark.parametrize(
    ("fn", "layout"), [(_rnn_loss, "column"), (_rnn_loss, "row"), (_rnn_step, "column")]
)
def test_a_carried_state_is_resharded_every_trip_as_compiled(mesh, fn, layout):
    args = _args()
    cost = shardlab.predict(fn, *args, mesh=mesh, in_shardings=SPECS[layout])
    report = shardlab.analyze(fn, *args, mesh=mesh, in_shardings=SPECS[layout])
    predicted, compiled = cost.total_comm_bytes, report.total_comm_bytes
    assert compiled > 0
    assert predicted == pytest.approx(compiled, rel=0.05)
    trips = {c.kind: c.count for c in report.collectives if c.bytes > 64}
    assert {c.kind: c.count for c in cost.collectives if c.bytes > 64 and c.count > 1} == {
        k: n for k, n in trips.items() if n > 1
    }


def test_a_carry_summed_each_trip_is_sliced_back_not_gathered_before_the_loop(mesh):
    """The state enters split over "data" on the contracted dimension; each trip sums its
    partial products (one all-reduce) and slices the sum back to that split for free, so
    the initial state is never gathered."""

    def fn(x, ws):
        return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0].sum()

    m = shardlab.mesh({"data": 8})
    x, ws = jnp.ones((16, 32)), jnp.ones((4, 32, 32))
    specs = (P(None, "data"), P(None, "data"))
    cost = shardlab.predict(fn, x, ws, mesh=m, in_shardings=specs)
    report = shardlab.analyze(fn, x, ws, mesh=m, in_shardings=specs)
    assert cost.total_comm_bytes == pytest.approx(report.total_comm_bytes, rel=0.01)
    assert "all-gather" not in {c.kind for c in cost.collectives}
