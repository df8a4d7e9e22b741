"""The five-dimensional baselines of ``shardlab.strategies`` run the plain step's numbers."""

from __future__ import annotations

import jax
import pytest

from shardlab import strategies
from shardlab._core.equivalence import assert_same_program
from shardlab.examples.transformer import gpt_scan
from shardlab.parallel.errors import SearchError
from shardlab.parallel.mesh import mesh as make_mesh


@pytest.fixture(scope="module")
def case():
    return gpt_scan(4, batch=8, seq=8, d=32, heads=4, vocab=64)


@pytest.fixture(scope="module")
def reference(case):
    return jax.jit(case.fn)(*case.args)


def _close(got, want, case):
    """The composite plan computes the plain step (``_core/equivalence.py``)."""
    assert_same_program(got, want, fn=case.fn, args=case.args)


@pytest.mark.parametrize(
    ("make", "mesh_shape", "method"),
    [
        (
            lambda c, m: strategies.pipeline_data(c.fn, *c.args, mesh=m, microbatches=2),
            {"stage": 2, "data": 4},
            "pipeline+data",
        ),
        (
            lambda c, m: strategies.pipeline_tensor(
                c.fn, *c.args, mesh=m, microbatches=4, remat="nothing"
            ),
            {"stage": 2, "data": 2, "model": 2},
            "pipeline+tensor",
        ),
        (
            lambda c, m: strategies.zero3_remat(c.fn, *c.args, mesh=m, model_axis="model"),
            {"data": 4, "model": 2},
            "zero3+megatron+remat",
        ),
    ],
)
def test_composites_equal_the_plain_step(case, reference, make, mesh_shape, method):
    plan = make(case, make_mesh(**mesh_shape))
    assert plan.method == method
    _close(plan.jit()(*case.args), reference, case)
    # the parts are really there: stages split the stacked layers, remat is recorded
    specs = plan.in_shardings[0]["blocks"]["w1"].spec
    if "pipeline" in method:
        assert plan.pipeline is not None and specs[0] == "stage"
        assert plan.verify().comm_bytes.get("collective-permute", 0) > 0
    else:
        assert plan.remat is not None and plan.remat.policy == "nothing"
        assert plan.in_shardings[0]["embed"].spec != jax.sharding.PartitionSpec()  # ZeRO-3


def test_composite_errors_name_the_fix(case):
    flat = make_mesh(data=8)
    with pytest.raises(SearchError, match=r"no 'stage' axis.*shardlab.mesh\(stage=2"):
        strategies.pipeline_data(case.fn, *case.args, mesh=flat, microbatches=2)
    with pytest.raises(SearchError, match=r"microbatches=3.*valid microbatch counts"):
        strategies.pipeline_data(
            case.fn, *case.args, mesh=make_mesh(stage=2, data=4), microbatches=3
        )
    with pytest.raises(SearchError, match="only the 'stage' axis"):
        strategies.pipeline_tensor(case.fn, *case.args, mesh=make_mesh(stage=8), microbatches=2)
