"""Writes tests/data/hlo/<compiler>_<program>_<n>.hlo: compiled HLO of six small programs.

Compiled on this CPU machine for XLA:CPU (8 simulated devices), XLA:GPU (an H100 target config,
deviceless, 1x1x8 and 1x8x8 topologies) and TPU (deviceless: v5e 2x4 and 8x8, v5p 2x2x2).
The expected collectives of each file are derived by hand in tests/parallel/test_hlo_targets.py;
after regenerating, check them again (a new XLA may compile differently).

    .venv/bin/python tools/make_hlo_fixtures.py [OUTDIR] [target,...]
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

H100 = """gpu_device_info { threads_per_block_limit: 1024 threads_per_warp: 32 \
shared_memory_per_block: 49152 shared_memory_per_core: 233472 threads_per_core_limit: 2048 \
core_count: 132 fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 \
block_dim_limit_z: 65535 memory_bandwidth: 3352320000000 l2_cache_size: 52428800 \
clock_rate_ghz: 1.98 device_memory_size: 84978434048 shared_memory_per_block_optin: 232448 \
cuda_compute_capability { major: 9 } registers_per_core_limit: 65536 \
registers_per_block_limit: 65536 }
platform_name: "CUDA"
device_description_str: "NVIDIA H100 80GB HBM3"
"""

ALL = ("data", "model")


def make_mesh(target: str) -> Mesh:
    """A ("data", "model") mesh: (2, 4) on 8 devices, (8, 8) on 64."""
    if target == "cpu_8":
        return Mesh(np.array(jax.devices("cpu")[:8]).reshape(2, 4), ALL)
    if target.startswith("gpu"):
        hosts, shape = ("1", (2, 4)) if target == "gpu_8" else ("8", (8, 8))
        topo = topologies.get_topology_desc(
            platform="cuda", topology=f"1x{hosts}x8", target_config=H100
        )
        return Mesh(np.array(topo.devices).reshape(shape), ALL)
    name = {"tpu-v5e_8": "v5e:2x4", "tpu-v5e_64": "v5e:8x8", "tpu-v5p_8": "v5p:2x2x2"}[target]
    topo = topologies.get_topology_desc(topology_name=name, platform="tpu")
    return topologies.make_mesh(topo, (8, 8) if target.endswith("_64") else (2, 4), ALL)


def sds(mesh, shape, dtype, spec):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))


def train(mesh, loss, params, *batch):
    """jit of one SGD step of ``loss``, new params kept in their shardings, loss replicated."""

    def step(params, *batch):
        value, grads = jax.value_and_grad(loss)(params, *batch)
        new = jax.tree.map(lambda p, g: (p - 0.01 * g).astype(p.dtype), params, grads)
        return new, value

    shardings = jax.tree.map(lambda s: s.sharding, params)
    return jax.jit(step, out_shardings=(shardings, NamedSharding(mesh, P()))), (params, *batch)


def dp(mesh, dt):
    """(a) data parallel: batch [256, 512] over every device; W1 [512,1024], W2 [1024,512]."""

    def loss(params, x, y):
        w1, w2 = params
        out = jnp.tanh(x @ w1) @ w2
        return jnp.mean((out.astype(jnp.float32) - y.astype(jnp.float32)) ** 2)

    params = (sds(mesh, (512, 1024), dt, P()), sds(mesh, (1024, 512), dt, P()))
    x = sds(mesh, (256, 512), dt, P(ALL))
    return train(mesh, loss, params, x, x)


def fsdp(mesh, dt):
    """(b) FSDP / ZeRO-3: 4 layers W_i [4096,4096] sharded on dim 0 over every device; batch
    [512, 4096] too; each weight gathered where it is used."""

    def loss(params, x):
        h = x
        for w in params:
            h = jnp.tanh(h @ lax.with_sharding_constraint(w, NamedSharding(mesh, P())))
        return jnp.mean(h.astype(jnp.float32) ** 2)

    params = tuple(sds(mesh, (4096, 4096), dt, P(ALL, None)) for _ in range(4))
    return train(mesh, loss, params, sds(mesh, (512, 4096), dt, P(ALL)))


def tp(mesh, dt):
    """(c) Megatron tensor parallel, two MLP blocks: W1 [512,2048] P(None,'model'),
    W2 [2048,512] P('model',None); batch [64, 512] over 'data'."""

    def loss(params, x):
        for w1, w2 in params:
            x = jnp.tanh(x @ w1) @ w2
        return jnp.mean(x.astype(jnp.float32) ** 2)

    block = (sds(mesh, (512, 2048), dt, P(None, "model")), sds(mesh, (2048, 512), dt, P("model")))
    return train(mesh, loss, (block, block), sds(mesh, (64, 512), dt, P("data")))


def perm(mesh, dt):
    """(d) shard_map: ppermute one step around the 'model' ring, then all_to_all over 'model';
    [64, 256] per device."""
    n = mesh.shape["model"]

    def local(x):
        y = lax.ppermute(x, "model", [(i, (i + 1) % n) for i in range(n)])
        return jnp.tanh(lax.all_to_all(y, "model", split_axis=0, concat_axis=1, tiled=True))

    f = jax.shard_map(local, mesh=mesh, in_specs=P(ALL), out_specs=P(ALL))
    return jax.jit(f), (sds(mesh, (64 * mesh.size, 256), dt, P(ALL)),)


def loop(mesh, dt):
    """(e) fori_loop of 6 steps inside shard_map, each a psum over 'model' of [32, 512]."""

    def local(x, w):
        return lax.fori_loop(0, 6, lambda i, c: jnp.tanh(lax.psum(c @ w, "model")), x)

    f = jax.shard_map(
        local, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"), check_vma=False
    )
    x = sds(mesh, (32 * mesh.shape["data"], 512), dt, P("data"))
    return jax.jit(f), (x, sds(mesh, (512, 512), dt, P()))


def seqtp(mesh, dt):
    """(f) sequence-parallel Megatron MLP: activations [8,1024,4096] sharded (batch 'data',
    sequence 'model'); W1 [4096,16384] P(None,'model'), W2 [16384,4096] P('model',None). TPU
    turns the second matmul's reduce-scatter into a windowed einsum (collective matmul)."""

    def loss(params, x):
        w1, w2 = params
        h = lax.with_sharding_constraint(
            jnp.einsum("bsd,df->bsf", x, w1), NamedSharding(mesh, P("data", None, "model"))
        )
        y = jnp.einsum("bsf,fd->bsd", jnp.tanh(h), w2)
        y = lax.with_sharding_constraint(y, NamedSharding(mesh, P("data", "model", None)))
        return jnp.mean(y.astype(jnp.float32) ** 2)

    params = (
        sds(mesh, (4096, 16384), dt, P(None, "model")),
        sds(mesh, (16384, 4096), dt, P("model")),
    )
    return train(mesh, loss, params, sds(mesh, (8, 1024, 4096), dt, P("data", "model")))


PROGRAMS = {"dp": dp, "fsdp": fsdp, "tp": tp, "perm": perm, "loop": loop, "seqtp": seqtp}
SETS = {
    "cpu_8": "dp fsdp tp perm loop",
    "gpu_8": "dp fsdp tp perm loop",
    "gpu_64": "dp fsdp tp",
    "tpu-v5e_8": "dp fsdp tp perm loop seqtp",
    "tpu-v5e_64": "dp fsdp loop seqtp",
    "tpu-v5p_8": "fsdp tp loop",
}


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/hlo"
    targets = sys.argv[2].split(",") if len(sys.argv) > 2 else list(SETS)
    os.makedirs(out, exist_ok=True)
    for target in targets:
        mesh = make_mesh(target)
        dt = jnp.float32 if target.startswith("cpu") else jnp.bfloat16
        compiler, n = target.split("_")
        for prog in SETS[target].split():
            fn, args = PROGRAMS[prog](mesh, dt)
            with jax.set_mesh(mesh):
                text = fn.lower(*args).compile().as_text()
            path = os.path.join(out, f"{compiler}_{prog}_{n}.hlo")
            with open(path, "w") as fh:
                fh.write(text)
            print(path, len(text), flush=True)


if __name__ == "__main__":
    main()
