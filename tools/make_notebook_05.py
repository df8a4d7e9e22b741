"""Writes notebooks/05_memory_budget.ipynb (outputs are left to the reader's kernel)."""

from __future__ import annotations

from nbformat.v4 import new_code_cell, new_markdown_cell
from notebooks import write

md, code = new_markdown_cell, new_code_cell
cells = [
    md(
        "# Fitting a model into a memory budget\n\n"
        "An accelerator has a fixed amount of memory, and one training step must fit in it: "
        "the parameters, the optimizer state, the activations the backward pass reads, and "
        "the compiler's temporaries. Here 8 simulated CPU devices stand in for accelerators. "
        "We give each device a **budget of half of what plain data parallelism needs**, "
        "and try the three standard ways down:\n\n"
        "- **ZeRO** splits the optimizer state (stages 1 and 2) and the parameters too "
        "(stage 3, FSDP) over the data-parallel devices, gathering a weight where it is used;\n"
        "- **rematerialisation** (remat) keeps fewer activations between the forward and the "
        "backward pass and recomputes the rest;\n"
        "- **pipeline stages** give each group of devices only its own layers.\n\n"
        "Every memory figure below is **compiled**: XLA's own per-device buffer assignment "
        "(`plan.verify()`), not a prediction. Each technique is shown with the layout of a "
        "weight, memory bars against the budget and a timeline. At the end "
        "`shardlab.search` chooses a mix that fits, and every plan is checked to compute "
        "exactly the plain step."
    ),
    code(
        "import jax, numpy as np, shardlab\n"
        "from shardlab.examples import gpt_scan\n"
        "\n"
        "case = gpt_scan(4, batch=16, seq=16, d=32, heads=2, vocab=128)  # 4 layers in one lax.scan\n"
        "step = case.fn                                  # step(params, momentum, (tokens, targets))\n"
        "args = jax.tree.map(np.array, case.args)        # host copies: each plan places them\n"
        "del case                                        # (its arrays sit on device 0)\n"
        "expected = jax.tree.map(np.array, jax.jit(step)(*args))  # the plain step's numbers\n"
        "mesh = shardlab.mesh(data=8)\n"
        "print({k: v.shape for k, v in args[0]['blocks'].items()})  # stacked: (layer, ...)"
    ),
    md(
        "Two small helpers: sizes in MiB, and one bar per plan — arguments `█`, outputs `▓`, "
        "temporaries `░`, all per device as compiled — with the budget marked `▏`."
    ),
    code(
        "def mib(nbytes):\n"
        "    return f'{nbytes / 2**20:.2f} MiB'\n"
        "\n"
        "def bars(rows, budget, width=50):\n"
        "    scale = width / max(budget, *(r.memory.total for _, r in rows))\n"
        "    print(' ' * 38 + ' ' * round(budget * scale) + f'▏budget {mib(budget)}')\n"
        "    for name, report in rows:\n"
        "        m = report.memory\n"
        "        bar = ('█' * round(m.argument * scale) + '▓' * round((m.output - m.alias) * scale)\n"
        "               + '░' * round(m.temp * scale))\n"
        "        verdict = 'fits' if m.total <= budget else f'over by {mib(m.total - budget)}'\n"
        "        print(f'{name:24} {mib(m.total):>11}  {bar:{width}}  {verdict}')\n"
        "    print(' ' * 38 + '█ arguments  ▓ outputs  ░ temporaries (compiled, per device)')"
    ),
    md(
        "## Data parallel: every device holds everything\n"
        "The batch is split 8 ways; the parameters and the momentum are copied on every "
        "device. We compile it and take half of its per-device memory as the budget."
    ),
    code(
        "dp = shardlab.strategies.data_parallel(step, *args, mesh=mesh)\n"
        "dp_report = dp.verify()  # compile: XLA's per-device memory\n"
        "m = dp_report.memory\n"
        "budget = m.total // 2\n"
        "print(f'data parallel: {m.total:,} bytes = {mib(m.total)} per device: arguments '\n"
        "      f'{mib(m.argument)} + outputs {mib(m.output)} + temporaries {mib(m.temp)}')\n"
        "print(f'budget: {mib(budget)} per device ({budget:,} bytes)')\n"
        "bars([('data parallel', dp_report)], budget)"
    ),
    md(
        "## ZeRO-3: split the parameters and the optimizer state\n"
        "The arguments (parameters, momentum) and the outputs (their new values) shrink "
        "8-fold; each weight is gathered where a layer uses it, so the temporaries grow."
    ),
    code(
        "zero3 = shardlab.strategies.zero(step, *args, mesh=mesh, stage=3)\n"
        "zero3_report = zero3.verify()\n"
        "bars([('data parallel', dp_report), ('ZeRO-3', zero3_report)], budget)"
    ),
    md(
        "The stacked MLP weight of the 4 layers under ZeRO-3 (hover a tile: devices, index "
        "slices, bytes):"
    ),
    code(
        "params_z3, momentum_z3, batch_z3 = zero3.shard(*args)  # placed as the plan wants them\n"
        "shardlab.show(params_z3['blocks']['w1'], name='blocks w1 under ZeRO-3')"
    ),
    md(
        "What the devices hold now: the ZeRO-3 parameters, momentum and batch, an eighth "
        "of each on every device (compare the *total* and *per device* columns). "
        "A replicated array would not show its 8 copies here: on simulated CPU devices the "
        "copies share one host buffer. The compiled figures count one per device, as an "
        "accelerator holds them."
    ),
    code("shardlab.memory()"),
    md(
        "The timeline of one ZeRO-3 step: the cost model's schedule (communication the "
        "compute waits for is outlined red) and the measured one, a lane per device."
    ),
    code("shardlab.timeline(zero3)"),
    md(
        "## Remat: keep less for the backward pass, recompute it\n"
        "`dots` keeps only the matmul outputs of each layer, `nothing` only the layer's "
        "input. The temporaries fall; the arguments stay as data parallel has them. The price "
        "is recomputation in the backward pass."
    ),
    code(
        "remat = {policy: shardlab.with_remat(dp, policy) for policy in ('dots', 'nothing')}\n"
        "remat_reports = {policy: plan.verify() for policy, plan in remat.items()}\n"
        "bars([('data parallel', dp_report)]\n"
        "     + [(f'remat {policy}', r) for policy, r in remat_reports.items()], budget)\n"
        "for policy, plan in remat.items():\n"
        "    extra = plan.cost.compute_time / dp.cost.compute_time - 1\n"
        "    print(f'{policy:8} temporaries {mib(dp_report.memory.temp)} → '\n"
        "          f'{mib(remat_reports[policy].memory.temp)}; compute {extra:+.0%} (predicted)')\n"
        "    print('        ', plan.notes[-1])"
    ),
    code("shardlab.timeline(remat['nothing'])"),
    md(
        "## Pipeline stages: each device holds its own layers\n"
        "A `stage` axis of 4 on the mesh: stage *s* holds layer *s* (4 layers, 4 stages), "
        "the batch is split over `data` inside each stage and cut into 4 microbatches that "
        "flow through the stages (GPipe). The stacked layer weights are split on their layer "
        "dimension over `stage`:"
    ),
    code(
        "stage_mesh = shardlab.mesh(stage=4, data=2)\n"
        "pipe = shardlab.strategies.pipeline_data(step, *args, mesh=stage_mesh, microbatches=4)\n"
        "params_pipe = pipe.shard(*args)[0]\n"
        "shardlab.show(params_pipe['blocks']['w1'], name='blocks w1, pipelined')"
    ),
    md(
        "The schedule, one lane per stage: forwards `F`, backwards `B` of each microbatch, "
        "and the idle bubble while the pipeline fills and drains."
    ),
    code("shardlab.pipeline_timeline(pipe)"),
    md(
        "Its compiled memory: the arguments shrink 4-fold, but GPipe keeps every "
        "microbatch's activations until its backward, and inside a stage the batch is split "
        "2 ways instead of 8 — so the temporaries grow."
    ),
    code(
        "pipe_report = pipe.verify()\n"
        "bars([('data parallel', dp_report), ('ZeRO-3', zero3_report),\n"
        "      ('remat dots', remat_reports['dots']), ('remat nothing', remat_reports['nothing']),\n"
        "      ('pipeline 4 × 4', pipe_report)], budget)"
    ),
    md(
        "## The search chooses the mix\n"
        "None of them fits alone, and each cuts a different part: ZeRO the arguments, remat "
        "the temporaries, stages some of both. `shardlab.search` with `memory_budget=` "
        "searches layouts that fit, prices mixes with ZeRO and remat with the cost model, "
        "and compiles its choice to check that it fits (given a mesh with a `stage` axis it "
        "prices pipeline stages too, at a longer search). Its notes say what it compared "
        "and why it chose what it did."
    ),
    code(
        "plan = shardlab.search(step, *args, mesh=mesh, memory_budget=budget)\n"
        "plan_report = plan.verify()\n"
        "print(plan.summary())\n"
        "print('remat:', plan.remat.policy if plan.remat else 'none', '· pipeline stages:',\n"
        "      f'{plan.pipeline.stages} × {plan.pipeline.microbatches} microbatches'\n"
        "      if plan.pipeline else 'none')\n"
        "for note in plan.notes:\n"
        "    print(' -', note)"
    ),
    code(
        "bars([('data parallel', dp_report), ('ZeRO-3', zero3_report),\n"
        "      ('remat nothing', remat_reports['nothing']), ('pipeline 4 × 4', pipe_report),\n"
        "      ('searched plan', plan_report)], budget)\n"
        "shardlab.show(plan.shard(*args)[0]['blocks']['w1'], name='blocks w1, searched plan')"
    ),
    md(
        "## Every plan computes the plain step\n"
        "Sharding, recomputation and microbatching change where and when the work happens, "
        "not what is computed: the loss and the new parameters equal the plain jitted "
        "step's."
    ),
    code(
        "shown = {'data parallel': dp, 'ZeRO-3': zero3, 'remat dots': remat['dots'],\n"
        "         'remat nothing': remat['nothing'], 'pipeline 4 × 4': pipe, 'searched plan': plan}\n"
        "print(f'{\"plain step\":15} loss {expected[2]:.6f}')\n"
        "for name, p in shown.items():\n"
        "    new_params, _, loss = p.jit()(*args)\n"
        "    np.testing.assert_allclose(loss, expected[2], rtol=1e-5)\n"
        "    pairs = list(zip(jax.tree.leaves(new_params), jax.tree.leaves(expected[0])))\n"
        "    for got, want in pairs:\n"
        "        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)\n"
        "    largest = max(float(np.max(np.abs(np.asarray(got) - want))) for got, want in pairs)\n"
        "    print(f'{name:15} loss {float(loss):.6f}, new parameters within {largest:.1e} '\n"
        "          'of the plain step')"
    ),
]
write(cells, "notebooks/05_memory_budget.ipynb")
