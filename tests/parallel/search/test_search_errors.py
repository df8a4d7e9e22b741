"""Bad input to the search: clear errors that name the offending item, no half-built plans."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import shardlab.parallel.search.driver as S
from shardlab import examples
from shardlab.parallel.errors import SearchError
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.search.annotations import resolve_annotations
from shardlab.parallel.specs import ShardingSpecError, check_spec


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


def _many_leaves_fn(params, x):
    return sum(jnp.sum(layer["w"] * x) for layer in params["layers"].values())


MANY = (
    {"layers": {f"l{i}": {"w": jnp.ones((4,)), "b": jnp.ones((4,))} for i in range(150)}},
    jnp.ones((4,)),
)


@pytest.mark.parametrize(
    ("typo", "want", "near"),
    [
        ("params/layers/l17/ww", "'params/layers/l17/w'", "under 'params/layers/l17'"),
        ("params/layer/l17/w", "'params/layers/l17/w'", "under 'params'"),
        ("parms/layers/l17/w", "'params/layers/l17/w'", "at the top level"),
    ],
)
def test_path_typo_among_hundreds_of_paths_is_short(m, typo, want, near):
    """300 leaves: the closest paths and a few near ones, never the list of every path."""
    with pytest.raises(SearchError) as info:
        resolve_annotations({typo: P()}, _many_leaves_fn, MANY, m)
    text = str(info.value)
    assert len(text) < 400, text
    assert f"{typo!r} names no argument" in text
    assert f"Did you mean {want}" in text and near in text
    assert "301 array paths in all" in text and "input_paths" in text
    assert "valid paths are" not in text


def test_path_typo_in_a_gpt_with_hundreds_of_leaves(m):
    case = examples.gpt(24)
    with pytest.raises(SearchError) as info:
        resolve_annotations({"params/blocks/3/wqq": P()}, case.fn, case.args, m)
    text = str(info.value)
    assert len(text) < 400, text
    assert "Did you mean 'params/blocks/3/wq'" in text


@pytest.mark.parametrize(
    ("spec", "shape", "nearest", "hint"),
    [
        (P(None, "modle"), (16, 32), "P(None, 'model')", "did you mean 'model'?"),
        # the closest name does not divide 6: another free mesh axis that does
        (P(None, "modle"), (16, 6), "P(None, 'data')", "does not divide size 6"),
        # no similar name: a free mesh axis that divides, not P()
        (P(None, "tensor"), (16, 32), "P(None, 'data')", "no mesh axis has a similar name"),
        (P("tensor", "model"), (16, 32), "P('data', 'model')", "'data' is free"),
        # the closest name is already used elsewhere in the spec
        (P("modle", "model"), (16, 32), "P('data', 'model')", "it is already used"),
        # nothing divides: unsplit
        (P(None, "modle"), (16, 3), "P()", "leave it unsplit"),
    ],
)
def test_missing_mesh_axis_suggests_the_nearest_spec_that_fits(m, spec, shape, nearest, hint):
    with pytest.raises(ShardingSpecError) as info:
        check_spec(spec, shape, m, where="annotations['params/w']")
    text = str(info.value)
    assert text.endswith(f"Nearest valid spec: {nearest}"), text
    assert hint in text and "annotations['params/w']" in text


def test_missing_mesh_axis_through_search(m):
    with pytest.raises(ShardingSpecError, match=r"'tensor'.*Nearest valid spec: P\(None, 'data'\)"):
        S.search(_fn, *ARGS, mesh=m, annotations={"params/w": P(None, "tensor")})


def test_a_prng_key_argument_is_named_in_spec_errors(m):
    """A typed PRNG key leaf (extended dtype, shape ()) annotated with a split spec: the
    error names its path."""
    args = ({"w": jnp.ones((16, 32)), "rng": jax.random.key(0)}, jnp.ones((12, 16)))
    with pytest.raises(
        ShardingSpecError, match=r"params/rng.*0 dimensions.*Nearest valid spec: P\(\)"
    ):
        resolve_annotations({"params/rng": P("data")}, _fn, args, m)
    with pytest.raises(SearchError, match=r"did you mean 'params/rng'"):
        resolve_annotations({"params/rgn": P()}, _fn, args, m)
    assert resolve_annotations({"params/rng": P()}, _fn, args, m) == {0: ()}
