"""Bytes an operation moves through memory (``traffic``): materialised operands and results
move, fused values and literals do not (``moved``); a slice, an in-place update and a
scan's own indexing move less (``SLICING``, ``UPDATING``, ``IN_PLACE``).
"""

from __future__ import annotations

from collections.abc import Sequence

from shardlab.parallel.cost.memory.live_ranges import Liveness
from shardlab.parallel.graph.opgraph import Node, OpGraph


def moved(lv: Liveness, inputs: frozenset[int] | set[int], var: int, literal: bool) -> bool:
    """Whether an operation reading or writing ``var`` moves it through memory: arguments
    and materialised values do; fused values and literals stay in registers."""
    return not literal and (var in lv.materialized or var in inputs)


SLICING = frozenset("slice dynamic_slice gather".split())
UPDATING = frozenset("dynamic_update_slice scatter scatter-add scatter_add".split())
IN_PLACE = frozenset(("scan_slice", "scan_stack"))  # a scan's own indexing: no copies


def traffic(
    graph: OpGraph,
    lv: Liveness,
    args: frozenset[int],
    node: Node,
    in_bytes: Sequence[int],
    out_bytes: Sequence[int],
) -> int:
    """Bytes an operation moves through memory, given its operands' and results' per-device
    bytes: materialised operands read and results written; a slice reads only what it keeps
    (and usually fuses into its consumer), and an in-place update (``dynamic_update_slice``,
    a scan's stacked output) writes only the update. A scan reads its stacked operands and
    writes its stacked results in place: the unrolled ``scan_slice``/``scan_stack`` nodes
    move nothing themselves."""
    if node.primitive in IN_PLACE:
        return 0
    if node.primitive in SLICING:
        return sum(out_bytes)
    if node.primitive in UPDATING:
        return sum(in_bytes[1:])
    total = sum(
        b
        for v, b in zip(node.inputs, in_bytes, strict=True)
        if moved(lv, args, v, graph.literal[v] is not None)
    )
    total += sum(
        b for v, b in zip(node.outputs, out_bytes, strict=True) if moved(lv, args, v, False)
    )
    return total
