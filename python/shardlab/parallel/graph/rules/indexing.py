"""Indexing: slices, dynamic (update) slices, gather and scatter. Dimensions taken whole
pass through; a gather's indexed dimensions stay whole (no masked lookups); scatter-add over a
sharded index dimension leaves partial sums, and into a split row-indexed dimension is masked
(every device scatters the updates that fall in its rows).
"""

from __future__ import annotations

import dataclasses

from shardlab.parallel.graph.opgraph import Node, OpGraph
from shardlab.parallel.graph.rules.base import (
    Dim,
    Factors,
    OpRule,
    RuleFn,
    replicated_rule,
    shape_of,
    size_of,
)


def _dynamic_slice(node: Node, g: OpGraph) -> OpRule:
    ins, out = shape_of(g, node.inputs[0]), shape_of(g, node.outputs[0])
    f = Factors()
    dims = [f.new(s) if s == o else () for s, o in zip(ins, out, strict=True)]
    idx = tuple(tuple(() for _ in shape_of(g, v)) for v in node.inputs[1:])
    return OpRule((tuple(dims), *idx), (tuple(dims),), tuple(f.sizes))


def _slice(node: Node, g: OpGraph) -> OpRule:
    """Static slice: dimensions taken whole (start 0, full size, stride 1) pass through."""
    ins, out = shape_of(g, node.inputs[0]), shape_of(g, node.outputs[0])
    strides = node.params.get("strides") or (1,) * len(ins)
    f = Factors()
    dims = [
        f.new(s) if s == o and start == 0 and step == 1 else ()
        for s, o, start, step in zip(ins, out, node.params["start_indices"], strides, strict=True)
    ]
    return OpRule((tuple(dims),), (tuple(dims),), tuple(f.sizes))


def _dynamic_update_slice(node: Node, g: OpGraph) -> OpRule:
    ins, upd = shape_of(g, node.inputs[0]), shape_of(g, node.inputs[1])
    f = Factors()
    dims = [f.new(s) if s == u else () for s, u in zip(ins, upd, strict=True)]
    idx = tuple(tuple(() for _ in shape_of(g, v)) for v in node.inputs[2:])
    return OpRule((tuple(dims), tuple(dims), *idx), (tuple(dims),), tuple(f.sizes))


def _gather_like(node: Node, g: OpGraph) -> OpRule:
    """scatter (and gathers of unusual form): conservatively replicated."""
    return dataclasses.replace(replicated_rule(node, g), known=True)


def _gather(node: Node, g: OpGraph) -> OpRule:
    """gather: index batch dims pass through to the result; fully sliced operand dims that
    are not indexed pass through too; indexed dims stay whole (no masked lookups)."""
    dn = node.params["dimension_numbers"]
    operand, indices = shape_of(g, node.inputs[0]), shape_of(g, node.inputs[1])
    out = shape_of(g, node.outputs[0])
    f = Factors()
    op_dims: list[Dim] = [()] * len(operand)
    idx_dims: list[Dim] = [()] * len(indices)
    out_dims: list[Dim] = [()] * len(out)
    batch_pos = [i for i in range(len(out)) if i not in dn.offset_dims]
    if len(batch_pos) != len(indices) - 1:
        return _gather_like(node, g)
    for j, pos in enumerate(batch_pos):
        idx_dims[j] = out_dims[pos] = d = f.new(indices[j])
        if j in dn.start_indices_batching_dims:
            k = dn.operand_batching_dims[dn.start_indices_batching_dims.index(j)]
            if operand[k] != indices[j]:
                return _gather_like(node, g)
            op_dims[k] = d
    skip = set(dn.collapsed_slice_dims) | set(dn.operand_batching_dims)
    window = [i for i in range(len(operand)) if i not in skip]
    for i, pos in zip(window, dn.offset_dims, strict=True):
        full = node.params["slice_sizes"][i] == operand[i] and i not in dn.start_index_map
        if full:
            op_dims[i] = out_dims[pos] = f.new(operand[i])
    extra = tuple(tuple(() for _ in shape_of(g, v)) for v in node.inputs[2:])
    return OpRule((tuple(op_dims), tuple(idx_dims), *extra), (tuple(out_dims),), tuple(f.sizes))


def _scatter_add(node: Node, g: OpGraph) -> OpRule:
    """scatter-add: update windows that cover whole operand dims pass through; sharding the
    scattered (index batch) dims leaves partial sums of the result; a dimension indexed one
    row at a time may be split (masked: indices and updates whole there)."""
    dn = node.params["dimension_numbers"]
    operand, indices = shape_of(g, node.inputs[0]), shape_of(g, node.inputs[1])
    updates = shape_of(g, node.inputs[2])
    f = Factors()
    op_dims: list[Dim] = [()] * len(operand)
    idx_dims: list[Dim] = [()] * len(indices)
    upd_dims: list[Dim] = [()] * len(updates)
    reduction: set[int] = set()
    scatter_pos = [i for i in range(len(updates)) if i not in dn.update_window_dims]
    if len(scatter_pos) != len(indices) - 1:
        return _gather_like(node, g)
    for j, pos in enumerate(scatter_pos):
        idx_dims[j] = upd_dims[pos] = d = f.new(indices[j])
        if j in dn.scatter_indices_batching_dims:
            k = dn.operand_batching_dims[dn.scatter_indices_batching_dims.index(j)]
            if operand[k] != indices[j]:
                return _gather_like(node, g)
            op_dims[k] = d
        else:
            reduction.update(d)
    skip = set(dn.inserted_window_dims) | set(dn.operand_batching_dims)
    window = [i for i in range(len(operand)) if i not in skip]
    for i, pos in zip(window, dn.update_window_dims, strict=True):
        if updates[pos] == operand[i] and i not in dn.scatter_dims_to_operand_dims:
            op_dims[i] = upd_dims[pos] = f.new(operand[i])
    for i in dn.scatter_dims_to_operand_dims:
        # A row-indexed dimension may be split: each device scatters every update whose
        # index falls in its rows (the partitioner's masked scatter: indices shifted by
        # the shard's offset, the others dropped), so indices and updates are whole there.
        if i in dn.inserted_window_dims and not op_dims[i]:
            op_dims[i] = f.new(operand[i])
    return OpRule(
        (tuple(op_dims), tuple(idx_dims), tuple(upd_dims)),
        (tuple(op_dims),),
        tuple(f.sizes),
        frozenset(reduction),
        flops=size_of(updates),
    )


RULES: dict[str, RuleFn] = {
    "dynamic_slice": _dynamic_slice,
    "slice": _slice,
    "dynamic_update_slice": _dynamic_update_slice,
    "gather": _gather,
    "scatter": _gather_like,
    "scatter-add": _scatter_add,
    "scatter_add": _scatter_add,
}
