"""Compiled vs predicted memory and recompute per remat policy: the figures in
``docs/design/remat.md``. ``python -m benchmarks.remat [layers | nnx | pipeline | megatron]``."""

from __future__ import annotations

import jax

from shardlab.parallel.plan.remat import POLICIES, with_remat


def measure(model: str = "4", batch: int = 32, seq: int = 32, d: int = 64) -> None:
    """Print compiled vs predicted memory and recompute per policy (the figures in
    ``docs/design/remat.md``): ``model`` is a layer count (``gpt_scan(layers)``, data parallel on
    all devices), ``nnx`` (the corpus's nnx scan), ``pipeline`` (``gpt_scan(4)`` on stage
    2 x data 4, 2 microbatches) or ``megatron`` (``gpt_scan(4)``, data 2 x model 4)."""
    import re

    from shardlab.examples.transformer import gpt_scan
    from shardlab.parallel.mesh import mesh as make_mesh
    from shardlab.parallel.search.strategies.baselines import data_parallel

    n = len(jax.devices())
    if model == "nnx":
        from examples.zoo.models import nnx_scan

        case, layers = nnx_scan(), 3
        base = data_parallel(case.fn, *case.args, mesh=make_mesh(data=n))
    elif model == "pipeline":
        from shardlab.parallel.plan.pipeline import with_pipeline
        from shardlab.parallel.records import PipelineSpec

        case, layers = gpt_scan(4), 4
        base = data_parallel(
            case.fn, *case.args, mesh=make_mesh(stage=2, data=n // 2), axes=("data",)
        )
        base = with_pipeline(base, PipelineSpec(stages=2, microbatches=2))
    elif model == "megatron":
        from shardlab.parallel.search.strategies.baselines import megatron

        case, layers = gpt_scan(4, batch=batch, seq=seq, d=d), 4
        mesh = make_mesh(data=2, model=n // 2)
        base = megatron(case.fn, *case.args, mesh=mesh, data_axes=("data",))
    else:
        layers = int(model)
        case = gpt_scan(layers, batch=batch, seq=seq, d=d)
        base = data_parallel(case.fn, *case.args, mesh=make_mesh(data=n))
    print(f"{case.name}, {base.method} on {base.mesh_shape}")
    print("policy   temp      total     predicted  pred/total  flops      dots  +flops/layer pred")
    plain = None
    for policy in POLICIES:
        plan = with_remat(base, policy)
        compiled = plan.jit().lower(*case.args).compile()
        mem = compiled.memory_analysis()
        cost = compiled.cost_analysis()
        cost = cost if isinstance(cost, dict) else cost[0]
        total = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
        dots = len(re.findall(r"\bdot\(", compiled.as_text()))
        plain = plain or (cost["flops"], plan.cost.flops)
        extra = (plan.cost.flops - plain[1]) / layers
        print(
            f"{policy:8} {mem.temp_size_in_bytes:<9} {total:<9} {plan.cost.memory.peak:<10} "
            f"{plan.cost.memory.peak / total:<11.3f} {cost['flops']:<10.4g} {dots:<5} "
            f"{cost['flops'] - plain[0]:.4g} {extra:.4g}"
        )


if __name__ == "__main__":  # python -m benchmarks.remat [layers | nnx | pipeline | megatron]
    import sys

    measure(sys.argv[1] if len(sys.argv) > 1 else "4")
