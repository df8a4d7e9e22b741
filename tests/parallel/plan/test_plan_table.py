"""``plan.table()`` reads as decisions (issue 36 item 5): a baseline plan lists its layouts
and collectives, ops that only follow their operands fold into one row per line, a costlier
choice says why, and specs are never broken over lines in HTML."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

import shardlab
from shardlab.parallel.plan.plan import Plan
from shardlab.parallel.plan.table import FOLLOW_MANY, following
from shardlab.strategies import megatron


def loss(params, x):
    for layer in params:
        x = jnp.tanh(x @ layer["w1"]) @ layer["w2"]
    return (x**2).mean()


def _args():
    layer = {"w1": jnp.ones((256, 512)) * 0.01, "w2": jnp.ones((512, 256)) * 0.01}
    return [layer, dict(layer)], jnp.ones((64, 256))


@pytest.fixture(scope="module")
def mesh():
    return shardlab.mesh(data=2, model=4)


@pytest.fixture(scope="module")
def searched(mesh):
    return shardlab.search(jax.grad(loss), *_args(), mesh=mesh, method="ilp")


def test_following_reads_the_chosen_split():
    assert following("P(None, 'model') <- P(None, 'model') · P(None, 'model')") == (
        "P(None, 'model')"
    )
    assert following("P('data') <- P('data')") == "P('data')"
    assert (
        following("P(None, 'model') <- P(None, 'data') · P('data', 'model') [sum over data]")
        is None
    )
    assert following("P('model', 'data') <- P('data', 'model')") is None
    assert following("P('model', None) <- scalars") is None
    assert following("replicated") is None


def test_a_baseline_plan_lists_its_layouts_and_collectives(mesh):
    plan = megatron(jax.grad(loss), *_args(), mesh=mesh)
    assert not plan.rows
    table = plan.table(limit=None)
    text = str(table)
    assert "fixed strategy (no search)" not in [row[2] for row in table.rows]  # was the only row
    inputs = [row for row in table.rows if row[0] == "input"]
    assert len(inputs) == len(plan.input_paths)
    assert any("P(None, 'model')" in row[2] and "@model" in row[2] for row in inputs)
    kinds = {row[0] for row in table.rows if row[0] != "input"}
    assert kinds and kinds <= {c.kind for c in plan.cost.collectives}
    assert "megatron" in text
    loaded = Plan.from_json(plan.to_json())
    assert loaded.table(limit=None) == table  # read from the plan's own fields


def test_following_ops_fold_and_costlier_choices_say_why(searched):
    table = searched.table(limit=None)
    assert len(table.rows) < len(searched.rows)  # folded
    seen: dict[tuple[str, str], int] = {}
    for _op, where, chosen, *_ in table.rows:
        layout = following(chosen)
        if layout is not None:
            seen[(where, layout)] = seen.get((where, layout), 0) + 1
    assert all(n == 1 for n in seen.values()), seen  # one row per line and layout
    assert any(row[5].startswith(FOLLOW_MANY) for row in table.rows)
    by_op = {row[0]: row for row in table.rows}
    for row in table.rows:
        alternatives = [float(a.rsplit(" ", 1)[1]) for a in row[4].split("; ") if row[4] != "-"]
        if alternatives and min(alternatives) < float(row[3]) - 0.005:
            assert row[5], row  # was: a costlier choice with no reason
    assert by_op  # the table has rows
    inputs = [row for row in table.rows if row[0] == "input"]
    assert all(re.search(r"\[[\d@a-z,()]+\]$", row[2]) for row in inputs), inputs


def test_specs_stay_on_one_line_in_html(searched):
    markup = searched.table(limit=None)._repr_html_()
    assert "<span style='white-space:nowrap'>P(" in markup
    assert "white-space:nowrap" in searched._repr_html_()
