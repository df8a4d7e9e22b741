"""Writes notebooks/02_sharding_layouts.ipynb."""

from __future__ import annotations

from nbformat.v4 import new_code_cell, new_markdown_cell
from notebooks import write

md, code = new_markdown_cell, new_code_cell
cells = [
    md(
        "# Sharding layouts on 8 devices\n\nHow an array is split across a device mesh: "
        "data parallel (split the batch), tensor parallel (split the weights) and 2-D "
        "(both). `shardlab.show` draws which device holds which tile — hover a tile for its "
        "devices, index slices and bytes — and works for layouts that do not exist yet. "
        "`shardlab.memory()` shows what each device holds."
    ),
    code(
        "import jax, jax.numpy as jnp, shardlab\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "print(len(jax.devices()), 'devices')\n"
        "mesh8 = shardlab.mesh(data=8)\n"
        "mesh24 = shardlab.mesh(data=2, model=4)\n"
        "mesh24"
    ),
    md("## Data parallel: the batch is split, the weights are copied on every device"),
    code(
        "batch = jax.device_put(jnp.ones((64, 512)), NamedSharding(mesh8, P('data')))\n"
        "weights = jax.device_put(jnp.ones((512, 512)), NamedSharding(mesh8, P()))\n"
        "shardlab.show(batch, name='batch')"
    ),
    code("shardlab.show(weights, name='weights (replicated)')"),
    md(
        "## Tensor parallel: the weight's columns are split over `model`\n"
        "On the 2×4 mesh, `P(None, 'model')` gives every device a quarter of the columns; "
        "the two rows of the mesh (`data`) hold copies."
    ),
    code(
        "w_tp = jax.device_put(jnp.ones((512, 1024)), NamedSharding(mesh24, P(None, 'model')))\n"
        "shardlab.show(w_tp, name='w (tensor parallel)')"
    ),
    md("## 2-D: batch over `data`, features over `model` — every device a different tile"),
    code(
        "x2d = jax.device_put(jnp.ones((64, 1024)), NamedSharding(mesh24, P('data', 'model')))\n"
        "shardlab.show(x2d, name='activations (2-D)')"
    ),
    md(
        "## Layouts that do not exist yet\nDraw a planned layout from a shape and a spec. A "
        "spec that does not fit says which dimension and which axis sizes, and suggests the "
        "nearest valid spec."
    ),
    code("shardlab.show((4096, 1024, 64), P(('data', 'model')), mesh=mesh24, dtype='bfloat16')"),
    code("shardlab.show((1000, 1024), P('data', 'modle'), mesh=mesh24)"),
    md(
        "## What the matmul communicates\nThe same `x @ w` with three layouts: the compiled "
        "program's collectives (from the HLO), next to what the cost model predicted."
    ),
    code(
        "def layer(x, w):\n"
        "    return jnp.tanh(x @ w)\n"
        "\n"
        "x = jnp.ones((64, 512)); w = jnp.ones((512, 1024))\n"
        "shardlab.commgraph(layer, x, w, mesh=mesh24, in_shardings=(P('data', 'model'), P('model', None)))"
    ),
    md("## Memory per device\nLive bytes per device and the largest arrays, with names."),
    code("panel = shardlab.memory()\npanel"),
    md("`watch` pins a live view that refreshes whenever a cell rebinds the name:"),
    code("watcher = shardlab.watch('x2d')\nwatcher"),
    code(
        "x2d = jax.device_put(x2d, NamedSharding(mesh24, P(None, 'model')))  # the view above updates"
    ),
]
write(cells, "notebooks/02_sharding_layouts.ipynb")
