"""Pipelined execution of a plan's layer scans: GPipe over a ``stage`` mesh axis, in one jit.

A layer scan (``lax.scan`` over parameters stacked on a leading layer axis) is run by a
``ScanRunner`` (``graph/interpret.py``) that cuts the layers into ``stages`` contiguous groups
(``(L, ...) -> (stages, L/stages, ...)``, the stage dim on ``spec.axis``), splits the batch into
``microbatches`` and loops ``microbatches + stages - 1`` times inside a partial-manual
``jax.shard_map`` over the stage axis (the other mesh axes stay automatic): every stage runs its
layers (an inner ``lax.scan``) on its current microbatch, then the activations move to the next
stage with ``jax.lax.ppermute``. Buffers start at zero and a validity mask decides what is
written, so bubble iterations never feed NaN into the gradients. A reverse scan (the backward
pass of a train step) runs the stages in the other direction.

Which dimensions are "the batch" is decided from the ``step`` the runner is given, when it is
called (a remat runner may wrap it): the step is traced, and "split on the batch" is propagated
through its equations with the sharding rules' factors (``graph/rules``). A value is
independent of the batch, split on one dimension (concatenated over microbatches) or a partial
sum over the batch (summed over microbatches: parameter gradients); an equation that needs the
whole batch stops it with an error naming the op and the user's line. The microbatch program
is the step's equations re-bound at microbatch shapes (shape parameters rewritten). See
``docs/design/pipeline.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shardlab._core.jaxprs import bind, bind_params, equation_context, source_context
from shardlab.parallel.cost.pipeline import divisors, predict_pipeline
from shardlab.parallel.errors import SearchError
from shardlab.parallel.graph.interpret import ScanRunner
from shardlab.parallel.graph.opgraph import Node, OpGraph, ScanGroup, build_from_jaxpr
from shardlab.parallel.graph.rules import rule_for
from shardlab.parallel.mesh import mesh_shape_of
from shardlab.parallel.records import PIPELINE_SCHEDULES, PipelineSpec
from shardlab.parallel.specs import spec_entries

SUM = -1  # the state of a partial sum over the batch (other states: None, or the split dim)
State = int | None
# Ops linear in every operand that is a partial sum (the others must not depend on the batch).
_LINEAR_ALL = frozenset(
    "add add_any sub neg convert_element_type reshape transpose squeeze expand_dims "
    "broadcast_in_dim reduce_sum copy copy_p reduce_precision sharding_constraint "
    "concatenate rev".split()
)
_LINEAR_ONE = frozenset("mul dot_general".split())  # linear in one operand
_REMAT = frozenset({"checkpoint", "remat", "remat2"})  # jax.checkpoint's primitive


class PipelineError(SearchError):
    """A pipeline cannot be built for this function, mesh or spec; the message says why."""


class _NotSeparable(Exception):
    def __init__(self, node: Node, why: str):
        super().__init__(f"{node.primitive} at {node.source or 'an unknown line'}: {why}")


# -- which dimensions are the batch -----------------------------------------------------------
def _states(g: OpGraph, inputs: dict[int, State], m: int) -> tuple[list[State], dict[int, int]]:
    """Per variable of ``g``, its batch state, and the batch-independent intermediates
    computed with the batch dim (``{variable: dim}``: computed whole, sliced per
    microbatch). A value that does not depend on the batch but has the batch dim, where an
    op aligns it with the batch, is promoted to split (a const or step input is sliced per
    microbatch; a ``broadcast_in_dim`` creating the dim is re-bound at the microbatch
    size; any other producer runs whole and is sliced), which restarts the walk."""
    fixed = dict(inputs)
    for _ in range(len(g.shapes) + 1):
        state: list[State] = [None] * len(g.shapes)
        for v, s in fixed.items():
            state[v] = s
        promoted = _walk(g, state, fixed, m)
        if not promoted:
            sliced = {}
            for v, d in fixed.items():
                producer = g.producer(v)
                if producer >= 0 and d is not None and not _broadcast_dim(g.nodes[producer], d):
                    sliced[v] = d
            return state, sliced
        fixed.update(promoted)
    raise AssertionError("batch analysis did not settle")  # pragma: no cover


def _walk(g: OpGraph, state: list[State], fixed: dict[int, State], m: int) -> dict[int, State]:
    for node in g.nodes:
        ins = [state[v] for v in node.inputs]
        if all(s is None for s in ins):
            continue
        if SUM in ins:
            _sum_op(node, ins, state)
            continue
        rule = rule_for(node, g)
        factor = None
        for k, s in enumerate(ins):
            if s is None:
                continue
            dims = rule.operands[k][s]
            if not dims or rule.factor_sizes[dims[0]] % m:
                raise _NotSeparable(node, f"the batch dim {s} of an operand is not kept whole")
            if factor is not None and dims[0] != factor:
                raise _NotSeparable(node, "it mixes two different batch dims")
            factor = dims[0]
        if factor in rule.replicated:
            raise _NotSeparable(node, "it needs the whole batch")
        promoted: dict[int, State] = {}
        for k, (v, s) in enumerate(zip(node.inputs, ins, strict=True)):
            where = [d for d, fs in enumerate(rule.operands[k]) if fs and fs[0] == factor]
            if s is None and where:
                promoted[v] = where[0]  # sliced per microbatch (see _Analysis)
        if promoted:
            return promoted
        for r, v in enumerate(node.outputs):
            where = [d for d, fs in enumerate(rule.results[r]) if factor in fs]
            if where and rule.results[r][where[0]][0] != factor:
                raise _NotSeparable(node, "the batch dim is merged below another dim")
            if where:
                state[v] = where[0]
            elif factor in rule.reduction:
                state[v] = SUM
            else:
                raise _NotSeparable(node, "it drops the batch dim without summing over it")
        for v in node.outputs:  # promoted earlier, now computed from the batch: not sliced
            fixed.pop(v, None)
    return {}


def _broadcast_dim(node: Node, dim: int) -> bool:
    """``node`` is a ``broadcast_in_dim`` that creates ``dim`` (constant along it)."""
    return node.primitive == "broadcast_in_dim" and dim not in node.params["broadcast_dimensions"]


def _sum_op(node: Node, ins: list[State], state: list[State]) -> None:
    p = node.primitive
    sums = sum(1 for s in ins if s == SUM)
    others = [s for s in ins if s != SUM]
    if any(s is not None for s in others):
        raise _NotSeparable(node, "it combines a partial sum over the batch with a split value")
    if p in _LINEAR_ALL and (sums == len(ins) or p in ("broadcast_in_dim", "reshape")):
        ok = True
    elif p in _LINEAR_ONE and sums == 1:
        ok = True
    else:
        ok = p == "div" and ins[0] == SUM and sums == 1
    if not ok:
        raise _NotSeparable(node, "a partial sum over the batch reaches a non-linear op")
    for v in node.outputs:
        state[v] = SUM


@dataclasses.dataclass
class _Analysis:
    graph: OpGraph
    state: list[State]
    consts: list[int]  # graph variables holding array consts (closed over by the step)
    n_carry: int
    checkpoint: dict[str, Any] | None  # a top-level jax.checkpoint's params, to keep it
    sliced: dict[int, int]  # batch-independent values with the batch dim: run whole, sliced


def _analyse(step: Any, init: list[Any], x0: list[Any], m: int) -> _Analysis:
    closed = jax.make_jaxpr(step)(init, x0)
    g = build_from_jaxpr(closed)
    n_carry = len(init)
    carry_vars = g.inputs[:n_carry]
    points = [v for v in carry_vars if g.shapes[v]]
    if not points:
        raise PipelineError("the layer scan carries no array with a batch dim to microbatch")
    first = max(points, key=lambda v: len(g.shapes[v]))
    errors: list[str] = []
    # Any dim along which the step separates is a valid microbatching: the first that works.
    for dim in [d for d, n in enumerate(g.shapes[first]) if n % m == 0 and n >= m]:
        inputs: dict[int, State] = {first: dim}
        for _ in range(n_carry + 1):
            try:
                state, sliced = _states(g, inputs, m)
            except _NotSeparable as e:
                errors.append(f"dim {dim} of the carry: {e}")
                break
            outs = [state[v] for v in g.outputs[:n_carry]]
            changed = False
            for v, s in zip(carry_vars, outs, strict=True):
                if inputs.get(v) != s and s is not None:
                    inputs[v], changed = s, True
            if not changed:
                mismatch = [k for k, v in enumerate(carry_vars) if state[v] != outs[k]]
                if mismatch:
                    errors.append(f"dim {dim}: carry {mismatch[0]} changes its batch layout")
                    break
                consts = [v for v, x in enumerate(g.literal) if x is not None and np.ndim(x) > 0]
                ckpt = next(
                    (dict(e.params) for e in closed.jaxpr.eqns if e.primitive.name in _REMAT),
                    None,
                )
                return _Analysis(g, state, consts, n_carry, ckpt, sliced)
    raise PipelineError(
        "the layer scan cannot be split into microbatches: "
        + "; ".join(errors or [f"no dim of the carry {g.shapes[first]} divides into {m}"])
    )


# -- the microbatch program --------------------------------------------------------------------
def _small(shape: Sequence[int], s: State, m: int) -> tuple[int, ...]:
    if s is None or s == SUM:
        return tuple(shape)
    return tuple(n // m if d == s else n for d, n in enumerate(shape))


def _evaluate(
    a: _Analysis, m: int, mb: Any, consts: list[Any], args: list[Any], *, manual: str
) -> list[Any]:
    """The step's equations on microbatch ``mb`` (shape parameters naming the batch
    rewritten; ``a.sliced`` values computed whole and sliced). The plan's sharding
    constraints are re-applied on the mesh inside the ``shard_map`` (``manual`` axis
    dropped: each stage holds its own layers)."""
    g, state = a.graph, a.state
    env: dict[int, Any] = dict(zip(a.consts, consts, strict=True))
    env.update(zip(g.inputs, args, strict=True))

    def read(v: int) -> Any:
        return env[v] if v in env else g.literal[v]

    for node in g.nodes:
        invals = [read(v) for v in node.inputs]
        eqn = node.eqn
        if node.primitive == "sharding_constraint":
            (v,) = node.outputs
            x = _constrain_inside(eqn, invals[0], manual)
            env[v] = _microbatch(x, a.sliced[v], m, mb) if v in a.sliced else x
            continue
        params = bind_params(eqn)
        want = [
            tuple(g.shapes[v]) if v in a.sliced else _small(g.shapes[v], state[v], m)
            for v in node.outputs
        ]
        for v, new in zip(node.outputs, want, strict=True):
            old = tuple(g.shapes[v])
            if new != old:  # a shape parameter names the batch: rewrite it
                for key, value in params.items():
                    if isinstance(value, tuple) and tuple(value) == old:
                        params[key] = new
        with equation_context(eqn):
            outs = bind(eqn, invals, params)
        for v, x, new in zip(node.outputs, outs, want, strict=True):
            if tuple(x.shape) != new:
                raise PipelineError(
                    f"{node.primitive} at {node.source or 'an unknown line'} cannot run on a "
                    f"microbatch (shape {tuple(x.shape)}, expected {new}): use microbatches=1"
                )
            if v in a.sliced:
                x = _microbatch(x, a.sliced[v], m, mb)
            env[v] = x
    return [read(v) for v in g.outputs]


def _constrain_inside(eqn: Any, x: Any, manual: str) -> Any:
    sharding = eqn.params["sharding"]
    spec = getattr(sharding, "spec", None)
    if spec is None:
        return x
    entries = [tuple(a for a in axes if a != manual) for axes in spec_entries(spec)]
    entries = entries[: x.ndim] + [()] * (x.ndim - len(entries))
    inner = P(*[(e[0] if len(e) == 1 else e) if e else None for e in entries])
    with source_context(eqn):  # not eqn.ctx: the stage's manual mesh stays current
        return jax.lax.with_sharding_constraint(
            x, NamedSharding(jax.sharding.get_abstract_mesh(), inner)
        )


def _to_mb(x: Any, s: Any, m: int, lead: int = 0) -> Any:
    """Split dim ``lead + s`` of ``x`` into microbatches, stacked at position ``lead``.

    Microbatch ``j`` holds rows ``j, j + m, j + 2m, ...`` (the microbatch index is the minor
    factor): a batch split over a data axis stays split within every microbatch, where
    contiguous microbatches would give the data axis to the microbatch index.
    """
    d = lead + s
    shape = (*x.shape[:d], x.shape[d] // m, m, *x.shape[d + 1 :])
    return jnp.moveaxis(x.reshape(shape), d + 1, lead)


def _from_mb(x: Any, s: Any, lead: int = 0) -> Any:
    """The inverse of ``_to_mb``."""
    d = lead + s
    x = jnp.moveaxis(x, lead, d + 1)
    return x.reshape((*x.shape[:d], x.shape[d] * x.shape[d + 1], *x.shape[d + 2 :]))


def _microbatch(x: Any, d: int, m: int, mb: Any) -> Any:
    """Microbatch ``mb`` of ``x`` along dim ``d`` (as ``_to_mb`` cuts them)."""
    x = x.reshape((*x.shape[:d], x.shape[d] // m, m, *x.shape[d + 1 :]))
    return jax.lax.dynamic_index_in_dim(x, mb, axis=d + 1, keepdims=False)


def gpipe_runner(mesh: Mesh, spec: PipelineSpec) -> ScanRunner:
    """A ``ScanRunner`` that runs a scan pipelined over ``spec.axis`` (GPipe)."""
    n_stages, m, axis = spec.stages, spec.microbatches, spec.axis

    def runner(step: Any, init: Any, xs: Any, *, length: int, reverse: bool = False, unroll=1):
        init, xs = list(init), list(xs)
        if length % n_stages:
            raise PipelineError(f"{n_stages} stages do not divide the scan's {length} layers")
        k = length // n_stages
        a = _analyse(step, init, [x[0] for x in xs], m)
        g, st = a.graph, a.state
        carry_st = [st[v] for v in g.inputs[: a.n_carry]]
        x_st = [st[v] for v in g.inputs[a.n_carry :]]
        y_st = [st[v] for v in g.outputs[a.n_carry :]]
        consts = [g.literal[v] for v in a.consts]
        c_st = [st[v] for v in a.consts]
        consts = [c if s is None else _to_mb(c, s, m) for c, s in zip(consts, c_st, strict=True)]
        inits = []
        for c, s in zip(init, carry_st, strict=True):
            if s == SUM:  # the whole init goes with microbatch 0, the others add to zero
                inits.append(jnp.zeros((m, *c.shape), c.dtype).at[0].set(c))
            elif s is None:
                inits.append(jnp.broadcast_to(c, (m, *c.shape)))
            else:
                inits.append(_to_mb(c, s, m))
        # (L, ...) -> (stages, L/stages, ...), microbatches of a split x after the stage dim
        staged = []
        for x, s in zip(xs, x_st, strict=True):
            x = x.reshape((n_stages, k, *x.shape[1:]))
            staged.append(x if s is None or s == SUM else _to_mb(x, s, m, lead=2).swapaxes(1, 2))

        def micro(carry: list[Any], x: list[Any], mb: Any, cs: list[Any]) -> Any:
            out = _evaluate(a, m, mb, cs, [*carry, *x], manual=axis)
            return out[: a.n_carry], out[a.n_carry :]

        if a.checkpoint is not None:  # keep a remat runner's jax.checkpoint around the step
            micro = jax.checkpoint(
                micro,
                prevent_cse=a.checkpoint.get("prevent_cse", True),
                policy=a.checkpoint.get("policy"),
            )

        def stages(cs: list[Any], inits: list[Any], xs_local: list[Any]):
            stage = jax.lax.axis_index(axis)
            pos = n_stages - 1 - stage if reverse else stage
            xs_local = [x[0] for x in xs_local]
            shapes = [c.shape[1:] for c in inits]
            state0 = [jnp.zeros(s, c.dtype) for s, c in zip(shapes, inits, strict=True)]
            done0 = [jnp.zeros_like(c) for c in inits]
            ys0 = []
            for v, s in zip(g.outputs[a.n_carry :], y_st, strict=True):
                small = _small(g.shapes[v], s, m)
                lead = (k,) if s == SUM or s is None else (m, k)
                ys0.append(jnp.zeros((*lead, *small), g.dtypes[v]))
            perm = [(i, i - 1 if reverse else i + 1) for i in range(n_stages)]
            perm = [(i, j) for i, j in perm if 0 <= j < n_stages]

            def tick(t: Any, loop: Any) -> Any:
                state, done, ys = loop
                mb = t - pos
                valid = (mb >= 0) & (mb < m)
                mbc = jnp.clip(mb, 0, m - 1)
                cs_mb = [c if s is None else c[mbc] for c, s in zip(cs, c_st, strict=True)]
                carry = [jnp.where(pos == 0, i[mbc], h) for i, h in zip(inits, state, strict=True)]
                x_mb = [
                    x if s is None or s == SUM else x[mbc]
                    for x, s in zip(xs_local, x_st, strict=True)
                ]
                carry, y = jax.lax.scan(
                    lambda c, x: micro(c, x, mbc, cs_mb), carry, x_mb, reverse=reverse
                )
                new_ys = []
                for buf, yv, s in zip(ys, y, y_st, strict=True):
                    if s == SUM:
                        new_ys.append(buf + jnp.where(valid, yv, jnp.zeros_like(yv)))
                    elif s is None:
                        new_ys.append(jnp.where(valid, yv, buf))
                    else:
                        old = buf[mbc]
                        new_ys.append(buf.at[mbc].set(jnp.where(valid, yv, old)))
                last = valid & (pos == n_stages - 1)
                done = [
                    d.at[mbc].set(jnp.where(last, c, d[mbc]))
                    for d, c in zip(done, carry, strict=False)
                ]
                state = [jax.lax.ppermute(c, axis, perm) for c in carry]
                return state, done, new_ys

            _, done, ys = jax.lax.fori_loop(0, m + n_stages - 1, tick, (state0, done0, ys0))
            return [d[None] for d in done], [y[None] for y in ys]

        lead = P(axis)
        run = jax.shard_map(
            stages,
            mesh=mesh,
            in_specs=([P()] * len(consts), [P()] * len(inits), [lead] * len(staged)),
            out_specs=([lead] * len(inits), [lead] * len(y_st)),
            axis_names=frozenset({axis}),
            check_vma=False,
        )
        done, ys = run(consts, inits, staged)
        last_stage = 0 if reverse else n_stages - 1
        carry_out = []
        for d, s in zip(done, carry_st, strict=True):
            d = d[last_stage]
            carry_out.append(d.sum(0) if s == SUM else d[-1] if s is None else _from_mb(d, s))
        ys_out = []
        for y, s in zip(ys, y_st, strict=True):
            if s is not None and s != SUM:
                y = _from_mb(y.swapaxes(1, 2), s, lead=2)
            ys_out.append(y.reshape((length, *y.shape[2:])))
        return carry_out, ys_out

    return runner


# -- which scans, and the plan -------------------------------------------------------------------
def layer_scans(graph: OpGraph, spec: PipelineSpec) -> list[int]:
    """The scan groups ``spec`` pipelines: ``spec.scans``, or every scan over stacked operands
    whose length ``spec.stages`` divides (the forward and backward layer scans)."""
    if spec.scans:
        return list(spec.scans)
    return [i for i, grp in enumerate(graph.scan_groups) if _stacked(grp) and _fits(grp, spec)]


def _stacked(group: ScanGroup) -> bool:
    return len(group.inputs) > group.num_consts + group.num_carry and group.length > 1


def _fits(group: ScanGroup, spec: PipelineSpec) -> bool:
    return group.length % spec.stages == 0


def pipeline_runners(graph: OpGraph, mesh: Mesh, spec: PipelineSpec) -> dict[int, ScanRunner]:
    """``{scan group: runner}`` running ``graph``'s layer scans pipelined (``Plan.jit``)."""
    _check_mesh(mesh, spec)
    runner = gpipe_runner(mesh, spec)
    return {i: runner for i in layer_scans(graph, spec)}


def _check_mesh(mesh: Mesh, spec: PipelineSpec) -> None:
    sizes = mesh_shape_of(mesh)
    if spec.axis not in sizes:
        raise PipelineError(
            f"pipeline axis {spec.axis!r} is not a mesh axis (the mesh has {list(sizes)}): "
            f"make a mesh with a {spec.axis!r} axis of {spec.stages}, e.g. "
            f"shardlab.mesh({spec.axis}={spec.stages}, data=...)"
        )
    if spec.stages != sizes[spec.axis]:
        raise PipelineError(
            f"stages={spec.stages} but mesh axis {spec.axis!r} has {sizes[spec.axis]} "
            f"devices: use stages={sizes[spec.axis]} (one stage per device of the axis)"
        )
    if spec.schedule not in PIPELINE_SCHEDULES:
        raise PipelineError(f"schedule {spec.schedule!r} is not one of {list(PIPELINE_SCHEDULES)}")
    v = spec.virtual_stages
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise PipelineError(f"virtual_stages={v!r}: use 1 or more model chunks per stage")
    if v > 1 and spec.schedule != "interleaved":
        raise PipelineError(
            f"virtual_stages={v} is for schedule='interleaved' (got {spec.schedule!r}); use "
            "schedule='interleaved' or virtual_stages=1"
        )
    if spec.microbatches < 1:
        raise PipelineError(f"microbatches={spec.microbatches}: use 1 or more")


def _batch_size(group: ScanGroup) -> tuple[int, tuple[int, ...]] | None:
    """The batch size of a layer scan (the first dim of its largest carry along which its
    body separates, as the runner finds it) and that carry's shape, or ``None``."""
    body = group.body
    carry = body.inputs[group.num_consts : group.num_consts + group.num_carry]
    arrays = [v for v in carry if body.shapes[v]]
    if not arrays:
        return None
    first = max(arrays, key=lambda v: len(body.shapes[v]))
    for dim, n in enumerate(body.shapes[first]):
        try:
            _states(body, {first: dim}, 1)
        except _NotSeparable:
            continue
        return n, tuple(body.shapes[first])
    return None


@dataclasses.dataclass(frozen=True)
class PipelineChoices:
    """The pipelines ``with_pipeline`` accepts for a function on a mesh (what the editor
    offers).

    Attributes:
        axis: the stage axis; ``axis_size`` its devices (0: the mesh has no such axis).
        layers: the layers of the first layer scan (0: no layer scan).
        stages: the valid stage counts (``with_pipeline`` needs one stage per device of the
            axis, dividing the layers): ``(axis_size,)`` or ``()``.
        microbatches: the valid microbatch counts (the divisors of the batch).
        reason: why ``stages`` is empty, in a sentence ("" when it is not).
    """

    axis: str
    axis_size: int
    layers: int
    stages: tuple[int, ...]
    microbatches: tuple[int, ...]
    reason: str = ""


def pipeline_choices(graph: OpGraph, mesh: Mesh, axis: str = "stage") -> PipelineChoices:
    """The stage and microbatch counts ``with_pipeline`` accepts for ``graph`` on ``mesh``."""
    size = int(mesh_shape_of(mesh).get(axis, 0))
    scans = [grp for grp in graph.scan_groups if _stacked(grp)]
    layers = scans[0].length if scans else 0
    batch = _batch_size(scans[0]) if scans else None
    micro = tuple(divisors(batch[0])) if batch is not None else (1,)
    reason = ""
    if not scans:
        reason = "no layer scan to pipeline (the layers must be one lax.scan over stacked params)"
    elif not size:
        reason = (
            f"the mesh has no {axis!r} axis: make it with one to pipeline, e.g. "
            f"shardlab.mesh({axis}=2, data={max(1, mesh.size // 2)})"
        )
    elif size < 2:
        reason = f"the {axis!r} axis has one device: make it 2 or more to pipeline"
    elif layers % size:
        valid = [d for d in divisors(layers) if d > 1]
        reason = (
            f"the {axis!r} axis has {size} devices, one stage each, but {size} stages do "
            f"not divide the {layers} layers; make the axis one of {valid}"
        )
    stages = () if reason else (size,)
    return PipelineChoices(axis, size, layers, stages, micro, reason)


def with_pipeline(plan: Any, spec: PipelineSpec) -> Any:
    """``plan`` with its layer scans pipelined as ``spec`` says.

    The stacked layer parameters (the scans' stacked operands that are arguments, and every
    argument and output of their shape: optimizer state, updated parameters) are split on
    the layer dim over ``spec.axis``; the rest of the plan is kept. ``plan.jit()`` and
    ``plan.verify()`` then run the pipelined program.

    Raises:
        PipelineError: the axis is missing or of another size, the stages do not divide
            the layers, the microbatches do not divide the batch, or there is no layer scan.
    """
    b = plan._bound()
    _check_mesh(b.mesh, spec)
    g = b.graph
    scans = [i for i, grp in enumerate(g.scan_groups) if _stacked(grp)]
    if not scans:
        raise PipelineError(
            "no layer scan to pipeline: the layers must be a jax.lax.scan over parameters "
            "stacked on a leading layer axis (flax nn.scan, nnx.scan, equinox filter_scan, "
            "or jax.lax.scan by hand); unrolled Python loops of identical blocks are not "
            "pipelined yet"
        )
    for i in spec.scans:
        if not 0 <= i < len(g.scan_groups):
            raise PipelineError(f"scan group {i} does not exist: the layer scans are {scans}")
    chosen = list(spec.scans) or scans
    for i in chosen:
        n = g.scan_groups[i].length
        if n % spec.stages:
            valid = [d for d in divisors(n) if d > 1]
            raise PipelineError(
                f"stages={spec.stages} does not divide the {n} layers of the layer scan: "
                f"valid stage counts are {valid}"
            )
    batch = _batch_size(g.scan_groups[chosen[0]])
    if batch is not None and batch[0] % spec.microbatches:
        n, shape = batch
        raise PipelineError(
            f"microbatches={spec.microbatches} does not divide the batch of {n} (the layer "
            f"scan's carry {shape}): valid microbatch counts are {divisors(n)}"
        )
    leaves = {v: k for k, v in enumerate(g.inputs)}
    stacked = {
        g.shapes[v]
        for i in chosen
        for v in g.scan_groups[i].inputs[g.scan_groups[i].num_consts + g.scan_groups[i].num_carry :]
        if v in leaves
    }

    def split(shapes: Sequence[tuple[int, ...]], specs: Sequence[Any]) -> tuple[Any, ...]:
        out = []
        for shape, lay in zip(shapes, specs, strict=True):
            if tuple(shape) in stacked and not lay[0]:
                # the stacked layers split over the stages; a split over the stage axis on
                # another dim (a ZeRO or tensor layout made on the whole mesh) moves here,
                # or every stage would gather every layer's state
                rest = [tuple(a for a in ax if a != spec.axis) for ax in lay[1:]]
                lay = ((spec.axis,), *rest)
            elif tuple(shape) not in stacked:
                # everything else is replicated over the stages: the batch (each stage runs
                # every microbatch in turn) and what lies outside the pipeline (a baseline
                # made on the whole mesh splits the batch over the stage axis too, and the
                # partitioner then gathers it for every stage: 4x the memory, measured)
                lay = tuple(tuple(a for a in ax if a != spec.axis) for ax in lay)
            out.append(lay)
        return tuple(out)

    notes = [
        f"pipelined: {spec.stages} stages over {spec.axis!r}, {spec.microbatches} microbatches"
    ]
    if spec.schedule in ("1f1b", "interleaved"):
        notes.append(
            f"{spec.schedule} runs as GPipe: one SPMD jit cannot interleave the forward and "
            "backward scans; its step time is the simulated schedule's, its memory the "
            "GPipe loop's it runs"
        )
    new = dataclasses.replace(
        plan,
        pipeline=spec,
        input_specs=split(plan.input_shapes, plan.input_specs),
        output_specs=split(plan.output_shapes, plan.output_specs),
        notes=(*plan.notes, *notes),
    )
    # Trace once (no compile): a step that cannot be microbatched fails here, not in jit.
    jax.eval_shape(new.function(dynamic=True), *b.traced.dynamic_args)
    return _priced(new, plan, spec)


def _priced(new: Any, plan: Any, spec: PipelineSpec) -> Any:
    """``new`` with the schedule simulator's cost (``cost/pipeline.py``) of running
    ``plan`` pipelined by ``spec``: step time with the bubbles, collective-permutes, the
    stage's share of the arguments and its in-flight residuals (the remat policy of
    ``plan`` included), where the unpipelined plan's cost would mislead every view."""
    try:
        priced = predict_pipeline(plan, spec, device=plan.cost.device)
    except SearchError as e:
        note = f"not priced as a pipeline ({e}): the cost shown is the unpipelined plan's"
        return dataclasses.replace(new, notes=(*new.notes, note))
    return dataclasses.replace(new, cost=priced.cost, notes=(*new.notes, *priced.notes))
