"""The corpus of "other people's models" (``examples.zoo``): train steps written the
way public JAX projects write them, on flax linen, flax nnx, equinox and optax.

Every model traces, every op-graph node has a sharding rule (no replicated fallback), each
family contains the primitives it was written for, and on a 2×4 mesh the strategy search's
plan and the data-parallel baseline compute what the plain jitted step computes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from examples import zoo
from examples.zoo import models
from shardlab._core.equivalence import assert_same_program
from shardlab.examples import Case
from shardlab.parallel.graph import rules
from shardlab.parallel.graph.rules.base import replicated_rule
from shardlab.parallel.graph.trace import trace
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.search.driver import search
from shardlab.parallel.search.strategies.baselines import baselines

NAMES = [make.__name__ for make in zoo.MODELS]


@functools.cache
def _case(name: str) -> Case:
    return getattr(zoo, name)()


@functools.cache
def _inventory(name: str):
    return zoo.primitive_inventory(_case(name))


@functools.cache
def _reference(name: str):
    case = _case(name)
    return jax.jit(case.fn)(*case.args)


def test_corpus_lists_every_family_once_in_a_fixed_order():
    assert NAMES == [
        "linen_gpt",
        "linen_seq2seq",
        "linen_resnet",
        "topk_moe",
        "pinn",
        "equinox_mlp",
        "nnx_scan",
        "vit",
        "unet",
    ]
    assert [c.name for c in zoo.corpus()] == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_model_traces_without_fallbacks(name):
    case = _case(name)
    assert case.name == name
    traced = trace(case.fn, *case.args)
    assert traced.graph.nodes
    assert zoo.fallbacks(case) == {}
    # every argument leaf is an array (no static parts): the step is jittable as it is
    for leaf in jax.tree.leaves(case.args):
        assert isinstance(leaf, jax.Array), (name, type(leaf))
    # the updated parameters and optimizer state are recognised as the arguments' new values
    assert len(traced.ties) >= len(jax.tree.leaves(case.args[0]))


def test_fallbacks_counts_a_primitive_whose_rule_is_removed(monkeypatch):
    """``fallbacks`` sees what the rule registry sees: remove the ``top_k`` rule and the MoE
    has one fallback, ``top_k``."""
    case = _case("topk_moe")
    monkeypatch.delitem(rules.RULES, "top_k")
    assert zoo.fallbacks(case) == {"top_k": 1}
    monkeypatch.setitem(rules.RULES, "split", replicated_rule)  # a rule that gives up
    assert zoo.fallbacks(_case("linen_gpt"))["split"] > 0


# per family, primitives it is built to exercise (in the step, gradient included)
EXPECTED = {
    "linen_gpt": {"split", "concatenate", "sin", "cos", "gather", "scatter-add"},
    "linen_seq2seq": {"gather", "scatter-add", "dot_general", "select_n"},
    "linen_resnet": {
        "conv_general_dilated",
        "reduce_window_max",
        "reduce_window_sum",
        "select_and_scatter_add",
        "rsqrt",
    },
    "topk_moe": {"top_k", "gather", "scatter-add", "eq", "iota"},
    "pinn": {"tanh", "dot_general"},
    "equinox_mlp": {"dot_general", "tanh"},
    "nnx_scan": {"scan", "random_bits", "random_fold_in", "random_split"},
    "vit": {"concatenate", "transpose", "reshape", "dot_general"},
    "unet": {"conv_general_dilated", "concatenate", "gather", "logistic", "cos", "sin"},
}


@pytest.mark.parametrize("name", NAMES)
def test_primitive_inventory_finds_the_family_primitives(name):
    inv = _inventory(name)
    missing = EXPECTED[name] - set(inv)
    assert not missing, (name, missing, inv)
    assert all(n > 0 for n in inv.values())
    # the graph the search sees holds the same leaf primitives (calls inlined)
    graph = trace(_case(name).fn, *_case(name).args, unroll_scans=False).graph
    calls = {"jit", "pjit", "custom_jvp_call", "custom_vjp_call", "closed_call"}
    assert set(graph.primitive_counts()) - {"scan"} <= set(inv) - calls


def test_inventory_counts_inside_sub_jaxprs():
    # jit, custom_jvp (jax.nn.relu, gelu's tanh form is plain) and the scan body are walked
    inv = zoo.primitive_inventory(
        Case(
            "nested",
            lambda x: jax.lax.scan(lambda c, y: (jax.nn.relu(c + y), None), x, x)[0],
            (jnp.ones((4, 8)),),
        )
    )
    assert inv["scan"] == 1 and inv["custom_jvp_call"] == 1 and inv["add"] == 1
    assert inv["max"] == 1  # relu's body, inside the custom_jvp inside the scan


def test_family_specific_structure():
    # the ResNet's gradient goes through max pooling's VJP; its BatchNorm state is updated
    assert _inventory("linen_resnet")["select_and_scatter_add"] >= 1
    _, stats, _, _ = _reference("linen_resnet")
    old = _case("linen_resnet").args[1]
    assert jax.tree.structure(stats) == jax.tree.structure(old)
    moved = [
        not np.allclose(a, b)
        for a, b in zip(jax.tree.leaves(stats), jax.tree.leaves(old), strict=True)
    ]
    assert all(moved)
    # the nnx step takes a typed PRNG key and returns its stream advanced
    _, rng_state, *_ = _case("nnx_scan").args
    keys = [
        x for x in jax.tree.leaves(rng_state) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended)
    ]
    assert len(keys) == 1 and "fry" in str(keys[0].dtype)
    _, new_rng, _, _ = _reference("nnx_scan")
    counts = [x for x in jax.tree.leaves(new_rng) if x.dtype == jnp.uint32]
    assert [int(c) for c in counts] == [1]
    # the PINN differentiates three times: the Hessian by the inputs, then by the parameters
    graph = trace(_case("pinn").fn, *_case("pinn").args).graph
    assert max(n.name_stack.count("jvp(") for n in graph.nodes) >= 3
    eqx_graph = trace(_case("equinox_mlp").fn, *_case("equinox_mlp").args).graph
    assert max(n.name_stack.count("jvp(") for n in eqx_graph.nodes) == 1
    # the MoE routes every token to exactly k=2 experts
    assert _inventory("topk_moe")["top_k"] == 1


def test_cases_are_deterministic():
    a, b = models.equinox_mlp(), models.equinox_mlp()
    assert models.leaves_equal(a.args, b.args)
    c = models.nnx_scan()
    assert models.leaves_equal(c.args, _case("nnx_scan").args)


# the cheap models, searched and run on a 2×4 mesh (about 5-20 s each on 2 cores: the search
# compiles its plan and the cheapest baselines to confirm its choice)
SEARCHED = [
    "equinox_mlp",
    "nnx_scan",
    "topk_moe",
    pytest.param("pinn", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module")
def mesh():
    return make_mesh(data=2, model=4)


@pytest.mark.parametrize("name", SEARCHED)
def test_search_and_data_parallel_compute_the_step(name, mesh):
    case, want = _case(name), _reference(name)
    plan = search(case.fn, *case.args, mesh=mesh, method="auto")
    assert not [w for w in plan.cost.warnings if "no sharding rule" in w], plan.cost.warnings
    assert_same_program(plan.jit()(*case.args), want, fn=case.fn, args=case.args)
    dp = baselines(case.fn, *case.args, mesh=mesh)["data_parallel"]
    assert_same_program(dp.jit()(*case.args), want, fn=case.fn, args=case.args)


@pytest.mark.parametrize(("name", "slack"), [("linen_seq2seq", 0), ("pinn", 2)])
def test_all_reduces_combine_as_the_compiled_program_does(mesh, name, slack):
    """XLA's combiner walks the all-reduces in post order and closes a group at the first one
    that depends on a member: Megatron's per-layer reductions and the PINN's derivative
    passes come out as many all-reduces as the compiled program has (levels of dependency
    alone merged the PINN's 13 into 5)."""
    case = _case(name)
    plan = baselines(case.fn, *case.args, mesh=mesh)["megatron"]
    report = plan.verify()
    predicted = sum(c.count for c in plan.cost.collectives if c.kind == "all-reduce")
    compiled = sum(c.count for c in report.collectives if c.kind == "all-reduce")
    assert abs(predicted - compiled) <= slack, (predicted, compiled)


def test_values_from_replicated_data_are_computed_split_where_consumers_slice_them(mesh):
    """The MoE's expert counts come from ``top_k``'s gathered routing: XLA computes the
    one-hot dispatch split over tokens, as its consumer (the routed einsum) wants, so the
    load-balancing count is a partial sum, all-reduced: data parallel compiles to two
    all-reduces, and the prediction has both, with the compiled bytes."""
    case = _case("topk_moe")
    plan = baselines(case.fn, *case.args, mesh=mesh)["data_parallel"]
    report = plan.verify()

    def all_reduces(cs):
        return sorted(c.bytes for c in cs if c.kind == "all-reduce" for _ in range(c.count))

    assert all_reduces(plan.cost.collectives) == all_reduces(report.collectives)


def test_combined_all_reduce_holds_its_operands_and_results(mesh):
    """A combined all-reduce's operands are all live when it runs, next to its results:
    the PINN's data-parallel step, whose many gradient contributions are reduced in one
    tuple all-reduce, is predicted within 10% of its compiled memory."""
    case = _case("pinn")
    plan = baselines(case.fn, *case.args, mesh=mesh)["data_parallel"]
    ratio = plan.cost.memory.peak / plan.verify().memory.total
    assert 0.9 <= ratio <= 1.1, ratio
