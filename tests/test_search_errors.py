"""Bad input to the search: clear errors that name the offending item, no half-built plans."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import shardlab.parallel.search.driver as S
from shardlab.parallel.errors import SearchError
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.specs import ShardingSpecError


def _fn(params, x):
    return jnp.tanh(x @ params["w"]) @ params["v"]


ARGS = ({"w": jnp.ones((16, 32)), "v": jnp.ones((32, 16))}, jnp.ones((12, 16)))


@pytest.fixture(scope="module")
def m():
    return make_mesh(data=2, model=4)


def test_unknown_argument_path(m):
    with pytest.raises(SearchError, match=r"'params/W'.*valid paths.*params/w.*did you mean"):
        S.search(_fn, *ARGS, mesh=m, annotations={"params/W": P()})


def test_unknown_mesh_axis(m):
    with pytest.raises(ShardingSpecError, match=r"'modle'.*did you mean 'model'"):
        S.search(_fn, *ARGS, mesh=m, annotations={"params/w": P(None, "modle")})


def test_indivisible_dimension(m):
    # x has 12 rows: not divisible by data×model = 8
    with pytest.raises(ShardingSpecError, match=r"size 12, not divisible by 8"):
        S.search(_fn, *ARGS, mesh=m, annotations={"x": P(("data", "model"))})


def test_contradictory_annotations(m):
    with pytest.raises(SearchError, match=r"contradictory annotations for 'params/w'"):
        S.search(_fn, *ARGS, mesh=m, annotations={"params": P(), (0, "w"): P("data")})


def test_function_that_does_not_trace(m):
    def broken(params, x):
        return x @ params["w"] @ params["w"]  # (12,32) @ (16,32): shapes do not match

    with pytest.raises(SearchError, match=r"'broken' does not trace.*TypeError"):
        S.search(broken, *ARGS, mesh=m)


def test_unknown_method_and_bad_mesh(m):
    with pytest.raises(SearchError, match=r"unknown method 'fast'.*auto, propagate"):
        S.search(_fn, *ARGS, mesh=m, method="fast")
    with pytest.raises(SearchError, match=r"jax\.sharding\.Mesh"):
        S.search(_fn, *ARGS, mesh=(2, 4))  # type: ignore[arg-type]


def test_budget_no_plan_can_meet(m):
    with pytest.raises(SearchError, match=r"no plan fits memory_budget=100 bytes.*smallest"):
        S.search(_fn, *ARGS, mesh=m, method="recursive", memory_budget=100)
