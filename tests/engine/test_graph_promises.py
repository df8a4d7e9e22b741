"""Graph cells keep their promises (issue 37): a failing or refused cell changes nothing and
leaves no traced value anywhere in the namespace; ``del`` then rebind re-runs as Python does;
boolean masks, prints, asserts and a blank first line are reported at the user's line."""

from __future__ import annotations

import collections
import functools
import threading
import traceback
import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.core.inputtransformer2 import TransformerManager
from jax.core import Tracer

from shardlab.engine.cells.source import dropped_blank_lines
from shardlab.engine.cells.staging import GraphCache, GraphStagingError, run_graph_cell


def tracers_in(namespace, *, max_depth=12):
    """Every path in ``namespace`` that leads to a JAX tracer: through dicts, lists, tuples,
    sets, deques, objects' ``__dict__`` and slots, and functions' closures, defaults and the
    globals they name. Written independently of the engine's own walks."""
    found = []
    seen = set()

    def walk(value, path, depth):
        if isinstance(value, Tracer):
            found.append(path)
            return
        if isinstance(value, (str, bytes, int, float, complex, type(None), np.ndarray, jax.Array)):
            return
        if isinstance(value, (types.ModuleType, type)) or id(value) in seen or depth > max_depth:
            return
        seen.add(id(value))
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}[{k!r}]", depth + 1)
        elif isinstance(value, (list, tuple, collections.deque)):
            for i, v in enumerate(value):
                walk(v, f"{path}[{i}]", depth + 1)
        elif isinstance(value, (set, frozenset)):
            for v in value:
                walk(v, f"{path}{{}}", depth + 1)
        elif isinstance(value, functools.partial):
            walk((value.func, value.args, value.keywords), path, depth + 1)
        elif isinstance(value, types.FunctionType):
            for name, cell in zip(value.__code__.co_freevars, value.__closure__ or (), strict=True):
                try:
                    walk(cell.cell_contents, f"{path}.<closure {name}>", depth + 1)
                except ValueError:
                    pass
            walk(value.__defaults__, f"{path}.<defaults>", depth + 1)
            for name in value.__code__.co_names:
                if name in value.__globals__:
                    walk(value.__globals__[name], f"{path}.<global {name}>", depth + 1)
        else:
            for k, v in getattr(value, "__dict__", {}).items():
                walk(v, f"{path}.{k}", depth + 1)
            for slot in getattr(type(value), "__slots__", ()):
                if hasattr(value, slot):
                    walk(getattr(value, slot), f"{path}.{slot}", depth + 1)

    for name, value in list(namespace.items()):
        walk(value, name, 0)
    return found


def run_failing(cell, ns, error=Exception, **options) -> Any:
    with pytest.raises(error) as info:
        run_graph_cell(cell, ns, cache=options.pop("cache", GraphCache()), **options)
    assert tracers_in(ns) == []
    return info.value


def user_namespace(code, **values):
    """A namespace whose functions are defined in it, as a notebook's are."""
    ns = {"jax": jax, "jnp": jnp, **values}
    exec(code, ns)
    return ns


# -- 1. a refused or failing cell changes nothing and leaves no tracer --------------------------


def test_append_to_a_list_in_a_dict_from_an_earlier_cell_is_refused_with_a_fix_that_applies():
    # flax's MNIST tutorial: `metrics_history` is a dict of lists made in an earlier cell
    history = {"train_loss": [], "train_accuracy": []}
    ns = {"jnp": jnp, "x": jnp.arange(4.0), "metrics_history": history}
    cell = 'loss = (x**2).mean()\nmetrics_history["train_loss"].append(loss)\n'
    error = run_failing(cell, ns, GraphStagingError, line_offset=1)
    assert error.lineno == 3 and "metrics_history" in error.line
    assert "pytree" not in str(error)  # a dict is one: that fix would not apply
    assert "%%eager" in error.fix and "metrics_history['train_loss'].append(loss)" in error.fix
    assert ns["metrics_history"] is history and history == {"train_loss": [], "train_accuracy": []}


def test_append_with_a_key_known_only_when_it_runs_is_undone_and_refused_at_its_line():
    history = {"train_loss": [], "train_accuracy": []}
    ns = {"jnp": jnp, "x": jnp.arange(4.0), "metrics_history": history}
    cell = (
        "metrics = {'loss': (x**2).mean(), 'accuracy': x.mean()}\n"
        "for metric, value in metrics.items():\n"
        "    metrics_history[f'train_{metric}'].append(value)\n"
    )
    error = run_failing(cell, ns, GraphStagingError)
    assert error.lineno == 3 and "with the block around it" in error.fix
    assert history == {"train_loss": [], "train_accuracy": []}


def test_a_function_appending_to_a_global_list_is_undone_and_refused():
    ns = user_namespace("history = []\ndef record(v):\n    history.append(v)\n    return v\n")
    ns["x"] = jnp.ones(3)
    error = run_failing("y = record(x * 2)\n", ns, GraphStagingError)
    assert "history" in str(error) and "history.append(value)" in error.fix
    assert ns["history"] == [] and "y" not in ns


def test_a_global_bound_by_a_called_function_is_undone_and_refused():
    ns = user_namespace("def remember(v):\n    global last\n    last = v\n    return v\n")
    ns["x"] = jnp.ones(3)
    error = run_failing("y = remember(x + 1)\n", ns, GraphStagingError)
    assert "`last`" in str(error) and "last" not in ns


def test_an_attribute_set_by_a_method_of_an_outside_object_is_undone():
    ns = user_namespace(
        "class Running:\n"
        "    def __init__(self):\n        self.total = 0.0\n"
        "    def add(self, v):\n        self.total = self.total + v\n        return v\n"
        "acc = Running()\n"
    )
    ns["x"] = jnp.ones(3)
    run_failing("y = acc.add(x.sum())\n", ns, GraphStagingError)
    assert ns["acc"].total == 0.0


@pytest.mark.parametrize(
    "tail, error",
    [
        ("z = 1 / 0\n", ZeroDivisionError),  # an exception after the mutation
        ("z = float(y.sum())\n", GraphStagingError),  # a trace error after it
        ("z = interrupt()\n", KeyboardInterrupt),  # interrupted after it
    ],
)
def test_a_cell_failing_after_a_mutation_puts_every_reached_container_back(tail, error):
    ns = user_namespace(
        "log = {'seen': [], 'calls': 0}\n"
        "def note(v):\n"
        "    log['seen'].append(v)\n"
        "    log['calls'] += 1\n"
        "    return v\n"
        "def interrupt():\n"
        "    raise KeyboardInterrupt\n"
    )
    ns["x"] = jnp.ones(3)
    log = ns["log"]
    run_failing("y = note(x * 2)\n" + tail, ns, error)
    assert ns["log"] is log and log == {"seen": [], "calls": 0}
    assert set(ns) >= {"x", "log"} and "y" not in ns and "z" not in ns


def test_a_failing_run_time_assert_undoes_what_tracing_changed():
    ns = user_namespace("steps = []\ndef step(v):\n    steps.append('traced')\n    return v\n")
    ns["x"] = jnp.ones(3)
    run_failing("y = step(x)\nassert (y > 2).all(), 'too small'\n", ns, AssertionError)
    assert ns["steps"] == [] and "y" not in ns


def test_a_cell_that_succeeds_keeps_its_trace_time_side_effects():
    ns = user_namespace("steps = []\ndef step(v):\n    steps.append('traced')\n    return v\n")
    ns["x"] = jnp.ones(3)
    cache = GraphCache()
    for _ in range(2):
        run_graph_cell("y = step(x)\n", ns, cache=cache)
    assert ns["steps"] == ["traced"]  # once, when it was traced, as before
    assert tracers_in(ns) == []


# -- 2. `del` then rebind ---------------------------------------------------------------------


def test_del_then_rebind_reruns_as_python_does():
    cell = "new_key, sub = jax.random.split(key)\nnoise = jax.random.normal(sub, (2,))\ndel key\nkey = new_key\n"
    staged = {"jax": jax, "key": jax.random.PRNGKey(0)}
    plain = dict(staged)
    cache = GraphCache()
    for _ in range(3):
        run_graph_cell(cell, staged, cache=cache)
        exec(cell, plain)
        np.testing.assert_array_equal(staged["key"], plain["key"])
        np.testing.assert_array_equal(staged["noise"], plain["noise"])
    assert cache.traces_of(cell) == 1


def test_split_and_del_loop_removes_only_what_stays_deleted():
    cell = "key, sub = jax.random.split(key)\nw = jax.random.normal(sub, (3,))\ndel sub\n"
    ns = {"jax": jax, "key": jax.random.PRNGKey(1)}
    cache = GraphCache()
    keys = []
    for _ in range(3):
        run_graph_cell(cell, ns, cache=cache)
        assert "sub" not in ns and "key" in ns
        keys.append(np.asarray(jax.random.key_data(ns["key"])).tolist())
    assert len({str(k) for k in keys}) == 3


def test_a_deleted_input_is_a_name_error_until_bound_again_then_the_cell_is_staged_again():
    cell = "y = x + 1\ndel x\n"
    ns = {"x": jnp.ones(2)}
    cache = GraphCache()
    run_graph_cell(cell, ns, cache=cache)
    assert "x" not in ns
    with pytest.raises(NameError, match="'x'"):
        run_graph_cell(cell, ns, cache=cache)
    ns["x"] = jnp.ones(5)
    run = run_graph_cell(cell, ns, cache=cache)
    assert run.traced and ns["y"].shape == (5,) and "x" not in ns


# -- 3. a boolean mask -----------------------------------------------------------------------


def test_boolean_mask_indexing_names_the_line_and_the_where_fix():
    ns = {"jnp": jnp, "x": jnp.arange(-2.0, 3.0)}
    error = run_failing("y = x * 2\nneg = x[x < 0]\n", ns, GraphStagingError, line_offset=1)
    assert error.lineno == 3 and error.line == "neg = x[x < 0]"
    assert "jnp.where(x < 0, x, 0)" in error.fix and "%%eager" in error.fix
    assert "depends on the values" in error.reason


def test_a_value_dependent_size_names_size():
    ns = {"jnp": jnp, "x": jnp.arange(-2.0, 3.0)}
    error = run_failing("idx = jnp.nonzero(x > 0)\n", ns, GraphStagingError)
    assert error.lineno == 1 and "size=" in error.fix


# -- 4. print, however it is reached ---------------------------------------------------------


def test_print_reached_through_builtins_or_a_called_function_prints_every_run(capsys):
    ns = user_namespace("import builtins\ndef show(v):\n    print('show', v)\n    return v\n")
    ns["x"] = jnp.arange(3.0)
    cell = (
        "y = x * 2\n"
        "print('cell', y[0])\n"
        "__builtins__.print('dunder', y[1])\n"
        "builtins.print(f'module {y[2]:.1f}')\n"
        "z = show(y + 1)\n"
    )
    cache = GraphCache()
    run_graph_cell(cell, ns, cache=cache)
    ns["x"] = jnp.arange(3.0) + 10
    run_graph_cell(cell, ns, cache=cache)
    assert capsys.readouterr().out.splitlines() == [
        "cell 0.0",
        "dunder 2.0",
        "module 4.0",
        "show [1. 3. 5.]",
        "cell 20.0",
        "dunder 22.0",
        "module 24.0",
        "show [21. 23. 25.]",
    ]
    assert cache.traces_of(cell) == 1 and tracers_in(ns) == []


def test_a_string_formatted_from_a_traced_value_outside_the_cell_gets_a_note(capsys):
    ns = user_namespace("def show(v):\n    print(f'loss {v}')\n    return v\n")
    ns["x"] = jnp.ones(())
    run = run_graph_cell("y = show(x)\n", ns, cache=GraphCache())
    assert any("cell line 1" in n and "jax.debug.print" in n for n in run.notes)


def test_print_bound_to_a_name_is_written_back_as_print():
    import builtins

    ns = {"x": jnp.ones(2)}
    run_graph_cell("p = print\ny = x\n", ns, cache=GraphCache())
    assert ns["p"] is builtins.print


def test_print_of_another_thread_during_a_trace_is_not_taken(capsys):
    started, done = threading.Event(), threading.Event()

    def other():
        started.wait()
        print("other thread")
        done.set()

    thread = threading.Thread(target=other)
    thread.start()

    def wait_for_other(v):
        started.set()
        done.wait(10)
        return v

    ns = {"wait_for_other": wait_for_other, "x": jnp.ones(2)}
    run_graph_cell("y = wait_for_other(x)\n", ns, cache=GraphCache())
    thread.join()
    assert capsys.readouterr().out == "other thread\n"


# -- 5. a blank first line ---------------------------------------------------------------------


def _as_the_kernel_runs(body, ns, **options):
    """What the kernel passes for `%%graph` + ``body``: IPython's transformed code (which
    drops leading blank lines) and the cell as the user sees it."""
    code = TransformerManager().transform_cell(body)
    return run_graph_cell(
        code, ns, line_offset=1, cell_text="%%graph\n" + body, filename="<cell-5>", **options
    )


def test_a_blank_line_after_the_magic_does_not_shift_error_lines():
    ns = {"x": jnp.ones(3)}
    with pytest.raises(GraphStagingError) as info:
        _as_the_kernel_runs("\ny = x * 2\nz = float(y.sum())\n", ns, cache=GraphCache())
    assert info.value.lineno == 4 and info.value.line == "z = float(y.sum())"
    with pytest.raises(ZeroDivisionError) as raised:
        _as_the_kernel_runs("\n\ny = x * 2\nz = 1 / 0\n", ns, cache=GraphCache())
    frame = [
        f for f in traceback.extract_tb(raised.value.__traceback__) if f.filename == "<cell-5>"
    ]
    assert frame[-1].lineno == 5


def test_dropped_blank_lines_finds_the_shift_for_the_code_and_for_segments():
    assert dropped_blank_lines("\n\ny = 1\n", "y = 1\n") == 2
    assert dropped_blank_lines("\n\ny = 1\n", "\n\ny = 1\n") == 0  # already padded
    assert dropped_blank_lines("y = 1\n", "y = 1\n") == 0
    # a staged segment after a magic line, padded to the transformed code's lines
    assert dropped_blank_lines("\n%time q = 1\ny = 1\n", "\ny = 1\n") == 1


# -- 6. assert on traced values ---------------------------------------------------------------


def test_a_failing_assert_raises_the_message_at_the_assert_line_and_writes_nothing():
    ns = {"jnp": jnp, "x": jnp.arange(3.0), "y": jnp.arange(3.0) + 1}
    cache = GraphCache()
    cell = "z = x + 1\nassert jnp.allclose(z, y), 'z differs'\n"
    run_graph_cell(cell, ns, cache=cache, filename="<cell-6>", line_offset=1)
    ns["y"] = ns["y"] * 2  # same shapes: the compiled program runs again, not a new trace
    del ns["z"]
    with pytest.raises(AssertionError) as info:
        run_graph_cell(cell, ns, cache=cache, filename="<cell-6>", line_offset=1)
    assert str(info.value) == "z differs" and "z" not in ns
    last = traceback.extract_tb(info.value.__traceback__)[-1]
    assert (last.filename, last.lineno) == ("<cell-6>", 3)
    assert cache.traces_of(cell) == 1
    assert tracers_in(ns) == []
