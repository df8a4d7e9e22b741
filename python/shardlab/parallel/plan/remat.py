"""Rematerialisation of a plan's layer scans: keep less for the backward scan, recompute it.

A train step of a model whose layers are one ``lax.scan`` over stacked parameters has two
scans in its jaxpr: the forward one, whose stacked outputs (``ys``) are the residuals the
backward needs, and the reverse one that reads them as its stacked inputs. With a policy
other than ``none`` the forward runner keeps only what the policy saves, stacked per layer:

* ``nothing`` (``jax.checkpoint_policies.nothing_saveable``): each layer's input carry;
* ``dots`` (``dots_saveable``): that, and the residuals that are ``dot_general`` outputs
  (through reshapes, transposes and converts) in the scan's body.

The dropped residuals leave the forward scan as cheap placeholders (a broadcast zero nothing
reads, so the compiler removes it). The backward runner takes the saved stacks as extra
stacked inputs and, inside its step, re-evaluates the forward body's equations that the
dropped residuals need — only those, starting from the layer's saved input, its parameters
and the kept matmul outputs — then runs the original backward step on the full residuals.
The equations are the original ones, so the numbers are the original program's.

Both runners call the scan's base runner (``plan/pipeline.py``) where the plan has one, so
remat composes with pipelining. The pairing of the two scans comes from the graph's
dataflow; a residual read outside the backward scan is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from shardlab.parallel.errors import SearchError
from shardlab.parallel.graph.interpret import ScanRunner
from shardlab.parallel.graph.opgraph import OpGraph, ScanGroup
from shardlab.parallel.records import RematSpec

POLICIES = ("none", "dots", "nothing")
# Ops a matmul output may pass through and still count as "the matmul's output".
_VIEWS = frozenset("reshape transpose squeeze expand_dims convert_element_type copy".split())

NO_LAYER_SCAN = (
    "no layer scan to rematerialise: remat applies to layers written as one lax.scan over "
    "stacked parameters (flax nn.scan, nnx.scan, equinox's scan-over-layers, or "
    "jax.lax.scan by hand) in a train step, where the forward scan's stacked outputs feed "
    "a backward scan. Python loops of blocks are not rematerialised yet; wrap each block in "
    "jax.checkpoint(block, policy=jax.checkpoint_policies.nothing_saveable) in your code "
    "instead."
)


@dataclasses.dataclass(frozen=True)
class LayerScan:
    """A forward layer scan and the backward scan that reads its residuals.

    Attributes:
        forward: the forward scan's group index.
        backward: the backward scan's group index.
        residuals: per ``ys`` position of the forward scan read by the backward one, the
            ``xs`` positions of the backward scan that read it.
        dots: the residual ``ys`` positions that are matmul outputs.
    """

    forward: int
    backward: int
    residuals: dict[int, tuple[int, ...]]
    dots: frozenset[int]

    def kept(self, policy: str) -> frozenset[int]:
        """The residual ``ys`` positions the policy keeps."""
        if policy == "none":
            return frozenset(self.residuals)
        return self.dots if policy == "dots" else frozenset()


def check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise SearchError(
            f"unknown remat policy {policy!r}: use one of {', '.join(map(repr, POLICIES))}"
        )


def layer_scans(graph: OpGraph) -> dict[int, LayerScan]:
    """``{forward group: LayerScan}`` for the scans whose residuals feed a backward scan.

    Raises:
        SearchError: a residual is also read outside the backward scan.
    """
    owner: dict[int, int] = {}  # node index -> scan group
    for k, g in enumerate(graph.scan_groups):
        for i in range(g.start, g.end):
            owner[i] = k
    out: dict[int, LayerScan] = {}
    for f, fwd in enumerate(graph.scan_groups):
        ys = fwd.outputs[fwd.num_carry :]
        readers: dict[int, set[int]] = {}
        for k, v in enumerate(ys):
            groups = {owner.get(i, -1) for i in graph.consumers(v)}
            readers[k] = groups
        backs = {b for gs in readers.values() for b in gs if b >= 0 and b != f}
        backs = {b for b in backs if graph.scan_groups[b].length == fwd.length}
        if len(backs) != 1:
            continue
        (b,) = backs
        bwd = graph.scan_groups[b]
        xs_b = bwd.inputs[bwd.num_consts + bwd.num_carry :]
        residuals: dict[int, tuple[int, ...]] = {}
        for k, v in enumerate(ys):
            if b not in readers[k]:
                continue
            others = [i for i in graph.consumers(v) if owner.get(i, -1) != b]
            if others or v in graph.outputs:
                where = graph.nodes[others[0]].primitive if others else "an output"
                raise SearchError(
                    f"scan group {f}'s residual {k} (shape {graph.shapes[v]}) is read by the "
                    f"backward scan {b} and also by {where}: it cannot be dropped and "
                    "recomputed; use remat policy 'none' for this function"
                )
            residuals[k] = tuple(j for j, u in enumerate(xs_b) if u == v)
        if residuals:
            out[f] = LayerScan(f, b, residuals, _dot_outputs(fwd))
    return out


def _dot_outputs(group: ScanGroup) -> frozenset[int]:
    body = group.body
    out = set()
    for k, v in enumerate(body.outputs[group.num_carry :]):
        while True:
            i = body.producer(v)
            if i < 0:
                break
            node = body.nodes[i]
            if node.primitive == "dot_general":
                out.add(k)
                break
            if node.primitive not in _VIEWS:
                break
            v = node.inputs[0]
    return frozenset(out)


def selected_scans(graph: OpGraph, spec: RematSpec) -> dict[int, LayerScan]:
    """The layer scans ``spec`` applies to, checked.

    Raises:
        SearchError: an unknown policy, no layer scan, or a scan index that is not one.
    """
    check_policy(spec.policy)
    found = layer_scans(graph)
    if not found:
        raise SearchError(NO_LAYER_SCAN)
    for s in spec.scans:
        if s not in found:
            raise SearchError(
                f"scan group {s!r} is not a forward layer scan: the forward layer scans of "
                f"this function are {sorted(found)} (of {len(graph.scan_groups)} scan groups)"
            )
    return {f: found[f] for f in (spec.scans or sorted(found))}


def remat_runners(
    graph: OpGraph, spec: RematSpec, base: Mapping[int, ScanRunner]
) -> dict[int, ScanRunner]:
    """Runners for the forward and backward scans of each layer scan ``spec`` names, wrapping
    ``base``'s runner of the group (``jax.lax.scan`` where it has none); ``base``'s other
    runners are kept."""
    runners = dict(base)
    if spec.policy == "none":
        check_policy(spec.policy)
        return runners
    for pair in selected_scans(graph, spec).values():
        state: dict[str, Any] = {}
        f, b = pair.forward, pair.backward
        fwd_base = base.get(f, jax.lax.scan)
        bwd_base = base.get(b, jax.lax.scan)
        runners[f] = _forward_runner(graph.scan_groups[f], pair, spec.policy, state, fwd_base)
        runners[b] = _backward_runner(graph, pair, spec.policy, state, bwd_base)
    return runners


def _forward_runner(
    group: ScanGroup, pair: LayerScan, policy: str, state: dict[str, Any], run: ScanRunner
) -> ScanRunner:
    kept = pair.kept(policy)
    dropped = [k for k in pair.residuals if k not in kept]

    def runner(step: Any, init: Any, xs: Any, *, length: int, reverse: bool, unroll: Any):
        state["consts"] = _consts_of(step)
        state["xs"] = list(xs)

        def saving(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
            new, ys = step(carry, x)
            out = [y for k, y in enumerate(ys) if k not in dropped]
            return new, [*out, *carry]  # the layer's input carry, stacked

        carry, saved = run(saving, init, xs, length=length, reverse=reverse, unroll=unroll)
        n_ys = len(group.outputs) - group.num_carry
        kept_ys = iter(saved[: n_ys - len(dropped)])
        state["inputs"] = list(saved[n_ys - len(dropped) :])
        ys = []
        for k, v in enumerate(group.outputs[group.num_carry :]):
            if k in dropped:  # nothing reads it: the backward runner recomputes it
                shape, dtype = group.body.shapes[group.body.outputs[group.num_carry + k]], None
                dtype = group.body.dtypes[group.body.outputs[group.num_carry + k]]
                ys.append(jnp.zeros((length, *shape), dtype))
            else:
                ys.append(next(kept_ys))
            del v
        return carry, ys

    return runner


def _consts_of(step: Any) -> list[Any]:
    """The forward step's closed-over constants (the interpreter's ``_scan`` step reads them
    from its ``consts`` cell): what the recomputation needs besides the saved stacks."""
    names = step.__code__.co_freevars
    if "consts" not in names or step.__closure__ is None:
        raise SearchError(
            "remat: the forward scan's step does not close over its constants; the "
            "interpreter's ScanRunner protocol changed (graph/interpret.py _scan)"
        )
    return list(step.__closure__[names.index("consts")].cell_contents)


def _backward_runner(
    graph: OpGraph, pair: LayerScan, policy: str, state: dict[str, Any], run: ScanRunner
) -> ScanRunner:
    fwd = graph.scan_groups[pair.forward]
    bwd = graph.scan_groups[pair.backward]
    body = fwd.body
    kept = pair.kept(policy)
    dropped = {k for k in pair.residuals if k not in kept}
    ys_f = body.outputs[fwd.num_carry :]
    # backward xs position -> forward ys position (dropped residuals only)
    slot = {j: k for k, js in pair.residuals.items() if k in dropped for j in js}
    # forward xs also read by the backward scan (the stacked parameters, usually)
    xs_f = fwd.inputs[fwd.num_consts + fwd.num_carry :]
    xs_b = list(bwd.inputs[bwd.num_consts + bwd.num_carry :])
    shared = {i: xs_b.index(u) for i, u in enumerate(xs_f) if u in xs_b}
    # kept residuals: forward body var -> backward xs position (to start recomputing from)
    known = {ys_f[k]: js[0] for k, js in pair.residuals.items() if k in kept and js}
    order = _needed(body, [ys_f[k] for k in sorted(dropped)], set(known) | set(body.inputs))

    def runner(step: Any, init: Any, xs: Any, *, length: int, reverse: bool, unroll: Any):
        if "inputs" not in state:
            raise SearchError(
                f"remat: the backward scan {pair.backward} ran before its forward scan "
                f"{pair.forward}"
            )
        xs = list(xs)
        own = [j for j in range(len(xs)) if j not in slot]
        extra_f = [i for i in range(len(xs_f)) if i not in shared]
        stacked = [xs[j] for j in own] + state["inputs"] + [state["xs"][i] for i in extra_f]
        consts = state["consts"]
        n_own, n_in = len(own), len(state["inputs"])

        def recomputing(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
            full: list[Any] = [None] * len(xs)
            for j, v in zip(own, x[:n_own], strict=True):
                full[j] = v
            inputs = x[n_own : n_own + n_in]
            extras = dict(zip(extra_f, x[n_own + n_in :], strict=True))
            layer_x = [full[shared[i]] if i in shared else extras[i] for i in range(len(xs_f))]
            env = dict(zip(body.inputs, [*consts, *inputs, *layer_x], strict=True))
            env.update({v: full[j] for v, j in known.items()})
            for i in order:
                node = body.nodes[i]
                outs = _bind(
                    node.eqn, [env[v] if v in env else body.literal[v] for v in node.inputs]
                )
                env.update(zip(node.outputs, outs, strict=True))
            for j, k in slot.items():
                v = ys_f[k]
                full[j] = env[v] if v in env else body.literal[v]
            return step(carry, full)

        return run(recomputing, init, stacked, length=length, reverse=reverse, unroll=unroll)

    return runner


def _needed(body: OpGraph, targets: Sequence[int], available: set[int]) -> list[int]:
    """Body node indices (program order) needed to compute ``targets`` from ``available``."""
    need: set[int] = set()
    stack = [v for v in targets if v not in available]
    seen: set[int] = set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        i = body.producer(v)
        if i < 0:
            continue
        need.add(i)
        stack.extend(u for u in body.nodes[i].inputs if u not in available)
    return sorted(need)


def _bind(eqn: Any, invals: Sequence[Any]) -> list[Any]:
    got = eqn.primitive.get_bind_params(eqn.params)
    subfuns, params = got if isinstance(got, tuple) else ((), got)
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*subfuns, *invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]
