"""Writes notebooks/01_eager_jit_graph.ipynb (outputs are left to the reader's kernel)."""

from __future__ import annotations

from nbformat.v4 import new_code_cell, new_markdown_cell
from notebooks import write

cells = [
    new_markdown_cell(
        "# One training step: eager → jit → graph\n\n"
        "The same small training step, three ways. **eager** runs it op by op so `print` "
        "and breakpoints see real numbers; **jit** compiles the hot function; **graph** "
        "stages the whole cell — gradient, update and loss — as one compiled program that "
        "re-runs without retracing. A cell picks its mode with a first line `%%eager`, "
        "`%%jit` or `%%graph` (or cell metadata `shardlab.mode`, or the default set by "
        "`%mode`).\n\nThis notebook runs on the *JAX · shardlab* kernel (8 simulated CPU "
        "devices)."
    ),
    new_code_cell(
        "import time\n"
        "import jax, jax.numpy as jnp\n"
        "\n"
        "key = jax.random.PRNGKey(0)\n"
        "k1, k2, k3 = jax.random.split(key, 3)\n"
        "params = {\n"
        "    'w1': jax.random.normal(k1, (16, 64)) * 0.3, 'b1': jnp.zeros(64),\n"
        "    'w2': jax.random.normal(k2, (64, 1)) * 0.3, 'b2': jnp.zeros(1),\n"
        "}\n"
        "x = jax.random.normal(k3, (256, 16))\n"
        "y = jnp.sin(x.sum(axis=1, keepdims=True))\n"
        "lr = 0.05\n"
        "print(len(jax.devices()), 'devices')"
    ),
    new_code_cell(
        "def loss_fn(params, x, y):\n"
        "    h = jnp.tanh(x @ params['w1'] + params['b1'])\n"
        "    for _ in range(8):  # a few extra layers of small ops: where op-by-op costs show\n"
        "        h = jnp.tanh(h * 0.9 + 0.1)\n"
        "    pred = h @ params['w2'] + params['b2']\n"
        "    return jnp.mean((pred - y) ** 2)\n"
        "\n"
        "@jax.jit\n"
        "def train_step(params, x, y):\n"
        "    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)\n"
        "    params = jax.tree.map(lambda p, g: p - lr * g, params, grads)\n"
        "    return params, loss"
    ),
    new_markdown_cell(
        "## 1. Debug eagerly\n`%%eager` runs jitted functions op by op: the `print` inside "
        "`debug_step` shows concrete values, not tracers."
    ),
    new_code_cell(
        "%%eager\n"
        "@jax.jit\n"
        "def debug_step(params, x, y):\n"
        "    h = jnp.tanh(x @ params['w1'] + params['b1'])\n"
        "    print('hidden mean', float(h.mean()))  # concrete under eager\n"
        "    return train_step(params, x, y)\n"
        "\n"
        "params, loss = debug_step(params, x, y)\n"
        "t0 = time.perf_counter()\n"
        "for _ in range(5):\n"
        "    params, loss = train_step(params, x, y)\n"
        "eager_ms = (time.perf_counter() - t0) / 5 * 1e3\n"
        "print(f'eager: {eager_ms:.2f} ms/step, loss {float(loss):.4f}')"
    ),
    new_markdown_cell("## 2. Speed it up with jit\nThe same function, compiled once and cached."),
    new_code_cell(
        "%%jit\n"
        "params, loss = train_step(params, x, y)  # compile\n"
        "jax.block_until_ready(loss)\n"
        "t0 = time.perf_counter()\n"
        "for _ in range(50):\n"
        "    params, loss = train_step(params, x, y)\n"
        "jax.block_until_ready(loss)\n"
        "jit_ms = (time.perf_counter() - t0) / 50 * 1e3\n"
        "print(f'jit: {jit_ms:.3f} ms/step, loss {float(loss):.4f}')"
    ),
    new_markdown_cell(
        "## 3. Stage the whole cell as a graph\nNo `@jax.jit` needed: the cell below is the "
        "step written at top level. `params`, `x` and `y` hold arrays, so they are the "
        "program's inputs; `grads`, `params` and `loss` are written back. `lr` is a Python "
        "float: static, part of the cache key. `print` prints at run time, every run."
    ),
    new_code_cell(
        "%%graph\n"
        "loss, grads = jax.value_and_grad(loss_fn)(params, x, y)\n"
        "params = jax.tree.map(lambda p, g: p - lr * g, params, grads)\n"
        "print(f'graph step: loss {loss:.4f}')"
    ),
    new_markdown_cell(
        "Re-running the cell with same-shaped inputs does not retrace. Time it by running "
        "the same cell body through the `graph` cell magic:"
    ),
    new_code_cell(
        "STEP = '''\n"
        "loss, grads = jax.value_and_grad(loss_fn)(params, x, y)\n"
        "params = jax.tree.map(lambda p, g: p - lr * g, params, grads)\n"
        "'''\n"
        "ip = get_ipython()\n"
        "ip.run_cell_magic('graph', '', STEP)  # compile once\n"
        "t0 = time.perf_counter()\n"
        "for _ in range(50):\n"
        "    ip.run_cell_magic('graph', '', STEP)\n"
        "jax.block_until_ready(loss)\n"
        "graph_ms = (time.perf_counter() - t0) / 50 * 1e3\n"
        "print(f'eager {eager_ms:8.2f} ms/step')\n"
        "print(f'jit   {jit_ms:8.3f} ms/step')\n"
        "print(f'graph {graph_ms:8.3f} ms/step  ({eager_ms / graph_ms:.0f}× faster than eager)')"
    ),
    new_markdown_cell(
        "## 4. What cannot be staged\nA graph cell that pulls a Python number out of an "
        "array fails with the line, the reason and the fix (this cell is expected to fail)."
    ),
    new_code_cell(
        "%%graph\nloss = loss_fn(params, x, y)\nbest = float(loss)  # a Python float of a traced value",
        metadata={"tags": ["raises-exception"]},
    ),
    new_markdown_cell(
        "## 5. Session hooks\n`%mode` lists the effective modes of the last cells; "
        "`%devices` shows the devices and per-device bytes; `%release` frees what no name "
        "holds."
    ),
    new_code_cell("%mode"),
    new_code_cell("%devices"),
    new_code_cell("%release"),
]

write(cells, "notebooks/01_eager_jit_graph.ipynb")
