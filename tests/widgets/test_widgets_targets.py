"""The editor, the timeline and the explorer on a mesh over a ``shardlab.target``: priced by
the target's profile, compiled in the background by its own compiler, and nothing measured
(its devices are abstract) with a note that says so and what to do instead."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import shardlab
from compilers import needs


def _mlp():
    params = {
        "w1": jax.ShapeDtypeStruct((256, 1024), jnp.bfloat16),
        "w2": jax.ShapeDtypeStruct((1024, 256), jnp.bfloat16),
    }
    x = jax.ShapeDtypeStruct((64, 256), jnp.bfloat16)

    def step(p, x):
        g = jax.grad(lambda p: jnp.mean(jnp.tanh(x @ p["w1"]) @ p["w2"]))(p)
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, g)

    return step, params, x


@pytest.mark.parametrize(
    ("kind", "kwargs", "profile", "marker"),
    [
        ("h100", {"hosts": 2}, "h100-nvlink", "all-reduce-start"),  # XLA:GPU's async pairs
        ("tpu-v5e", {"topology": "2x4"}, "tpu-v5e", "all-reduce"),
    ],
)
def test_editor_timeline_and_explorer_work_on_a_target(kind, kwargs, profile, marker):
    from shardlab.parallel.targets.catalog import KINDS

    needs(KINDS[kind].platform)
    t = shardlab.target(kind, **kwargs)
    mesh = shardlab.mesh(data=t.device_count // 4, model=4, devices=t)
    step, params, x = _mlp()

    ed = shardlab.editor(step, params, x, mesh=mesh, compile=False)
    evaluation = ed.model.set_all([P(None, "model"), P("model", None), P("data", None)])
    assert evaluation.cost.device == profile
    results: list = []
    ed.model.compile(results.append).join(120)
    assert results[0].error is None, results[0].error
    report = results[0].report
    assert marker in report.hlo and {c.mesh_axes for c in report.collectives} >= {("data",)}

    plan = shardlab.search(step, params, x, mesh=mesh, confirm=False)
    assert plan.cost.device == profile
    view = shardlab.timeline(plan)
    text = view.text()
    assert f"priced by the datasheet profile {profile}" in text
    assert f"nothing measured: the mesh is over {t.description}" in text
    assert "plan.to_code()" in text

    explorer = shardlab.explore(step, params, x, mesh=mesh)
    assert len(explorer.candidates) >= 2
    assert all(c.memory > 0 for c in explorer.candidates)
