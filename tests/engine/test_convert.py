"""Converted control flow: errors at the user's line, the converted source, strict mode,
fallbacks to Python, graph cells (conversions counted, one-branch names), and generated code
that carries user text only as parsed AST."""

from __future__ import annotations

import ast
import traceback
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardlab
from shardlab._core.equivalence import assert_same_program
from shardlab.engine.cells.source import analyse_cell
from shardlab.engine.cells.staging import GraphCache, run_graph_cell
from shardlab.engine.convert.ops import ConversionNote

X = jnp.array([1.0, -2.0, 3.0])


def one_branch(x):
    if x.sum() > 0:
        y = x * 2
    return y


def shape_mismatch(x):
    if x.sum() > 0:
        y = x
    else:
        y = x[:2]
    return y


def growing(xs):
    out = xs[0]
    for row in xs:
        out = jnp.concatenate([out, row])
    return out


def appends(xs):
    seen = []
    for row in xs:
        seen.append(row * 2)
    return seen


def vector_condition(x):
    if x > 0:
        return x
    return -x


def bad_scalar(x):
    if x.sum() > 0:
        y = float(x.sum())
    else:
        y = 0.0
    return y


def test_one_branch_name_is_an_error_naming_it_and_the_line():
    with pytest.raises(shardlab.ControlFlowError) as info:
        shardlab.to_static(one_branch)(X)
    message = str(info.value)
    assert f"test_convert.py:{one_branch.__code__.co_firstlineno + 1}" in message
    assert (
        "`if x.sum() > 0:`" in message and "`y` is bound only when the condition is true" in message
    )


def test_shape_mismatch_names_the_shapes():
    with pytest.raises(
        shardlab.ControlFlowError, match=r"shape \(3,\) when the condition is true and \(2,\)"
    ):
        shardlab.to_static(shape_mismatch)(X)


def test_vector_condition_says_how_to_reduce_it():
    with pytest.raises(shardlab.ControlFlowError, match=r"shape \(3,\).*no single truth value"):
        shardlab.to_static(vector_condition)(X)


def test_errors_inside_converted_code_point_at_user_lines_not_generated_code():
    with pytest.raises(jax.errors.ConcretizationTypeError) as info:
        shardlab.to_static(bad_scalar)(X)
    frames = traceback.extract_tb(info.value.__traceback__)
    mine = [f for f in frames if f.filename == __file__]
    assert mine[-1].lineno == bad_scalar.__code__.co_firstlineno + 2
    assert mine[-1].line.strip() == "y = float(x.sum())"
    assert not any("autograph" in f.filename or f.filename.startswith("<") for f in frames)


def test_growing_loop_falls_back_to_python_with_one_note():
    xs = jnp.arange(4.0).reshape(2, 2)
    with pytest.warns(
        ConversionNote,
        match=r"test_convert.py:\d+: `for` over a traced array runs as an unrolled Python loop",
    ):
        out = shardlab.to_static(growing)(xs)
    assert_same_program(out, growing(xs), fn=growing, args=(xs,))


def test_growing_loop_in_strict_mode_is_an_error():
    xs = jnp.arange(4.0).reshape(2, 2)
    with pytest.raises(shardlab.ControlFlowError, match=r"could not be staged as lax\.scan"):
        shardlab.to_static(growing, strict=True)(xs)


def test_in_place_mutation_keeps_the_loop_python_and_strict_refuses_it():
    xs = jnp.arange(4.0).reshape(2, 2)
    out = shardlab.to_static(appends)(xs)  # the Python loop over the rows: correct
    assert_same_program(out, appends(xs), fn=appends, args=(xs,))
    with pytest.raises(shardlab.ControlFlowError, match="changes `seen` in place"):
        shardlab.to_static(appends, strict=True)


def test_converted_shows_the_source_to_static_compiles():
    text = shardlab.converted(one_branch)
    assert "__sl__.if_stmt(" in text and "def __sl_fn_if_true_0(y):" in text
    ast.parse(text)
    assert shardlab.converted(shardlab.to_static(one_branch)) == text


def test_converted_refuses_a_lambda():
    with pytest.raises(TypeError, match="not a plain `def`"):
        shardlab.converted(lambda x: x)


def test_to_static_passes_jit_options_and_keeps_the_name():
    def scaled(x, n):
        for _ in range(n):  # static n: unrolled
            x = x * 2
        return x

    fn = shardlab.to_static(scaled, static_argnums=1)
    np.testing.assert_allclose(fn(X, 3), X * 8)
    assert fn.__name__ == "scaled"
    assert "name=scaled" in str(jax.make_jaxpr(fn, static_argnums=1)(X, 3))


def test_decorator_with_options():
    @shardlab.to_static(strict=True)
    def clipped(x):
        if x.max() > 2:
            x = jnp.minimum(x, 2.0)
        return x

    np.testing.assert_allclose(clipped(X), jnp.minimum(X, 2.0))


def test_user_text_reaches_generated_code_only_as_parsed_ast():
    def tricky(x):
        label = "'); __import__('os').system('echo pwned') #"
        if x.sum() > 0:
            x = x + len(label + "{x}")
        return x

    text = shardlab.converted(tricky)
    tree = ast.parse(text)
    strings = {
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }
    assert "'); __import__('os').system('echo pwned') #" in strings
    assert not any(
        isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "system" for n in ast.walk(tree)
    )
    out = shardlab.to_static(tricky)(X)  # the string stays a constant
    np.testing.assert_allclose(out, X + 46)


# -- graph cells ------------------------------------------------------------------------------


def test_graph_cell_converts_and_counts():
    ns = {"x": X, "jnp": jnp}
    source = (
        "if x.sum() > 0:\n    y = x * 2\nelse:\n    y = -x\n"
        "total = 0.0\nfor v in x:\n    total = total + v\n"
        "n = 0\nwhile total < 100:\n    total = total * 2 + 1\n    n += 1\n"
    )
    run = run_graph_cell(source, ns, cache=GraphCache(), line_offset=1)
    np.testing.assert_allclose(ns["y"], X * 2)
    expected_total, n = 2.0, 0
    while expected_total < 100:
        expected_total, n = expected_total * 2 + 1, n + 1
    assert float(ns["total"]) == expected_total and int(ns["n"]) == n
    assert run.conversions["converted"] == 3
    assert run.conversions["staged"] == {"cond": 1, "scan": 1, "while_loop": 1}


def test_graph_cell_concrete_conditions_stay_python():
    ns = {"x": X, "flag": True, "steps": 3}
    run = run_graph_cell(
        "if flag:\n    y = x + 1\nfor i in range(steps):\n    y = y * 2\n", ns, cache=GraphCache()
    )
    np.testing.assert_allclose(ns["y"], (X + 1) * 8)
    assert ns["i"] == 2
    assert run.conversions["staged"] == {} and run.conversions["python"] == 2


def test_graph_cell_without_control_flow_is_not_rewritten():
    cell = analyse_cell("y = x * 2\n", filename="<t>")
    assert cell.sites == () and cell.converted_source is None


def test_graph_cell_one_branch_name_error_names_the_cell_line():
    with pytest.raises(shardlab.GraphStagingError) as info:
        run_graph_cell(
            "a = x\nif a.sum() > 0:\n    z = a\n", {"x": X}, cache=GraphCache(), line_offset=1
        )
    assert info.value.lineno == 3
    assert "cell line 3: `if a.sum() > 0:`" in str(info.value)


def test_graph_cell_strict_refuses_what_stays_python():
    source = "log = []\nfor v in x:\n    log.append(v)\n"
    ns = {"x": X}
    run_graph_cell(source, ns, cache=GraphCache())  # Python loop over the rows
    assert len(ns["log"]) == 3
    with pytest.raises(shardlab.GraphStagingError, match="cannot be converted for staging"):
        run_graph_cell(source, {"x": X}, cache=GraphCache(), strict=True)


def test_graph_cell_fallback_note_is_said_once():
    source = "out = x[:1]\nfor v in x:\n    out = jnp.concatenate([out, v[None]])\n"
    cache = GraphCache()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a graph cell says it as a note, not a warning
        first = run_graph_cell(source, {"x": X, "jnp": jnp}, cache=cache, line_offset=1)
    assert any(
        "cell line 3: `for` over a traced array runs as an unrolled Python loop" in n
        for n in first.notes
    )
    again = run_graph_cell(source, {"x": X * 2, "jnp": jnp}, cache=cache, line_offset=1)
    assert again.notes == ()


def test_graph_cell_calling_a_to_static_function():
    @shardlab.to_static
    def relu_sum(v):
        if v.sum() > 0:
            return v.sum()
        return jnp.zeros(())

    ns = {"x": X, "relu_sum": relu_sum}
    run_graph_cell("r = relu_sum(x)\nif r > 1:\n    r = r * 10\n", ns, cache=GraphCache())
    assert float(ns["r"]) == 20.0


def test_graph_cell_unconverted_function_error_suggests_to_static():
    def helper(v):
        if v.sum() > 0:
            return v
        return -v

    with pytest.raises(shardlab.GraphStagingError, match=r"shardlab\.to_static"):
        run_graph_cell("r = helper(x)\n", {"x": X, "helper": helper}, cache=GraphCache())


def test_graph_cell_loop_that_prints_keeps_the_cells_print_order(capsys):
    ns = {"x": jnp.arange(3.0)}
    source = "print('start')\nfor v in x:\n    print('v', v)\ntotal = x.sum()\nprint('end')\n"
    run = run_graph_cell(source, ns, cache=GraphCache())
    assert capsys.readouterr().out.split() == ["start", "v", "0.0", "v", "1.0", "v", "2.0", "end"]
    assert run.conversions["staged"] == {}  # unrolled over the rows, as before conversion
