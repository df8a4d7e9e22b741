"""Writes notebooks/03_strategy_editor.ipynb."""

from __future__ import annotations

from nbformat.v4 import new_code_cell, new_markdown_cell
from notebooks import write

md, code = new_markdown_cell, new_code_cell
cells = [
    md(
        "# Editing a transformer's sharding strategy\n\nA 4-layer GPT-style train step "
        "(embedding, attention, MLP, layer norm, SGD with momentum) on a 2×4 mesh. The editor "
        "shows its figures on top — predicted beside compiled — and below them a tab per "
        "argument (`params`, `momentum`, `batch`) with one dropdown per dimension of every "
        'leaf, labelled as you index it (`params["embed"]`, `batch[0]`). The four '
        'identical layers are one row (`params["blocks"][*]["w1"]` ×4); its *per layer* '
        "button opens a row per layer to override one. Every edit updates the predicted "
        "communication, memory and step time at once (the cost model, no compile); the "
        "compiled figures follow from a background compile. "
        "Then **Auto** runs the strategy search, and we compare its plan with the Megatron "
        "baseline."
    ),
    code(
        "import jax, jax.numpy as jnp, shardlab\n"
        "from jax.sharding import PartitionSpec as P\n"
        "from shardlab.examples import gpt\n"
        "\n"
        "case = gpt(4)                      # step(params, momentum, (tokens, targets))\n"
        "mesh = shardlab.mesh(data=2, model=4)\n"
        "step, args = case.fn, case.args\n"
        "data_parallel = jax.tree.map(lambda _: P(), args[:2]) + ((P('data'), P('data')),)\n"
        "ed = shardlab.editor(step, *args, mesh=mesh, in_shardings=data_parallel)\n"
        "ed"
    ),
    md(
        "Edit from code (the same as choosing in the layer row's dropdowns): split every "
        "block's MLP weights Megatron-style — `w1` by columns, `w2` by rows — over `model`."
    ),
    code(
        "ed.edit_group('params[\"blocks\"][*][\"w1\"]', 1, 'model')\n"
        "ed.edit_group('params[\"blocks\"][*][\"w2\"]', 0, 'model')\n"
        "print(ed.view().text())"
    ),
    md("An invalid choice is shown in the editor; the last valid strategy stays:"),
    code(
        "ed.edit('params[\"blocks\"][0][\"w1\"]', 0, 'model')  # 'model' is already on dim 1\n"
        "print(ed.error)"
    ),
    md("Export the strategy as code you can paste:"),
    code("ed.export()\nprint(ed.code)"),
    md(
        "## What the compiled program communicates\nThe collectives per kind and mesh axis, "
        "predicted and compiled, and which line of the model caused each."
    ),
    code(
        "current = ed.model.in_shardings()\n"
        "shardlab.commgraph(step, *args, mesh=mesh, in_shardings=current)"
    ),
    code("shardlab.timeline(step, *args, mesh=mesh, in_shardings=current)"),
    md(
        "## Auto, and the Megatron baseline\n`shardlab.search` picks a strategy with the "
        "cost model (the editor's **Auto** button runs the same search with a progress bar). "
        "Compare its compiled communication with the Megatron + data-parallel baseline."
    ),
    code(
        "plan = shardlab.search(step, *args, mesh=mesh, method='auto')\n"
        "baseline = shardlab.strategies.megatron(step, *args, mesh=mesh, data_axes=('data',))\n"
        "for label, p in (('auto', plan), ('megatron+dp', baseline)):\n"
        "    report = p.verify()  # compile and read the actual collectives and memory\n"
        "    print(f'{label:12} [{p.method}] predicted step {p.cost.time * 1e3:6.3f} ms '\n"
        "          f'(compute {p.cost.compute_time * 1e3:.3f}); compiled communication '\n"
        "          f'{p.compiled_comm_time(report) * 1e3:.3f} ms, '\n"
        "          f'{report.total_comm_bytes / 2**20:.2f} MiB on the wire, '\n"
        "          f'{report.memory.total / 2**20:.2f} MiB/device')\n"
        "plan  # summary first; the inputs by layer and the decisions fold open"
    ),
    code("plan.table(limit=12)  # per operation: the chosen split and the alternatives"),
    code("plan.show()  # the plan's predicted communication beside the compiled program"),
    md("Show the plan in the editor (what **Auto** does):"),
    code("ed.apply(plan)\nprint(ed.view().text())"),
]
write(cells, "notebooks/03_strategy_editor.ipynb")
