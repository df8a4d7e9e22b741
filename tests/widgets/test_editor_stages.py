"""The strategy editor's pipeline and remat controls on a scanned-layer train step: only
valid counts are offered, a change through the dropdowns changes the plan (its stages,
microbatches and remat), the figures and the schedule follow, the edited plan runs to the
plain step's numbers, and invalid combinations give a message naming a valid alternative."""

from __future__ import annotations

import inspect
import re

import jax
import jax.numpy as jnp
import pytest

import shardlab
from shardlab._core.equivalence import assert_same_program
from shardlab.examples import transformer
from shardlab.examples.transformer import gpt_scan
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.records import PipelineSpec, RematSpec

pytestmark = pytest.mark.timeout(300)


def _scan_line() -> int:
    """The line of ``gpt_scan``'s ``jax.lax.scan`` in the example's source."""
    lines, first = inspect.getsourcelines(transformer.gpt_scan)
    return first + next(i for i, line in enumerate(lines) if "jax.lax.scan(" in line)


@pytest.fixture(scope="module")
def case():
    # 8 sequences of 16 tokens, width 64: the layers' residuals are most of the memory
    return gpt_scan(4, batch=8, seq=16, d=64, heads=4, vocab=64)


@pytest.fixture(scope="module")
def plain(case):
    return jax.jit(case.fn)(*case.args)


@pytest.fixture()
def editor(case):
    ed = shardlab.editor(case.fn, *case.args, mesh=make_mesh(stage=4, data=2), compile=False)
    yield ed
    ed.close()


def _equal(got, want, fn, *args):
    """The edited plan computes the plain step (``_core/equivalence.py``)."""
    assert_same_program(got, want, fn=fn, args=args)


def test_only_valid_counts_and_the_users_scan_line(editor):
    controls = editor.stage_controls
    assert controls.useful and not controls.stages.disabled
    assert controls.stages.options == (("off", 0), ("4 stages", 4))  # the stage axis' size
    assert [v for _, v in controls.microbatches.options] == [1, 2, 4, 8]  # divide the batch
    assert controls.microbatches.disabled and controls.schedule.disabled  # pipeline off
    (group,) = editor.model.layer_groups
    assert group.label == (
        f"lax.scan at shardlab/examples/transformer.py:{_scan_line()} (4 layers)"
    )
    assert list(controls.remat) == [group.scan]
    assert [v for _, v in controls.remat[group.scan].options] == ["none", "dots", "nothing"]


def test_stages_that_do_not_fit_are_not_offered(case):
    # 8 stages for 4 layers: the dropdown is off-only and says what would fit
    ed = shardlab.editor(case.fn, *case.args, mesh=make_mesh(stage=8), compile=False)
    try:
        assert ed.stage_controls.stages.disabled
        assert ed.model.choices.stages == ()
        assert (
            "8 stages do not divide the 4 layers; make the axis one of [2, 4]"
            in ed.model.choices.reason
        )
        ed.set_pipeline(8)
        assert "stages=8" in ed.error and "use 0 (no pipeline)" in ed.error
        assert ed.model.pipeline is None
    finally:
        ed.close()
    flat = shardlab.editor(case.fn, *case.args, mesh=make_mesh(data=8), compile=False)
    try:
        assert "no 'stage' axis" in flat.model.choices.reason
        assert "shardlab.mesh(stage=2, data=4)" in flat.model.choices.reason
    finally:
        flat.close()


def test_dropdowns_change_the_plan_figures_and_it_runs_as_the_plain_step(editor, case, plain):
    controls, model = editor.stage_controls, editor.model
    (group,) = model.layer_groups
    plain_memory = model.current.cost.memory.peak
    controls.remat[group.scan].value = "dots"  # what a user's choice in the browser does
    assert editor.error is None
    dots = model.current.cost.memory.peak
    controls.remat[group.scan].value = "nothing"
    nothing = model.current.cost.memory.peak
    assert nothing < dots < plain_memory  # remat keeps less for the backward scan
    assert model.plan().remat == RematSpec("nothing")
    assert "remat 'nothing': lax.scan at" in editor.view().text()
    assert "changed: remat: dots → nothing" in editor.view().text()
    _equal(model.plan().jit()(*case.args), plain, case.fn, *case.args)

    controls.stages.value = 4  # stages on: the smallest microbatch count filling them
    assert editor.error is None
    assert not controls.microbatches.disabled and controls.microbatches.value == 4
    controls.microbatches.value = 2
    controls.schedule.value = "1f1b"
    plan = model.plan()
    assert plan.pipeline == PipelineSpec(4, 2, schedule="1f1b")
    assert plan.remat == RematSpec("nothing")
    schedule = model.current.pipeline
    assert schedule is not None and (schedule.spec.stages, schedule.spec.microbatches) == (4, 2)
    assert model.current.cost == plan.cost  # the figures are the staged plan's prediction
    # the live view: the schedule, one lane per stage, every microbatch's F and B on each
    html = editor.view().html()
    assert [int(s) for s in re.findall(r">stage (\d)</text>", html)] == [0, 1, 2, 3]
    for stage in range(4):
        for mb in range(2):
            assert f"stage {stage}: forward of microbatch {mb}," in html
            assert f"stage {stage}: backward of microbatch {mb}," in html
    assert "bubble: " in html and "GPipe/MaxText definition" in html
    text = editor.view().text()
    assert "pipeline: 4 stages × 2 microbatches (1f1b)" in text
    assert "changed: pipeline: 4 stages × 2 microbatches (gpipe) → 4 stages × 2 " in text
    # the strategy lists the layers split over the stages, as the staged plan has them
    assert re.search(r"params\[\"blocks\"\]\[\"w1\"\]: P\('stage'", text), text
    _equal(plan.jit()(*case.args), plain, case.fn, *case.args)

    controls.stages.value = 0  # off again: the plan is unpipelined, remat kept
    assert model.plan().pipeline is None and model.plan().remat == RematSpec("nothing")
    assert controls.microbatches.disabled


def test_invalid_choices_name_a_valid_alternative(editor):
    model = editor.model
    editor.set_pipeline(4, 4)
    kept = model.current
    editor.set_pipeline(2)
    assert "stages=2" in editor.error and "use stages=4, or 0 (no pipeline)" in editor.error
    editor.set_pipeline(4, 3)
    assert "microbatches=3 does not divide the batch of 8: use one of [1, 2, 4, 8]" in (
        editor.error
    )
    editor.set_remat("sometimes")
    assert "remat policy 'sometimes': use one of ['none', 'dots', 'nothing']" in editor.error
    assert model.current is kept and model.pipeline == PipelineSpec(4, 4)
    # the controls show the strategy that was kept
    assert (editor.stage_controls.stages.value, editor.stage_controls.microbatches.value) == (4, 4)
    assert "invalid choice (last valid strategy kept)" in editor.view().text()
    editor.reset()
    assert model.pipeline is None and model.plan().remat is None and editor.error is None


def two_scans(params, x):
    """Two layer scans of their own (an encoder and a decoder), on two lines."""
    h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, params["encoder"])
    h, _ = jax.lax.scan(lambda h, w: (jnp.sin(h @ w), None), h, params["decoder"])
    return (h**2).mean()


def test_one_dropdown_per_layer_scan_and_one_policy_per_plan():
    params = {"encoder": jnp.ones((2, 32, 32)) * 0.05, "decoder": jnp.ones((4, 32, 32)) * 0.05}
    args = (params, jnp.ones((16, 32)))
    step = jax.grad(two_scans)
    ed = shardlab.editor(step, *args, mesh=make_mesh(data=8), compile=False)
    try:
        groups = ed.model.layer_groups
        lines, first = inspect.getsourcelines(two_scans)
        scan_lines = [first + i for i, line in enumerate(lines) if "jax.lax.scan(" in line]
        assert [g.layers for g in groups] == [2, 4]
        assert [g.label.rsplit(":", 1)[1] for g in groups] == [
            f"{n} ({k} layers)" for n, k in zip(scan_lines, (2, 4), strict=True)
        ]
        assert len(ed.stage_controls.remat) == 2
        ed.set_remat("dots", f":{scan_lines[1]} ")  # the decoder alone, by its line
        assert ed.error is None
        assert ed.model.plan().remat == RematSpec("dots", (groups[1].scan,))
        ed.stage_controls.remat[groups[0].scan].value = "nothing"
        assert "one remat policy per plan" in ed.error and "'dots'" in ed.error
        assert ed.stage_controls.remat[groups[0].scan].value == "none"  # put back
        ed.set_remat("nothing")  # every group
        assert ed.model.plan().remat == RematSpec("nothing")
        got = ed.model.plan().jit()(*args)
        _equal(got, jax.jit(step)(*args), step, *args)
    finally:
        ed.close()


def test_applying_a_pipelined_plan_shows_its_stages_and_remat(editor, case):
    plan = shardlab.strategies.pipeline_data(
        case.fn, *case.args, mesh=editor.model.mesh, microbatches=2, remat="dots"
    )
    editor.apply(plan, refresh=False)
    controls = editor.stage_controls
    assert (controls.stages.value, controls.microbatches.value) == (4, 2)
    assert [d.value for d in controls.remat.values()] == ["dots"]
    assert editor.model.plan() is plan and editor.model.current.cost == plan.cost
    assert editor.model.current.pipeline.spec == plan.pipeline  # its schedule is drawn
    assert "sl-stage-forward" in editor.view().html()
    controls.microbatches.value = 8  # an edit from there: a hand plan with those stages
    assert editor.model.plan().pipeline == PipelineSpec(4, 8)
    assert editor.model.plan().remat == RematSpec("dots")
