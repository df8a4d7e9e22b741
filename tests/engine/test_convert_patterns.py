"""AutoGraph-style programs that converted control flow got wrong (issue 37): each converted
result equals the plain Python one where Python gives a value, and where Python raises, the
error names the user's variable and line with no internals (``__sl`` names, the
``Undefined`` placeholder, shardlab's own files)."""

from __future__ import annotations

import contextlib
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardlab
from shardlab._core.equivalence import assert_same_program
from shardlab.engine.cells.staging import GraphCache, run_graph_cell


def same_as_python(fn, *args):
    """The converted result equals the plain Python one on concrete arguments."""
    staged = shardlab.to_static(fn)
    expected = jax.tree.map(jnp.asarray, fn(*args))  # Python numbers as jit returns them
    assert_same_program(staged(*args), expected, fn=staged, args=args)


def no_internals(error: BaseException) -> str:
    """The message, checked for the pass's internals."""
    text = str(error)
    for word in ("__sl", "Undefined", "engine/convert", "shardlab/engine"):
        assert word not in text, f"{word!r} in {text!r}"
    return text


def first_line(fn) -> int:
    return fn.__code__.co_firstlineno


# -- 4. internals reaching the user -----------------------------------------------------------


def bound_in_one_branch_read_in_the_other(xs):
    acc = 0.0
    for x in xs:
        if x > 0:
            t = x
        else:
            acc = acc + t + 1
    return acc


def bound_in_one_branch_read_in_the_other_while(n):
    i = 0
    acc = 0
    while i < n:
        if i % 2 == 1:
            acc = acc + t  # noqa: F821 (bound in an earlier iteration, as Python allows)
        else:
            t = i * 10  # noqa: F841 (read by a later iteration)
        i += 1
    return acc


def return_inside_with(x):
    with contextlib.nullcontext():
        if x.sum() > 0:
            return x * 2
        y = x + 1
    return y


def returns_of_two_structures(x):
    if x.sum() > 0:
        with contextlib.nullcontext():
            return x * 2
    return (x, x)


def read_before_any_binding(n):
    i = 0
    acc = 0
    while i < n:
        acc = acc + t  # noqa: F821 (unbound in the first iteration: the error under test)
        t = i  # noqa: F841 (read by the next iteration)
        i += 1
    return acc


def float_of_traced(x):
    return float(x.sum())


def test_name_bound_in_one_branch_and_read_in_the_other_is_carried():
    same_as_python(bound_in_one_branch_read_in_the_other, jnp.array([1.0, -1.0, 2.0, -3.0]))
    same_as_python(bound_in_one_branch_read_in_the_other_while, jnp.int32(6))


def test_return_inside_with_on_both_paths():
    same_as_python(return_inside_with, jnp.ones(3))
    same_as_python(return_inside_with, -jnp.ones(3))


def test_returns_of_two_structures_name_the_return_value_and_line():
    with pytest.raises(shardlab.ControlFlowError) as info:
        shardlab.to_static(returns_of_two_structures)(jnp.ones(3))
    text = no_internals(info.value)
    assert "the return value has a different structure" in text
    assert f"test_convert_patterns.py:{first_line(returns_of_two_structures) + 4}" in text


def test_reading_a_name_no_path_bound_yet_is_unbound_local_error_naming_it():
    with pytest.raises(UnboundLocalError, match="`t` is read here but has no value") as info:
        shardlab.to_static(read_before_any_binding)(jnp.int32(3))
    no_internals(info.value)


def test_jax_errors_name_the_users_function_not_the_wrapper():
    with pytest.raises(jax.errors.ConcretizationTypeError) as info:
        shardlab.to_static(float_of_traced)(jnp.ones(2))
    assert f"float_of_traced at {__file__}:{first_line(float_of_traced)}" in str(info.value)
    assert "convert/api.py" not in str(info.value)


@pytest.mark.parametrize("source", ["out = x or y\n", "out = x and y\n", "out = not x\n"])
@pytest.mark.parametrize("x", [0.0, 2.0])
def test_graph_cell_with_only_logic_operators(source, x):
    ns = {"x": jnp.float32(x), "y": jnp.float32(3.0)}
    python: dict = {"x": x, "y": 3.0}
    exec(source, python)
    run_graph_cell(source, ns, cache=GraphCache())
    assert float(ns["out"]) == float(python["out"])


# -- 3. a loop that may run zero times --------------------------------------------------------


def bound_only_in_while(n):
    i = 0
    while i < n:
        y = i * 2
        i += 1
    return y


def bound_before_while(n):
    i = 0
    y = -1
    while i < n:
        y = i * 2
        i += 1
    return y


def bound_only_in_range(x, n):
    for i in range(n):
        last = x * i
    return last


def bound_only_in_rows(xs):
    for row in xs:
        last = row
    return last


def test_name_bound_only_in_a_traced_while_is_an_error_naming_it():
    with pytest.raises(UnboundLocalError):
        bound_only_in_while(0)  # what Python says
    with pytest.raises(shardlab.ControlFlowError) as info:
        shardlab.to_static(bound_only_in_while)(jnp.int32(0))
    text = no_internals(info.value)
    assert f"test_convert_patterns.py:{first_line(bound_only_in_while) + 2}: `while i < n:`" in text
    assert "`y` is bound inside this loop and read after it" in text
    assert "bind `y` before the loop" in text


def test_bound_before_the_loop_runs_zero_and_more_times_as_python():
    for n in (0, 3):
        same_as_python(bound_before_while, jnp.int32(n))


def test_traced_range_and_empty_rows_say_the_same():
    with pytest.raises(shardlab.ControlFlowError, match="`last` is bound inside this loop"):
        shardlab.to_static(bound_only_in_range)(jnp.ones(2), jnp.int32(0))
    with pytest.raises(shardlab.ControlFlowError, match="array it loops over is empty") as info:
        shardlab.to_static(bound_only_in_rows)(jnp.zeros((0, 3)))
    no_internals(info.value)
    same_as_python(bound_only_in_rows, jnp.arange(6.0).reshape(2, 3))


# -- 1. closures see the current iteration ----------------------------------------------------


def closure_in_while(n):
    i = 20

    def g():
        return i + 2

    out = 0
    while i < n:
        i = i + 1
        out = g()
    return out


def closure_in_scan(xs):
    scale = 1.0
    times = lambda v: v * scale  # noqa: E731 (a closure, as users write them)
    acc = 0.0
    for x in xs:
        scale = scale * 2
        acc = acc + times(x)
    return acc


def closure_in_if(x):
    c = 1.0

    def g():
        return c * 10

    if x.sum() > 0:
        c = 2.0
        r = g()
    else:
        r = g() - 1
    return r


def test_closures_see_the_current_iteration():
    assert closure_in_while(21) == 23
    same_as_python(closure_in_while, jnp.int32(21))
    same_as_python(closure_in_while, jnp.int32(25))
    same_as_python(closure_in_scan, jnp.ones(3))
    same_as_python(closure_in_if, jnp.ones(2))
    same_as_python(closure_in_if, -jnp.ones(2))


# -- 6. item assignment, jumps inside try, chained comparisons --------------------------------


def dict_item_in_if(x):
    d = {"a": x, "b": 0.0}
    if x.sum() > 0:
        d["b"] = 1.0
    return d


def list_item_in_while(n):
    y = [0, 0]
    i = 0
    while i < n:
        y[0] += 1
        i += 1
    return y


def nested_item_in_scan(xs):
    state = {"stats": {"total": 0.0}, "n": 0}
    for x in xs:
        state["stats"]["total"] += x
        state["n"] += 1
    return state


def break_inside_try_finally(n):
    i = 0
    cleanups = 0
    while i < n:
        try:
            if i > 2:
                break
            i += 1
        finally:
            cleanups += 1
    return i, cleanups


def return_inside_try_finally(x):
    y = x
    try:
        if x > 0:
            return x * 2
        y = x - 1
    finally:
        y = y + 0
    return y


def return_inside_try_else(x):
    try:
        if x > 0:
            return x * 2
    except ValueError:
        return x
    else:
        x = x + 100
    return x


def return_inside_finally(x):
    while x < 10:
        try:
            x = x + 1
        finally:
            if x > 5:
                return x  # noqa: B012 (the pattern under test)
    return x


def chained(x, y, z):
    if x == y == z:
        return 1
    return 0


def chained_ranges(x):
    if 0 < x < 10 <= x * 10:
        return x
    return -x


def test_item_assignment_makes_the_container_state():
    same_as_python(dict_item_in_if, jnp.ones(2))
    same_as_python(dict_item_in_if, -jnp.ones(2))
    same_as_python(list_item_in_while, jnp.int32(3))
    same_as_python(nested_item_in_scan, jnp.arange(4.0))


def test_jumps_inside_try_finally_and_else():
    for n in (0, 2, 10):
        same_as_python(break_inside_try_finally, jnp.int32(n))
    for x in (2.0, -2.0):
        same_as_python(return_inside_try_finally, jnp.float32(x))
        same_as_python(return_inside_try_else, jnp.float32(x))


def test_return_inside_finally_is_a_clear_error_at_the_users_line():
    with pytest.raises(shardlab.ControlFlowError) as info:
        shardlab.to_static(return_inside_finally)(jnp.float32(1))
    text = no_internals(info.value)
    assert f"test_convert_patterns.py:{first_line(return_inside_finally) + 1}" in text
    assert "inside `finally` is not converted" in text


@pytest.mark.parametrize("values", [(1, 1, 1), (1, 1, 2), (2, 1, 1)])
def test_chained_comparisons_on_traced_values(values):
    same_as_python(chained, *(jnp.int32(v) for v in values))


@pytest.mark.parametrize("x", [0.5, 5.0, 20.0, -1.0])
def test_chained_comparisons_of_three_and_more(x):
    same_as_python(chained_ranges, jnp.float32(x))


def test_graph_cell_item_assignment_and_chained_comparison():
    source = (
        "d = {'a': x, 'n': 0.0}\nif x.sum() > 0:\n    d['n'] = 1.0\n"
        "ok = 0 < x[0] < 10\nfor v in x:\n    d['a'] = d['a'] + v\n"
    )
    ns = {"x": jnp.arange(1.0, 4.0)}
    python: dict = {"x": np.arange(1.0, 4.0)}
    exec(source, python)
    run_graph_cell(source, ns, cache=GraphCache())
    np.testing.assert_allclose(ns["d"]["a"], python["d"]["a"])
    assert float(ns["d"]["n"]) == python["d"]["n"] and bool(ns["ok"]) == bool(python["ok"])


# -- 7. assert on a traced value, checked when the program runs -------------------------------


def asserts_positive(x):
    assert x.sum() > 0, "x must sum to a positive value"
    return x * 2


def asserts_in_loop(xs):
    total = 0.0
    for x in xs:
        assert x < 10, "every row must be under 10"
        total = total + x
    return total


def test_assert_on_a_traced_value_checks_at_run_time():
    fn = shardlab.to_static(asserts_positive)
    same_as_python(asserts_positive, jnp.ones(2))
    with pytest.raises(AssertionError, match="x must sum to a positive value"):
        fn(-jnp.ones(2))
    np.testing.assert_allclose(fn(jnp.ones(2)), 2 * np.ones(2))  # the same program, again
    same_as_python(asserts_in_loop, jnp.arange(3.0))
    with pytest.raises(AssertionError, match="every row must be under 10"):
        shardlab.to_static(asserts_in_loop)(jnp.array([1.0, 20.0]))


def test_assert_in_a_graph_cell():
    source = "assert x.min() >= 0, 'negative input'\ny = x * 2\n"
    ns = {"x": jnp.ones(2)}
    run_graph_cell(source, ns, cache=GraphCache())
    np.testing.assert_allclose(ns["y"], 2 * np.ones(2))
    bad = {"x": -jnp.ones(2)}
    with pytest.raises(AssertionError, match="negative input"):
        run_graph_cell(source, bad, cache=GraphCache())
    assert "y" not in bad  # a failed run writes nothing back


# -- 5. dead names are not required ------------------------------------------------------------


def dead_after_return(x):
    if x.sum() > 0:
        t = x * 2
        return t
    t = jnp.stack([x, x])
    return t.sum(0)


def local_to_one_branch_of_a_loop_body(n):
    i = 0
    acc = 0.0
    while i < n:
        if i > 2:
            tmp = i * 2.0
            acc = acc + tmp
        i += 1
    return acc


def temporaries_of_two_shapes(x):
    if x.sum() > 0:
        tmp = x[:2]
        out = tmp.sum()
    else:
        tmp = x
        out = tmp.mean()
    return out


def test_dead_names_are_not_required_on_every_path():
    for x in (jnp.ones(3), -jnp.ones(3)):
        same_as_python(dead_after_return, x)
        same_as_python(temporaries_of_two_shapes, x)
    same_as_python(local_to_one_branch_of_a_loop_body, jnp.int32(6))


# -- 2. an exception while tracing a branch is not the program's --------------------------------


def raises_in_untaken_branch(x):
    try:
        if x > 0:
            r = 1
        else:
            raise ValueError("negative")
    except ValueError:
        r = 2
    return r


def test_exception_in_a_traced_branch_is_not_swallowed_by_the_users_try():
    assert raises_in_untaken_branch(1.0) == 1
    with pytest.raises(shardlab.ControlFlowError) as info:
        shardlab.to_static(raises_in_untaken_branch)(jnp.float32(1.0))
    text = no_internals(info.value)
    assert f"test_convert_patterns.py:{first_line(raises_in_untaken_branch) + 2}" in text
    assert "tracing the false branch raised ValueError: negative" in text
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames[-1].filename == __file__ or "convert" not in frames[-1].filename


# -- 8. a long concrete range in a graph cell -------------------------------------------------

TRAIN = "w = jnp.zeros(3)\nfor step in range(1000):\n    grad = 2 * (w - target)\n    w = w - 0.01 * grad\n"


def test_long_concrete_range_in_a_graph_cell_is_staged_as_one_scan():
    ns = {"target": jnp.arange(3.0), "jnp": jnp}
    run = run_graph_cell(TRAIN, ns, cache=GraphCache())
    eager = {"target": jnp.arange(3.0), "jnp": jnp}
    exec(TRAIN, eager)
    np.testing.assert_allclose(ns["w"], eager["w"], rtol=1e-5)
    assert int(ns["step"]) == eager["step"] == 999
    assert run.conversions is not None and run.conversions["staged"] == {"scan": 1}
    assert run.notes == ()


def test_long_range_that_cannot_be_staged_unrolls_and_says_how_long():
    source = "w = jnp.zeros(())\nfor step in range(120):\n    w = w + vals[step]\n"
    ns = {"vals": [float(i) for i in range(120)], "jnp": jnp}
    run = run_graph_cell(source, ns, cache=GraphCache(), line_offset=1)
    assert float(ns["w"]) == sum(range(120))
    (note,) = run.notes
    assert note.startswith("cell line 3: `for` over range(0, 120, 1) runs unrolled: 120 copies")
    assert "__sl" not in note


def test_short_and_python_only_ranges_stay_python():
    ns = {"x": jnp.ones(2)}
    run = run_graph_cell(
        "for i in range(5):\n    x = x * 2\nn = 0\nfor i in range(500):\n    n += 1\n",
        ns,
        cache=GraphCache(),
    )
    np.testing.assert_allclose(ns["x"], 32 * np.ones(2))
    assert ns["n"] == 500 and run.notes == ()
    assert run.conversions is not None and run.conversions["staged"] == {}
