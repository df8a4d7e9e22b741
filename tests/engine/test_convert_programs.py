"""Control-flow programs: each converted (``shardlab.to_static``) result equals the plain Python
result on concrete inputs, and gradients through converted conds and static-trip-count loops
equal the eager ones (``jax.grad`` of the plain function runs its Python control flow on
concrete values)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import shardlab
from shardlab._core.equivalence import assert_same_program

# -- the programs -----------------------------------------------------------------------------


def if_else(x):
    if x.sum() > 0:
        y = x * 2
    else:
        y = -x
    return y


def if_elif_else(x):
    s = x.sum()
    if s > 10:
        out = x - 10
    elif s > 0:
        out = x * 3
    else:
        out = x**2
    return out


def nested_if(x):
    if x[0] > 0:
        if x[1] > 0:
            r = x[0] * x[1]
        else:
            r = x[0] - x[1]
    else:
        r = jnp.sin(x[0]) + x[1]
    return r


def if_without_else(x):
    y = x + 1
    if x.mean() > 0.5:
        y = y * 10
    return y


def if_dict_state(x):
    params = {"w": x, "b": jnp.zeros(())}
    if x.sum() > 0:
        params = {"w": params["w"] * 2, "b": params["b"] + 1}
    else:
        params = {"w": -params["w"], "b": params["b"] - 1}
    return params


def if_tuple_state(x):
    a, b = x, x.sum()
    if b > 1:
        a, b = a * 2, b + 1
    return a, b


def early_return(x):
    if x.sum() > 0:
        return x * 3
    return -x


def early_return_nested(x):
    if x[0] > 0:
        if x[1] > 0:
            return x.sum()
        z = x[0] * 2
        return z
    return x.prod()


def returns_at_depths(x):
    s = x.sum()
    if s > 100:
        return s
    y = s * 2
    if y > 10:
        return y + 1
    return y - 1


def while_traced(x):
    while x.sum() < 50:
        x = x * 2
    return x


def while_break(x):
    i = 0
    while i < 20:
        x = x * 1.5
        i += 1
        if x.sum() > 30:
            break
    return x, i


def while_continue(x, n):
    i = 0
    total = jnp.zeros(())
    while i < n:
        i += 1
        if x[i % 3] < 0:
            continue
        total = total + x[i % 3]
    return total


def while_concrete_test(x):
    k = 0
    while k < 4:  # Python: unrolled
        if x.sum() > k:
            x = x - 1
        k += 1
    return x


def for_range_traced_break(x):
    for i in range(10):
        x = x + i
        if x.sum() > 20:
            break
    return x


def for_range_traced_n(x, n):
    for i in range(n):
        x = x + i
    return x


def for_range_traced_bounds(x, start, stop):
    total = jnp.zeros(())
    for i in range(start, stop, 2):
        total = total + i * x.sum()
    return total


def for_rows(xs):
    acc = jnp.zeros(xs.shape[1:])
    for row in xs:
        acc = acc + jnp.tanh(row)
    return acc


def for_rows_continue(xs):
    acc = 0.0
    for row in xs:
        if row.sum() < 0:
            continue
        acc = acc + row.sum()
    return acc


def for_rows_break(xs):
    count = 0
    acc = 0.0
    for row in xs:
        if row.max() > 5:
            break
        acc = acc + row.sum()
        count += 1
    return acc, count


def for_rows_return(xs):
    for row in xs:
        if row.sum() > 3:
            return row
    return jnp.zeros_like(xs[0])


def for_dict_carry(xs):
    state = {"sum": jnp.zeros(()), "max": jnp.full((), -jnp.inf)}
    for row in xs:
        state = {"sum": state["sum"] + row.sum(), "max": jnp.maximum(state["max"], row.max())}
    return state


def for_tuple_carry(xs):
    carry = (jnp.zeros(()), jnp.ones(()))
    for row in xs:
        s, p = carry
        carry = (s + row.sum(), p * row.mean())
    return carry


def logical_ops(x):
    a = x.sum() > 0
    b = x.max() < 3
    if (a and b) or not (x.min() > -1):
        r = x * 2
    else:
        r = x
    return r


def mixed_static_traced(x, scale=2, mode="double"):
    if mode == "double" and scale > 1:  # Python values: stays Python
        y = x * scale
    else:
        y = x
    if y.sum() > 4 and scale > 1:  # traced and Python
        y = y - 1
    return y


def conditional_expression(x):
    y = x * 2 if x.sum() > 0 else x / 2
    return y + (1.0 if x.shape[0] > 2 else 0.0)


@shardlab.to_static
def inner_converted(v):
    if v.sum() > 0:
        return v * 10
    return v


def calls_converted(x):
    y = inner_converted(x)
    if y.sum() > 20:
        y = y / 2
    return y


def while_early_return(x):
    i = 0
    while i < 10:
        x = x + 1
        if x.sum() > 12:
            return x * 100
        i += 1
    return x


def nested_loops(xs):
    total = 0.0
    for row in xs:
        j = 0
        while j < 3:
            total = total + row.sum() * j
            j += 1
    return total


def counter_becomes_traced(x):
    count = 0
    while x.sum() < 100:
        x = x * 3
        count = count + 1
    return x, count


def dtype_promotion(x):
    if x.sum() > 0:
        y = 1
    else:
        y = x.sum() * 0.5
    return y


def for_else(xs):
    found = -1.0
    for row in xs:
        if row.sum() > 100:
            found = row.sum()
            break
    else:
        found = 0.5
    return found


def while_else(x):
    i = 0
    while i < 5:
        i += 1
        if x.sum() > 100:
            break
        x = x * 2
    else:
        x = x + 1000
    return x


def nested_static_loops(x):
    out = x
    for i in range(2):
        for j in range(3):
            if out.sum() > i + j:
                out = out * 0.9
            else:
                out = out + 1
    return out


def static_shape_condition(x):
    if x.shape[0] > 2:  # shapes are concrete: Python
        return x[:2]
    return x


def none_argument(x, bias=None):
    if bias is None:
        return x
    if bias.sum() > 0:
        return x + bias
    return x - bias


def list_in_python_loop(x):
    parts = []
    for i in range(3):  # Python loop over a concrete range: list appends are fine
        parts = [*parts, x * i]
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


X3 = jnp.array([1.0, -2.0, 3.0])
ROWS = jnp.array([[1.0, 2.0], [-3.0, 1.0], [4.0, 0.5], [7.0, 1.0]])

# (function, arguments that vary across cases)
PROGRAMS = [
    (if_else, [(X3,), (-X3,)]),
    (if_elif_else, [(X3,), (X3 * 5,), (-X3 * 2,)]),
    (nested_if, [(jnp.array([1.0, 2.0]),), (jnp.array([1.0, -2.0]),), (jnp.array([-1.0, 2.0]),)]),
    (if_without_else, [(X3,), (X3 * 0,)]),
    (if_dict_state, [(X3,), (-X3,)]),
    (if_tuple_state, [(X3,), (-X3,)]),
    (early_return, [(X3,), (-X3,)]),
    (
        early_return_nested,
        [(jnp.array([1.0, 2.0]),), (jnp.array([1.0, -2.0]),), (jnp.array([-1.0, 2.0]),)],
    ),
    (returns_at_depths, [(X3 * 60,), (X3 * 3,), (X3,)]),
    (while_traced, [(X3 + 2,), (jnp.array([30.0, 30.0]),)]),
    (while_break, [(X3 + 2,), (jnp.array([0.01, 0.01]),)]),
    (while_continue, [(X3, 5), (X3, jnp.int32(7))]),
    (while_concrete_test, [(X3,), (X3 * 5,)]),
    (for_range_traced_break, [(X3,), (X3 * 0,)]),
    (for_range_traced_n, [(X3, jnp.int32(4)), (X3, jnp.int32(0))]),
    (for_range_traced_bounds, [(X3, jnp.int32(1), jnp.int32(8)), (X3, jnp.int32(5), jnp.int32(2))]),
    (for_rows, [(ROWS,)]),
    (for_rows_continue, [(ROWS,)]),
    (for_rows_break, [(ROWS,), (ROWS[:2],)]),
    (for_rows_return, [(ROWS,), (ROWS[:2] * 0,)]),
    (for_dict_carry, [(ROWS,)]),
    (for_tuple_carry, [(ROWS,)]),
    (logical_ops, [(X3,), (jnp.array([1.0, 1.0]),), (jnp.array([-5.0, 0.0]),)]),
    (mixed_static_traced, [(X3,), (X3 * 3,)]),
    (conditional_expression, [(X3,), (-X3,), (jnp.array([1.0, 2.0]),)]),
    (calls_converted, [(X3,), (X3 * 2,), (-X3,)]),
    (while_early_return, [(X3,), (X3 * 0 - 100,)]),
    (nested_loops, [(ROWS,)]),
    (counter_becomes_traced, [(X3 + 2,)]),
    (dtype_promotion, [(X3,), (-X3,)]),
    (for_else, [(ROWS,), (ROWS * 100,)]),
    (while_else, [(X3,), (X3 * 100,)]),
    (nested_static_loops, [(X3,), (-X3,)]),
    (static_shape_condition, [(X3,), (X3[:2],)]),
    (none_argument, [(X3,), (X3, X3), (X3, -X3)]),
    (list_in_python_loop, [(X3,)]),
]


def _close(actual, expected, converted, *args):
    """The converted program computes the Python one (``_core/equivalence.py``). A Python
    number, or a weakly typed array, takes the converted side's dtype, as JAX's promotion
    gives it when both branches of a converted ``if`` must agree."""

    def as_actual(e, a):
        weak = not hasattr(e, "dtype") or getattr(e, "weak_type", False)
        return jnp.asarray(e, dtype=jnp.asarray(a).dtype if weak else None)

    actual = jax.tree.map(jnp.asarray, actual)
    assert_same_program(actual, jax.tree.map(as_actual, expected, actual), fn=converted, args=args)


def test_suite_has_at_least_30_programs():
    assert len(PROGRAMS) >= 30


@pytest.mark.parametrize("fn, cases", PROGRAMS, ids=[p[0].__name__ for p in PROGRAMS])
def test_converted_equals_python(fn, cases):
    static = shardlab.to_static(fn)
    for args in cases:
        _close(static(*args), fn(*args), static, *args)


def test_traced_conditions_become_lax_control_flow():
    def primitives(fn, *args):
        jaxpr = jax.make_jaxpr(shardlab.to_static(fn))(*args)
        names = set()

        def walk(j):
            for eqn in j.eqns:
                names.add(eqn.primitive.name)
                for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                    walk(sub)

        walk(jaxpr.jaxpr)
        return names

    assert "cond" in primitives(if_else, X3)
    assert "while" in primitives(while_traced, X3 + 2)
    assert "while" in primitives(for_range_traced_n, X3, jnp.int32(3))
    assert "scan" in primitives(for_rows, ROWS)
    # concrete conditions stay Python: nothing staged
    assert not {"cond", "while", "scan"} & primitives(static_shape_condition, X3)


GRADIENTS = [
    (if_else, lambda x: if_else(x).sum(), [X3, -X3]),
    (if_elif_else, None, [X3, X3 * 5, -X3 * 2]),
    (nested_if, None, [jnp.array([1.0, 2.0]), jnp.array([1.0, -2.0]), jnp.array([-1.0, 2.0])]),
    (early_return, None, [X3, -X3]),
    (returns_at_depths, None, [X3 * 60, X3 * 3, X3]),
    (for_range_traced_break, None, [X3, X3 * 0]),
    (for_rows, None, [ROWS]),
    (for_rows_continue, None, [ROWS]),
    (for_dict_carry, None, [ROWS]),
    (nested_static_loops, None, [X3, -X3]),
    (logical_ops, None, [X3, jnp.array([-5.0, 0.0])]),
]


def _scalar(fn):
    def loss(*args):
        leaves = jax.tree_util.tree_leaves(fn(*args))
        return sum(jnp.sum(leaf * (i + 1)) for i, leaf in enumerate(leaves))

    return loss


@pytest.mark.parametrize("fn, _, cases", GRADIENTS, ids=[g[0].__name__ for g in GRADIENTS])
def test_gradients_equal_eager(fn, _, cases):
    static = shardlab.to_static(fn)
    for x in cases:
        _close(jax.grad(_scalar(static))(x), jax.grad(_scalar(fn))(x), jax.grad(_scalar(static)), x)


def test_traced_while_under_grad_says_why_and_what_to_do():
    static = shardlab.to_static(while_traced)
    with pytest.raises(shardlab.ControlFlowError) as info:
        jax.grad(lambda x: static(x).sum())(X3 + 2)
    message = str(info.value)
    assert "test_convert_programs.py:" in message
    assert "while x.sum() < 50" in message
    assert "reverse-mode" in message and "while_loop" in message
    assert "static trip count" in message and "lax.scan" in message
    # forward mode works
    primal, _tangent = jax.jvp(static, (X3 + 2,), (jnp.ones(3),))
    _close(primal, while_traced(X3 + 2), static, X3 + 2)
