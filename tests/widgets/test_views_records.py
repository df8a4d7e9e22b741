"""Records read at a glance: Plan/Report/CostBreakdown reprs and HTML, plan.table(),
plan.to_code() that runs, labels as written, source lines, the editor's applied plan, the
editor's compiler messages, progress of long calls, layout aspect."""

from __future__ import annotations

import os
import re
import sys
import types

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import shardlab
from shardlab._core.equivalence import assert_same_program
from shardlab.parallel import display
from shardlab.parallel.labels import group_label, layer_of, path_label, source_label
from shardlab.widgets._base.capture import captured_stderr
from shardlab.widgets._base.html import source_label as collective_source


def stacked(params, x):
    for layer in params["blocks"]:
        x = jnp.tanh(x @ layer["w1"]) @ layer["w2"]
    return (x**2).mean()


train = jax.grad(stacked)  # a global: to_code() calls it by this name


def _args(layers: int = 4):
    blocks = [
        {"w1": jnp.ones((64, 128)) * 0.01, "w2": jnp.ones((128, 64)) * 0.01} for _ in range(layers)
    ]
    return {"blocks": blocks}, jnp.ones((256, 64))


@pytest.fixture(scope="module")
def mesh():
    return shardlab.mesh(data=2, model=4)


@pytest.fixture(scope="module")
def plan(mesh):
    return shardlab.search(train, *_args(), mesh=mesh, method="ilp")


def test_path_labels_as_written():
    assert path_label("params/blocks/3/w1") == 'params["blocks"][3]["w1"]'
    assert path_label("batch/0") == "batch[0]"
    assert path_label("x") == "x"
    assert path_label("1/w") == 'args[1]["w"]'  # a positional argument of unknown name
    assert layer_of("params/blocks/3/w1") == ("params/blocks", "3", "w1")
    assert group_label("params/blocks/3/w1") == 'params["blocks"][*]["w1"]'
    assert group_label("batch/0") == "batch[0]"  # a last index is no layer


def test_plan_repr_html_and_table(plan):
    text = repr(plan)
    assert len(text) < 400 and "\n" not in text, text
    assert text.startswith("Plan(ilp on data=2 × model=4: predicted ")
    assert "per device" in text and "optimal" in text
    html = plan._repr_html_()
    summary, _, rest = html.partition("<details")
    for row in ("method", "mesh", "predicted step", "communication", "memory per device"):
        assert f">{row}</th>" in summary, row
    assert "optimality" in summary and "ILP" in summary
    # the inputs table groups the layers: one row for the four w1 when they agree
    assert "inputs by layer" in rest
    assert re.search(r"params\[&quot;blocks&quot;\]\[\*\]\[&quot;w1&quot;\]", rest) or (
        "params[&quot;blocks&quot;][3][&quot;w1&quot;]" in rest
    )
    table = plan.table(limit=5)
    printed = str(table)
    lines = printed.splitlines()
    header, rule = lines[1], lines[2]
    assert header.startswith("op") and set(rule) <= {"-", " "}
    starts = [m.start() for m in re.finditer(r"-+", rule)]
    assert all(header[s - 1] == " " for s in starts[1:])  # columns aligned under the rule
    assert "dot_general" in table and "\\n" not in printed
    assert "<table>" in table._repr_html_() and "more rows" in printed
    assert repr(table) == printed  # a terminal shows the aligned text, not a quoted string


def test_report_and_cost_reprs(plan):
    cost = repr(plan.cost)
    assert cost.startswith("CostBreakdown(predicted ") and len(cost) < 400
    assert "KiB" in cost or "MiB" in cost
    assert "Report" not in cost and "collectives=(" not in cost
    html = plan.cost._repr_html_()
    assert "predicted step" in html and "communication per mesh axis" in html
    report = plan.verify()
    text = repr(report)
    assert text.startswith("Report(compiled on data=2 × model=4: ") and len(text) < 400
    assert "collectives by source line" in report._repr_html_()


def test_to_code_runs_and_reproduces_the_plan(plan, mesh):
    code = plan.to_code()
    assert "step = jax.jit(train," in code  # the user's name, no placeholder
    assert "node " not in code and "/tmp/" not in code and "ipykernel" not in code
    assert max(map(len, code.splitlines())) <= 100
    namespace = {"train": train}
    exec(compile(code, "<exported>", "exec"), namespace)
    want_in = [s.spec for s in jax.tree.leaves(plan.in_shardings)]
    got_in = [s.spec for s in jax.tree.leaves(namespace["in_shardings"])]
    assert got_in == want_in
    want_out = [s.spec for s in jax.tree.leaves(plan.out_shardings)]
    assert [s.spec for s in jax.tree.leaves(namespace["out_shardings"])] == want_out
    assert jax.tree.structure(namespace["in_shardings"]) == jax.tree.structure(plan.in_shardings)
    args = plan.shard(*_args())
    got = namespace["step"](*args)
    assert_same_program(got, train(*_args()), fn=train, args=_args())
    # a function with no global name gets the clearly named placeholder
    anonymous = shardlab.search(jax.grad(stacked), *_args(1), mesh=mesh, method="recursive")
    assert "# fn: the function this plan was made for" in anonymous.to_code()
    assert "step = jax.jit(fn," in anonymous.to_code()


def test_editor_apply_shows_the_plan_own_figures(plan, mesh):
    ed = shardlab.editor(train, *_args(), mesh=mesh, compile=False)
    labels = [leaf.label for leaf in ed.model.leaves]
    assert labels == list(plan.input_labels)  # the editor's labels are the plan's
    assert ed.rows[0].members == [0, 2, 4, 6]  # blocks[*]["w1"] ×4 is one row
    ed.apply(plan)
    current = ed.model.current
    assert current is not None and current.cost == plan.cost  # exactly the plan's cost
    view = ed.view()
    assert f"predicted step {display.human_time(plan.cost.time)}" in view.text()
    results: list = []
    ed.model.compile(results.append).join(120)
    assert results[0].error is None, results[0].error
    verified = plan.verify()
    assert results[0].report.total_comm_bytes == verified.total_comm_bytes
    assert results[0].report.memory == verified.memory
    assert ed.model.plan() is plan  # export writes the plan's own code
    # an edit afterwards makes it a hand strategy again
    ed.edit_group('params["blocks"][*]["w1"]', 1, "model")
    assert ed.model.applied is None
    assert all(ed.model.specs[i] == P(None, "model") for i in (0, 2, 4, 6))
    ed.close()


def test_group_row_changes_every_layer_and_expands(mesh):
    ed = shardlab.editor(train, *_args(), mesh=mesh, compile=False)
    row = ed.rows[0]
    row.dropdowns[1].value = ("model",)  # what a user's choice in the browser does
    assert [ed.model.specs[i] for i in row.members] == [P(None, "model")] * 4
    assert "×4" in ed.view().text()
    ed.expand(row, True)  # per layer: rows built on demand, showing the current specs
    assert len(row.children) == 4 and row.children[0].dropdowns[1].value == ("model",)
    row.children[2].dropdowns[1].value = ()  # override one layer
    assert all(e is None for e in ed.model.specs[row.members[2]])
    assert row.dropdowns[1].value == "(mixed)"
    ed.close()


def test_source_labels(monkeypatch):
    shell = types.SimpleNamespace(
        compile=types.SimpleNamespace(_filename_map={"/tmp/ipykernel_1/123.py": 8})
    )
    fake = types.SimpleNamespace(get_ipython=lambda: shell)
    monkeypatch.setitem(sys.modules, "IPython", fake)
    assert source_label("/tmp/ipykernel_1/123.py:2") == "In [8], line 2"
    assert source_label("/tmp/ipykernel_9/456.py:3") == "a notebook cell, line 3"
    own = os.path.join(os.path.dirname(shardlab.__file__), "parallel", "graph", "interpret.py")
    assert collective_source(own + ":120") == "(compiler-inserted)"  # never shardlab's own
    assert collective_source("") == "(compiler-inserted)"
    example = os.path.join(os.path.dirname(shardlab.__file__), "examples", "transformer.py")
    assert source_label(example + ":44").endswith("shardlab/examples/transformer.py:44")


def test_compiler_messages_are_captured():
    with captured_stderr() as captured:
        os.write(2, b"W external/xla: Involuntary full rematerialization\n")
    assert "Involuntary full rematerialization" in captured.text


def test_search_and_verify_show_progress(monkeypatch, mesh):
    calls: list = []

    class Bar:
        def __init__(self, what):
            self.what = what

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            calls.append((self.what, "exit"))

        def __call__(self, fraction, message):
            calls.append((self.what, fraction, message))

        def done(self, message):
            calls.append((self.what, "done", message))

    monkeypatch.setattr(display, "PROGRESS_FACTORY", [Bar])
    plan = shardlab.search(train, *_args(1), mesh=mesh, method="recursive")
    assert ("search", 0.0, "tracing") in calls
    assert ("search", "done", f"done: {plan.method}") in calls
    plan.verify()
    assert any(c[0] == "verify" and c[1] == "done" for c in calls)
    with display.progress_bar("outer"):  # long work inside long work: the outer bar only
        assert isinstance(display.progress_bar("verify"), display._NoBar)
    assert not isinstance(display.progress_bar("verify"), display._NoBar)

    class Interrupting(Bar):
        def __call__(self, fraction, message):
            super().__call__(fraction, message)
            if message.startswith("forest descent") and not getattr(self, "pressed", False):
                self.pressed = True
                raise KeyboardInterrupt  # what pressing interrupt does mid-search

    calls.clear()
    monkeypatch.setattr(display, "PROGRESS_FACTORY", [Interrupting])
    partial = shardlab.search(train, *_args(), mesh=mesh, method="recursive")
    assert partial.complete is False  # the best plan so far, marked as such
    assert any(c[1] == "done" and "best plan found so far" in c[2] for c in calls)


def test_ticking_bar_appears_while_the_caller_is_blocked(monkeypatch):
    import io
    import time

    from shardlab.widgets._base import long_work
    from shardlab.widgets._base import progress as progress_bar

    stream = io.StringIO()
    monkeypatch.setattr(progress_bar, "_in_notebook", lambda: False)
    bar = long_work.TickingBar("verify")
    bar.bar = progress_bar.ProgressBar("verify", delay=0.2, stream=stream)
    with bar:
        bar(0.1, "compiling")
        time.sleep(0.8)  # blocked, as in XLA's compile: the ticker draws the bar
        bar.done("compiled")
    assert "verify [" in stream.getvalue() and "compiled" in stream.getvalue()


def test_layout_keeps_the_aspect_ratio():
    mesh8 = shardlab.mesh(data=8)

    def size(shape, spec):
        html = shardlab.show(shape, spec, mesh=mesh8).html()
        w, h = re.search(r"class='sl-array' width='(\d+)' height='(\d+)'", html).groups()
        return int(w) - 60, int(h) - 18

    w, h = size((64, 512), P("data"))
    assert w > 2 * h  # a batch of 64 rows of 512 is wide and short
    w, h = size((512, 512), P())
    assert abs(w - h) <= 2  # a square weight is square
    one = shardlab.mesh(data=1, devices=jax.devices()[:1])
    view = shardlab.show((64, 512), P(), mesh=one)
    assert "1 device" in view.html() and "1 devices" not in view.html()
