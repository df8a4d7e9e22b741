"""The per-device memory model (fusion, live ranges) against XLA's compiled memory, and
memory budgets checked on the compiled plan."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from shardlab import examples, strategies
from shardlab._core.equivalence import assert_same_program
from shardlab.parallel.cost.memory import device_memory, in_output_buffers, liveness
from shardlab.parallel.cost.profiles import resolve_profile
from shardlab.parallel.errors import SearchError
from shardlab.parallel.graph.opgraph import live_nodes
from shardlab.parallel.graph.trace import trace
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.search.driver import search


@pytest.fixture(scope="module")
def m8():
    return make_mesh(data=8)


def test_elementwise_chains_are_fused_and_matmul_outputs_are_not():
    def f(x, w):
        h = jnp.tanh(x * 2.0 + 1.0)  # one loop fusion feeding the matmul
        return jnp.sum(jnp.exp(h @ w))

    x, w = jnp.ones((64, 32)), jnp.ones((32, 16))
    g = trace(f, x, w, unroll_scans=False).graph
    lv = liveness(g, live_nodes(g))
    prim = {v: n.primitive for n in g.nodes for v in n.outputs}
    fused = {prim[v] for v in prim if v not in lv.materialized}
    kept = {prim[v] for v in lv.materialized}
    assert {"mul", "add", "exp"} <= fused
    assert {"tanh", "dot_general", "reduce_sum"} <= kept  # tanh feeds a matmul
    # The sum reads the matmul's output through the fused exp: it lives until the sum.
    dot = next(n for n in g.nodes if n.primitive == "dot_general")
    total = next(n.index for n in g.nodes if n.primitive == "reduce_sum")
    assert lv.last_use[dot.outputs[0]] == total


def test_a_value_last_read_by_an_elementwise_output_lives_in_its_buffer():
    """``0.9 * m + x @ w``: the matmul's result is read for the last time, elementwise, by
    the output of the same size, so XLA computes it in that output's buffer (no temp);
    read transposed too (layout assignment makes the transpose a bitcast: compiled, both
    have no temp), but not with a different size."""

    def inside(f, *args):
        g = trace(f, *args, unroll_scans=False).graph
        lv = liveness(g, live_nodes(g))
        prim = {v: n.primitive for n in g.nodes for v in n.outputs}
        return sorted(prim[v] for v in in_output_buffers(g, lv, g.nbytes, lambda v: 0))

    m, x, w = jnp.ones((64, 64)), jnp.ones((64, 32)), jnp.ones((32, 64))
    assert inside(lambda m, x, w: 0.9 * m + x @ w, m, x, w) == ["dot_general"]
    assert inside(lambda m, x, w: 0.9 * m + (x @ w).T, m, x, w) == ["dot_general"]
    assert inside(lambda m, x, w: 0.9 * m + (x @ w)[:, :1], m, x, w) == []


@pytest.mark.parametrize(
    "case",
    [
        lambda: examples.mlp(1024, 128, train=True),
        lambda: examples.gpt(2),
        examples.embedding,
    ],
)
def test_data_parallel_train_steps_within_ten_percent(m8, case):
    """Temporaries placed in output buffers not yet written, and gradients computed in the
    new state's buffers: data parallel's predicted per-device total is within 10%."""
    c = case()
    plan = strategies.baselines(c.fn, *c.args, mesh=m8)["data_parallel"]
    ratio = plan.cost.memory.peak / plan.verify().memory.total
    assert 0.9 <= ratio <= 1.1, (c.name, ratio)


@pytest.mark.parametrize(
    ("case", "strategy"),
    [
        (examples.pinn, "data_parallel"),
        (examples.pinn, "zero"),
        (lambda: examples.gpt(2), "data_parallel"),
        (lambda: examples.gpt(2), "megatron"),
        (lambda: examples.mlp(1024, 128, train=True), "megatron"),
    ],
)
def test_predicted_memory_tracks_compiled(m8, case, strategy):
    c = case()
    plan = strategies.baselines(c.fn, *c.args, mesh=m8)[strategy]
    compiled = plan.verify().memory
    predicted = plan.cost.memory
    assert predicted.parameters == compiled.argument
    assert abs(predicted.outputs - compiled.output) <= 0.02 * compiled.output + 1024
    ratio = predicted.peak / compiled.total
    assert 0.75 <= ratio <= 1.3, (predicted, compiled)


@pytest.mark.slow
@pytest.mark.timeout(900)  # the GPT case searches, compiles and tightens: ~230 s when shared
@pytest.mark.parametrize(
    ("case", "fraction"),
    [(examples.conv, 0.8), (examples.pinn, 0.95), (lambda: examples.gpt(2), 0.6)],
)
def test_budget_below_data_parallel_fits_once_compiled(m8, case, fraction):
    c = case()
    dp = strategies.data_parallel(c.fn, *c.args, mesh=m8)
    budget = int(dp.verify().memory.total * fraction)
    plan = search(c.fn, *c.args, mesh=m8, method="ilp", memory_budget=budget, time_limit=5)
    assert plan.verify().memory.total <= budget, plan.notes
    assert any("fits the budget" in n or "compiles within it" in n for n in plan.notes)
    ref = jax.jit(c.fn)(*c.args)
    got = plan.jit()(*c.args)
    assert_same_program(got, ref, fn=c.fn, args=c.args)


def test_unreachable_budget_names_the_smallest_reached(m8):
    c = examples.pinn()
    with pytest.raises(SearchError, match=r"memory_budget=50000 bytes.*smallest per-device"):
        search(c.fn, *c.args, mesh=m8, method="recursive", memory_budget=50_000)


def _pooled_conv_step():
    """A conv + max-pool train step: max pooling's gradient is ``select_and_scatter_add``."""

    def step(w, x):
        def loss(w):
            y = jax.lax.conv_general_dilated(
                x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
            )
            y = jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
            return jnp.mean(y**2)

        return w - 0.1 * jax.grad(loss)(w)

    w = jnp.full((3, 3, 8, 16), 0.1)
    x = jax.random.normal(jax.random.key(0), (16, 32, 32, 8))
    return step, (w, x)


@pytest.mark.parametrize("strategy", ["replicated", "data_parallel"])
def test_max_pool_gradient_holds_the_cpu_expansion_scratch(m8, strategy):
    """XLA:CPU expands ``select_and_scatter`` into s32 iotas of the operand, window indices
    and a scatter: with that scratch the prediction is within 10% of the compiled total;
    a profile whose backend has a native kernel predicts far less."""
    fn, args = _pooled_conv_step()
    cpu = resolve_profile("cpu-sim")
    plan = strategies.baselines(fn, *args, mesh=m8, device=cpu)[strategy]
    compiled = plan.verify().memory.total
    assert 0.9 <= plan.cost.memory.peak / compiled <= 1.1, (plan.cost.memory, compiled)
    native = cpu.replace(platform="gpu")
    other = strategies.baselines(fn, *args, mesh=m8, device=native)[strategy]
    assert other.cost.memory.peak < 0.6 * plan.cost.memory.peak


@pytest.mark.parametrize(
    ("case", "strategy"),
    [
        (lambda: examples.mlp(1024, 128, train=True), "megatron"),
        (lambda: examples.mlp(1024, 128, train=True), "zero"),
        pytest.param(
            lambda: examples.gpt(2),
            "megatron",
            marks=pytest.mark.xfail(
                strict=True,
                reason="0.87 of compiled, with 4 or 8 heads alike: XLA:CPU holds 16 whole "
                "(8, 16, 64) LayerNorm and residual intermediates at its peak, the model 9. "
                "It passed while the model gathered q, k and v for 4 heads on 8 devices "
                "(XLA splits them: test_comm_partitioner), which made up the difference",
            ),
        ),
    ],
)
def test_outputs_resharded_at_the_end_hold_their_computed_buffer(m8, case, strategy):
    """An output computed in one layout and resharded into its final one: the final copy
    is the output buffer, only the computed buffer is temp (not counted twice), and one
    temporary at a time sits in a not-yet-written output buffer."""
    c = case()
    plan = strategies.baselines(c.fn, *c.args, mesh=m8)[strategy]
    ratio = plan.cost.memory.peak / plan.verify().memory.total
    assert 0.9 <= ratio <= 1.1, (c.name, strategy, ratio)


def _plain_first_fit(bins, spans):
    """The plain quadratic first fit ``_Bins`` must reproduce: (bin or -1) per span."""
    hosted = [[] for _ in bins]
    out = []
    for lo, first, last, read in spans:
        for k in range(lo, len(bins)):
            if bins[k] > read and all(b < first or a > last for a, b in hosted[k]):
                hosted[k].append((first, last))
                out.append(k)
                break
        else:
            out.append(-1)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_output_buffer_first_fit_matches_the_plain_loop(seed):
    import random

    from shardlab.parallel.cost.memory import _Bins

    rng = random.Random(seed)
    end = rng.choice([5, 40, 700])  # fewer and more program points than probes
    written = sorted(rng.randint(0, end) + rng.choice([0, 0.5]) for _ in range(rng.randint(1, 60)))
    rng.shuffle(written)
    spans = []
    for _ in range(400):
        first = rng.randint(0, end)
        last = min(end, first + rng.choice([0, 1, 3, end // 4, end]))
        spans.append((rng.randint(0, len(written)), first, last, last + rng.choice([0, 0.5])))
    bins = _Bins(written, end)
    placed = [bins.place(lo, first, last, read) for lo, first, last, read in spans]
    # which bin took each: the same spans in the same bins as the plain loop
    want = _plain_first_fit(written, spans)
    assert placed == [k >= 0 for k in want]
    assert sum(len(s) for s in bins.starts) == sum(k >= 0 for k in want)
    for k in range(len(written)):
        plain = sorted(
            (f, last) for (_lo, f, last, _r), w in zip(spans, want, strict=True) if w == k
        )
        assert list(zip(bins.starts[k], bins.ends[k], strict=True)) == plain


def test_fused_reads_of_a_deep_residual_stream_match_the_plain_walk():
    """A residual stream summed through many layers is fused into its readers: every
    reader reads every layer's matmul output. The memoised walk gives the plain depth-first
    walk's buffers in its order (what ``written_over`` picks from)."""
    from shardlab.parallel.cost.memory import FUSIBLE, _Reads

    def f(x, ws):
        for w in ws:
            x = x + jnp.tanh(x @ w) * 0.5
        return jnp.sum(x)

    x = jnp.ones((8, 16))
    ws = [jnp.full((16, 16), 0.01 * k) for k in range(12)]
    g = trace(f, x, ws, unroll_scans=False).graph
    lv = liveness(g, live_nodes(g))

    def plain(inputs, through):
        out, stack, seen = [], list(reversed(inputs)), set()
        while stack:
            u = stack.pop()
            if u in seen:
                continue
            seen.add(u)
            if u in lv.materialized or g.producer(u) < 0:
                out.append(u)
                continue
            node = g.nodes[g.producer(u)]
            if node.primitive in through and len(node.outputs) == 1:
                stack.extend(reversed(node.inputs))
        return out

    for through in (FUSIBLE, frozenset(("add", "mul", "tanh"))):
        reads = _Reads(g, lv, through)
        longest = 0
        for node in g.nodes:
            assert reads(node.inputs) == plain(node.inputs, through)
            longest = max(longest, len(reads(node.inputs)))
    assert longest >= 3  # some reader reads through fused values


def test_a_product_read_again_through_a_dot_is_written_out():
    """``p = a * (1 - h)`` reads two operands as large as itself, and its consumer ``p * r``
    also reads ``r``, computed from ``p`` through a dot: XLA will not duplicate ``p``
    (``InstructionFusion::ComputeGloballyUnfusible``: it cannot be fused on all paths), so
    ``p`` has a buffer next to ``a`` and ``h``, which the sum at the end still reads."""

    def f(x, w, v):
        a = x @ v
        h = jnp.tanh(x @ w)
        p = a * (1.0 - h)
        r = jnp.sin(p) @ w
        return (p * r) @ w + a * h

    args = jnp.ones((512, 64)), jnp.full((64, 64), 0.1), jnp.full((64, 64), 0.2)
    g = trace(f, *args, unroll_scans=False).graph
    live = live_nodes(g)
    product = next(n.outputs[0] for n in g.nodes if n.primitive == "mul")
    assert product not in liveness(g, live).materialized  # the search's rows fuse it
    assert product in liveness(g, live, copies=True).materialized
    compiled = jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes
    assert device_memory(g, live, g.nbytes).activations == compiled
