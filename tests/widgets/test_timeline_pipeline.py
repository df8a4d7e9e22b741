"""``shardlab.timeline`` of a pipelined plan: one lane per stage with the forward and backward
of every microbatch (the pipeline simulator's schedule), the transfers and the bubble,
labelled; measured lanes named by their stage; the bokeh form has the same lanes; an
unpipelined plan's timeline is unchanged."""

from __future__ import annotations

import re
from collections import Counter

import pytest

import shardlab
from shardlab.examples.transformer import gpt_scan
from shardlab.parallel.cost.pipeline import predict_pipeline
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.widgets.timeline.lanes import build_lanes

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def case():
    return gpt_scan(4, batch=8, seq=8, d=32, heads=4, vocab=64)


@pytest.fixture(scope="module")
def plan(case):
    return shardlab.strategies.pipeline_data(
        case.fn, *case.args, mesh=make_mesh(stage=4, data=2), microbatches=4
    )


def test_one_lane_per_stage_with_every_microbatchs_forward_and_backward(plan):
    view = shardlab.timeline(plan, measured=False)
    (model,) = view.timelines
    assert model.stages == 4 and not model.measured
    boxes = Counter((e.stage, e.label) for e in model.events if e.stream == "compute")
    want = {
        (s, f"{kind} of microbatch {m}")
        for s in range(4)
        for m in range(4)
        for kind in ("forward", "backward")
    }
    assert set(boxes) == want and set(boxes.values()) == {1}
    # the transfers: collective-permutes, exposed, on the senders' lanes (not the last's
    # forward, not the first's backward)
    sends = [e for e in model.events if e.stream == "communication"]
    assert sends and {e.kind for e in sends} == {"collective-permute"}
    assert all(e.exposed == pytest.approx(e.end - e.start) for e in sends)
    # the figures are the simulator's
    priced = predict_pipeline(plan, plan.pipeline)
    assert model.total == pytest.approx(priced.schedule.step_time)
    assert model.compute == pytest.approx(sum(priced.schedule.busy) / 4)
    # drawn: four stage lanes, 16 forward and 16 backward boxes, idle gaps, bubble labelled
    html = view.html()
    assert [int(s) for s in re.findall(r">stage (\d)</text>", html)] == [0, 1, 2, 3]
    assert html.count("class='sl-stage-forward'") == 16
    assert html.count("class='sl-stage-backward'") == 16
    assert html.count("class='sl-stage-idle'") > 0
    bubble = f"{priced.schedule.bubble_share_of_step:.1%} of the pipelined part idle"
    assert bubble in html and bubble in view.text()
    assert "one lane per stage" in view.text()
    lanes = build_lanes(model, budget=3000)
    assert lanes.lanes == ("stage 0", "stage 1", "stage 2", "stage 3")


def test_measured_lanes_name_their_stage_and_bokeh_draws_the_stages(plan):
    view = shardlab.timeline(plan)
    assert len(view.timelines) == 2, view.notes
    measured = view.timelines[1]
    assert measured.measured and measured.devices == 8
    assert "stage 3 · device 7" in view.html()
    plot = view.bokeh()
    assert plot.lanes[0].lanes == ("stage 0", "stage 1", "stage 2", "stage 3")
    assert plot.lanes[1].lanes[0] == "stage 0 · device 0"
    plot.model()  # bokeh builds the figures for the stage lanes
    # under the plots, the labelled schedule (F/B boxes) the SVG view draws
    assert plot.extra_html().count("class='sl-stage-forward'") == 16
    assert "bubble: " in plot.extra_html()  # once, with the schedule (not again in the notes)
    assert not any("bubble: " in n for n in plot.notes)


def test_an_unpipelined_plan_is_unchanged(case):
    flat = shardlab.strategies.data_parallel(case.fn, *case.args, mesh=make_mesh(data=8))
    view = shardlab.timeline(flat, measured=False)
    (model,) = view.timelines
    assert model.stages == 0 and view.pipeline is None
    assert build_lanes(model, budget=3000).lanes == ("devices 0–7 (SPMD)",)
    assert "sl-stage-forward" not in view.html()
