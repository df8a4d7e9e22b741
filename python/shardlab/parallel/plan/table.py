"""``Plan.table()``: what the plan chose per operation, and why, in rows a person reads.

- Operations that only follow their operands (an ``add`` or ``mul`` whose output keeps the
  layout of its inputs) are folded into one row per source line and layout
  (``sub, mul ×2, add_any``): they are consequences, not decisions.
- Where a cheaper alternative was passed over, the row says why: the op follows its
  operands, or the cheaper split costs more in the ops around it (a row prices only its own
  op and the resharding from its producers; the search priced the whole program).
- Inputs show their spec as written (``P('data')``) and JAX's type notation of the split
  (``[64@data,256]``; a plan records shapes, not dtypes).
- A plan made without a search (a baseline ``auto`` returned) has no decisions: its table
  lists its input layouts and the collectives the cost model expects, by source line.

Everything is read from the plan's own fields, so a loaded plan's table is the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardlab.parallel.cost.profiles import comm_time
from shardlab.parallel.display import PlanTable, human_bytes
from shardlab.parallel.labels import path_label, source_label, spec_label, typed_shape
from shardlab.parallel.records import Collective, PlanRow

HEADERS = ("op", "where", "chosen", "cost (µs)", "alternatives (µs)", "why")
FOLLOWS = "follows its operands"
FOLLOW_MANY = "follow their operands"
AROUND = "a cheaper split here costs more in resharding around it"
USED_BY = "fits the ops that use it: the cheaper layout would be resharded for them"


def following(chosen: str) -> str | None:
    """The layout of an op whose output keeps its operands' layout (``A <- A · A``), else
    None (a split that changes layout, sums partial results, or reads scalars)."""
    out, arrow, ins = chosen.partition(" <- ")
    if not arrow or "[" in ins or ins == "scalars":
        return None
    operands = ins.split(" · ")
    return out if all(o == out for o in operands) else None


def _input_text(plan: Any, path: str, chosen: str) -> str:
    try:
        i = plan.input_paths.index(path)
    except ValueError:
        return chosen
    spec = spec_label(_trimmed(plan.input_specs[i]))
    return f"{spec} {typed_shape('', plan.input_shapes[i], plan.input_specs[i])}"


def _trimmed(dim_axes: Sequence[Sequence[str]]) -> list[Sequence[str]]:
    axes = list(dim_axes)
    while axes and not axes[-1]:
        axes.pop()
    return axes


def _why(row: PlanRow) -> str:
    cheaper = [c for _, c in row.alternatives if c < row.cost * (1 - 1e-9)]
    if not cheaper:
        return ""
    if row.op == "input":
        return USED_BY
    if following(row.chosen) is not None:
        return f"{FOLLOWS}: {AROUND}"
    return AROUND


def _alternatives(row: PlanRow) -> str:
    return (
        "; ".join(
            f"{spec_label(a) if a.startswith('P(') else a} {c * 1e6:.2f}"
            for a, c in row.alternatives
        )
        or "-"
    )


def _op_list(ops: Sequence[str]) -> str:
    counts: dict[str, int] = {}
    for op in ops:
        counts[op] = counts.get(op, 0) + 1
    return ", ".join(op if n == 1 else f"{op} ×{n}" for op, n in counts.items())


def searched_rows(plan: Any) -> list[tuple[float, tuple[str, ...]]]:
    """``(cost, cells)`` per decision, trivially following ops folded per line and layout."""
    out: list[tuple[float, tuple[str, ...]]] = []
    folded: dict[tuple[str, str], list[PlanRow]] = {}
    for r in plan.rows:
        layout = following(r.chosen) if r.op != "input" else None
        if layout is not None:
            folded.setdefault((r.where, layout), []).append(r)
            continue
        if r.op == "input":
            where, chosen = path_label(r.where), _input_text(plan, r.where, r.chosen)
        else:
            where, chosen = source_label(r.where), r.chosen
        cells = (r.op, where, chosen, f"{r.cost * 1e6:.2f}", _alternatives(r), _why(r))
        out.append((r.cost, cells))
    for (where, layout), members in folded.items():
        cost = sum(m.cost for m in members)
        if len(members) == 1:
            r = members[0]
            cells = (
                r.op,
                source_label(where),
                r.chosen,
                f"{cost * 1e6:.2f}",
                _alternatives(r),
                _why(r) or FOLLOWS,
            )
        else:
            cells = (
                _op_list([m.op for m in members]),
                source_label(where),
                f"{layout} (each keeps its operands' layout)",
                f"{cost * 1e6:.2f}",
                "-",
                FOLLOW_MANY + (f": {AROUND}" if any(_why(m) for m in members) else ""),
            )
        out.append((cost, cells))
    return out


def _seconds(plan: Any, members: list[Collective]) -> float:
    """The members' time by the plan's profile; for a profile this process does not know
    (a loaded plan's calibrated one, or a damaged name), their wire bytes' share of the
    plan's recorded communication time."""
    try:
        return comm_time(members, plan.cost.device)
    except ValueError:
        total = sum(c.wire_bytes * c.count for c in plan.cost.collectives)
        mine = sum(m.wire_bytes * m.count for m in members)
        return plan.cost.comm_time * mine / total if total > 0 else 0.0


def baseline_rows(plan: Any) -> list[tuple[float, tuple[str, ...]]]:
    """A plan made without a search: its input layouts, then the collectives the cost model
    expects, one row per kind, mesh axes and source line."""
    out: list[tuple[float, tuple[str, ...]]] = []
    groups: dict[tuple[str, tuple[str, ...], str], list[Collective]] = {}
    for c in plan.cost.collectives:
        groups.setdefault((c.kind, tuple(c.mesh_axes), c.source), []).append(c)
    for (kind, axes, source), members in groups.items():
        seconds = _seconds(plan, members)
        runs = sum(m.count for m in members)
        size = human_bytes(sum(m.bytes * m.count for m in members))
        chosen = f"over {', '.join(axes) or '-'}: {size}" + (f" in {runs} runs" if runs > 1 else "")
        out.append(
            (
                seconds,
                (
                    kind,
                    source_label(source, missing="(no source line)"),
                    chosen,
                    f"{seconds * 1e6:.2f}",
                    "-",
                    "the strategy's collective",
                ),
            )
        )
    out.sort(key=lambda item: -item[0])
    inputs = [
        (
            -1.0,
            (
                "input",
                path_label(path),
                _input_text(plan, path, ""),
                "-",
                "-",
                f"the {plan.method} strategy's layout",
            ),
        )
        for path in plan.input_paths
    ]
    return out + inputs


def plan_table(plan: Any, limit: int | None) -> PlanTable:
    if plan.rows:
        rows = sorted(searched_rows(plan), key=lambda item: -item[0])
        notes = plan.notes
    else:
        rows = baseline_rows(plan)
        notes = (
            f"{plan.method}: a fixed strategy (no search): its layouts and the "
            "collectives the cost model expects",
            *plan.notes,
        )
    shown = rows[:limit] if limit else rows
    return PlanTable(
        title=f"plan {plan.summary()}",
        headers=HEADERS,
        rows=tuple(cells for _, cells in shown),
        notes=tuple(notes),
        omitted=len(rows) - len(shown),
        nowrap=(2, 4),
    )
