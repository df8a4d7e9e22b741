"""The strategy editor: its model in-process, and the widget in a real kernel."""

from __future__ import annotations

import importlib
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import shardlab
from kernelclient import Kernel
from shardlab._core.equivalence import assert_same_program
from shardlab.parallel.cost import layouts as L
from shardlab.parallel.specs import ShardingSpecError
from shardlab.widgets.editor.model import EditorModel, diff
from shardlab.widgets.editor.widget import EditorView


def loss(params, x):
    for w1, w2 in params:
        x = jnp.tanh(x @ w1) @ w2
    return (x**2).mean()


@pytest.fixture(scope="module")
def model():
    mesh = shardlab.mesh(data=2, model=4)
    params = [(jnp.ones((64, 256)) * 0.01, jnp.ones((256, 64)) * 0.01) for _ in range(2)]
    return EditorModel(jax.grad(loss), (params, jnp.ones((30, 64))), mesh)


def test_edits_update_prediction_and_diff(model):
    first = model.set_all([P()] * 4 + [P("data")])
    assert first.cost.comm_bytes["all-reduce"] > 0  # data parallel: gradients all-reduced
    second = model.edit(0, 1, ("model",))
    assert second.generation == first.generation + 1
    changes = diff(first.cost, second.cost)
    assert any(c.startswith("all-reduce:") for c in changes)
    # the prediction is the cost model's, the same as shardlab.predict with those specs
    direct = shardlab.predict(
        model.fn, *model.args, mesh=model.mesh, in_shardings=model.in_shardings()
    )
    assert direct.comm_bytes == second.cost.comm_bytes


def test_hand_plan_has_the_editor_figures(model):
    """The strategy as a hand-specified plan: the editor's labels are the plan's paths and
    its predicted cost is the one the editor shows."""
    labels = ["params[0][0]", "params[0][1]", "params[1][0]", "params[1][1]", "x"]
    assert [leaf.label for leaf in model.leaves] == labels
    assert [leaf.path for leaf in model.leaves] == list(model.traced.paths)
    model.constraints = {}
    model.set_all([P(None, "model"), P("model", None)] * 2 + [P("data")])
    first = model.intermediates[0]
    shown = model.constrain(first.node, 0, ("data",))
    plan = model.plan()
    assert plan.method == "hand" and plan.input_paths == model.traced.paths
    assert plan.input_labels == tuple(labels)  # the editor's labels are the plan's
    assert plan.intermediate_specs() == {first.node: (P("data"),)}
    assert plan.cost.comm_bytes == shown.cost.comm_bytes
    assert plan.cost.time == shown.cost.time
    assert plan.cost.memory.peak == shown.cost.memory.peak
    model.constrain(first.node, 0, ())
    assert model.constraints == {}


def test_invalid_edit_keeps_last_valid_strategy(model):
    model.set_all([P(None, "model"), P(), P(), P(), P("data")])
    before, generation = list(model.specs), model.generation
    with pytest.raises(ShardingSpecError, match="mesh axis 'model' is used twice"):
        model.edit(0, 0, ("model",))
    with pytest.raises(ShardingSpecError, match="dimension 0 has size 30, not divisible by 4"):
        model.edit(4, 0, ("model",))
    assert model.specs == before and model.generation == generation


def test_background_compile_and_supersede(model):
    model.set_all([P()] * 4 + [P("data")])
    results: list = []
    stale = model.compile(results.append)
    model.edit(4, 0, ())  # a newer edit before the compile finished (or just after)
    fresh = model.compile(results.append)
    stale.join(60)
    fresh.join(60)
    by_generation = {r.generation: r for r in results}
    assert by_generation[model.generation].superseded is False
    report = by_generation[model.generation].report
    assert report is not None and report.total_comm_bytes == pytest.approx(0.0, abs=1)
    older = [r for g, r in by_generation.items() if g != model.generation]
    assert all(r.superseded for r in older)


def test_exported_code_runs_and_matches(model):
    specs = [P(None, "model"), P("model", None)] * 2 + [P("data")]
    model.set_all(specs)
    code = model.code()
    assert code == model.plan().to_code()  # the plan's code generator
    assert "mesh = shardlab.mesh(data=2, model=4)" in code
    assert "step = jax.jit(fn," in code  # jax.grad(loss) has no name: the placeholder
    assert "# fn: the function this plan was made for" in code
    assert max(len(line) for line in code.splitlines()) <= 100  # formatted, not one line
    namespace: dict = {"fn": model.fn}  # the exported code jits the user's ``fn``
    exec(code, namespace)
    shardings = namespace["in_shardings"]
    assert jax.tree.structure(shardings) == jax.tree.structure(model.in_shardings())
    got_specs = [L.from_spec(s.spec, 2) for s in jax.tree.leaves(shardings)]
    assert got_specs == [L.from_spec(s, 2) for s in specs]
    got = namespace["step"](*model.args)
    want = model.fn(*model.args)
    assert_same_program(got, want, fn=model.fn, args=model.args)


def test_editor_view_text_and_html(model):
    evaluation = model.set_all([P()] * 4 + [P("data")])
    view = EditorView(evaluation, changes=["x"], compiled=None, compiling=True, error="bad dim")
    html = view.html()
    assert "sl-edit-error" in html and "compiling in the background" in html
    assert "strategy #" in view.text() and "all-reduce" in view.text()


@pytest.mark.kernel
def test_editor_widget_in_a_kernel():
    kernel = Kernel()
    try:
        created = kernel.ok(
            "import jax, jax.numpy as jnp, shardlab, time\n"
            "from jax.sharding import PartitionSpec as P\n"
            "m = shardlab.mesh(data=2, model=4)\n"
            "def loss(params, x):\n"
            "    for w1, w2 in params:\n"
            "        x = jnp.tanh(x @ w1) @ w2\n"
            "    return (x**2).mean()\n"
            "params = [(jnp.ones((64, 256)), jnp.ones((256, 64))) for _ in range(2)]\n"
            "ed = shardlab.editor(jax.grad(loss), params, jnp.ones((32, 64)), mesh=m,\n"
            "                     in_shardings=([(P(), P())] * 2, P('data')))"
        )
        shown = kernel.ok("ed")
        ident = next(d["transient"]["display_id"] for d in shown.displays if d.get("transient"))
        all_dropdowns = [
            o
            for o in created.comm_opens
            if o["data"].get("state", {}).get("_model_name") == "DropdownModel"
        ]
        # the params tab: one row per layer group (params[*][0] and params[*][1], each ×2),
        # two dims each; the x tab, the per-layer rows and the intermediates are built when
        # first opened
        assert len(all_dropdowns) == 2 * 2
        dropdowns = all_dropdowns
        labels_html = [
            o["data"]["state"].get("value", "")
            for o in created.comm_opens
            if o["data"].get("state", {}).get("_model_name") == "HTMLModel"
        ]
        assert any("params[*][0]" in t for t in labels_html), labels_html
        first = dropdowns[1]  # params[*][0], dim 1 (256): both layers
        labels = first["data"]["state"]["_options_labels"]
        assert labels[:3] == ["—", "data", "model"]
        edit = kernel.send_comm(
            first["comm_id"], {"method": "update", "state": {"index": 2}, "buffer_paths": []}
        )
        assert not edit.errors
        update = next(u for u in edit.updates if u["transient"]["display_id"] == ident)
        assert "strategy #2" in update["data"]["text/plain"]
        assert "changed:" in update["data"]["text/plain"]
        assert "params[*][0]: P(None, 'model') ×2" in update["data"]["text/plain"]
        w2_dim0 = dropdowns[2]  # params[*][1] (w2, 256 × 64), dim 0
        bad = kernel.send_comm(
            w2_dim0["comm_id"],
            {"method": "update", "state": {"index": labels.index("model")}, "buffer_paths": []},
        )
        message = next(u for u in bad.updates if u["transient"]["display_id"] == ident)
        assert "invalid choice" not in message["data"]["text/plain"]  # model on dim 0: valid
        worse = kernel.send_comm(
            dropdowns[0]["comm_id"],
            {"method": "update", "state": {"index": labels.index("model")}, "buffer_paths": []},
        )
        text = next(u for u in worse.updates if u["transient"]["display_id"] == ident)
        assert "invalid choice (last valid strategy kept)" in text["data"]["text/plain"]
        assert "used twice" in text["data"]["text/plain"]
        waited = kernel.ok(
            "t0 = time.time()\n"
            "while ed.compiling and time.time() - t0 < 60:\n    time.sleep(0.05)\n"
            "ed.compiled is not None and ed.compiled.report is not None"
        )
        assert waited.text == "True"
        # Auto: the search runs in a background thread with a progress bar; its plan lands
        # in the dropdowns and the figures.
        clicked = kernel.send_comm(
            created.widget("Auto"), {"method": "custom", "content": {"event": "click"}}
        )
        assert not clicked.errors
        searched = kernel.ok(
            "t0 = time.time()\n"
            "while not ed.status.startswith('Auto: plan') and time.time() - t0 < 120:\n"
            "    time.sleep(0.1)\n"
            "print(ed.status, ed.progress.value, ed.error)"
        )
        assert "Auto: plan from method 'auto" in searched.stdout, searched.stdout
        assert " 1.0 None" in searched.stdout
        export = kernel.ok("ed.export()\nprint(ed.code)")
        assert "in_shardings = " in export.stdout
        assert kernel.ok("1 + 1").text == "2"
    finally:
        kernel.shutdown()


def test_stopping_auto_shows_stopped_early(monkeypatch):
    """Stop during Auto: the search returns its best plan so far (``complete=False``), the
    editor shows it and says it stopped early."""
    editor_module = importlib.import_module("shardlab.widgets.editor.widget")
    mesh = shardlab.mesh(data=2, model=4)
    params = [(jnp.ones((64, 256)), jnp.ones((256, 64))) for _ in range(2)]
    ed = shardlab.editor(jax.grad(loss), params, jnp.ones((32, 64)), mesh=mesh, compile=False)
    real = editor_module.search

    def search(*args, progress, **kwargs):
        def pressing_stop(fraction, message):
            if message.startswith("forest descent"):  # while the search is solving
                ed.stop_button.click()
            progress(fraction, message)

        # the recursive method reports progress while it solves (the ILP does not)
        return real(*args, **{**kwargs, "method": "recursive"}, progress=pressing_stop)

    monkeypatch.setattr(editor_module, "search", search)
    ed.auto().join(120)
    assert ed.error is None
    assert ed.status == "Auto: plan from method 'recursive' (stopped early: best plan so far)"
    assert not ed.auto_button.disabled and ed.stop_button.disabled
    ed.close()
    assert ed.auto_button.comm is None  # closed: the kernel no longer holds the editor


def test_constraints_on_intermediates_change_prediction_and_compile(model):
    model.constraints = {}
    model.set_all([P()] * 4 + [P("data")])
    assert model.intermediates and model.intermediates[0].label.startswith(
        "matmul at test_widgets_editor.py:"
    )
    first = model.intermediates[0]
    before = model.current
    after = model.constrain(first.node, 1, ("model",))  # x @ w1 columns over 'model'
    assert model.constraints == {first.node: P(None, "model")}
    assert after.cost.comm_bytes != before.cost.comm_bytes
    results: list = []
    model.compile(results.append).join(60)
    assert results[0].error is None and results[0].report is not None
    # the compiled program honours the constraint: it now communicates over 'model'
    assert any("model" in c.mesh_axes for c in results[0].report.collectives)
    code = model.code()
    assert "constrains 1 intermediate values" in code
    assert "test_widgets_editor.py:" in code and "(dot_general): P(None, 'model')" in code
    assert f"node {first.node}" not in code and "/tmp/" not in code  # no internal names
    with pytest.raises(ShardingSpecError):
        model.constrain(first.node, 0, ("model",))  # 'model' already on dim 1
    assert model.constraints == {first.node: P(None, "model")}
    model.constrain(first.node, 1, ())  # back to unconstrained
    assert model.constraints == {}


def test_editor_applies_a_plan_for_a_scanned_model():
    """Scans are unrolled as the search does: a plan's constraints land on the same nodes,
    the scan body is listed once, and the applied plan compiles to its collectives."""
    mesh = shardlab.mesh(data=2, model=4)

    def scanned(ws, x):
        def body(h, w):
            return jnp.tanh(h @ w), None

        h, _ = jax.lax.scan(body, x, ws)
        return (h**2).mean()

    # A batch large enough that splitting it pays for the all-reduce each scan iteration
    # launches (with 32 rows the optimum is to communicate nothing).
    args = (jnp.ones((3, 64, 64)) * 0.02, jnp.ones((2048, 64)))
    plan = shardlab.search(jax.grad(scanned), *args, mesh=mesh, method="ilp")
    ed = shardlab.editor(jax.grad(scanned), *args, mesh=mesh, compile=False)
    body_dots = [i for i in ed.model.intermediates if "scan body" in i.label]
    assert body_dots and len(body_dots) < 3 * 3  # one iteration's matmuls, not every one
    ed.apply(plan)
    assert ed.error is None
    assert ed.model.specs == [s.spec for s in jax.tree_util.tree_leaves(plan.in_shardings)]
    assert ed.model.current is not None
    predicted = ed.model.current.cost
    # the editor propagates the plan's layouts itself: the same bytes, perhaps other kinds
    total = sum(predicted.comm_bytes.values())
    assert total == pytest.approx(sum(plan.cost.comm_bytes.values()), rel=0.35)
    results: list = []
    ed.model.compile(results.append).join(60)
    assert results[0].error is None, results[0].error
    # the editor leaves output layouts to XLA (the plan pins them): no more kinds than the plan
    compiled = {c.kind for c in results[0].report.collectives}
    assert compiled and compiled <= {c.kind for c in plan.verify().collectives}


def test_background_compile_shows_an_indeterminate_bar_after_a_second(monkeypatch):
    """A compile that runs past the progress delay (about a second) shows an indeterminate
    bar with "compiling in the background… n s" in the editor; the compiled figures replace
    it. A newer edit keeps the one bar; a quick compile never shows it."""
    import threading
    import time

    mesh = shardlab.mesh(data=2, model=4)
    params = [(jnp.ones((64, 256)), jnp.ones((256, 64))) for _ in range(2)]
    ed = shardlab.editor(jax.grad(loss), params, jnp.ones((32, 64)), mesh=mesh)
    views: list[tuple[str, str]] = []
    monkeypatch.setattr(ed, "_refresh", lambda: views.append((ed.view().text(), ed.view().html())))
    real = ed.model.compile
    delay = {"s": 1.8}

    def slow(on_done):
        def job():
            time.sleep(delay["s"])
            real(on_done).join(60)

        thread = threading.Thread(target=job, daemon=True)
        thread.start()
        return thread

    monkeypatch.setattr(ed.model, "compile", slow)
    ed.edit(0, 1, "model")
    assert ed.compiling and "sl-progress-indeterminate" not in views[-1][1]  # not yet
    assert views[-1][0].count("compiling in the background…") == 1
    bar = ed._compile_bar
    assert bar is not None
    time.sleep(0.3)
    ed.edit(0, 1, ())  # supersedes the first compile; the bar keeps running
    assert ed._compile_bar is bar
    t0 = time.time()
    while ed.compiling and time.time() - t0 < 60:
        time.sleep(0.05)
    assert not ed.compiling and ed._compile_bar is None and ed.compile_shown_s is None
    shown = [(text, html) for text, html in views if "sl-progress-indeterminate" in html]
    assert shown, views
    assert "role='progressbar'" in shown[0][1]
    assert any(re.search(r"compiling in the background… [1-9]\d* s", t) for t, _ in shown)
    assert ed.compiled is not None and ed.compiled.report is not None
    done_text, done_html = views[-1]
    assert "sl-progress-indeterminate" not in done_html and "compiled in " in done_text
    # A quick compile: no bar at all.
    delay["s"] = 0.0
    views.clear()
    ed.edit(0, 1, "model")
    t0 = time.time()
    while ed.compiling and time.time() - t0 < 60:
        time.sleep(0.05)
    if ed.compiled is not None and ed.compiled.seconds < 0.5:
        assert not any("sl-progress-indeterminate" in html for _, html in views)
    ed.close()
