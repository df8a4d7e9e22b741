"""Pipeline cost: the schedule simulator against closed forms, the stage DP against brute
force, predicted collective-permutes against the compiled pipelined program, the errors, and
the fast refusal of an impossible memory budget."""

from __future__ import annotations

import itertools
import random
import time

import pytest

from shardlab.examples.transformer import gpt, gpt_scan
from shardlab.parallel.cost.pipeline import predict_pipeline, simulate
from shardlab.parallel.errors import SearchError
from shardlab.parallel.graph.trace import trace
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.plan.binding import Binding
from shardlab.parallel.records import PipelineSpec
from shardlab.parallel.search.driver import search
from shardlab.parallel.search.solve.bounds import finest_split, memory_bound
from shardlab.parallel.search.strategies.baselines import baselines, data_parallel
from shardlab.parallel.search.strategies.stages import (
    assignment_of,
    choose_pipeline,
    choose_stages,
    in_flight,
    stage_dp,
)


def _small_scan(layers=4, d=32):
    return gpt_scan(layers, batch=8, seq=8, d=d, heads=2, vocab=64)


@pytest.fixture(scope="module")
def stage_mesh():
    return make_mesh(stage=4, data=2)


@pytest.fixture(scope="module")
def dp_plan(stage_mesh):
    case = _small_scan()
    return case, data_parallel(case.fn, *case.args, mesh=stage_mesh, axes=("data",))


# -- the simulator ----------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), [(1, 1), (2, 3), (4, 4), (4, 8), (3, 1), (5, 2)])
def test_uniform_stages_match_closed_forms(schedule, p, m):
    tf, tb = 1.5e-3, 2.75e-3
    r = simulate([tf] * p, [tb] * p, m, schedule=schedule)
    assert r.step_time == pytest.approx((m + p - 1) * (tf + tb), rel=1e-12)
    assert r.bubble_share_of_step == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    assert r.bubble_over_ideal == pytest.approx((p - 1) / m, abs=1e-12)
    assert r.bubble_share_of_step_formula == pytest.approx((p - 1) / (m + p - 1))
    assert r.bubble_over_ideal_formula == pytest.approx((p - 1) / m)
    assert r.in_flight == tuple(in_flight(schedule, p, m, s) for s in range(p))
    if schedule == "gpipe":
        assert r.in_flight == (m,) * p
    else:
        assert r.peak_in_flight <= p and r.in_flight == tuple(min(m, p - s) for s in range(p))
    # Every stage's lane covers the step: its events and idle gaps tile [0, step].
    for s in range(p):
        lane = [e for e in r.events if e.stage == s]
        assert lane[0].start == 0.0 and lane[-1].end == pytest.approx(r.step_time)
        assert all(a.end == pytest.approx(b.start) for a, b in itertools.pairwise(lane))
        assert sum(e.end - e.start for e in lane if e.kind in ("forward", "backward")) == (
            pytest.approx(r.busy[s])
        )
        assert [e.microbatch for e in lane if e.kind == "forward"] == list(range(m))


def test_transfers_are_exposed_and_forward_only():
    p, m, tf, tb, x = 4, 4, 1.0, 2.0, 0.25
    plain = simulate([tf] * p, [tb] * p, m)
    sent = simulate([tf] * p, [tb] * p, m, transfer=x)
    # GPipe: the first microbatch crosses p-1 boundaries each way before the pipe fills,
    # and every stage but the last pays m sends forward (and every but the first back).
    assert sent.step_time >= plain.step_time + 2 * (p - 1) * x - 1e-12
    assert sent.sending[0] == pytest.approx(m * x) and sent.sending[1] == pytest.approx(2 * m * x)
    fwd = simulate([tf] * p, [0.0] * p, m)
    assert fwd.step_time == pytest.approx((m + p - 1) * tf)
    with pytest.raises(SearchError, match=r"'zb'.*'gpipe', '1f1b', 'interleaved'"):
        simulate([tf], [tb], 2, schedule="zb")


@pytest.mark.parametrize("v", [1, 2, 3, 4])
@pytest.mark.parametrize(("p", "groups"), [(2, 1), (2, 3), (4, 1), (4, 2), (8, 1), (8, 4)])
def test_interleaved_bubble_is_megatrons(p, groups, v):
    # The bubble comes out of the dependency order (chunk c on stage s waits for chunk c
    # on s-1, or chunk c-1 on the last stage), and equals arXiv 2104.04473's (p-1)/(v·m)
    # of the ideal for uniform stages.
    m, tf, tb = p * groups, 1.5e-3, 2.75e-3
    f, b = [tf / v] * (p * v), [tb / v] * (p * v)
    r = simulate(f, b, m, schedule="interleaved", virtual_stages=v)
    ideal = m * (tf + tb)
    assert r.step_time - ideal == pytest.approx((p - 1) / (v * m) * ideal, rel=1e-9)
    assert r.bubble_over_ideal == pytest.approx((p - 1) / (v * m), rel=1e-9)
    assert r.bubble_over_ideal_formula == pytest.approx((p - 1) / (v * m))
    assert r.bubble_share_of_step == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-9)
    assert r.virtual_stages == v and r.busy == pytest.approx((ideal,) * p)
    for s in range(p):  # every chunk of every microbatch, once each way, on its own stage
        lane = [e for e in r.events if e.stage == s and e.kind in ("forward", "backward")]
        assert sorted((e.kind, e.microbatch, e.chunk) for e in lane) == sorted(
            (kind, j, c) for kind in ("backward", "forward") for j in range(m) for c in range(v)
        )
        assert all(
            a.end == pytest.approx(b.start)
            for a, b in itertools.pairwise([e for e in r.events if e.stage == s])
        )
    # Forward order on stage 0: p microbatches through chunk 0, then through chunk 1, ...
    first = [(e.microbatch, e.chunk) for e in r.events if e.stage == 0 and e.kind == "forward"]
    assert first[: p * v] == [(j, c) for c in range(v) for j in range(p)]


@pytest.mark.parametrize(("p", "m"), [(2, 2), (4, 4), (4, 8), (3, 6)])
def test_interleaved_with_one_chunk_is_1f1b(p, m):
    f, b = [1.0, 1.5, 0.5, 2.0][:p], [2.0, 2.5, 1.0, 3.0][:p]
    one = simulate(f, b, m, schedule="1f1b", transfer=0.1)
    same = simulate(f, b, m, schedule="interleaved", virtual_stages=1, transfer=0.1)
    assert same.events == one.events and same.step_time == one.step_time
    assert same.in_flight == one.in_flight


def test_interleaved_beats_1f1b_for_equal_work_and_sends_v_times_as_much():
    rng = random.Random(7)
    for _ in range(40):
        p, v = rng.choice([2, 4, 8]), rng.choice([2, 3, 4])
        m = p * rng.randint(1, 4)
        tf, tb = rng.uniform(0.5, 2.0), rng.uniform(0.5, 4.0)
        one = simulate([tf] * p, [tb] * p, m, schedule="1f1b")
        inter = simulate(
            [tf / v] * (p * v), [tb / v] * (p * v), m, schedule="interleaved", virtual_stages=v
        )
        assert inter.step_time <= one.step_time + 1e-12
    # Transfers: p·v - 1 boundaries, crossed by every microbatch both ways.
    p, v, m, x = 4, 2, 8, 0.01
    inter = simulate([0.5] * 8, [1.0] * 8, m, schedule="interleaved", virtual_stages=v, transfer=x)
    one = simulate([1.0] * 4, [2.0] * 4, m, schedule="1f1b", transfer=x)
    assert sum(inter.sending) == pytest.approx(2 * m * (p * v - 1) * x)
    assert sum(one.sending) == pytest.approx(2 * m * (p - 1) * x)


def test_interleaved_simulator_errors():
    with pytest.raises(SearchError, match=r"virtual_stages=2 is for schedule='interleaved'"):
        simulate([1.0] * 4, [1.0] * 4, 4, schedule="1f1b", virtual_stages=2)
    with pytest.raises(SearchError, match=r"virtual_stages=0: use 1 or more"):
        simulate([1.0] * 4, [1.0] * 4, 4, schedule="interleaved", virtual_stages=0)
    with pytest.raises(SearchError, match=r"per virtual stage, stages × virtual_stages=3"):
        simulate([1.0] * 4, [1.0] * 4, 4, schedule="interleaved", virtual_stages=3)


def test_nonuniform_stages_slowest_stage_dominates():
    r = simulate([1.0, 3.0, 1.0], [1.0, 3.0, 1.0], 8)
    # The slowest stage runs all 2m of its steps back to back once filled.
    assert r.step_time >= 8 * 6.0
    assert r.bubble_over_ideal == pytest.approx((r.step_time - 8 * 6.0) / (8 * 6.0))


# -- the stage DP ------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "p", "m"), [(8, 4, 4), (12, 4, 8), (16, 8, 2), (24, 4, 1)])
def test_dp_balances_uniform_layers(n, p, m):
    got = stage_dp([2e-3] * n, p, m)
    assert got is not None
    assert got.imbalance <= 1.15
    assert sum(got.counts) == n and len(got.counts) == p
    choice = choose_stages([2e-3] * n, p, m)
    assert choice.balanced.counts == (n // p,) * p
    assert "within 1%" in choice.note


def _brute(layer_time, p, m, memory=None, limit=float("inf")):
    n, best = len(layer_time), None
    for cuts in itertools.combinations(range(1, n), p - 1):
        bounds = (0, *cuts, n)
        counts = [bounds[i + 1] - bounds[i] for i in range(p)]
        a = assignment_of(counts, layer_time, m, memory=memory, limit=limit)
        if a.feasible and (best is None or a.objective < best.objective):
            best = a
    return best


def test_dp_matches_brute_force_on_random_cases():
    rng = random.Random(15)
    for _ in range(60):
        n = rng.randint(2, 9)
        p = rng.randint(1, min(4, n))
        m = rng.randint(1, 8)
        layer_time = [rng.uniform(0.1, 3.0) for _ in range(n)]
        weights = [rng.uniform(1.0, 5.0) for _ in range(n)]
        schedule = rng.choice(["gpipe", "1f1b"])

        def memory(s, i, k, weights=weights, schedule=schedule, p=p, m=m):
            return sum(weights[i:k]) * in_flight(schedule, p, m, s)

        limit = rng.choice([float("inf"), rng.uniform(3.0, 30.0)])
        want = _brute(layer_time, p, m, memory, limit)
        got = stage_dp(layer_time, p, m, memory=memory, limit=limit)
        if want is None:
            assert got is None
            continue
        assert got is not None and got.feasible
        assert got.objective == pytest.approx(want.objective, rel=1e-12)


def test_choose_stages_says_when_unequal_is_better():
    choice = choose_stages([1.0, 1.0, 1.0, 5.0], 2, 4)
    assert choice.balanced.counts == (2, 2)
    assert choice.optimum is not None and choice.optimum.counts == (3, 1)
    assert "unequal assignment [3, 1] would be better" in choice.note


# -- from the graph -----------------------------------------------------------------------


def test_predicted_permutes_match_compiled_hlo(dp_plan):
    from shardlab.parallel.plan.pipeline import with_pipeline

    _, dp = dp_plan
    spec = PipelineSpec(stages=4, microbatches=2)
    predicted = predict_pipeline(dp, spec)
    rep = with_pipeline(dp, spec).verify()
    cps = [c for c in rep.collectives if c.kind == "collective-permute"]
    assert sum(c.count for c in cps) == predicted.permute_count
    compiled_bytes = sum(c.bytes * c.count for c in cps)
    assert predicted.permute_bytes == pytest.approx(compiled_bytes, rel=0.05)
    permutes = [c for c in predicted.cost.collectives if c.kind == "collective-permute"]
    assert sum(c.bytes * c.count for c in permutes) == predicted.permute_bytes
    # Memory with the residuals of every loop iteration: a rough estimate, above the
    # compiled figure here (648,260 vs 481,900 B when written; docs/design/pipeline.md).
    assert predicted.cost.memory.peak == pytest.approx(rep.memory.total, rel=0.4)
    assert predicted.cost.memory.peak < dp.verify().memory.total


def test_stage_times_come_from_the_graph(stage_mesh, dp_plan):
    _, dp = dp_plan
    wide = _small_scan(d=64)
    dp_wide = data_parallel(wide.fn, *wide.args, mesh=stage_mesh, axes=("data",))
    spec = PipelineSpec(stages=4, microbatches=4)
    narrow_cost, wide_cost = predict_pipeline(dp, spec), predict_pipeline(dp_wide, spec)
    assert all(
        w > n > 0 for w, n in zip(wide_cost.stage_forward, narrow_cost.stage_forward, strict=True)
    )
    assert all(
        w > n > 0 for w, n in zip(wide_cost.stage_backward, narrow_cost.stage_backward, strict=True)
    )
    assert wide_cost.microbatch_bytes == 2 * narrow_cost.microbatch_bytes
    # Four layers on four stages: one layer each; the total is outside + pipelined step.
    assert narrow_cost.layers_per_stage == (1, 1, 1, 1)
    sim = narrow_cost.schedule
    assert narrow_cost.time >= narrow_cost.outside_time + sim.step_time
    # 1F1B holds fewer microbatches in flight than GPipe at m > p... here m == p: equal peak,
    # fewer on the later stages, so less in-flight memory on the busiest stage at most.
    f1b = predict_pipeline(dp, PipelineSpec(4, 4, schedule="1f1b"))
    assert f1b.schedule.in_flight == (4, 3, 2, 1)
    assert f1b.in_flight_bytes <= narrow_cost.in_flight_bytes
    # A Binding works too (replicated layouts).
    bound = predict_pipeline(dp.binding, spec)
    assert bound.schedule.stages == 4


def test_interleaved_from_the_graph(stage_mesh):
    case = _small_scan(layers=8)
    dp = data_parallel(case.fn, *case.args, mesh=stage_mesh, axes=("data",))
    one = predict_pipeline(dp, PipelineSpec(4, 4, schedule="1f1b"))
    inter = predict_pipeline(dp, PipelineSpec(4, 4, schedule="interleaved", virtual_stages=2))
    assert inter.schedule.virtual_stages == 2 and inter.layers_per_stage == (2, 2, 2, 2)
    # the same work per stage, a smaller bubble, twice the boundaries' transfers
    assert inter.stage_forward == pytest.approx(one.stage_forward)
    assert inter.schedule.bubble_over_ideal_formula == pytest.approx(3 / 8)
    assert sum(inter.schedule.sending) == pytest.approx(
        sum(one.schedule.sending) * (4 * 2 - 1) / (4 - 1)
    )
    free = simulate(
        [f / 2 for f in inter.stage_forward] * 2,
        [b / 2 for b in inter.stage_backward] * 2,
        4,
        schedule="interleaved",
        virtual_stages=2,
    )
    assert (
        free.step_time
        <= simulate(one.stage_forward, one.stage_backward, 4, schedule="1f1b").step_time
    )
    assert any("interleaved: 2 model chunks" in n for n in inter.notes)
    # Megatron's requirements, each error naming the valid values
    with pytest.raises(
        SearchError,
        match=r"stages=4 × virtual_stages=4 = 16 does not divide "
        r"the 8 scanned layers; use virtual_stages in \[2\]",
    ):
        predict_pipeline(dp, PipelineSpec(4, 4, schedule="interleaved", virtual_stages=4))
    with pytest.raises(
        SearchError,
        match=r"microbatches=2: Megatron's interleaved schedule "
        r"needs a multiple of the stages \(4\); use one of \[4, 8\]",
    ):
        predict_pipeline(dp, PipelineSpec(4, 2, schedule="interleaved", virtual_stages=2))
    with pytest.raises(SearchError, match=r"virtual_stages=2 is for schedule='interleaved'"):
        predict_pipeline(dp, PipelineSpec(4, 4, virtual_stages=2))
    # an assignment counts layers per virtual stage: p·v of them
    with pytest.raises(SearchError, match=r"4 stages × 2 virtual stages = 8 positive layer"):
        predict_pipeline(
            dp,
            PipelineSpec(4, 4, schedule="interleaved", virtual_stages=2),
            assignment=[2, 2, 2, 2],
        )


def test_choose_pipeline_prices_interleaved_when_asked(stage_mesh):
    case = _small_scan(layers=8)
    got = choose_pipeline(
        case.fn,
        *case.args,
        mesh=stage_mesh,
        microbatches=4,
        schedules=("1f1b", "interleaved"),
    )
    schedules = {t[2] for t in got.tried}
    assert schedules == {"1f1b", "interleaved×2"}  # 8 layers on 4 stages: 2 chunks at most
    # microbatches not a multiple of the stages: interleaved is not tried
    two = choose_pipeline(
        case.fn, *case.args, mesh=stage_mesh, microbatches=2, schedules=("interleaved",)
    )
    assert not two.tried and "interleaved needs a multiple of the stages" in two.reason


def test_recompute_is_priced_in_the_stages(dp_plan):
    _, dp = dp_plan
    spec = PipelineSpec(4, 4)
    plain = predict_pipeline(dp, spec, policy="none")
    full = predict_pipeline(dp, spec, policy="nothing")
    dots = predict_pipeline(dp, spec, policy="dots")
    # Full recompute repeats the forward in the backward; dots repeats less of it.
    assert plain.stage_forward == full.stage_forward
    extra = [f - p for f, p in zip(full.stage_backward, plain.stage_backward, strict=True)]
    assert all(0.5 * fw < e <= 1.01 * fw for e, fw in zip(extra, full.stage_forward, strict=True))
    assert all(
        p <= d <= f
        for p, d, f in zip(
            plain.stage_backward, dots.stage_backward, full.stage_backward, strict=True
        )
    )
    assert full.time > dots.time >= plain.time
    assert any("recompute (nothing)" in n for n in full.notes)


def test_pipeline_errors(stage_mesh, dp_plan):
    case, dp = dp_plan
    with pytest.raises(
        SearchError, match=r"stages=3 does not divide the 4 scanned layers.*\[1, 2, 4\]"
    ):
        predict_pipeline(dp, PipelineSpec(3, 2))
    with pytest.raises(SearchError, match=r"microbatches=3 does not divide the batch of 8"):
        predict_pipeline(dp, PipelineSpec(4, 3))
    with pytest.raises(SearchError, match=r"microbatches=3 does not divide the batch of 8"):
        choose_pipeline(case.fn, *case.args, mesh=stage_mesh, pipeline=4, microbatches=3)
    with pytest.raises(SearchError, match=r"pipeline=3 stages do not divide the 4"):
        choose_pipeline(case.fn, *case.args, mesh=stage_mesh, pipeline=3)
    with pytest.raises(SearchError, match=r"pipeline=2 stages.*size 4.*pipeline=4"):
        choose_pipeline(case.fn, *case.args, mesh=stage_mesh, pipeline=2)
    with pytest.raises(SearchError, match=r"pipeline='yes'"):
        choose_pipeline(case.fn, *case.args, mesh=stage_mesh, pipeline="yes")
    flat = make_mesh(data=2, model=4)
    with pytest.raises(SearchError, match=r"no 'stage' axis \(axes \['data', 'model'\]\)"):
        choose_pipeline(case.fn, *case.args, mesh=flat, pipeline=4)
    assert "no 'stage' axis" in choose_pipeline(case.fn, *case.args, mesh=flat).reason
    with pytest.raises(SearchError, match=r"pipeline axis 'stage' is not a mesh axis"):
        predict_pipeline(Binding(trace(case.fn, *case.args), flat), PipelineSpec(4, 2))
    loop = gpt(2, batch=8, seq=8, d=32, heads=2, vocab=64)
    with pytest.raises(SearchError, match="no repeated layer scan"):
        choose_pipeline(loop.fn, *loop.args, mesh=stage_mesh, pipeline=4)
    assert "no repeated layer scan" in choose_pipeline(loop.fn, *loop.args, mesh=stage_mesh).reason


def test_choose_pipeline_auto(stage_mesh):
    case = _small_scan()
    got = choose_pipeline(case.fn, *case.args, mesh=stage_mesh)
    assert got.tried and got.unpipelined
    best = min((t for t in got.tried), key=lambda t: t[4])
    if got.spec is None:
        assert "stages do not pay" in got.reason and best[4] >= got.unpipelined_time
    else:
        assert got.cost is not None and got.cost.time == pytest.approx(best[4])
        assert got.cost.time < got.unpipelined_time
    # A budget under every unpipelined baseline but above the best pipeline's memory
    # makes stages the only answer.
    smallest_flat = min(
        p.cost.memory.peak for p in baselines(case.fn, *case.args, mesh=stage_mesh).values()
    )
    smallest_pipe = min(t[5] for t in got.tried)
    if smallest_pipe < smallest_flat:
        budget = (smallest_pipe + smallest_flat) / 2
        tight = choose_pipeline(case.fn, *case.args, mesh=stage_mesh, memory_budget=budget)
        assert tight.spec is not None and tight.cost is not None
        assert tight.cost.cost.memory.peak <= budget
    assert choose_pipeline(case.fn, *case.args, mesh=stage_mesh, pipeline=False).spec is None


# -- fast refusal of an impossible budget -------------------------------------------------


def test_finest_split():
    sizes = {"data": 2, "model": 4}
    assert finest_split((64, 256), sizes) == 8
    assert finest_split((), sizes) == 1
    assert finest_split((2, 3), sizes) == 2
    assert finest_split((4,), sizes) == 4


def test_impossible_budget_refused_in_seconds():
    case = gpt(2, batch=8, seq=8, d=32, heads=2, vocab=64)
    mesh = make_mesh(data=2, model=4)
    graph = trace(case.fn, *case.args).graph
    bound = memory_bound(graph, {"data": 2, "model": 4})
    # The bound is below every plan the model can price (the baselines span ZeRO and
    # tensor splits) and below the compiled memory of the most sharded one.
    plans = baselines(case.fn, *case.args, mesh=mesh)
    assert all(bound.lower_bound <= p.cost.memory.peak for p in plans.values())
    zero = plans["zero+megatron"]
    assert bound.lower_bound <= zero.verify().memory.total
    for budget in (1024, bound.lower_bound - 1):
        start = time.perf_counter()
        with pytest.raises(SearchError, match=f"at least {bound.lower_bound} B") as info:
            search(case.fn, *case.args, mesh=mesh, memory_budget=budget, confirm=False)
        # refused from the bound: seconds, where searching took minutes (a loose guard)
        assert time.perf_counter() - start < 30.0
        assert "nothing was searched or compiled" in str(info.value)
        assert f"{bound.replicated} B" in str(info.value)
