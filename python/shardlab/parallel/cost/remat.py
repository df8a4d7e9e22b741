"""What rematerialising a plan's layer scans saves in memory and costs in recompute.

A train step over scanned layers holds, when its backward scan starts, the forward scan's
stacked residuals (``ys``): per layer, every intermediate the backward needs. A remat policy
(``plan/remat.py``) keeps only some of them — ``dots``: the matmul outputs, ``nothing``:
none — plus each layer's input carry, and the backward scan recomputes the rest one layer at
a time. So per device, the plan's memory model is walked again with the dropped residual
stacks taking no bytes and one of them holding the saved layer inputs (the peak moves, and
output buffers host what they can); the backward's slices of the dropped stacks remain one
layer's recomputed buffers. Without that walk (``estimate`` not given), against the plain
step's ``memory_estimate``:

    temp' = temp − Σ dropped residual stacks + Σ saved input stacks + the largest dropped
            residual of one layer (recomputed inside the backward step)

The extra work is the forward body's equations those residuals need, once per layer
(``rule.flops`` per node, split as the plan splits each node's output; its roofline time
from the propagation's per-node spans). Arguments and outputs do not change.

The pairing of each forward layer scan with the backward scan reading its residuals is
dataflow in the op graph (``layer_scans``); the runners use the same pairing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from shardlab.parallel.cost import layouts as L
from shardlab.parallel.cost.propagate import Propagation
from shardlab.parallel.errors import SearchError
from shardlab.parallel.graph.opgraph import OpGraph, ScanGroup
from shardlab.parallel.graph.rules import rule_for
from shardlab.parallel.records import DeviceMemoryEstimate, RematSpec, _Record

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
        forward: the forward scan's group index (``OpGraph.scan_groups``).
        backward: the backward scan's group index.
        residuals: per ``ys`` position of the forward scan read by the backward one, the
            ``xs`` positions of the backward scan that read it.
        dots: the residual ``ys`` positions that are matmul outputs (through views).
    """

    forward: int
    backward: int
    residuals: dict[int, tuple[int, ...]]
    dots: frozenset[int]

    def kept(self, policy: str) -> frozenset[int]:
        """The residual ``ys`` positions ``policy`` keeps."""
        if policy == "none":
            return frozenset(self.residuals)
        return self.dots & frozenset(self.residuals) if policy == "dots" else frozenset()

    def dropped(self, policy: str) -> tuple[int, ...]:
        """The residual ``ys`` positions ``policy`` recomputes."""
        kept = self.kept(policy)
        return tuple(k for k in sorted(self.residuals) if k not in kept)


def check_policy(policy: str) -> None:
    """Raises ``SearchError`` naming the valid policies."""
    if policy not in POLICIES:
        raise SearchError(
            f"unknown remat policy {policy!r}: use one of {', '.join(map(repr, POLICIES))}"
        )


def layer_scans(graph: OpGraph) -> dict[int, LayerScan]:
    """``{forward group: LayerScan}``: the scans whose stacked outputs feed one backward
    scan of the same length.

    Raises:
        SearchError: a residual is also read outside the backward scan (or is an output).
    """
    owner: dict[int, int] = {}  # node index -> scan group
    for k, g in enumerate(graph.scan_groups):
        for i in range(g.start, g.end):
            owner[i] = k
    out: dict[int, LayerScan] = {}
    for f, fwd in enumerate(graph.scan_groups):
        ys = fwd.outputs[fwd.num_carry :]
        readers = [{owner.get(i, -1) for i in graph.consumers(v)} for v in ys]
        backs = {b for gs in readers for b in gs if b >= 0 and b != f}
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
                where = (
                    f"node {others[0]} ({graph.nodes[others[0]].primitive})"
                    if others
                    else "an output"
                )
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
    """The residuals ``dots`` keeps: a matmul's output, seen through views and a bias add
    (``dot + bias``: autodiff saves the sum, ``dots_saveable`` the matmul's output of the
    same size, from which the backward adds the bias again)."""
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
            if node.primitive in _VIEWS:
                v = node.inputs[0]
            elif (bias := _biased(body, node)) is not None:
                v = bias
            else:
                break
    return frozenset(out)


def _biased(body: OpGraph, node: Any) -> int | None:
    """For ``x + b`` with ``b`` smaller than ``x`` (a bias broadcast along ``x``), ``x``."""
    if node.primitive not in ("add", "add_any") or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    size = math.prod(body.shapes[node.outputs[0]])
    full = [u for u in (a, b) if math.prod(body.shapes[u]) == size]
    if len(full) != 1:
        return None
    other = b if full[0] == a else a
    producer = body.producer(other)
    small = math.prod(body.shapes[other]) < size or (
        producer >= 0
        and body.nodes[producer].primitive == "broadcast_in_dim"
        and math.prod(body.shapes[body.nodes[producer].inputs[0]]) < size
    )
    return full[0] if small else None


def selected_scans(graph: OpGraph, spec: RematSpec) -> dict[int, LayerScan]:
    """The layer scans ``spec`` applies to (all of them when ``spec.scans`` is empty).

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


def recomputed_nodes(group: ScanGroup, pair: LayerScan, policy: str) -> list[int]:
    """Body node indices (program order) the backward step re-evaluates: what the dropped
    residuals need, from the layer's inputs and the kept residuals."""
    body = group.body
    ys = body.outputs[group.num_carry :]
    available = set(body.inputs) | {ys[k] for k in pair.kept(policy)}
    need: set[int] = set()
    stack = [ys[k] for k in pair.dropped(policy) if ys[k] not in available]
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


@dataclasses.dataclass(frozen=True)
class RematCost(_Record):
    """The cost model's account of a remat policy on a plan (per device).

    Attributes:
        policy: the policy.
        scans: the forward layer scans it applies to.
        memory: the predicted memory with remat.
        dropped_bytes: residual stacks no longer held.
        saved_bytes: stacks held instead (each layer's input carry).
        recompute_bytes: the largest recomputed residual of one layer: the rest fuse into
            the backward step's own loops (measured: ``docs/design/remat.md``).
        recompute_flops: extra flops (the recomputed equations, all layers).
        recompute_time: their roofline seconds.
    """

    policy: str
    scans: tuple[int, ...]
    memory: DeviceMemoryEstimate
    dropped_bytes: int
    saved_bytes: int
    recompute_bytes: int
    recompute_flops: float
    recompute_time: float


def remat_cost(
    graph: OpGraph,
    prop: Propagation,
    sizes: Mapping[str, int],
    memory: DeviceMemoryEstimate,
    spec: RematSpec,
    estimate: Callable[[Mapping[int, int]], DeviceMemoryEstimate] | None = None,
) -> RematCost:
    """Predicted per-device memory and extra recompute of ``spec`` on a plan.

    Args:
        graph: the plan's op graph (scans unrolled).
        prop: the plan's propagation (layouts, per-node spans).
        sizes: ``{mesh axis: size}``.
        memory: the plan's memory estimate without remat (``memory_estimate``).
        spec: the remat spec.
        estimate: the plan's memory model re-run with some variables' per-device bytes
            replaced (``predict.memory_estimate(..., overrides=...)``). Given, the remat
            memory is that walk with the dropped residual stacks taking no bytes and one of
            them holding the saved layer inputs instead: the peak moves and output buffers
            host what they can, as compiled. Without it, the module docstring's formula.

    Raises:
        SearchError: as ``selected_scans``.
    """

    def local(v: int) -> int:
        dims = prop.layouts[v] or L.replicated(len(graph.shapes[v]))
        return L.local_bytes(graph.nbytes(v), dims, prop.sizes_or(sizes))

    if spec.policy == "none":
        check_policy(spec.policy)
        return RematCost("none", (), memory, 0, 0, 0, 0.0, 0.0)
    pairs = selected_scans(graph, spec)
    seconds = {i: s for i, _, _, s in prop.spans}
    dropped = saved = layer = 0
    flops = time = 0.0
    overrides: dict[int, int] = {}
    for f, pair in pairs.items():
        group = graph.scan_groups[f]
        ys = group.outputs[group.num_carry :]
        gone = pair.dropped(spec.policy)
        sizes_ = [local(ys[k]) for k in gone]
        dropped += sum(sizes_)
        layer = max(layer, max(sizes_, default=0) // group.length)
        kept = sum(local(v) for v in group.outputs[: group.num_carry]) * group.length
        saved += kept
        for n, k in enumerate(gone):  # every iteration's version of the stacked buffer
            for stacks in group.stacks:
                overrides[graph.nodes[stacks[k]].outputs[0]] = kept if n == 0 else 0
        for k in recomputed_nodes(group, pair, spec.policy):
            for start in group.iteration_starts:
                node = graph.nodes[start + k]
                flops += _node_flops(graph, node.index, local)
                time += seconds.get(node.index, 0.0)
    if estimate is not None and overrides:
        predicted = estimate(overrides)
    else:
        temp = max(0, memory.activations - dropped + saved + layer)
        predicted = dataclasses.replace(
            memory, activations=temp, peak=memory.parameters + memory.outputs + temp
        )
    return RematCost(spec.policy, tuple(pairs), predicted, dropped, saved, layer, flops, time)


def _node_flops(graph: OpGraph, i: int, local: Callable[[int], int]) -> float:
    """Per-device flops of node ``i``: the rule's, split as its first output is split."""
    node = graph.nodes[i]
    whole = rule_for(node, graph).flops
    if not node.outputs:
        return whole
    v = node.outputs[0]
    share = local(v) / graph.nbytes(v) if graph.nbytes(v) else 1.0
    return whole * share
