"""Arguments as users pass them: already placed anywhere, and models with non-array leaves.

Analysis (analyze, predict, search, baselines, plan.verify, commgraph) traces and lowers on
shapes, so the example arguments' placement never matters; ``plan.jit()`` takes arguments in
any layout and ``plan.shard`` places them once. Non-array leaves (an equinox MLP's
activation, a string, a bool) are static; Python numbers are traced (docs/design/parallel.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardlab
from shardlab import strategies
from shardlab._core.equivalence import assert_same_program
from shardlab.parallel.arguments import split
from shardlab.parallel.errors import ArgumentError
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.widgets.commgraph import CommGraphView

BATCH, HIDDEN = 16, 16


def _step(params, batch):
    def loss(p, xy):
        h = jnp.tanh(xy[0] @ p["w1"])
        return jnp.mean((h @ p["w2"] - xy[1]) ** 2)

    value, grads = jax.value_and_grad(loss)(params, batch)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value


def _loss(params, x):
    return jnp.mean(jnp.tanh(x @ params["w1"]) @ params["w2"])


def _args():
    k = jax.random.split(jax.random.key(0), 4)
    params = {
        "w1": jax.random.normal(k[0], (HIDDEN, 2 * HIDDEN)) * 0.1,
        "w2": jax.random.normal(k[1], (2 * HIDDEN, HIDDEN)) * 0.1,
    }
    batch = (jax.random.normal(k[2], (BATCH, HIDDEN)), jax.random.normal(k[3], (BATCH, HIDDEN)))
    return params, batch


def _close(got, want, fn, *args):
    """The plan computes the plain program (``_core/equivalence.py``), array leaves only."""
    got = [x for x in jax.tree.leaves(got) if eqx.is_array(x)]
    want = [x for x in jax.tree.leaves(want) if eqx.is_array(x)]
    assert_same_program(got, want, fn=fn, args=args)


@pytest.fixture(scope="module")
def mesh24():
    return make_mesh(data=2, model=4)


@pytest.fixture(scope="module")
def other_mesh():
    """Other axis names, shape and device order than ``mesh24``."""
    return make_mesh(rows=4, cols=2, devices=jax.devices()[::-1])


@pytest.fixture(scope="module", params=["same_mesh_other_spec", "other_mesh", "one_device"])
def placed(request, mesh24, other_mesh):
    """``_args()`` committed somewhere the plans do not want them."""
    params, batch = _args()
    if request.param == "same_mesh_other_spec":
        where = NamedSharding(mesh24, P("data", "model"))
    elif request.param == "other_mesh":
        where = NamedSharding(other_mesh, P("rows", "cols"))
    else:
        where = jax.devices()[5]
    return jax.device_put((params, batch), where)


@pytest.fixture(scope="module")
def plan(mesh24):
    """A plan searched on unplaced arguments (the reference for placed ones)."""
    return shardlab.search(_step, *_args(), mesh=mesh24, method="recursive")


IN_SPECS = (None, (P("data", None), P("data")))


def _comm(report):
    return sorted((c.kind, c.bytes) for c in report.collectives)


def test_analyze_and_predict_ignore_placement(placed, mesh24):
    want = shardlab.analyze(_step, *_args(), mesh=mesh24, in_shardings=IN_SPECS)
    got = shardlab.analyze(_step, *placed, mesh=mesh24, in_shardings=IN_SPECS)
    assert _comm(got) == _comm(want) and got.input_shardings == want.input_shardings
    cost = shardlab.predict(_step, *placed, mesh=mesh24, in_shardings=IN_SPECS)
    ref = shardlab.predict(_step, *_args(), mesh=mesh24, in_shardings=IN_SPECS)
    assert cost.time == ref.time and cost.comm_bytes == ref.comm_bytes


def test_commgraph_takes_placed_arguments(placed, mesh24):
    view = shardlab.commgraph(_step, *placed, mesh=mesh24, in_shardings=IN_SPECS)
    assert isinstance(view, CommGraphView)  # not the error view


def test_search_and_baselines_ignore_placement(placed, mesh24, plan):
    got = shardlab.search(_step, *placed, mesh=mesh24, method="recursive")
    assert got.input_specs == plan.input_specs and got.output_specs == plan.output_specs
    assert _comm(got.verify()) == _comm(plan.verify())
    dp = strategies.baselines(_step, *placed, mesh=mesh24)["data_parallel"]
    assert dp.verify().collectives  # the gradient all-reduce


def test_plan_jit_takes_any_layout(placed, plan):
    step = plan.jit()
    got = step(*placed)
    _close(got, jax.jit(_step)(*placed), _step, *placed)
    for leaf, want in zip(jax.tree.leaves(got), jax.tree.leaves(plan.out_shardings), strict=True):
        assert leaf.sharding.is_equivalent_to(want, leaf.ndim)
    # under an outer jit the arguments pass through (tracers are not placed)
    _close(jax.jit(step)(*plan.shard(*placed)), got, _step, *placed)


def test_plan_shard_places_once(placed, plan):
    sharded = plan.shard(*placed)
    assert jax.tree.structure(sharded) == jax.tree.structure(placed)
    for leaf, want in zip(
        jax.tree.leaves(sharded), jax.tree.leaves(plan.in_shardings), strict=True
    ):
        assert leaf.sharding.is_equivalent_to(want, leaf.ndim)
    again = plan.shard(*sharded)  # already placed: nothing moves
    assert all(
        a is b for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(sharded), strict=True)
    )
    _close(plan.jit()(*sharded), _step(*_args()), _step, *_args())


def test_plan_jit_gradients_equal(mesh24, other_mesh):
    params, (x, _) = _args()
    loss_plan = shardlab.search(_loss, params, x, mesh=mesh24, method="recursive")
    x_elsewhere = jax.device_put(x, NamedSharding(other_mesh, P("rows")))
    planned = loss_plan.jit()
    got = jax.grad(lambda p: planned(p, x_elsewhere))(params)
    _close(got, jax.jit(jax.grad(_loss))(params, x), jax.grad(_loss), params, x)


def test_plan_jit_rejects_another_structure(plan):
    params, batch = _args()
    with pytest.raises(TypeError, match="structure"):
        plan.jit()(params, batch[0])


# -- models with non-array leaves ------------------------------------------------------------
@pytest.fixture(scope="module")
def mlp():
    return eqx.nn.MLP(HIDDEN, 8, 32, 2, activation=jax.nn.relu, key=jax.random.key(1))


def _forward(model, x):
    return jax.vmap(model)(x)


def _eqx_step(model, x, y):
    def loss(m):
        return jnp.mean((jax.vmap(m)(x) - y) ** 2)

    value, grads = eqx.filter_value_and_grad(loss)(model)
    return eqx.apply_updates(model, jax.tree.map(lambda g: -0.1 * g, grads)), value


@pytest.fixture(scope="module")
def mlp_plan(mlp, mesh24):
    x = jnp.ones((BATCH, HIDDEN))
    return shardlab.search(_forward, mlp, x, mesh=mesh24, method="recursive")


def test_equinox_mlp_through_analyze_predict_search(mlp, mlp_plan, mesh24):
    x = jax.random.normal(jax.random.key(2), (BATCH, HIDDEN))
    specs = (None, P("data"))
    report = shardlab.analyze(_forward, mlp, x, mesh=mesh24, in_shardings=specs)
    assert report.input_shardings  # compiled
    assert shardlab.predict(_forward, mlp, x, mesh=mesh24, in_shardings=specs).time > 0
    # only the array leaves are inputs: no activation, no final_activation
    assert mlp_plan.input_paths == (
        *(f"model/layers/{i}/{w}" for i in range(3) for w in ("weight", "bias")),
        "x",
    )
    _close(mlp_plan.jit()(mlp, x), _forward(mlp, x), _forward, mlp, x)
    assert mlp_plan.verify().memory.total > 0
    # its in_shardings are shaped like eqx.filter(model, eqx.is_array)
    model_shardings = mlp_plan.in_shardings[0]
    assert model_shardings.activation is None and isinstance(
        model_shardings.layers[0].weight, NamedSharding
    )
    sharded_model, sharded_x = mlp_plan.shard(mlp, x)
    assert sharded_model.activation is jax.nn.relu
    _close(mlp_plan.jit()(sharded_model, sharded_x), _forward(mlp, x), _forward, mlp, x)


def test_equinox_train_step_returns_the_whole_model(mlp, mesh24):
    x = jax.random.normal(jax.random.key(3), (BATCH, HIDDEN))
    y = jax.random.normal(jax.random.key(4), (BATCH, 8))
    plan = shardlab.search(_eqx_step, mlp, x, y, mesh=mesh24, method="recursive")
    new_model, value = plan.jit()(mlp, x, y)
    assert isinstance(new_model, eqx.nn.MLP) and new_model.activation is jax.nn.relu
    _close((new_model, value), _eqx_step(mlp, x, y), _eqx_step, mlp, x, y)
    dp = strategies.data_parallel(_eqx_step, mlp, x, y, mesh=mesh24)
    _close(dp.jit()(mlp, x, y), _eqx_step(mlp, x, y), _eqx_step, mlp, x, y)


def test_a_changed_static_leaf_is_named(mlp, mlp_plan):
    other = eqx.tree_at(lambda m: m.activation, mlp, jax.nn.gelu)
    with pytest.raises(ArgumentError, match="model/activation"):
        mlp_plan.jit()(other, jnp.ones((BATCH, HIDDEN)))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Layer:
    """A pytree whose leaves are an array, a function and a string."""

    w: jax.Array
    act: Callable[[jax.Array], jax.Array]
    name: str


def _apply(layer, config, x):
    y = layer.act(x @ layer.w) * config["scale"]
    return {"out": config["fn"](y), "label": config["label"], "training": config["training"]}


def test_dataclass_and_dict_with_callables_strings_and_numbers(mesh24):
    layer = Layer(jnp.full((HIDDEN, 8), 0.1), jnp.tanh, "layer")
    config = {"fn": jax.nn.relu, "label": "first", "scale": 2.0, "training": True}
    x = jax.random.normal(jax.random.key(5), (BATCH, HIDDEN))
    plan = shardlab.search(_apply, layer, config, x, mesh=mesh24, method="recursive")
    # the Python float is traced (as under jax.jit); the function, string and bool are not
    assert plan.input_paths == ("layer/w", "config/scale", "x")
    got = plan.jit()(layer, config, x)
    assert got["label"] == "first" and got["training"] is True
    _close(got["out"], _apply(layer, config, x)["out"], _apply, layer, config, x)
    halved = plan.jit()(layer, {**config, "scale": 1.0}, x)  # traced: no new plan needed
    _close(
        halved["out"], _apply(layer, {**config, "scale": 1.0}, x)["out"], _apply, layer, config, x
    )
    specs = (None, None, P("data"))
    assert shardlab.analyze(_apply, layer, config, x, mesh=mesh24, in_shardings=specs).hlo
    assert shardlab.predict(_apply, layer, config, x, mesh=mesh24, in_shardings=specs).time > 0
    with pytest.raises(ArgumentError, match="config/label"):
        plan.jit()(layer, {**config, "label": "second"}, x)


@dataclasses.dataclass
class _Unregistered:
    w: jax.Array


def test_a_leaf_neither_traced_nor_static_is_named(mesh24):
    holder = _Unregistered(jnp.ones((HIDDEN, HIDDEN)))
    x = jnp.ones((BATCH, HIDDEN))
    for call in (
        lambda: shardlab.search(lambda h, x: x @ h.w, holder, x, mesh=mesh24),
        lambda: shardlab.analyze(lambda h, x: x @ h.w, holder, x, mesh=mesh24),
    ):
        with pytest.raises(ArgumentError, match=r"h .*_Unregistered.*eqx\.partition"):
            call()
    with pytest.raises(ArgumentError, match=r"argument 0/cfg is a _Options.*nor hashable"):
        split(({"cfg": _Options(depth=2)},))


@dataclasses.dataclass
class _Options:  # eq without hash: unhashable
    depth: int


def test_a_function_is_traced_once_per_argument_signature():
    from shardlab.parallel.graph.trace import trace

    calls = []

    def f(x, scale):
        calls.append(1)  # runs only while tracing
        return x * scale

    x = jnp.ones((4, 8))
    first = trace(f, x, 2.0)
    again = trace(f, jnp.zeros((4, 8)), 3.0)  # same shapes, dtypes and weak types
    assert again.jaxpr is first.jaxpr and len(calls) == 1
    other = trace(f, jnp.ones((8, 8)), 2.0)  # a new shape traces again
    assert other.jaxpr is not first.jaxpr and len(calls) == 2
