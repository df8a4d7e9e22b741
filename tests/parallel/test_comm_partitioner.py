"""The cost model predicts the collectives XLA's SPMD partitioner compiles (issue 17).

Measured on XLA:CPU (jax 0.10), where the partitioner decides what the plan leaves open:
- moving a tensor between two layouts (``layouts.reshard``) goes by tile counts per
  dimension: a refinement is a local slice plus a collective-permute, a coarsening a
  permute plus one all-gather per dimension, tiles moving between dimensions an all-to-all
  (after slicing the replicas when the target is fully tiled), each with a permute when
  the device order differs; a replicated target is gathered dimension by dimension;
- ZeRO × Megatron: a gradient is resharded once into the optimizer state's layout (Adam's
  two moments share it), the update runs in that layout, and a matmul's gradient the state
  wants split over the data axis is computed split over the model axis's devices instead,
  all-reduced in those pieces and permuted into place.
"""

from __future__ import annotations

import collections
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from examples.zoo import models
from shardlab.parallel.compiled.analyze import analyze
from shardlab.parallel.cost import layouts as L
from shardlab.parallel.cost.predict import predict
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.search.strategies.baselines import baselines

AXES: tuple[str, str] = ("data", "model")
SHAPE = (32, 64)


def _layouts() -> list[L.DimAxes]:
    """Every layout of a matrix on a two-axis mesh (each axis used at most once)."""
    out: set[L.DimAxes] = set()
    for where in itertools.product((None, 0, 1), repeat=2):
        dims: list[list[str]] = [[], []]
        for axis, d in zip(AXES, where, strict=True):
            if d is not None:
                dims[d].append(axis)
        for d in (0, 1):
            for order in itertools.permutations(dims[d]):
                lay = [tuple(x) for x in dims]
                lay[d] = tuple(order)
                out.add((lay[0], lay[1]))
    return sorted(out)


def _spec(lay: L.DimAxes) -> PartitionSpec:
    entries: list[str | tuple[str, ...] | None] = []
    for axes in lay:
        entries.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return PartitionSpec(*entries)


def _kinds(items) -> list[tuple[str, int, int]]:
    return sorted(items)


@pytest.mark.parametrize("shape", [(2, 4), (4, 2)])
def test_reshard_predicts_the_partitioners_collectives_for_every_layout_pair(shape):
    """All 110 ordered pairs of distinct matrix layouts on the mesh: the predicted
    collectives (kind, result bytes per device, group size) are the compiled ones."""
    mesh = make_mesh(shape=shape, names=AXES)
    sizes: dict[str, int] = {a: n for a, n in zip(AXES, shape, strict=True)}
    x = jax.ShapeDtypeStruct(SHAPE, jnp.float32)
    nbytes = SHAPE[0] * SHAPE[1] * 4
    wrong = []
    for src, dst in itertools.permutations(_layouts(), 2):
        target = NamedSharding(mesh, _spec(dst))

        def f(a, target=target):
            return jax.lax.with_sharding_constraint(a * 2, target) * 3

        report = analyze(
            f, x, mesh=mesh, in_shardings=(NamedSharding(mesh, _spec(src)),), out_shardings=target
        )
        compiled = _kinds((c.kind, c.bytes, c.group_size) for c in report.collectives)
        predicted = _kinds((k, b, g) for k, b, g, _ in L.reshard(src, dst, nbytes, sizes))
        if compiled != predicted:
            wrong.append((src, dst, compiled, predicted))
    assert not wrong, wrong


def test_reshard_gathers_a_replicated_target_dimension_by_dimension():
    sizes = {"data": 2, "model": 4}
    got = L.reshard((("data",), ("model",)), ((), ()), 8192, sizes)
    assert got == [("all-gather", 4096, 4, ("model",)), ("all-gather", 8192, 2, ("data",))]


def test_reshard_between_axes_of_one_dimension_permutes_instead_of_gathering():
    """ZeRO's optimizer state split over ``data`` where Megatron splits the weight over
    ``model`` on the same dimension: a permute and a gather over the factor between them
    (model → data), or a local slice and a permute (data → model); never a full gather."""
    sizes = {"data": 2, "model": 4}
    to_state = L.reshard((("model",), ()), (("data",), ()), 8192, sizes)
    assert to_state == [
        ("collective-permute", 2048, 2, ("model", "data")),
        ("all-gather", 4096, 2, ("model",)),
    ]
    to_param = L.reshard((("data",), ()), (("model",), ()), 8192, sizes)
    assert to_param == [("collective-permute", 2048, 2, ("data", "model"))]


@functools.cache
def _equinox_mlp():
    return models.equinox_mlp()


def _per_kind(collectives) -> dict[str, tuple[int, int]]:
    out: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for c in collectives:
        out[c.kind][0] += c.count
        out[c.kind][1] += c.count * c.bytes
    return {k: (n, b) for k, (n, b) in sorted(out.items())}


def test_zero_megatron_step_predicts_the_compiled_collectives():
    """The equinox MLP's ZeRO × Megatron step on 2×4: per kind, the predicted collectives'
    count and bytes are the compiled program's (the old model gathered the gradient for
    each Adam moment and the update over whole axes: 1.48× the compiled time)."""
    case = _equinox_mlp()
    mesh = make_mesh(shape=(2, 4), names=AXES)
    plan = baselines(case.fn, *case.args, mesh=mesh)["zero+megatron"]
    report = plan.verify()
    assert _per_kind(plan.cost.collectives) == _per_kind(report.collectives)
    assert plan.cost.comm_time == pytest.approx(plan.compiled_comm_time(report), rel=1e-6)


def _compiled_and_predicted(f, args, mesh, ins, outs):
    def named(specs):
        return jax.tree_util.tree_map(
            lambda s: NamedSharding(mesh, s),
            specs,
            is_leaf=lambda s: isinstance(s, PartitionSpec),
        )

    report = analyze(f, *args, mesh=mesh, in_shardings=named(ins), out_shardings=named(outs))
    cost = predict(f, *args, mesh=mesh, in_shardings=ins, out_shardings=outs)
    compiled = _kinds((c.kind, c.bytes, c.group_size) for c in report.collectives)
    return compiled, _kinds((c.kind, c.bytes, c.group_size) for c in cost.collectives)


@pytest.mark.parametrize(
    ("shape", "want"),
    [
        ((2, 4), [("all-reduce", 1024, 2), ("collective-permute", 1024, 2)]),
        ((4, 2), [("all-reduce", 2048, 4)]),
    ],
)
def test_matmul_partial_sum_wanted_split_is_reduced_in_pieces_on_replica_devices(shape, want):
    """A weight-gradient-like sum over a data-split batch whose consumer wants it split
    over ``data``: with no reduce-scatter, XLA computes it split over the ``model``
    devices (that hold the operands whole), all-reduces the pieces and permutes them into
    place, when ``model`` has a multiple of ``data``'s devices (2×4); else (4×2) it
    all-reduces the whole and slices."""
    mesh = make_mesh(shape=shape, names=AXES)

    def f(s, x, w):
        return s + 0.1 * (x.T @ jnp.tanh(x @ w))

    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in ((16, 32), (64, 16), (16, 32))]
    ins = (PartitionSpec("data", None), PartitionSpec("data", None), PartitionSpec())
    compiled, predicted = _compiled_and_predicted(f, args, mesh, ins, PartitionSpec("data", None))
    assert compiled == want
    assert predicted == compiled


def test_adam_update_with_state_and_weight_split_over_different_axes():
    """Megatron's weight split over ``model``, Adam's moments over ``data`` (ZeRO): the
    gradient goes to the moments' layout by permute + gather, the update back by a local
    slice + permute, and the moments' elementwise updates run in the moments' layout (the
    output sharding wins over the more finely split operand)."""
    mesh = make_mesh(shape=(2, 4), names=AXES)

    def f(w, m, v):
        g = jnp.sin(w)
        m2 = 0.9 * m + 0.1 * g
        v2 = 0.99 * v + 0.01 * (g * g)
        return w - 0.1 * m2 / (jnp.sqrt(v2) + 1e-8), m2, v2

    sd = jax.ShapeDtypeStruct((32, 16), jnp.float32)
    specs = (PartitionSpec("model", None), PartitionSpec("data", None), PartitionSpec("data", None))
    compiled, predicted = _compiled_and_predicted(f, (sd, sd, sd), mesh, specs, specs)
    assert predicted == compiled
    assert not any(k == "all-gather" and g == 4 for k, _, g in predicted)


@pytest.mark.parametrize(
    ("name", "gathers"),
    [("implicit", 2), ("explicit_once", 1), ("computed_then_implicit", 2)],
)
def test_an_operand_an_op_broadcasts_implicitly_is_gathered_for_each_op(name, gathers):
    """A small split vector scaling two data-split activations (BatchNorm's scale, in the
    forward and the backward): each elementwise op that broadcasts it implicitly (size-1
    dims expanded) lowers to a broadcast of its own, and XLA gathers the vector once per
    op; one explicit broadcast shared by both is gathered once. The old model gathered
    once in every case (a reshard cached across consumers)."""
    mesh = make_mesh(shape=(8,), names=("data",))

    def use(t, t2, b):
        return jnp.tanh(t * b), jnp.sin(t2 * b)

    variants = {
        "implicit": lambda t, t2, x: use(t, t2, x.reshape(1, 16)),
        "explicit_once": lambda t, t2, x: use(t, t2, jnp.broadcast_to(x[None], (64, 16))),
        "computed_then_implicit": lambda t, t2, x: use(t, t2, jnp.exp(x).reshape(1, 16)),
    }
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in ((64, 16), (64, 16), (16,))]
    split = PartitionSpec("data")
    compiled, predicted = _compiled_and_predicted(
        variants[name], args, mesh, (split, split, split), (split, split)
    )
    assert [k for k, _, _ in compiled] == ["all-gather"] * gathers
    assert predicted == compiled


@functools.cache
def _case(name: str):
    return getattr(models, name)()


@pytest.mark.parametrize(
    ("model", "plan", "shape"),
    [("linen_resnet", "zero", (8,)), ("pinn", "megatron", (8,))],
)
def test_corpus_plan_predicts_the_compiled_collectives_per_kind(model, plan, shape):
    """Per kind, count and bytes as compiled:
    - the ResNet's ZeRO step: BatchNorm's backward broadcasts per-channel sums (split
      like the scale) to the batch-split activations; XLA gathers the sums (64 bytes), the
      old model moved the broadcast activations with all-to-alls (2 KB each);
    - the PINN's Megatron step (grad of grad under ``vmap``): XLA combines its 17
      all-reduces into 13, the grouping of the combiner's post order with operands
      visited last first; first-first combined them into 11."""
    case = _case(model)
    mesh = make_mesh(shape=shape, names=AXES[: len(shape)])
    chosen = baselines(case.fn, *case.args, mesh=mesh)[plan]
    report = chosen.verify()
    assert _per_kind(chosen.cost.collectives) == _per_kind(report.collectives)


@pytest.mark.parametrize("shards", [2, 4, 8])
@pytest.mark.parametrize("pieces", [(32, 32, 32), (48, 16, 32), (16, 48)])
def test_a_split_along_a_split_dimension_is_a_halo_exchange(shards, pieces):
    """``jnp.split`` of a dimension split over the mesh (a fused qkv projection under
    Megatron): the pieces stay split, each device fetching its part of a piece from the
    devices holding it with collective-permutes (XLA's halo exchange; near and far halos),
    as many and as wide as compiled. The old model gathered the operand (all-gathers)."""
    mesh = make_mesh(shape=(8 // shards, shards), names=AXES)
    cuts = list(itertools.accumulate(pieces))[:-1]

    def f(x):
        return tuple(jnp.sin(p) for p in jnp.split(x, cuts, axis=1))

    x = jax.ShapeDtypeStruct((16, sum(pieces)), jnp.float32)
    split = PartitionSpec(None, "model")
    compiled, predicted = _compiled_and_predicted(f, [x], mesh, (split,), (split,) * len(pieces))
    assert {k for k, _, _ in compiled} == {"collective-permute"}
    assert predicted == compiled


@pytest.mark.parametrize(
    ("mesh_shape", "shape", "spec"),
    [
        ((2, 4), (16, 8, 32), PartitionSpec("data", None, "model")),
        ((2, 4), (2, 8, 32), PartitionSpec(None, None, "model")),
        ((1, 8), (4, 16, 32), PartitionSpec(None, None, "model")),
    ],
)
def test_a_concatenation_along_a_split_dimension_moves_the_split_with_all_to_alls(
    mesh_shape, shape, spec
):
    """``jnp.concatenate`` of pieces split along the joined dimension (the backward of
    the qkv split): XLA moves the split to the first other dimension it divides (one
    all-to-all per piece), joins locally and moves the result's split back (one more).
    The old model all-gathered every piece."""
    mesh = make_mesh(shape=mesh_shape, names=AXES)
    axis = len(shape) - 1

    def f(x, y, z):
        return jnp.sin(jnp.concatenate([jnp.sin(x), jnp.cos(y), jnp.tanh(z)], axis=axis))

    args = [jax.ShapeDtypeStruct(shape, jnp.float32)] * 3
    compiled, predicted = _compiled_and_predicted(f, args, mesh, (spec,) * 3, spec)
    assert [k for k, _, _ in compiled] == ["all-to-all"] * 4
    assert predicted == compiled


@pytest.mark.parametrize(
    "shape",
    [dict(), dict(vocab=256, batch=512)],
    ids=["few updates: masked", "more updates than table: reduced whole"],
)
def test_an_embedding_gradient_sliced_into_its_update_is_scattered_as_xla_chooses(shape):
    """ZeRO on an embedding model: the table's gradient (a scatter-add of the looked-up
    rows' cotangents into zeros) is wanted split by rows for the update. XLA's partitioner
    takes the scatter method of least peak memory (then communication). A 1 MiB table
    looked up by 512 ids: each device scatters into its own rows, the updates and ids
    gathered (128 KiB and 2 KiB), not the gradient all-reduced and sliced (the model that
    kept indexed dimensions whole: memory 1.82×). A 64 KiB table looked up by 4,096 ids
    (1 MiB of updates, a GPT's tokens into its words): each device scatters its own updates
    into a whole table, all-reduced (gathering the updates: 1.08× on a GPT)."""
    from shardlab import examples

    case = examples.embedding(**shape)
    chosen = baselines(case.fn, *case.args, mesh=make_mesh(data=8))["zero"]
    report = chosen.verify()
    assert _per_kind(chosen.cost.collectives) == _per_kind(report.collectives)
    # The reduced-whole case's temp is over by 1.17x (it was 3.97x when the model gathered
    # the updates): a memory rule still to find, so its bound is looser.
    high = 1.1 if not shape else 1.2
    assert 0.9 <= chosen.cost.memory.peak / report.memory.total <= high


def test_a_follower_read_in_a_more_split_layout_is_pinned_to_the_searched_one():
    """The MoE's searched plan on 2×4 computes the router softmax's ``exp`` split over the
    data axis only, and the division reads it split over the experts too. Left
    unconstrained, XLA's propagation computed ``exp`` in the division's layout, and the sum
    over the experts became a partial sum with an all-reduce the plan did not price (0.80
    of the compiled communication); the plan now constrains the follower, and per kind the
    compiled collectives are the predicted ones."""
    from shardlab import examples
    from shardlab.parallel.search.driver import search

    case = examples.moe()
    mesh = make_mesh(shape=(2, 4), names=AXES)
    plan = search(case.fn, *case.args, mesh=mesh, method="ilp")
    assert "exp" in {primitive for _, primitive, _ in plan.constraints}
    report = plan.verify()
    assert _per_kind(plan.cost.collectives) == _per_kind(report.collectives)


@pytest.mark.parametrize("shape", [{"model": 8}, {"data": 2, "model": 4}])
def test_fewer_heads_than_tensor_parallel_devices_split_the_head_width(shape):
    """Megatron attention with 2 heads of width 32 on 8 (and 4) tensor-parallel devices:
    the partitioner keeps each projection's tiles where they are when it reshapes
    ``(b, t, 64)`` to ``(b, t, 2, 32)`` — heads split 2 ways, each head's width over the
    rest — so the scores are partial sums all-reduced within the width's groups
    (``replica_groups=[2,4]<=[8]``). The model that could not split one axis over two
    dimensions gathered every q, k and v instead (1.27-1.40x the compiled bytes on a
    4-head GPT on 8 devices, all three compilers)."""
    from shardlab.examples.transformer import gpt

    case = gpt(1, batch=8, seq=16, d=64, heads=2, vocab=128)
    chosen = baselines(case.fn, *case.args, mesh=make_mesh(**shape))["megatron"]
    report = chosen.verify()
    predicted, compiled = _per_kind(chosen.cost.collectives), _per_kind(report.collectives)
    assert predicted == compiled
    assert "all-gather" not in compiled
    groups = sorted({c.group_size for c in chosen.cost.collectives})
    assert groups == sorted({c.group_size for c in report.collectives})


def test_a_result_split_over_part_of_an_axis_gets_a_valid_spec():
    """A function whose result is the reshaped projection (2 heads of width 32, the width
    split over 8 devices): the result's layout is over the axis's parts (heads over 2 of
    the 8, width over 4). A PartitionSpec cannot name a part, so the plan's output spec
    names the axis only where it divides the dimension, and the plan compiles."""
    from jax.sharding import PartitionSpec as P

    from shardlab.parallel.cost import layouts as L
    from shardlab.parallel.graph.trace import trace
    from shardlab.parallel.plan.fixed import fixed_plan

    def heads(x, w):
        return (x @ w).reshape(8, 16, 2, 32)

    x, w = jnp.ones((8, 16, 64)), jnp.ones((64, 64))
    mesh = make_mesh(model=8)
    traced = trace(heads, x, w)
    plan = fixed_plan(
        traced,
        mesh,
        [L.replicated(3), L.from_spec(P(None, "model"), 2)],
        method="hand",
    )
    (out,) = plan.output_specs
    for size, axes in zip((8, 16, 2, 32), out, strict=True):
        assert size % math.prod(mesh.shape[a] for a in axes) == 0, out
    report = plan.verify()
    assert report.memory.total > 0
