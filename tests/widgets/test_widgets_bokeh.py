"""The bokeh views' records and HTML: fair lane reduction (every device drawn when capped),
the Pareto front, the explorer's candidates, memory history markers, and self-contained
output (no network URL, BokehJS inline once)."""

from __future__ import annotations

import itertools
import random
import re

import jax.numpy as jnp
import pytest

import shardlab
from shardlab.parallel.cost.schedule import Event, Timeline, _merge
from shardlab.widgets._base import bokeh as _bokeh
from shardlab.widgets.explore.bokeh import ExplorerView, explore
from shardlab.widgets.explore.candidates import budgets_between, pareto_front
from shardlab.widgets.memory.history import MemoryHistory, MemoryTimelineView
from shardlab.widgets.timeline.bokeh import BokehTimelineView, difference_note
from shardlab.widgets.timeline.lanes import Interval, build_lanes, reduce_fairly, shares
from shardlab.widgets.timeline.svg import MAX_RECTS, TimelineView

NETWORK = re.compile(r"""(src|href)\s*=\s*["']?(https?:)?//""", re.I)
SCRIPT = re.compile(r"<script[^>]*>.*?</script>", re.S)


def markup(html: str) -> str:
    """``html`` without its scripts' text: what would ask the network as HTML. (BokehJS's
    code holds one URL, MathJax's CDN, fetched only to typeset TeX, which no view uses; the
    browser test with the network blocked checks that nothing asks.)"""
    return SCRIPT.sub("<script></script>", html)


def measured(devices: int = 8, per_device: int = 1000, *, skew: bool = False) -> Timeline:
    """A synthetic measured trace: on each device, compute kernels and every 10th an
    all-reduce; with ``skew``, device d has (d + 1) times as many kernels."""
    events = []
    for d in range(devices):
        n = per_device * (d + 1) if skew else per_device
        for i in range(n):
            events.append(Event("compute", i * 1e-6, i * 1e-6 + 0.7e-6, "dot", device=d))
            if i % 10 == 0:
                events.append(
                    Event(
                        "communication",
                        i * 1e-6,
                        i * 1e-6 + 2e-6,
                        "all-reduce",
                        "all-reduce",
                        device=d,
                        wire_bytes=1024.0,
                    )
                )
    total = max(e.end for e in events)
    return Timeline(tuple(events), total, 1e-3, 1e-3, 1e-3, devices, measured=True)


def test_shares_water_fill_and_never_exceed():
    assert shares([10, 10, 10], 30) == [10, 10, 10]
    assert shares([1, 100, 100], 51) == [1, 25, 25]
    assert shares([5, 1000], 100) == [5, 95]
    for _ in range(200):
        counts = [random.randint(1, 500) for _ in range(random.randint(1, 16))]
        budget = random.randint(len(counts), 3000)
        got = shares(counts, budget)
        assert sum(got) <= budget
        assert all(1 <= g <= c for g, c in zip(got, counts, strict=True))
        if sum(counts) <= budget:
            assert got == counts


def test_svg_timeline_draws_every_device_lane_when_capped():
    # 8 devices × 1,100 intervals = 8,800 > MAX_RECTS: the old view left device 7 empty
    html = TimelineView([measured()]).html()
    lanes = [int(x) for x in re.findall(r"data-lane='(\d+)'", html)]
    assert len(lanes) <= MAX_RECTS
    counts = {lane: lanes.count(lane) for lane in set(lanes)}
    assert sorted(counts) == list(range(8))
    assert max(counts.values()) - min(counts.values()) <= 1  # the budget shared fairly
    assert "8,800 intervals drawn as" in html and "every lane drawn" in html
    for d in range(8):
        assert f">device {d}<" in html


def test_reduction_is_fair_across_uneven_lanes_and_keeps_busy_time():
    timeline = measured(per_device=200, skew=True)  # device 7 has 8× device 0's intervals
    lanes = build_lanes(timeline, budget=2000)
    assert lanes.reduced and len(lanes.intervals) <= 2000
    by_row = {}
    for item in lanes.intervals:
        by_row.setdefault((item.lane, item.stream), []).append(item)
    assert {lane for lane, _ in by_row} == set(range(8))
    compute = {lane: len(v) for (lane, s), v in by_row.items() if s == "compute"}
    assert max(compute.values()) - min(compute.values()) <= 1
    before = sum(e.end - e.start for e in timeline.events)
    assert sum(i.busy for i in lanes.intervals) == pytest.approx(before, rel=1e-9)
    assert sum(i.count for i in lanes.intervals) == len(timeline.events)
    for row in by_row.values():  # aggregates of adjacent intervals do not overlap
        row.sort(key=lambda i: i.start)
        for a, b in itertools.pairwise(row):
            assert b.start >= a.end - 1e-12


def test_same_kind_neighbours_merge_before_mixed_ones():
    items = [Interval(0, "communication", t, t + 1.0, "all-reduce", "ar") for t in (0, 2, 4)]
    items += [Interval(0, "communication", t, t + 1.0, "all-gather", "ag") for t in (6, 8)]
    out = reduce_fairly(items, 2)
    assert [(i.kind, i.count) for i in out] == [("all-reduce", 3), ("all-gather", 2)]
    assert out[0].label.startswith("3 intervals: ar ×3")


def test_model_timeline_is_one_spmd_lane():
    events = (
        Event("compute", 0.0, 1e-3, "dot"),
        Event("communication", 0, 2e-3, "all-reduce", "all-reduce", exposed=1e-3),
    )
    lanes = build_lanes(Timeline(events, 2e-3, 1e-3, 2e-3, 1e-3, 8), budget=100)
    assert lanes.lanes == ("devices 0–7 (SPMD)",) and not lanes.reduced


def test_measured_merge_keeps_devices_apart():
    import shardlab.parallel.cost.schedule as schedule

    events = [Event("compute", t, t + 1.0, "add", device=d) for d in range(3) for t in (0.0, 1.0)]
    old, schedule.MAX_EVENTS = schedule.MAX_EVENTS, 3
    try:
        merged = _merge(events)
    finally:
        schedule.MAX_EVENTS = old
    assert [(e.device, e.start, e.end) for e in merged] == [(d, 0.0, 2.0) for d in range(3)]


def test_bokeh_timeline_html_is_self_contained_with_every_lane():
    model = Timeline((Event("compute", 0.0, 1e-4, "dot"),), 1e-4, 1e-4, 0, 0, 8)
    view = BokehTimelineView([model, measured()], fallback=TimelineView([model, measured()]))
    html = view.html()
    assert not NETWORK.search(markup(html))
    assert "Bokeh.embed.embed_item" in html and "sl-timeline-svg" in html  # plot over SVG
    assert all(f"device {d}" in html for d in range(8))
    assert view.lanes[1].reduced is False  # 8,800 < 20,000: drawn as they are
    note = difference_note(model, measured(), platform="cpu")
    assert "simulated on the host CPU" in note and "×" in note


def test_loader_is_inline_guarded_and_network_free():
    html = _bokeh.loader_html()
    assert "<script src" not in html and not NETWORK.search(markup(html))
    assert html.count("</script") == 1  # the library cannot close its own script early
    assert f'window.Bokeh.version === "{_bokeh.bokeh_version()}"' in html
    assert 0.9e6 < len(html) < 1.6e6  # the core bundle, not output_notebook's ~7.9 MB


def test_loader_is_published_once_per_session(monkeypatch):
    published = []
    monkeypatch.setattr("IPython.display.display", lambda *a, **k: published.append(a[0]))

    class Shell:
        kernel = None

    monkeypatch.setattr("IPython.get_ipython", lambda: Shell())
    _bokeh.reset_loader()
    try:
        assert _bokeh.ensure_loader() is True
        assert _bokeh.ensure_loader() is False
        assert len(published) == 1 and "BokehJS" in published[0]["text/plain"]
    finally:
        _bokeh.reset_loader()


def test_pareto_front_matches_brute_force():
    assert pareto_front([(1, 5), (2, 3), (3, 4), (4, 1), (2, 3)]) == [0, 1, 3]
    for _ in range(100):
        points = [(random.randint(0, 20), random.randint(0, 20)) for _ in range(12)]
        front = set(pareto_front(points))
        for i, (x, y) in enumerate(points):
            dominated = any(
                (a <= x and b <= y and (a, b) != (x, y)) or ((a, b) == (x, y) and j < i)
                for j, (a, b) in enumerate(points)
            )
            assert (i in front) == (not dominated), (points, i)


def test_budgets_spread_inside_the_range():
    got = budgets_between(100.0, 1600.0, 4)
    assert len(got) == 4 and all(100 < b < 1600 for b in got) and got == sorted(got)
    assert budgets_between(100.0, 100.5, 4) == []


def mlp(params, x):
    for w1, w2 in params:
        x = jnp.tanh(x @ w1) @ w2
    return (x**2).mean()


@pytest.mark.timeout(300)
def test_explore_prices_methods_baselines_and_budgets():
    mesh = shardlab.mesh(data=2, model=4)
    params = [(jnp.ones((32, 128)), jnp.ones((128, 32))) for _ in range(2)]
    calls = []
    ex = explore(
        mlp,
        params,
        jnp.ones((64, 32)),
        mesh=mesh,
        budgets=2,
        progress=lambda f, m: calls.append((f, m)),
    )
    names = [c.name for c in ex.candidates] + [n for c in ex.candidates for n in c.also]
    for want in (
        "search: propagate",
        "search: recursive",
        "search: ilp",
        "baseline: replicated",
        "baseline: data_parallel",
        "baseline: megatron",
    ):
        assert want in names
    assert calls[-1] == (1.0, "done") and all(0 <= f <= 1 for f, _ in calls)
    front = ex.pareto
    assert front and all(
        not any(o.time < c.time and o.memory < c.memory for o in ex.candidates) for c in front
    )
    view = ExplorerView(ex.collected)
    html = view.html()
    assert not NETWORK.search(markup(html))
    assert "sl-explorer-svg" in html and "Pareto" in html
    assert "$$" not in html  # no TeX: BokehJS would fetch MathJax for it
    assert html.count("sl-plan-code") >= len(ex.candidates)  # each selection's code is there
    assert "baseline: replicated" in ex.text()


def test_memory_history_marks_device_switches_and_keeps_markers_when_thinned(monkeypatch):
    values = {"n": 8}

    def sampler():
        return tuple((f"TFRT_CPU_{d}", 1024 * (d + 1)) for d in range(values["n"]))

    import shardlab.engine.resources.memory_history as memory_history

    monkeypatch.setattr(memory_history, "MAX_SAMPLES", 50)
    history = MemoryHistory(None, sampler=sampler)
    for _ in range(60):
        history.sample()
    values["n"] = 4
    history.sample()
    history.mark("release", "release (cell 3)")
    assert [m.kind for m in history.markers] == ["devices", "release"]
    assert "devices 8 → 4" in history.markers[0].text
    assert len(history.samples) <= 50 + 1
    view = history.view()
    assert isinstance(view, MemoryTimelineView)
    html = view.html()
    assert html.count("sl-memory-line") == 8 and not NETWORK.search(markup(html))
    assert "devices 8 → 4" in view.text()
