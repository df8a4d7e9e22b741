"""shardlab.compare and %%compare: eager, compiled and a float64 referee (issue 11).

The functions here really differ between eager and compiled on CPU with JAX 0.10: XLA's
algebraic simplifier folds ``(b + c) - c`` into ``b`` (which removes a cancellation eager
keeps, so compiled is closer to float64), and also folds ``(b + 1e30) - 1e30``, where IEEE
arithmetic in float32 and float64 alike gives 0 (so compiled is the one off).
"""

from __future__ import annotations

import linecache

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardlab
from shardlab.engine.compare import run as compare_module
from shardlab.engine.compare.cell import bisect_cell, compare_cell
from shardlab.engine.compare.numerics import Tolerance, difference


def cancel(b):
    c = (b + 1e7) - 1e7
    return jnp.tanh(c).sum()


def folded_wrong(b):
    return (b + 1e30) - 1e30


@pytest.fixture(scope="module")
def b():
    return jax.random.uniform(jax.random.key(0), (100,))


def test_cancellation_compiled_differs_and_is_closer_to_float64(b):
    report = shardlab.compare(cancel, b)
    (leaf,) = report.leaves
    d = leaf.difference
    assert not d.agree and d.max_abs > 0.5  # eager lost b's digits; compiled kept them
    assert d.closer == "compiled"
    assert d.compiled_error < 1e-4 < 0.5 < d.eager_error
    assert leaf.verdict == compare_module.COMPILED_CLOSER and report.passed
    assert report.bisect_call == "shardlab.bisect(cancel, b)"  # the user's own expressions
    assert "compiled closer to float64" in report.text()


def test_a_fold_ieee_arithmetic_does_not_make_fails_with_eager_closer(b):
    report = shardlab.compare(folded_wrong, b)
    (leaf,) = report.leaves
    assert leaf.difference.closer == "eager"
    assert leaf.difference.eager_error == 0.0 and leaf.difference.compiled_error > 0.3
    assert leaf.verdict == compare_module.COMPILED_OFF
    assert not report.passed
    assert "FAIL" in report.summary()
    assert "to find the first diverging operation: shardlab.bisect(folded_wrong, b)" in (
        report.text()
    )


def step(params, x, key):
    noise = jax.random.normal(key, x.shape)
    h = jnp.tanh(x @ params["w1"]) + 0.1 * noise @ params["w1"]
    loss = jnp.mean(h**2)
    grads = {"w1": params["w1"] * loss, "b": jnp.zeros(3)}
    return loss, grads


def test_agreeing_step_with_prng_keys_and_dict_outputs():
    k1, k2 = jax.random.split(jax.random.key(1))
    params = {"w1": jax.random.normal(k1, (8, 3))}
    x = jax.random.normal(k2, (16, 8))
    report = shardlab.compare(step, params, x, jax.random.key(7))
    labels = [leaf.label for leaf in report.leaves]
    assert labels == ["loss", "grads['b']", "grads['w1']"]  # the names the return wrote
    assert report.passed and not report.differs
    assert all(leaf.verdict == "agree" for leaf in report.leaves)
    # The reference drew the same normals: its error is float32 rounding, not O(1) (under
    # x64 jax.random.normal(key) draws other numbers; the reference avoids that).
    loss = report.leaves[0].difference
    assert loss.eager_error is not None and loss.eager_error < 1e-5
    assert report.bisect_call is None


def test_x64_is_on_only_inside_the_reference(b):
    assert not jax.config.jax_enable_x64
    shardlab.compare(cancel, b)
    assert not jax.config.jax_enable_x64
    assert jnp.ones(2).dtype == jnp.float32 and jnp.asarray(1.0).dtype == jnp.float32


def noisy(x):
    return x + np.random.default_rng().normal()  # a new number each time the Python runs


def test_python_that_differs_when_traced_is_its_own_verdict():
    report = shardlab.compare(noisy, jnp.ones(4))
    (leaf,) = report.leaves
    assert not leaf.traced_agrees
    assert leaf.verdict == compare_module.TRACE_DIFFERS and not report.passed
    assert any("trace time" in note for note in report.notes)


def bf16_loss(w, x):
    h = (x.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16)).astype(jnp.float32)
    return jnp.mean(h**2)


def test_bf16_matmul_compiled_keeps_excess_precision():
    # Eager rounds the bf16 dot to bf16, then converts; XLA fuses dot and convert and keeps
    # the float32 accumulator (excess precision): compiled differs, and is closer.
    w = jax.random.normal(jax.random.key(2), (64, 64))
    x = jax.random.normal(jax.random.key(3), (32, 64))
    report = shardlab.compare(bf16_loss, w, x)
    (leaf,) = report.leaves
    d = leaf.difference
    assert not d.agree and d.closer == "compiled" and report.passed
    # both are far from float64 next to float32 rounding: the program chose bf16
    assert d.compiled_error > 1e-5 * d.magnitude and d.eager_error > d.compiled_error


def branchy(x):
    if x.sum() > 0:
        return x
    return -x


def test_a_function_that_does_not_trace_is_explained():
    report = shardlab.compare(branchy, jnp.ones(3))
    assert report.failure is not None and not report.passed
    assert report.failure.kind == "branch"
    assert "test_compare.py:" in report.failure.where
    assert report.failure.line == "if x.sum() > 0:"
    assert "jax.lax.cond" in report.failure.fix


def test_html_view_is_a_table_with_labels_and_units(b):
    html = shardlab.compare(cancel, b)._repr_html_()
    assert html is not None and "<table" in html
    for text in ("max |compiled − float64|", "closer to float64", "compiled", "verdict"):
        assert text in html


def test_the_float64_rule_is_torchs(b):
    rng = np.random.default_rng(0)
    ref = rng.normal(size=2000)
    eager_noise = rng.normal(size=2000) * 1e-3
    eager = (ref + eager_noise).astype(np.float32)
    twice = (ref + 1.9 * eager_noise).astype(np.float32)  # within 2x eager's error: pass
    thrice = (ref + 3.0 * eager_noise).astype(np.float32)  # beyond 2x: fail
    assert difference(eager, twice, ref).passed
    assert not difference(eager, thrice, ref).passed
    small = slice(0, 100)  # fewer than 1000 elements: margin 3x
    assert difference(
        eager[small], (ref + 2.5 * eager_noise)[small].astype(np.float32), ref[small]
    ).passed
    loose = {"float32": Tolerance(1e-2, 1e-2)}
    assert difference(eager, thrice, ref, overrides=loose).agree
    nan = np.array([np.nan, 1.0], np.float32)
    assert difference(nan, nan.copy()).agree
    assert not difference(nan, np.array([0.0, 1.0], np.float32)).agree
    assert not difference(np.array([1, 2]), np.array([1, 3])).agree  # integers: exact


def test_cell_runs_on_copies_and_leaves_the_namespace_as_it_was(tmp_path):
    source = (
        "c = (b + 1e7) - 1e7\n"
        "loss = jnp.tanh(c).sum()\n"
        "grads = {'w1': params['w1'] * loss}\n"
        "bump()\n"  # a function that assigns a global of the namespace
        "loss * 2\n"
    )
    filename = "<compare-test-cell>"
    text = "%%compare\n" + source
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    namespace: dict = {"jax": jax, "jnp": jnp}
    exec("counter = 0\ndef bump():\n    global counter\n    counter += 1\n", namespace)
    namespace["b"] = jax.random.uniform(jax.random.key(0), (100,))
    namespace["params"] = {"w1": jnp.ones(3)}
    before = dict(namespace)
    w1_before = namespace["params"]["w1"]
    report = compare_cell(source, namespace, filename=filename, line_offset=1, cell_text=text)
    assert set(namespace) == set(before)
    assert all(namespace[k] is before[k] for k in before)
    assert namespace["params"]["w1"] is w1_before and namespace["counter"] == 0
    assert [leaf.label for leaf in report.leaves] == ["c", "loss", "grads['w1']", "result"]
    assert any("`counter`" in note for note in report.notes)
    assert report.bisect_call is not None and "%%compare --bisect" in report.bisect_call
    found = bisect_cell(source, namespace, filename=filename, line_offset=1)
    assert found.found and found.primitive == "sub"
    assert found.source == f"{filename}:2" and found.line == "c = (b + 1e7) - 1e7"
    assert namespace["counter"] == 0 and all(namespace[k] is before[k] for k in before)
    # graph mode's own refusals are the compiled side's finding; still nothing changes
    mutating = "params['w1'] = params['w1'] * 2\n"
    refused = compare_cell(mutating, namespace, filename=filename, line_offset=1)
    assert refused.failure is not None and refused.failure.kind == "graph"
    assert "graph mode cannot stage this cell" in refused.summary()
    assert namespace["params"]["w1"] is w1_before


@pytest.mark.kernel
def test_compare_cell_magic_in_a_real_kernel():
    from kernelclient import Kernel

    kernel = Kernel()
    try:
        kernel.ok(
            "import jax, jax.numpy as jnp\n"
            "b = jax.random.uniform(jax.random.key(0), (100,))\n"
            "params = {'w1': jnp.ones(3)}"
        )
        snapshot = (  # every user name: identity, and the value of arrays and dicts of them
            "{k: (id(v), jax.tree.map(lambda a: a.tolist(), v) if isinstance(v, (jax.Array, dict))"
            " else None) for k, v in globals().items() if not k.startswith('_') "
            "and k not in ('In', 'Out', 'exit', 'quit', 'get_ipython')}"
        )
        before = kernel.ok(snapshot).text
        out = kernel.execute(
            "%%compare\nc = (b + 1e7) - 1e7\nloss = jnp.tanh(c).sum()\n"
            "grads = {'w1': params['w1'] * loss}\nprint('eager loss', loss)"
        )
        assert out.status == "ok", out.error_text
        assert "eager loss" in out.stdout  # the eager run's prints are shown, once
        assert out.stdout.count("eager loss") == 1
        (shown,) = out.displays
        plain = shown["data"]["text/plain"]
        for label in ("c ", "loss", "grads['w1']", "compiled closer to float64"):
            assert label in plain, plain
        assert "<table" in shown["data"]["text/html"]
        assert kernel.ok(snapshot).text == before  # nothing written, nothing changed
        assert kernel.ok("'c' in globals(), 'loss' in globals(), 'grads' in globals()").text == (
            "(False, False, False)"
        )
        found = kernel.execute("%%compare --bisect\nc = (b + 1e7) - 1e7\nloss = jnp.tanh(c).sum()")
        assert found.status == "ok", found.error_text
        text = found.displays[-1]["data"]["text/plain"]
        count = found.reply["content"]["execution_count"]
        assert f"`sub` at In [{count}], line 2" in text, text
        assert "shardlab" not in text.split("line:")[1].split("\n")[0]
    finally:
        kernel.shutdown()


@pytest.mark.parametrize("line", ["out = x or y", "out = not x", "out = x == y == z"])
def test_a_cell_converted_without_control_flow_compares(line):
    """A cell converted only for ``and``/``or``/``not`` or a chained comparison (no
    ``if``/``while``/``for``, so no sites) still gets the converter's runtime when compared:
    it was ``NameError: name '__sl__' is not defined``."""
    namespace: dict = {"jax": jax, "jnp": jnp}
    namespace.update(x=jnp.array(0.0), y=jnp.array(2.0), z=jnp.array(2.0))
    report = compare_cell(line + "\n", namespace, filename="<compare-or-cell>")
    assert report.failure is None, report.summary()
    assert "__sl" not in report.summary()
    if line == "out = x or y":  # a float result is compared; booleans are not
        assert [leaf.label for leaf in report.leaves] == ["out"]
