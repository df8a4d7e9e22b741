"""Property: on random small graphs and meshes, every plan compiles and equals the function."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardlab._core.equivalence import assert_same_program
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.search.driver import search

OPS = ("matmul", "tanh", "residual", "center", "transpose", "reshape", "colsum")
MESHES = ((8,), (2, 4), (4, 2))


@st.composite
def programs(draw):
    batch = draw(st.sampled_from((4, 8, 12, 16)))
    width = draw(st.sampled_from((4, 8, 16)))
    ops = draw(st.lists(st.sampled_from(OPS), min_size=2, max_size=6))
    widths = [draw(st.sampled_from((4, 8, 12, 16))) for _ in ops]
    train = draw(st.booleans())
    shape = draw(st.sampled_from(MESHES))
    method = draw(st.sampled_from(("propagate", "recursive", "ilp", "auto")))
    return batch, width, ops, widths, train, shape, method


def _build(batch, width, ops, widths):
    keys = iter(jax.random.split(jax.random.key(7), len(ops) + 1))
    weights = []
    w_in = width
    for op, w_out in zip(ops, widths, strict=True):
        if op == "matmul":
            weights.append(jax.random.normal(next(keys), (w_in, w_out)) * 0.3)
            w_in = w_out
    x = jax.random.normal(next(keys), (batch, width))

    def forward(ws, x):
        it = iter(ws)
        for op in ops:
            if op == "matmul":
                x = x @ next(it)
            elif op == "tanh":
                x = jnp.tanh(x)
            elif op == "residual":
                x = x + 0.5 * x * x
            elif op == "center":
                x = x - jnp.mean(x, axis=-1, keepdims=True)
            elif op == "transpose":
                x = (x.T * 2.0).T
            elif op == "reshape" and x.shape[1] % 2 == 0:
                x = jnp.sin(x.reshape(x.shape[0], 2, x.shape[1] // 2)).reshape(x.shape)
            elif op == "colsum":
                x = x + jnp.sum(x, axis=0, keepdims=True) * 0.1
        return x

    return forward, (weights, x)


@settings(max_examples=15, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(programs())
def test_random_graphs_plans_compile_and_match(program):
    batch, width, ops, widths, train, shape, method = program
    forward, args = _build(batch, width, ops, widths)
    if train:

        def fn(ws, x):
            value, grads = jax.value_and_grad(lambda w: jnp.sum(forward(w, x) ** 2))(ws)
            return [w - 0.01 * g for w, g in zip(ws, grads, strict=True)], value

    else:
        fn = forward
    mesh = make_mesh(shape=shape, names=("data", "model")[: len(shape)])
    plan = search(fn, *args, mesh=mesh, method=method)
    assert plan.complete
    out = plan.jit()(*args)
    ref = fn(*args)
    assert_same_program(out, ref, fn=fn, args=args)
