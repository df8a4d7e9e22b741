"""shardlab.bisect: the first equation whose compiled value leaves eager's (issue 11)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardlab
from shardlab.engine.compare import evaluate as jaxpr_eval
from shardlab.engine.compare.bisect import compile_bound

PLANTED_LINE = "    x = (x + 1e7) - 1e7  # the planted culprit"


def long_chain(x):
    for _ in range(12):
        x = jnp.sin(x) * 1.01 + 0.1
    x = (x + 1e7) - 1e7  # the planted culprit
    for _ in range(12):
        x = jnp.cos(x) * 0.99
    return x.sum()


@pytest.fixture(scope="module")
def b():
    return jax.random.uniform(jax.random.key(0), (100,))


def _planted_index(fn, *args) -> tuple[int, int]:
    """The index of the planted ``sub`` in the flat jaxpr, and the equation count."""
    flat = jaxpr_eval.flatten(jax.make_jaxpr(fn)(*args))
    subs = [
        i
        for i, e in enumerate(flat.jaxpr.eqns)
        if e.primitive.name == "sub" and "10000000.0" in str(e)
    ]
    assert len(subs) == 1
    return subs[0], len(flat.jaxpr.eqns)


def test_finds_the_planted_culprit_in_log_compiles(b):
    index, count = _planted_index(long_chain, b)
    report = shardlab.bisect(long_chain, b)
    assert report.found and report.index == index and report.equations == count
    assert report.primitive == "sub"
    assert report.compiles <= math.ceil(math.log2(count)) + 2 == compile_bound(count)
    line = PLANTED_LINE.strip()
    assert report.line == line
    with open(__file__) as source:
        number = 1 + source.read().splitlines()[:1000].index(PLANTED_LINE.rstrip())
    assert report.source.endswith(f"test_bisect.py:{number}")
    assert "shardlab" not in report.source
    assert report.input_shapes == ("float32[100]", "float32[scalar]")
    assert report.cause == "rewrite"  # alone it agrees; only fused with the add it differs
    assert report.replay_f32 == 0.0 and report.inputs_max_abs == 0.0
    assert report.difference is not None and report.difference.max_abs > 0.1
    # the steps bisected the cone: every '=' is before the answer, every '≠' at or after
    assert all((s.index < index) != s.diverged for s in report.steps)
    assert f"#{index}" in report.text() and "rewrite" in report.text()


@pytest.mark.parametrize("position", [0, 5, 17, 30])
def test_the_culprit_is_found_wherever_it_is_planted(b, position):
    def planted(x):
        for i in range(32):
            if i == position:
                x = (x + 1e7) - 1e7
            x = (
                x + 0.37 + 0.01 * jnp.sin(3 * x)
            )  # keeps a difference, neither squashed nor exploded
        return x

    index, count = _planted_index(planted, b)
    report = shardlab.bisect(planted, b)
    assert report.index == index, report.text()
    assert report.compiles <= compile_bound(count), report.text()


def bf16_loss(w, x):
    h = (x.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16)).astype(jnp.float32)
    return jnp.mean(h**2)


def test_bf16_excess_precision_is_located_at_the_convert():
    w = jax.random.normal(jax.random.key(2), (64, 64))
    x = jax.random.normal(jax.random.key(3), (32, 64))
    report = shardlab.bisect(bf16_loss, w, x)
    assert report.primitive == "convert_element_type"
    assert report.input_shapes == ("bfloat16[32×64]",)
    assert report.eager_vs_f64 is not None and report.compiled_vs_f64 is not None
    assert report.compiled_vs_f64 < report.eager_vs_f64  # compiled kept float32


def test_no_divergence_says_so_with_one_compile():
    def agree(x, key):
        return {"y": x * 2 + jax.random.normal(key, x.shape), "s": jnp.sum(x)}

    report = shardlab.bisect(agree, jnp.arange(8.0), jax.random.key(1))
    assert not report.found and report.compiles == 1 and report.failure is None
    assert "no equation diverges" in report.text()
    assert not report.python_differs


def test_python_that_runs_at_trace_time_is_named():
    def noisy(x):
        return x * 2 + np.random.default_rng().normal()

    report = shardlab.bisect(noisy, jnp.ones(4))
    assert not report.found and report.python_differs
    assert "trace time" in report.text()


def test_a_function_that_does_not_trace_gets_the_error_explained():
    def scalar(x):
        return x * float(x.sum())

    report = shardlab.bisect(scalar, jnp.ones(3))
    assert report.failure is not None and not report.found and report.compiles == 0
    assert report.failure.kind == "scalar"
    assert report.failure.line == "return x * float(x.sum())"
    assert "keep it an array" in report.failure.fix
    assert "does not trace" in report.text()


def test_html_view_names_the_equation(b):
    html = shardlab.bisect(long_chain, b)._repr_html_()
    assert html is not None and "(x + 1e7) - 1e7" in html and "rewrite" in html


def test_the_reference_keeps_random_draws_and_runs_in_float64():
    def sample(key):
        return jax.random.normal(key, (4,)) * 3.0

    key = jax.random.key(5)
    closed = jax.make_jaxpr(sample)(key)
    with jaxpr_eval.float64():
        (wide,) = jaxpr_eval.evaluate(closed.jaxpr, closed.consts, [key], wide=True).outputs
        assert wide.dtype == jnp.float64
        x64_draw = jax.random.normal(key, (4,))  # what re-running the Python under x64 gets
    assert np.allclose(np.asarray(wide), np.asarray(sample(key)), rtol=1e-6)
    assert not np.allclose(np.asarray(x64_draw) * 3, np.asarray(sample(key)), rtol=1e-3)
    assert not jax.config.jax_enable_x64
