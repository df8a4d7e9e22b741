"""Strategy-editor latency: an edit's refreshed figures (cost model) and compiled figures.

Run: ``make bench`` or ``python -m benchmarks.editor``.
"""

from __future__ import annotations

import statistics
import time

from jax.sharding import PartitionSpec as P

from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.widgets.editor.model import EditorModel, diff
from shardlab.widgets.editor.widget import EditorView

EDITS = 12


def _edits(model: EditorModel) -> list[tuple[int, int, tuple[str, ...]]]:
    """Megatron-style toggles on the MLP weights of each block: split w1's columns over
    'model', then back, cycling through the blocks (every edit is valid)."""
    targets = [i for i, leaf in enumerate(model.leaves) if leaf.path.endswith("/w1")]
    targets = [i for i in targets if leaf_is_param(model, i)]
    out = []
    for k in range(EDITS):
        index = targets[k % len(targets)]
        out.append((index, 1, ("model",) if (k // len(targets)) % 2 == 0 else ()))
    return out


def leaf_is_param(model: EditorModel, index: int) -> bool:
    return model.traced.arg_of_leaf[index] == 0  # the first argument: the parameters


def run() -> str:
    from shardlab.examples import gpt

    case = gpt(4)
    mesh = make_mesh(data=2, model=4)
    start = time.perf_counter()
    model = EditorModel(case.fn, case.args, mesh)
    setup = time.perf_counter() - start
    # Data parallel to start with: the batch (third argument) split over 'data'.
    specs = [P("data") if arg == 2 else P() for arg in model.traced.arg_of_leaf]
    model.set_all(specs)
    refresh, compile_times = [], []
    superseded = 0
    for number, (index, dim, axes) in enumerate(_edits(model)):
        t0 = time.perf_counter()
        evaluation = model.edit(index, dim, axes)
        changes = diff(model.previous.cost if model.previous else None, evaluation.cost)
        EditorView(evaluation, changes=changes, compiled=None, compiling=True, error=None).html()
        refresh.append(time.perf_counter() - t0)
        if number % 4 == 0:  # compiled figures in the background, for every 4th edit
            results = []
            thread = model.compile(results.append)
            thread.join()
            compile_times.append(results[0].seconds)
    # A newer edit supersedes a stale compile.
    stale_results = []
    stale = model.compile(stale_results.append)
    model.edit(*_edits(model)[0])
    stale.join()
    superseded = sum(r.superseded for r in stale_results)
    median_refresh = statistics.median(refresh)
    lines = [
        "## Strategy editor latency",
        "",
        "Command: `make bench` (section `benchmarks.editor`). A 4-layer GPT-style train "
        "step (`shardlab.examples.gpt(4)`: embedding, attention, MLP, layer norm; SGD with "
        "momentum) on a 2×4 mesh of simulated CPU devices. An edit splits or unsplits one MLP "
        "weight over `model`; medians.",
        "",
        "| figure | value | target |",
        "|---|---|---|",
        f"| editor set-up (trace the step once) | {setup * 1e3:.0f} ms | |",
        f"| **edit → refreshed cost-model figures** (validate, predict, diff, render), "
        f"median of {len(refresh)} | **{median_refresh * 1e3:.1f} ms** (max "
        f"{max(refresh) * 1e3:.1f} ms) | ≤ 300 ms |",
        f"| edit → compiled figures (background compile + HLO analysis), median of "
        f"{len(compile_times)} | {statistics.median(compile_times):.2f} s | in the background |",
        f"| stale compile superseded by a newer edit | {superseded} of {len(stale_results)} | "
        "1 of 1 |",
        "",
        f"Graph: {len(model.graph.nodes)} equations. The refresh path never compiles; the "
        "compiled figures arrive from a background thread and never block the notebook.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run())
