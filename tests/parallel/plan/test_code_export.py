"""``plan.to_code()`` pasted into a fresh namespace runs and reproduces the plan (issue 36
item 1): optax states are written with their imports, equinox modules and flax nnx states
take their structure from the arguments; the snippet shows as code in a notebook."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import shardlab
from shardlab.parallel.plan.code import PlanCode

X = jnp.ones((64, 16))
Y = jnp.ones((64, 8))


@pytest.fixture(scope="module")
def mesh():
    return shardlab.mesh(data=2, model=4)


def _specs(tree):
    return [s.spec for s in jax.tree.leaves(tree)]


def _run_pasted(code, **values):
    """``code`` executed as a pasted cell: a fresh namespace holding only ``values``."""
    namespace = dict(values)
    exec(compile(str(code), "<pasted>", "exec"), namespace)
    return namespace


def _assert_reproduces(plan, namespace):
    got_in, got_out = namespace["in_shardings"], namespace["out_shardings"]
    assert jax.tree.structure(got_in) == jax.tree.structure(plan.in_shardings)
    assert jax.tree.structure(got_out) == jax.tree.structure(plan.out_shardings)
    assert _specs(got_in) == _specs(plan.in_shardings)
    assert _specs(got_out) == _specs(plan.out_shardings)


# -- optax: a train step over a params dict --------------------------------------------------
momentum = optax.sgd(0.1, momentum=0.9)


def loss(params, batch):
    x, y = batch
    return ((jnp.tanh(x @ params["w1"]) @ params["w2"] - y) ** 2).mean()


def sgd_step(params, opt_state, batch):
    grads = jax.grad(loss)(params, batch)
    updates, opt_state = momentum.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def test_optax_step_runs_pasted(mesh):
    params = {"w1": jnp.ones((16, 32)) * 0.1, "w2": jnp.ones((32, 8)) * 0.1}
    opt_state = momentum.init(params)
    plan = shardlab.search(sgd_step, params, opt_state, (X, Y), mesh=mesh, method="propagate")
    code = plan.to_code()
    assert "optax.TraceState(trace=" in code and "optax.EmptyState()" in code
    assert "import optax" in code
    namespace = _run_pasted(code, sgd_step=sgd_step)  # was: NameError: TraceState
    _assert_reproduces(plan, namespace)
    new_params, _ = namespace["step"](params, opt_state, (X, Y))
    want, _ = sgd_step(params, opt_state, (X, Y))
    for got_leaf, want_leaf in zip(jax.tree.leaves(new_params), jax.tree.leaves(want), strict=True):
        assert jnp.allclose(got_leaf, want_leaf, atol=1e-6)


# -- flax nnx: a step over an nnx.State -------------------------------------------------------
class Mlp(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(16, 32, rngs=rngs)
        self.l2 = nnx.Linear(32, 8, rngs=rngs)

    def __call__(self, x):
        return self.l2(jnp.tanh(self.l1(x)))


graphdef, nnx_state = nnx.split(Mlp(nnx.Rngs(0)))


def nnx_step(state, x, y):
    def mse(state):
        return ((nnx.merge(graphdef, state)(x) - y) ** 2).mean()

    grads = jax.grad(mse)(state)
    return jax.tree.map(lambda p, g: p - 0.1 * g, state, grads)


def test_flax_nnx_step_runs_pasted(mesh):
    plan = shardlab.search(nnx_step, nnx_state, X, Y, mesh=mesh, method="propagate")
    code = plan.to_code()
    assert "args = (state, x, y)" in code  # the structure comes from the arguments
    namespace = _run_pasted(code, nnx_step=nnx_step, state=nnx_state, x=X, y=Y)
    _assert_reproduces(plan, namespace)
    got = namespace["step"](nnx_state, X, Y)
    want = nnx_step(nnx_state, X, Y)
    assert all(
        jnp.allclose(a, b, atol=1e-6)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
    )


# -- equinox: a module with static leaves (activation functions) -----------------------------
mlp = eqx.nn.MLP(16, 8, 32, 2, key=jax.random.key(0))


def eqx_step(model, x, y):
    grads = eqx.filter_grad(lambda m: ((jax.vmap(m)(x) - y) ** 2).mean())(model)
    return eqx.apply_updates(model, jax.tree.map(lambda g: -0.1 * g, grads))


def test_equinox_step_runs_pasted(mesh):
    plan = shardlab.search(eqx_step, mlp, X, Y, mesh=mesh, method="propagate")
    code = plan.to_code()
    assert "import equinox as eqx" in code and "eqx.filter_jit" in code
    namespace = _run_pasted(code, eqx_step=eqx_step, model=mlp, x=X, y=Y)
    _assert_reproduces(plan, namespace)
    got = namespace["step"](mlp, X, Y)
    want = eqx_step(mlp, X, Y)
    assert isinstance(got, eqx.nn.MLP)
    got_arrays = jax.tree.leaves(eqx.filter(got, eqx.is_array))
    want_arrays = jax.tree.leaves(eqx.filter(want, eqx.is_array))
    assert all(jnp.allclose(a, b, atol=1e-6) for a, b in zip(got_arrays, want_arrays, strict=True))


def test_a_function_named_step_is_not_shadowed(mesh):
    """``step = _sharded(step)`` reads the function before rebinding the name."""
    plan = shardlab.search(eqx_step, mlp, X, Y, mesh=mesh, method="propagate")
    code = plan.to_code(name="step")
    namespace = _run_pasted(code, step=eqx_step, model=mlp, x=X, y=Y)
    assert isinstance(namespace["step"](mlp, X, Y), eqx.nn.MLP)


# -- how the snippet shows --------------------------------------------------------------------
def test_code_shows_as_code(mesh):
    params = {"w1": jnp.ones((16, 32)), "w2": jnp.ones((32, 8))}
    plan = shardlab.search(
        sgd_step, params, momentum.init(params), (X, Y), mesh=mesh, method="propagate"
    )
    code = plan.to_code()
    assert isinstance(code, str) and isinstance(code, PlanCode)
    assert repr(code) == str(code) and "\\n" not in repr(code)  # not one quoted line
    markdown = code._repr_markdown_()
    assert markdown.startswith("```python\nimport jax") or markdown.startswith("```python\n#")
    assert markdown.rstrip().endswith("```")
    from IPython.lib.pretty import pretty

    assert pretty(code) == str(code).rstrip("\n")  # IPython's text/plain: the code itself
    assert "step = jax.jit(sgd_step," in code
