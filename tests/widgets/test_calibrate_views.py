"""Issue 14, the parts around the calibration: which profile priced a plan in the Plan
display, the editor and the timeline (with the measured-vs-model gap per phase), the
explorer on a calibrated profile, the ranking bench's helpers, and ``%calibrate`` in a real
kernel. ``tests/parallel/cost/test_calibrate.py`` tests the calibration itself."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import shardlab
from benchmarks.ranking import kendall_tau, measure_side_by_side, reprice
from kernelclient import Kernel
from shardlab import examples
from shardlab.parallel.cost.calibrate import calibrate
from shardlab.parallel.cost.profiles import DEVICE_PROFILES, resolve_profile
from shardlab.parallel.search.strategies.baselines import baselines
from shardlab.widgets.records_html import plan_html
from shardlab.widgets.timeline.svg import phases, timeline


@pytest.fixture(scope="module")
def profile():
    # one mesh axis of 8 (the default measures groups of 8, 2 and 4): a third of the time
    return calibrate(shardlab.mesh(data=8), quick=True, progress=lambda fraction, message: None)


def loss(params, x):
    w1, w2 = params
    return jnp.mean(jnp.tanh(x @ w1) @ w2)


def test_plan_display_says_which_profile_priced_it(profile):
    mesh = shardlab.mesh(data=8)
    params = (jnp.ones((64, 128)) * 0.01, jnp.ones((128, 16)) * 0.01)
    x = jnp.ones((64, 64))
    calibrated = shardlab.search(jax.grad(loss), params, x, mesh=mesh, device=profile)
    datasheet = shardlab.search(jax.grad(loss), params, x, mesh=mesh, device="cpu-sim")
    assert calibrated.cost.device == profile.name
    html = plan_html(calibrated)
    assert "priced by" in html and "calibrated profile" in html
    assert profile.calibration is not None
    assert profile.calibration.date[:10] in html and "8 × cpu" in html
    assert "datasheet profile cpu-sim" in plan_html(datasheet)
    # the plan's cost breakdown resolves back to the calibrated figures by its name
    assert resolve_profile(calibrated.cost.device) is profile


def test_timeline_names_the_profile_and_gaps_per_phase(profile):
    mesh = shardlab.mesh(data=8)
    params = (jnp.ones((64, 128)) * 0.01, jnp.ones((128, 16)) * 0.01)
    x = jnp.ones((64, 64))
    plan = baselines(jax.grad(loss), params, x, mesh=mesh, device=profile)["data_parallel"]
    view = timeline(plan, device=profile)
    text = view.text()
    assert f"model priced by the calibrated profile {profile.name}" in text
    model, measured = view.timelines
    assert measured.measured and not model.measured
    gaps = dict((phase, (m, x)) for phase, m, x in view.gaps())
    assert {"compute", "all-reduce", "idle"} <= gaps.keys()
    # the measured phases of one device add up to its step (compute + collectives + idle)
    measured_phases = phases(measured)
    assert math.isclose(sum(measured_phases.values()), measured.total, rel_tol=1e-6) or (
        measured_phases["idle"] == 0.0
    )
    # the model's phases come from its own schedule, priced by the calibrated profile
    assert gaps["all-reduce"][0] == pytest.approx(
        sum(e.end - e.start for e in model.events if e.kind == "all-reduce")
    )
    assert "per phase (one device): model → measured" in text
    assert "sl-phase-gaps" in view.html() and "sl-priced-by" in view.html()
    datasheet = timeline(plan, device="cpu-sim", measured=False)
    assert "datasheet profile cpu-sim" in datasheet.text() and datasheet.gaps() == []


def test_editor_and_explorer_accept_a_calibrated_profile(profile):
    mesh = shardlab.mesh(data=2, model=4)
    params = (jnp.ones((64, 128)) * 0.01, jnp.ones((128, 16)) * 0.01)
    x = jnp.ones((64, 64))
    ed = shardlab.editor(jax.grad(loss), params, x, mesh=mesh, device=profile, compile=False)
    try:
        assert "priced by the calibrated profile" in ed.view().text()
        assert "sl-priced-by" in ed.view().html()
    finally:
        ed.close()
    found = shardlab.explore(
        jax.grad(loss),
        params,
        x,
        mesh=mesh,
        methods=("propagate",),
        budgets=0,
        device=profile,
        progress=lambda fraction, message: None,
    )
    assert found.candidates
    for c in found.candidates:  # every candidate priced by the calibrated figures
        assert c.plan is not None and c.plan.cost.device == profile.name


def test_kendall_tau_matches_scipy_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.integers(0, 4, 9).astype(float)
        y = rng.integers(0, 4, 9).astype(float)
        expected = float(getattr(stats.kendalltau(x, y), "statistic"))  # noqa: B009 - scipy stubs lack it
        got = kendall_tau(list(x), list(y))
        assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected)
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert kendall_tau([1, 2, 3], [30, 20, 10]) == -1.0


def test_reprice_is_the_plans_own_prediction_and_moves_with_the_profile(profile):
    case = examples.mlp(128, 256, train=True)
    mesh = shardlab.mesh(data=2, model=4)
    plans = baselines(case.fn, *case.args, mesh=mesh, device="cpu-sim")
    for plan in plans.values():
        assert reprice(plan, DEVICE_PROFILES["cpu-sim"]) == pytest.approx(plan.cost.time)
    slower = DEVICE_PROFILES["cpu-sim"].replace(peak_flops=1e9)
    replicated = plans["replicated"]
    assert reprice(replicated, slower) > reprice(replicated, DEVICE_PROFILES["cpu-sim"])
    # measured side by side: a replicated step does 8x the compute of data parallel
    measured = measure_side_by_side(
        {"replicated": replicated, "data_parallel": plans["data_parallel"]},
        case,
        again=["replicated", "data_parallel"],
    )
    assert set(measured) == {
        "replicated",
        "data_parallel",
        "replicated (again)",
        "data_parallel (again)",
    }
    assert all(v > 0 for v in measured.values())
    # two measurements of the same plans order them alike when they are far apart
    assert measured["replicated (again)"] > measured["data_parallel (again)"]


KERNEL_SETUP = """\
import jax, jax.numpy as jnp, shardlab
from shardlab.parallel.cost.profiles import resolve_profile
def loss(p, x):
    return jnp.mean(jnp.tanh(x @ p[0]) @ p[1])
params = (jnp.ones((64, 128)) * 0.01, jnp.ones((128, 16)) * 0.01)
x = jnp.ones((64, 64))
"""


@pytest.mark.kernel
def test_calibrate_magic_in_a_real_kernel(tmp_path):
    kernel = Kernel()
    try:
        kernel.ok(KERNEL_SETUP)
        first = kernel.ok("%calibrate")
        assert "calibrated profile calibrated-" in first.stdout
        assert "all-reduce" in first.stdout and "residual" in first.stdout
        shown = kernel.ok("%calibrate --show")
        assert first.stdout.splitlines()[0] == shown.stdout.splitlines()[0]  # the cached one
        saved = tmp_path / "profile.json"
        kernel.ok(f"%calibrate --save {saved}")
        data = json.loads(saved.read_text())
        assert "calibrated" in json.dumps(data)
        used = kernel.ok("%calibrate --use")
        assert "new searches use the calibrated profile" in used.stdout
        kernel.ok("plan = shardlab.search(jax.grad(loss), params, x, mesh=shardlab.mesh(data=8))")
        device = kernel.ok("plan.cost.device").text.strip("'\"")
        assert device == shown.stdout.split()[2]  # the cached profile's name
        kernel.ok("%calibrate --no-use")
        assert kernel.ok("resolve_profile(None).name").text.strip("'\"") == "cpu-sim"
        kernel.ok("%config CalibrateMagics.use_by_default = True")
        assert kernel.ok("resolve_profile(None).calibrated").text == "True"
        kernel.ok("%calibrate --no-use")
        loaded = kernel.ok(f"%calibrate --load {saved}")
        assert "calibrated profile" in loaded.stdout
        bad = tmp_path / "bad.json"
        bad.write_text('{"format": "shardlab-device-profile", "version": 1, "profile": 3}')
        failed = kernel.execute(f"%calibrate --load {bad}")  # a UsageError: on stderr
        assert "%calibrate --load" in failed.stderr and "'profile'" in failed.stderr
        unknown = kernel.execute("%calibrate --fast")
        assert "'--fast'" in unknown.stderr and "--full" in unknown.stderr
        assert kernel.ok("1 + 1").text == "2"  # the kernel goes on
    finally:
        kernel.shutdown()
