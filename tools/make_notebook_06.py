"""Writes notebooks/06_multi_process.ipynb (outputs are left to the reader's kernel)."""

from __future__ import annotations

from nbformat.v4 import new_code_cell, new_markdown_cell
from notebooks import write

cells = []


def md(text: str) -> None:
    cells.append(new_markdown_cell(text.strip()))


def code(text: str, *, raises: bool = False) -> None:
    cell = new_code_cell(text.strip())
    if raises:
        cell.metadata["tags"] = ["raises-exception"]
    cells.append(cell)


md("""
# Beyond one process: `%cluster` and `%%spmd`

One host with several GPUs wants one process per GPU, and a cluster is many hosts. JAX's own
multi-controller runtime (`jax.distributed`) joins such processes into one set of devices; here
two local processes with 4 simulated CPU devices each form one 8-device mesh. The processes
are ipyparallel engines; this notebook's kernel only drives them and never joins the runtime,
so a process that dies cannot take the notebook (and its variables) with it.
docs/guide/cluster.md says what changes on several GPU hosts.
""")
code("""
%cluster start -n 2 --devices-per-process 4
""")
md("""
`%%spmd` runs a cell on every process, in the cell's mode (eager, jit or graph). Output comes
from process 0; `--all` shows every process's, each line tagged with its process.
""")
code("""
%%spmd --all
import jax, jax.numpy as jnp, numpy as np, shardlab
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = shardlab.mesh(data=2, model=4)  # 8 devices: 4 in each process
print(f"process {jax.process_index()} of {jax.process_count()}: "
      f"{len(jax.local_devices())} local devices, {len(jax.devices())} in the mesh")
""")
md("""
## A collective across processes
Each process contributes its 4 devices' values; `psum` over both mesh axes adds all 8.
""")
code("""
%%spmd --all
local = np.full((4,), jax.process_index() + 1.0, np.float32)  # 1s on process 0, 2s on 1
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P(("data", "model"))), local)
psum = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, ("data", "model")), mesh=mesh,
                             in_specs=P(("data", "model")), out_specs=P()))
total = float(psum(x)[0])
assert total == 4 * 1 + 4 * 2
print("psum over 8 devices:", total)
""")
md("""
## Each process reads only its own data
`shardlab.data.shard(load, mesh, spec)` asks the sharding which block this process's devices
hold and calls `load` for that block only (an array-like such as `np.load(path,
mmap_mode="r")` is indexed instead). Here `load` counts the rows it is asked for.
""")
code("""
%%spmd --all
rows_read = []
full = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)
def load(index):
    rows_read.append(index[0].stop - index[0].start)
    return full[index]
batch = shardlab.data.shard(load, mesh, P("data"), shape=full.shape)
assert sum(rows_read) == 32  # half of the 64 rows: the other process read the rest
print(f"read {sum(rows_read)} of {full.shape[0]} rows; global batch {batch.shape}")
""")
md("""
## A sharded train step
The batch is split over `data`, the weights over `model` (tensor parallel). The losses match
what one process with 8 devices computes (`tests/integration/test_cluster.py` checks that).
""")
code("""
%%spmd
rng = np.random.default_rng(0)
W1 = shardlab.data.shard((rng.normal(size=(16, 64)) / 4).astype(np.float32), mesh, P(None, "model"))
W2 = shardlab.data.shard((rng.normal(size=(64, 16)) / 8).astype(np.float32), mesh, P("model", None))
params = {"w1": W1, "w2": W2}
x = batch / 1024.0  # the global batch, sharded over `data`
target = jnp.sin(6 * x)

def loss_fn(p, x, y):
    return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - y) ** 2)

@jax.jit
def step(p, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
    return jax.tree.map(lambda w, g: w - 0.5 * g, p, grads), loss

losses = []
for i in range(5):
    params, loss = step(params, x, target)
    losses.append(float(loss))
print("losses:", " ".join(f"{l:.5f}" for l in losses))
assert losses[-1] < losses[0]
""")
md("""
## Records come back to the notebook
`analyze` runs where the devices are; its `Report` is a record, so `%cluster pull` brings it
here and the notebook draws it.
""")
code("""
%%spmd
report = shardlab.analyze(step, params, x, target, mesh=mesh,
                          in_shardings=({"w1": P(None, "model"), "w2": P("model", None)},
                                        P("data"), P("data")))
""")
code("""
%cluster pull report
report
""")
md("""
## Devices, memory and release, per process
""")
code("""
%spmd --all %devices
""")
code("""
%spmd --all %release
""")
md("""
`%cluster status` lists each process with its pid, devices, live device bytes and resident
memory (`shardlab.memory()` in a `%%spmd --all` cell draws each process's panel).
""")
code("""
%cluster status
""")
md("""
## An error names its process
""")
code(
    """
%%spmd
if jax.process_index() == 1:
    raise ValueError("a bad shard on this process")
""",
    raises=True,
)
md("""
If an engine dies (killed, out of memory), the next cell says which: *process 1 died; the
cluster is stopped; `%cluster restart`*, and the notebook keeps its variables. `%%spmd
--timeout 60` turns a hang, such as a collective waiting for a peer that never comes, into an
error (and stops the cluster: an interrupted collective cannot be resumed safely).
""")
code("""
%cluster stop
""")
write(cells, "notebooks/06_multi_process.ipynb")
