"""Writes notebooks/07_plan_a_cluster.ipynb."""

from __future__ import annotations

from nbformat.v4 import new_code_cell, new_markdown_cell
from notebooks import write

md, code = new_markdown_cell, new_code_cell
cells = [
    md(
        "# Plan a cluster from a laptop\n\n"
        "This notebook runs on 8 simulated CPU devices, and plans a Llama-style train step for "
        "64 H100 GPUs and for a 64-chip TPU v5p slice. `%target` describes the machine; its "
        "own compiler — XLA:GPU or XLA:TPU — compiles every program for it here, *deviceless*: "
        "the layouts, collectives and memory below are those compilers', not the CPU's. "
        "The arguments are abstract (`jax.ShapeDtypeStruct`): nothing is allocated. The "
        "model is small so that the notebook runs in a minute; `shardlab.examples.llama` has "
        "the 8B and 70B configurations too (docs/benchmarks.md plans them)."
    ),
    code(
        "import jax, shardlab\n"
        "from shardlab.examples.llama import LlamaConfig, llama\n"
        "from shardlab.parallel.targets.target import mesh_layout\n"
        "print(len(jax.devices()), jax.devices()[0].platform, 'devices in this kernel')\n"
        "config = LlamaConfig('llama-small', layers=2, d=512, heads=8, kv_heads=2, ffn=2048,"
        " vocab=8192)\n"
        "case = llama(config, batch=64, seq=256)  # bf16, abstract\n"
        "print(f'{config.parameter_count() / 1e6:.0f}M parameters; arguments:',"
        " type(case.args[0]['embed']).__name__)"
    ),
    md(
        "## 64 H100s: 8 hosts of 8\n"
        "`%target` makes new meshes use the target. The last axis (`model`) stays inside a "
        "host's NVLink domain; `data` runs across the hosts' InfiniBand."
    ),
    code("%target h100 hosts=8"),
    code("mesh = shardlab.mesh(data=8, model=8)\nprint(mesh_layout(mesh).describe())"),
    md(
        "## Search a strategy, priced for H100s, confirmed by XLA:GPU\n"
        "The search prices candidates with the H100 datasheet profile and compiles its choice "
        "with the target's compiler."
    ),
    code("plan = shardlab.search(case.fn, *case.args, mesh=mesh)\nplan"),
    code(
        "report = plan.verify()  # compiled by XLA:GPU, deviceless\n"
        "hbm = shardlab.DEVICE_PROFILES[shardlab.target('h100', hosts=8).profile].memory_bytes\n"
        "gib = 2**30\n"
        "print(f'per device: predicted {plan.cost.memory.peak / gib:.2f} GiB, compiled '\n"
        "      f'{report.memory.total / gib:.2f} GiB of {hbm / gib:.0f} GiB HBM')"
    ),
    md(
        "## The collectives, by source line, and which cross hosts\n"
        "Each compiled collective with the line of the model that caused it; a collective "
        "over `data` leaves the host (InfiniBand), one over `model` stays on NVLink."
    ),
    code(
        "crossing = set(mesh_layout(mesh).crossing)\n"
        "rows = {}\n"
        "for c in report.collectives:\n"
        "    key = (c.kind, c.mesh_axes, c.source.rsplit('/', 1)[-1] or '(no line)')\n"
        "    rows[key] = rows.get(key, 0) + c.bytes * c.count\n"
        "for (kind, axes, line), nbytes in sorted(rows.items(), key=lambda r: -r[1]):\n"
        "    where = 'crosses hosts' if crossing & set(axes) else 'within a host'\n"
        '    print(f\'{kind:<18} {"×".join(axes) or "-":<11} {nbytes / 2**20:9.1f} MiB  '
        "{where:<14} {line}')"
    ),
    md(
        "## The layout of one argument over 64 GPUs\n"
        "The argument the plan splits over the most mesh axes, drawn over the 64 devices (this "
        "small model's weights are copied on every device: the plan splits the batch)."
    ),
    code(
        "leaves, specs = jax.tree.leaves(case.args), jax.tree.leaves(plan.in_shardings)\n"
        "i = max(range(len(specs)), key=lambda i: sum(a is not None for a in specs[i].spec))\n"
        "shardlab.show(leaves[i].shape, specs[i].spec, mesh=mesh, dtype=leaves[i].dtype,\n"
        "              name=plan.input_labels[i])"
    ),
    md(
        "## The same model on a TPU v5p slice (4x4x4: 64 chips)\n"
        "Inside a slice every axis runs on ICI; the mesh follows the torus. The search above "
        "confirmed its choice by compiling it and three baselines with XLA:GPU; each XLA:TPU "
        "compile takes about ten seconds of a laptop's CPU, so here the model's ranking "
        "decides (`confirm=False`) and `verify()` compiles the plan once with XLA:TPU."
    ),
    code("%target tpu-v5p topology=4x4x4"),
    code(
        "tpu_mesh = shardlab.mesh(data=16, model=4)\n"
        "print(mesh_layout(tpu_mesh).describe())\n"
        "tpu_plan = shardlab.search(case.fn, *case.args, mesh=tpu_mesh, confirm=False)\n"
        "tpu_report = tpu_plan.verify()  # compiled by XLA:TPU (libtpu), deviceless\n"
        "print(tpu_plan.summary())\n"
        "print(f'per device: predicted {tpu_plan.cost.memory.peak / gib:.2f} GiB, compiled '\n"
        "      f'{tpu_report.memory.total / gib:.2f} GiB')"
    ),
    md(
        "## Export the plan to run on the cluster\n"
        "Nothing runs on a target here — its devices are descriptions — so calling the plan "
        "says so. `plan.to_code()` writes it out for the machine it was made for; "
        "`plan.to_json()` saves it."
    ),
    code("print('\\n'.join(plan.to_code().splitlines()[:12]))"),
    code(
        "try:\n"
        "    plan.jit()(*case.args)\n"
        "except Exception as error:\n"
        "    print(type(error).__name__, ':', str(error)[:160], '...')"
    ),
    code("%target off"),
]

write(cells, "notebooks/07_plan_a_cluster.ipynb")
