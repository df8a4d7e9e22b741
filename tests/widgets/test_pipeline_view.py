"""``shardlab.pipeline_timeline``: a pipelined plan's schedule drawn one lane per stage."""

from __future__ import annotations

import re

import pytest

import shardlab
from shardlab.examples.transformer import gpt_scan
from shardlab.parallel.mesh import mesh as make_mesh


@pytest.fixture(scope="module")
def plan():
    c = gpt_scan(4, batch=8, seq=8, d=32, heads=4, vocab=64)
    return shardlab.strategies.pipeline_data(
        c.fn, *c.args, mesh=make_mesh(stage=4, data=2), microbatches=4
    )


def test_one_lane_per_stage_with_every_microbatch(plan):
    view = shardlab.pipeline_timeline(plan)
    html = view._repr_html_()
    assert [int(s) for s in re.findall(r">stage (\d)</text>", html)] == [0, 1, 2, 3]
    # every stage runs a forward and a backward of each of the 4 microbatches
    assert html.count("class='sl-stage-forward'") == 16
    assert html.count("class='sl-stage-backward'") == 16
    for stage in range(4):
        for m in range(4):
            assert f"stage {stage}: forward of microbatch {m}," in html
    s = view.cost.schedule
    assert html.count("class='sl-stage-idle'") == sum(e.kind == "idle" for e in s.events) > 0
    # the figures beside it are the simulator's, under both labelled definitions
    text = repr(view)
    assert f"{s.bubble_share_of_step:.1%} of the pipelined part idle" in text
    assert "Megatron definition" in text and "GPipe/MaxText definition" in text
    assert f"{view.cost.permute_count} collective-permutes per step" in text


def test_other_schedule_and_unpipelined_plan(plan):
    # 8 microbatches on 4 stages: 1F1B holds at most 4 in flight, GPipe all 8
    one = shardlab.pipeline_timeline(plan, shardlab.PipelineSpec(4, 8, schedule="1f1b"))
    gpipe = shardlab.pipeline_timeline(plan, shardlab.PipelineSpec(4, 8))
    assert (one.cost.schedule.peak_in_flight, gpipe.cost.schedule.peak_in_flight) == (4, 8)
    c = gpt_scan(4, batch=8, seq=8, d=32, heads=4, vocab=64)
    flat = shardlab.strategies.data_parallel(c.fn, *c.args, mesh=make_mesh(data=8))
    with pytest.raises(shardlab.SearchError, match="no pipeline stages: pass one"):
        shardlab.pipeline_timeline(flat)
