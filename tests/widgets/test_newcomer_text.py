"""Text a newcomer reads (issue 36 items 7, 8, 10): specs as written (``P('data')``, not
``P('data',)``), JAX's type notation beside them, counts that agree with their nouns, FLOPs in
human units, and no ratio against a zero."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardlab
from shardlab.parallel.cost.schedule import Timeline
from shardlab.parallel.display import human_flops, plural, ratio_text, report_text
from shardlab.parallel.labels import spec_label, typed_shape
from shardlab.widgets.layout import show
from shardlab.widgets.timeline.bokeh import difference_note
from shardlab.widgets.timeline.svg import TimelineView


@pytest.fixture(scope="module")
def mesh():
    return shardlab.mesh(data=2, model=4)


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        (P("data"), "P('data')"),
        (P(("data", "model")), "P(('data', 'model'))"),
        (P("data", None), "P('data', None)"),
        (P(), "P()"),
        (P(None, "model"), "P(None, 'model')"),
        ((("data",), ()), "P('data', None)"),  # per-dimension axes
        ((("data", "model"),), "P(('data', 'model'))"),
        ("P('data',)", "P('data')"),  # JAX's text of a one-entry spec
        ("P(('data', 'model'),)", "P(('data', 'model'))"),
    ],
)
def test_specs_print_as_users_write_them(spec, text):
    assert spec_label(spec) == text
    if isinstance(spec, P):
        assert eval(text, {"P": P}) == spec  # the text is the same spec


def test_type_notation_is_jax_own():
    assert typed_shape("float32", (8, 256), (("data",), ())) == "float32[8@data,256]"
    assert typed_shape("float32", (8, 256), (("data", "model"),)) == "float32[8@(data,model),256]"
    assert typed_shape(jnp.dtype("bfloat16"), (4,), ()) == "bfloat16[4]"
    mesh = jax.make_mesh((2, 4), ("data", "model"))  # Explicit axes: JAX prints the same
    with jax.set_mesh(mesh):
        x = jax.device_put(jnp.ones((8, 256)), P(("data", "model")))
        assert str(jax.typeof(x)) == typed_shape("float32", (8, 256), (("data", "model"),))


def test_layout_view_shows_type_and_spec(mesh):
    view = show((8, 256), P("data"), mesh=mesh, name="x")
    first = view.text().splitlines()[0]
    assert first.startswith("x: float32[8@data,256] P('data') on mesh"), first
    assert "P('data',)" not in view.html() and "float32[8@data,256]" in view.html()


def test_counts_agree_with_their_nouns():
    assert plural(1, "collective") == "1 collective"
    assert plural(0, "collective") == "0 collectives"
    assert plural(2, "output") == "2 outputs"
    assert plural(2, "entry", "entries") == "2 entries"


def test_flops_in_human_units():
    assert human_flops(8.86e4) == "88.6 kFLOP"
    assert human_flops(1.234e9) == "1.23 GFLOP"
    assert human_flops(512) == "512 FLOP"


def test_report_text_of_one_collective(mesh):
    def f(x):
        return x.sum()

    x = jax.device_put(jnp.ones((64,)), NamedSharding(mesh, P("data")))
    report = shardlab.analyze(f, x, mesh=mesh, in_shardings=(P("data"),))
    text = report_text(report)
    assert len(report.collectives) == 1  # the sum's all-reduce over data
    assert ": 1 collective, " in text  # was: 1 collectives
    assert f"; {human_flops(report.flops)} per device)" in text and "GFLOP" not in text


def test_ratios_against_zero_do_not_print():
    assert ratio_text(10.67e-3, 1.7e-12) == ""  # a rounding residue
    assert ratio_text(10.67e-3, 0.0) == ""
    assert ratio_text(1.0, float("nan")) == ""
    assert ratio_text(10.67e-3, 2e-8, resolution=5e-8) == ""  # prints as 0.0 µs
    assert ratio_text(3.0, 2.0) == "1.5×"
    assert ratio_text(5000.0, 2.0) == "2,500×"
    model = Timeline(
        (), total=10e-6, compute=10e-6 - 1.7e-21, communication=0.0, exposed=0.0, devices=8
    )
    measured = Timeline(
        (), total=10.67e-3, compute=1e-3, communication=0.0, exposed=0.0, devices=8, measured=True
    )
    text = TimelineView([model, measured]).text()
    idle = next(line for line in text.splitlines() if line.strip().startswith("idle"))
    assert "×" not in idle, idle  # was: idle 0.0 µs → 9.67 ms (…e+15×)
    compute = next(line for line in text.splitlines() if line.strip().startswith("compute"))
    assert "(100.0×)" in compute or "(100×)" in compute, compute
    zero = Timeline((), total=0.0, compute=0.0, communication=0.0, exposed=0.0, devices=8)
    assert "inf" not in difference_note(zero, measured)


def test_compare_summary_reads_as_a_sentence():
    counter = itertools.count()

    def shifted(x):  # a Python counter: eager and the trace see different numbers
        return x + next(counter)

    def pair(x):
        return x * 2, x + next(counter)

    x = jnp.ones((4,))
    assert shardlab.compare(shifted, x).summary() == "compare shifted: FAIL: the output differs"
    assert shardlab.compare(pair, x).summary() == "compare pair: FAIL on [1] of 2 outputs"
    agree = shardlab.compare(lambda x: x * 2, x).summary()
    assert agree.endswith("eager and compiled agree on the output"), agree
    assert "(s)" not in agree
