"""Graph cells staged as one program: inputs, outputs, caching, printing and errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shardlab._core.equivalence import assert_same_program, rounding_steps
from shardlab.engine.cells.staging import GraphCache, GraphStagingError, run_graph_cell

STEP = """\
def_loss = 0.0
grads = jax.grad(loss_fn)(params, batch)
params = jax.tree.map(lambda p, g: p - lr * g, params, grads)
loss = loss_fn(params, batch)
loss
"""


def loss_fn(params, batch):
    return jnp.mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2)


def make_ns(n=32):
    key = jax.random.PRNGKey(0)
    k1, k2 = jax.random.split(key)
    return {
        "jax": jax,
        "jnp": jnp,
        "loss_fn": loss_fn,
        "lr": 0.1,
        "params": {"w": jax.random.normal(k1, (4, 2)), "b": jnp.zeros(2)},
        "batch": {"x": jax.random.normal(k2, (n, 4)), "y": jnp.ones((n, 2))},
    }


def reference_step(ns):
    params = ns["params"]
    grads = jax.grad(loss_fn)(params, ns["batch"])
    params = jax.tree.map(lambda p, g: p - ns["lr"] * g, params, grads)
    return params, loss_fn(params, ns["batch"])


def _equal_to_plain(run, ns, expected):
    """The staged cell computed the plain step (``_core/equivalence.py``)."""
    params, batch = expected[0], ns["batch"]
    steps = rounding_steps(
        lambda p, b: reference_step({**ns, "params": p, "batch": b}), params, batch
    )
    assert_same_program((ns["params"], run.result), expected, steps=steps)


def test_outputs_written_back_and_equal_to_plain_jax():
    ns = make_ns()
    expected_params, expected_loss = reference_step(ns)
    run = run_graph_cell(STEP, ns, cache=GraphCache())
    assert set(run.inputs) >= {"params", "batch"} and "lr" not in run.inputs
    assert set(run.outputs) == {"def_loss", "grads", "params", "loss"}
    _equal_to_plain(run, ns, (expected_params, expected_loss))
    assert ns["def_loss"] == 0.0  # a static output comes back as the Python value


def test_rerun_with_same_shapes_does_not_retrace_but_new_shapes_do():
    cache = GraphCache()
    ns = make_ns()
    first = run_graph_cell(STEP, ns, cache=cache)
    for _ in range(3):
        again = run_graph_cell(STEP, ns, cache=cache)
        assert not again.traced
    assert again.traces == first.traces == 1
    ns["batch"] = make_ns(64)["batch"]
    grown = run_graph_cell(STEP, ns, cache=cache)
    assert grown.traced and grown.traces == 2


def test_changed_static_value_is_a_new_cache_entry():
    cache = GraphCache()
    ns = make_ns()
    run_graph_cell(STEP, ns, cache=cache)
    ns["lr"] = 0.5
    run = run_graph_cell(STEP, ns, cache=cache)
    assert run.traced and len(cache) == 2


def test_sharded_inputs_keep_their_sharding_and_match_unsharded():
    mesh = Mesh(np.array(jax.devices()).reshape(8), ("data",))
    ns = make_ns(64)
    expected_params, expected_loss = reference_step(ns)
    ns["batch"] = jax.device_put(ns["batch"], NamedSharding(mesh, P("data")))
    run = run_graph_cell(STEP, ns, cache=GraphCache())
    _equal_to_plain(run, ns, (expected_params, expected_loss))
    assert ns["batch"]["x"].sharding.spec == P("data")


def test_print_runs_every_run_with_concrete_values(capsys):
    cache = GraphCache()
    ns = {"jnp": jnp, "x": jnp.arange(4.0)}
    cell = 'y = x * 2\nprint("total", y.sum())\nprint(f"mean {y.mean():.2f}")\n'
    run_graph_cell(cell, ns, cache=cache)
    ns["x"] = jnp.arange(4.0) + 1
    run_graph_cell(cell, ns, cache=cache)
    out = capsys.readouterr().out.splitlines()
    assert out == ["total 12.0", "mean 3.00", "total 20.0", "mean 5.00"]
    assert cache.traces_of(cell) == 1


def test_print_inside_a_loop_body_uses_a_runtime_callback(capsys):
    ns = {"jax": jax, "jnp": jnp, "x": jnp.ones(2)}
    cell = "def_ = 0\ny = jax.lax.fori_loop(0, 2, lambda i, c: (print(c), c + 1)[1], x)\n"
    run_graph_cell(cell, ns, cache=GraphCache())
    jax.effects_barrier()
    assert capsys.readouterr().out.count("[") == 2
    np.testing.assert_allclose(ns["y"], [3.0, 3.0])


@pytest.mark.parametrize(
    "cell, line, fragment",
    [
        # converted to lax.cond: `z` bound on one path only is the error now
        ("y = x * 2\nif y.sum() > 0:\n    z = y\n", 2, "`z` is bound only when"),
        ("s = float(x.sum())\n", 1, "Python number"),
        ("s = x.sum().item()\n", 1, "Python number"),
        ("import numpy as np\nh = np.asarray(x)\n", 2, "jax.numpy"),
        ("log.append(x)\n", 1, "log = [*log, new_item]"),
        ("table['k'] = x\n", 1, "table = {**table"),
        ("def f(a):\n    return a\n", 1, "define it in a %%jit"),
    ],
)
def test_unstageable_cells_name_line_reason_and_fix(cell, line, fragment):
    ns = {"jnp": jnp, "x": jnp.arange(3.0), "log": [], "table": {}}
    before = dict(ns)
    with pytest.raises(GraphStagingError) as info:
        run_graph_cell(cell, ns, cache=GraphCache(), line_offset=1)
    error = info.value
    assert error.lineno == line + 1  # the %%graph line counts
    assert fragment in str(error)
    assert "why:" in str(error) and "fix:" in str(error)
    assert ns == before and ns["log"] == []  # nothing half-applied


def test_error_in_called_function_names_cell_line_and_function_line():
    def helper(v):
        return v.sum().item()

    ns = {"helper": helper, "x": jnp.ones(3)}
    with pytest.raises(GraphStagingError) as info:
        run_graph_cell("a = 1\nb = helper(x)\n", ns, cache=GraphCache())
    assert info.value.lineno == 2 and "helper(x)" in info.value.line
    assert info.value.where is not None and "test_graph.py" in info.value.where


def test_user_exception_propagates_and_changes_nothing():
    ns = {"x": jnp.ones(3)}
    with pytest.raises(ZeroDivisionError):
        run_graph_cell("x = x + 1\ny = 1 / 0\n", ns, cache=GraphCache())
    assert set(ns) == {"x"} and float(ns["x"][0]) == 1.0


def test_keyboard_interrupt_while_tracing_changes_nothing_and_cache_recovers():
    # A class attribute: the interrupted trace's journal puts back the containers it reached
    # (a counter in a dict would be 0 again), not classes.
    class Interrupt:
        pending = True

    def slow(v):
        if Interrupt.pending:
            Interrupt.pending = False
            raise KeyboardInterrupt
        return v * 3

    cache = GraphCache()
    ns = {"slow": slow, "x": jnp.ones(3)}
    with pytest.raises(KeyboardInterrupt):
        run_graph_cell("x = slow(x)\n", ns, cache=cache)
    assert float(ns["x"][0]) == 1.0
    run_graph_cell("x = slow(x)\n", ns, cache=cache)
    assert float(ns["x"][0]) == 3.0


def test_del_removes_name_after_run():
    ns = {"x": jnp.ones(2), "tmp": jnp.zeros(2)}
    run_graph_cell("y = x + tmp\ndel tmp\n", ns, cache=GraphCache())
    assert "tmp" not in ns and float(ns["y"][0]) == 1.0


def test_cache_is_bounded():
    cache = GraphCache(max_entries=3)
    ns = {"x": jnp.ones(2)}
    for k in range(6):
        run_graph_cell(f"y = x * {k}\n", ns, cache=cache)
    assert len(cache) == 3
    assert cache.clear() == 3 and len(cache) == 0


def test_state_read_through_a_function_global_is_part_of_the_key():
    cache = GraphCache()
    config = {"scale": 2.0}

    def scaled(v):
        return v * config["scale"]

    ns = {"jnp": jnp, "scaled": scaled, "x": jnp.ones(3)}
    run_graph_cell("y = scaled(x)\n", ns, cache=cache)
    assert float(ns["y"][0]) == 2.0
    config["scale"] = 3.0  # a global of the function, not read by the cell itself
    run = run_graph_cell("y = scaled(x)\n", ns, cache=cache)
    assert float(ns["y"][0]) == 3.0 and run.traced


def test_state_changed_by_tracing_itself_does_not_retrace_every_run():
    cache = GraphCache()
    seen = [0]

    def counted(v):
        seen[0] += 1  # runs at trace time only
        return v + 1

    ns = {"counted": counted, "x": jnp.ones(2)}
    runs = [run_graph_cell("y = counted(x)\n", ns, cache=cache) for _ in range(4)]
    assert [r.traced for r in runs] == [True, False, False, False] and seen[0] == 1


def test_object_that_is_not_a_pytree_cannot_carry_a_tracer_out():
    class Box:
        def __init__(self, v):
            self.v = v

    ns = {"Box": Box, "x": jnp.ones(2)}
    with pytest.raises(GraphStagingError, match=r"cell line 1.*\n.*`box\.v`"):
        run_graph_cell("box = Box(x * 2)\n", ns, cache=GraphCache())
    assert "box" not in ns


def test_in_place_change_of_an_input_pytree_is_written_back():
    from flax import nnx

    drop = nnx.Dropout(0.5, rngs=nnx.Rngs(0))
    plain = nnx.Dropout(0.5, rngs=nnx.Rngs(0))
    ns = {"drop": drop, "jnp": jnp}
    cache = GraphCache()
    for _ in range(3):
        run = run_graph_cell("m = drop(jnp.ones(8))\n", ns, cache=cache)
        assert run.updated == ("drop",) and ns["drop"] is drop
        np.testing.assert_array_equal(ns["m"], plain(jnp.ones(8)))


def test_numpy_item_assignment_hint_does_not_suggest_dataclasses():
    ns = {"a": np.zeros(3), "jnp": jnp}
    with pytest.raises(GraphStagingError) as info:
        run_graph_cell("a[0] = 1.0\n", ns, cache=GraphCache())
    assert ".at[index].set" in str(info.value) and "dataclasses" not in str(info.value)
