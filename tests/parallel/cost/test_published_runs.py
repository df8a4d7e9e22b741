"""The paper replay (``benchmarks/published``): the abstract GPT counts Megatron's FLOPs, a
pipelined row is priced with its published degrees, and the ordering checks are computed
from the predictions (and fail when a prediction reverses an ordering)."""

from __future__ import annotations

import dataclasses

import jax
import pytest

from benchmarks.published.megatron_runs import megatron_figures, megatron_table_1
from benchmarks.published.replay import Prediction, Replayer
from benchmarks.published.section import Row, checks, replay, runs
from compilers import needs
from shardlab.examples.gpt3 import GPTConfig, gpt, megatron_flops
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.plan.remat import with_remat
from shardlab.parallel.records import PipelineSpec
from shardlab.parallel.search.strategies.baselines import data_parallel


def test_abstract_gpt_counts_megatrons_eq3():
    # A published-like shape (Megatron's vocabulary and sequence, h 2048), 4 layers, on one
    # device: the traced step's FLOPs are Eq. 3's model FLOPs, 72 B s l h² (1 + s/6h) +
    # 6 B s h V. Full recompute ("nothing") adds the forward up to the MLP's last matmul,
    # whose output the backward does not need (JAX drops it; Eq. 3's fourth pass has it).
    config = GPTConfig("gpt-small", 4, 2048, 16)
    batch, seq, h, layers = 4, 2048, config.d, config.layers
    case = gpt(config, batch=batch, seq=seq)
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    plan = data_parallel(case.fn, *case.args, mesh=mesh)
    model = megatron_flops(config, batch, seq, recompute=False)
    assert plan.cost.flops == pytest.approx(model, rel=0.01)
    full = with_remat(plan, "nothing").cost.flops
    eq3 = megatron_flops(config, batch, seq)
    w2 = layers * 2 * batch * seq * 4 * h * h
    assert full == pytest.approx(eq3 - w2, rel=0.01)
    assert full < eq3  # the recompute JAX runs is less than Megatron's


def test_table_1_derived_times_match_the_anchors():
    # Eq. 3 / (TFLOP/s × GPUs): the anchors file's derived iteration times.
    want = (3.70, 3.70, 14.45, 16.06, 24.82, 37.61, 54.08, 102.63)
    got = [r.published for r in megatron_table_1()]
    assert got == pytest.approx(want, abs=0.01)


def test_a_pipelined_row_is_priced_with_its_published_degrees():
    needs("cuda")
    # Table 1's 76.1B: TP 8, PP 4, DP 32, MBS 2, GBS 1792, 5 layers per virtual stage
    # (examples/sc21/run_table_1.sh): 28 microbatches, 3 chunks per stage.
    run = next(r for r in megatron_table_1() if r.model.layers == 60)
    assert dict(run.mesh) == {"stage": 4, "data": 32, "model": 8}
    assert run.microbatches == 1792 // (32 * 2) and run.virtual == 60 // 4 // 5
    replayer = Replayer()
    got = replayer.predict(run)
    assert got.spec == PipelineSpec(4, 28, schedule="interleaved", virtual_stages=3)
    _, mesh, layouts, _ = replayer.layouts(run)
    assert mesh.devices.size == 1024 and dict(mesh.shape) == dict(run.mesh)
    # Megatron's tensor split: the first layer weight of the MLP split on its output
    # features over "model", the vocabulary of the tied embedding too.
    shapes = replayer.traced(run)[1].input_shapes()
    assert layouts[shapes.index((60, 10240, 40960))] == ((), (), ("model",))
    assert layouts[shapes.index((51200, 10240))] == (("model",), ())
    # The bubble the schedule simulated is interleaving's (p-1)/(v·m) at these degrees,
    # give or take the stage-to-stage transfers.
    assert got.bubble == pytest.approx(3 / (3 * 28), abs=0.03)
    assert 0 < got.recompute < got.seconds and got.seconds > 0


def _fake(rows: list[Row], tag: str, seconds: float) -> Row:
    row = next(r for r in rows if r.run.tag == tag)
    return dataclasses.replace(
        row, prediction=Prediction(seconds, seconds, 0.0, None, 0.0, None, 0.0)
    )


def test_ordering_checks_follow_the_predictions():
    table = [Row(r, None) for r in runs()]
    by_tag = {r.run.tag: r for r in table if r.run.tag}
    assert {"t2-ptdp-gpt-175b-1536", "f13-8x8", "tt-interleaved", "k-gpt-22b-dots"} <= set(by_tag)
    order = [_fake(table, t, s) for t, s in (("f13-8x8", 1.0), ("f13-4x16", 2.0))]
    order += [_fake(table, t, s) for t, s in (("f13-32x2", 3.0), ("f13-2x32", 4.0))]
    kept = [
        _fake(table, "t2-ptdp-gpt-175b-1536", 20.0),
        _fake(table, "t2-zero3-gpt-175b-1536", 60.0),
        _fake(table, "tt-interleaved", 30.0),
        _fake(table, "tt-1f1b", 40.0),
        _fake(table, "k-gpt-22b-dots", 1.1),
        _fake(table, "k-gpt-22b-nothing", 1.4),
        *order,
    ]
    found = {c.name: c for c in checks(kept)}
    named = [
        "Megatron T2: PTD-P beats ZeRO-3, 175B on 1536 GPUs",
        "Megatron F13: (p, t) = (8, 8) is best, 162B on 64 GPUs",
        "torchtitan T5: interleaved 1F1B beats 1F1B, 405B on 512 GPUs",
        "Korthikanti T3: selective recompute costs less than full, 22B",
    ]
    assert all(found[n].preserved is True for n in named)
    # Reverse each prediction: every check says so.
    flipped = [
        dataclasses.replace(
            r, prediction=dataclasses.replace(r.prediction, seconds=10.0 - r.prediction.seconds)
        )
        if r.prediction is not None
        else r
        for r in kept
    ]
    found = {c.name: c for c in checks(flipped)}
    assert all(found[n].preserved is False for n in named)
    # A row that was not replayed leaves its check undecided, not passed.
    assert checks([])[0].preserved is None


def test_figure_12_ordering_from_the_cost_model():
    needs("cuda")
    pair = [r for r in megatron_figures() if r.tag in ("f12-12-interleaved", "f12-12-1f1b")]
    rows = replay(pair, log=False)
    assert all(r.prediction is not None for r in rows), [r.failed for r in rows]
    inter, one = (
        next(r.prediction for r in rows if r.run.tag == t and r.prediction is not None)
        for t in ("f12-12-interleaved", "f12-12-1f1b")
    )
    check = next(c for c in checks(rows) if c.name.endswith("175B, GBS 12"))
    assert check.preserved is (inter.seconds < one.seconds)
    assert inter.spec == PipelineSpec(12, 12, schedule="interleaved", virtual_stages=4)
    assert one.spec == PipelineSpec(12, 12, schedule="1f1b")
