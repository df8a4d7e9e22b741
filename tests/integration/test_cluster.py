"""%cluster and %%spmd with real processes: 2 ipyparallel engines × 4 CPU devices, one JAX
runtime, driven from a real shardlab kernel (which never joins the runtime itself).

One cluster is shared by the module; the fault tests at the end stop it and restart it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import signal
import textwrap
import time

import psutil
import pytest

from kernelclient import Kernel

pytestmark = [pytest.mark.slow, pytest.mark.kernel, pytest.mark.timeout(300)]

START = "%cluster start -n 2 --devices-per-process 4"

# A small two-layer model, data parallel over `data` and tensor parallel over `model`; the same
# code runs in the kernel on 8 devices of one process and on the cluster's 2 × 4.
TRAIN = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np, shardlab
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = shardlab.mesh(data=2, model=4)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(32, 16)).astype(np.float32)
    Y = rng.normal(size=(32, 4)).astype(np.float32)
    W1 = (rng.normal(size=(16, 64)) / 4).astype(np.float32)
    W2 = (rng.normal(size=(64, 4)) / 8).astype(np.float32)
    def put(a, spec):
        return shardlab.data.shard(a, mesh, spec)
    params = {"w1": put(W1, P(None, "model")), "w2": put(W2, P("model", None))}
    x, y = put(X, P("data")), put(Y, P("data"))
    def loss_fn(p, x, y):
        h = jnp.tanh(x @ p["w1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)
    @jax.jit
    def step(p, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        return jax.tree.map(lambda w, g: w - 0.1 * g, p, grads), loss
    losses = []
    for _ in range(3):
        params, loss = step(params, x, y)
        losses.append(float(loss))
    """
)


def children(pid: int) -> list[psutil.Process]:
    try:
        return [p for p in psutil.Process(pid).children(recursive=True) if _alive(p)]
    except psutil.NoSuchProcess:
        return []


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def engine_pids(kernel: Kernel) -> list[int]:
    status = kernel.ok("%cluster status").stdout
    return [int(p) for p in re.findall(r"process \d+: pid (\d+)", status)]


@pytest.fixture(scope="module")
def kernel():
    k = Kernel()
    k.pid = int(k.ok("import os; os.getpid()").text)  # type: ignore[attr-defined]
    started = time.monotonic()
    out = k.ok(START, timeout=180)
    k.start_s = time.monotonic() - started  # type: ignore[attr-defined]
    assert "2 processes" in out.stdout and "8 devices" in out.stdout, out.stdout
    yield k
    k.execute("%cluster stop", timeout=60)
    k.shutdown()


def test_status_processes_and_loopback_listeners(kernel):
    status = kernel.ok("%cluster status").stdout
    assert "process 0: pid" in status and "process 1: pid" in status
    assert "cpu devices 0,1,2,3" in status
    listening = re.search(r"listening: (.*)", status)
    assert listening is not None
    # every listening socket of the cluster's processes (controller, engines, their helpers):
    # the coordinator, gloo and ipyparallel all on loopback
    found = []
    for process in children(kernel.pid):
        try:
            conns = process.net_connections("inet")
        except psutil.Error:
            continue
        found += [c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN]
    assert found, "the cluster has listening sockets"
    for ip in found:
        address = ipaddress.ip_address(ip)
        mapped = getattr(address, "ipv4_mapped", None)
        assert (mapped or address).is_loopback, f"listener on {ip}"
    # the notebook's own kernel never joined the distributed runtime
    joined = kernel.ok(
        "from jax._src import distributed as _d\n_d.global_state.client is None"
    ).text
    assert joined == "True"


def test_cross_process_psum(kernel):
    out = kernel.ok(
        "%%spmd --all\n"
        "import jax, jax.numpy as jnp, numpy as np, shardlab\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "mesh = shardlab.mesh(data=2, model=4)\n"
        "local = np.full((4,), jax.process_index() + 1.0, np.float32)\n"
        "x = jax.make_array_from_process_local_data(NamedSharding(mesh, P(('data', 'model'))), local)\n"
        "total = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, ('data', 'model')), mesh=mesh,\n"
        "    in_specs=P(('data', 'model')), out_specs=P()))(x)\n"
        "print('psum', float(total[0]), len(jax.devices()), jax.process_count())\n"
    )
    assert "[p0] psum 12.0 8 2" in out.stdout and "[p1] psum 12.0 8 2" in out.stdout, out.stdout


def test_train_step_loss_equals_single_process(kernel):
    kernel.ok("%%spmd\n" + TRAIN)
    kernel.ok("%cluster pull losses --as cluster_losses")
    kernel.ok(TRAIN)  # the kernel's own 8 devices, one process
    out = kernel.ok(
        "import numpy as _np\n"
        "print(cluster_losses, losses)\n"
        "bool(_np.allclose(cluster_losses, losses, rtol=1e-5, atol=1e-6)) and len(losses) == 3"
    )
    assert out.text == "True", out.stdout


def test_each_process_reads_only_its_slice(kernel):
    kernel.ok(
        "%%spmd\n"
        "reads = []\n"
        "data = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)\n"
        "def load(index):\n"
        "    reads.append(index)\n"
        "    return data[index]\n"
        "batch = shardlab.data.shard(load, mesh, P('data'), shape=data.shape)\n"
        "rows = sum(i[0].stop - i[0].start for i in reads)\n"
        "total = float(jax.jit(lambda b: b.sum(), out_shardings=NamedSharding(mesh, P()))(batch))\n"
    )
    out = kernel.ok("%spmd --all print('rows', rows, 'of', data.shape[0], 'total', total)")
    expected = float(sum(range(64 * 8)))
    assert f"[p0] rows 32 of 64 total {expected}" in out.stdout, out.stdout
    assert f"[p1] rows 32 of 64 total {expected}" in out.stdout, out.stdout


def test_cell_modes_apply_on_the_engines(kernel):
    probe = (
        "%%spmd\n"
        "seen = []\n"
        "f = jax.jit(lambda a: (seen.append(isinstance(a, jax.core.Tracer)), a * 2)[1])\n"
        "out = f(jnp.ones(2))\n"
        "print('traced' if seen[0] else 'concrete')\n"
    )
    kernel.ok("%mode eager")
    assert "concrete" in kernel.ok(probe).stdout
    kernel.ok("%mode jit")
    assert "traced" in kernel.ok(probe).stdout
    kernel.ok("%mode graph")
    graph = kernel.ok("%%spmd\nz = jnp.arange(4.0) * 3\nprint('graph sum', z.sum())")
    kernel.ok("%mode jit")
    assert "graph sum 18.0" in graph.stdout
    staged = kernel.ok("%spmd print(len(get_ipython()._shardlab_session.graph_cache._cells))")
    assert staged.stdout.strip() not in ("", "0"), staged.stdout


def test_error_names_its_process(kernel):
    out = kernel.execute("%%spmd\nif jax.process_index() == 1:\n    raise ValueError('only on 1')")
    assert out.status == "error"
    assert out.errors[0]["ename"] == "SpmdError"
    assert "process 1: ValueError: only on 1" in out.errors[0]["evalue"]
    assert "process 0" not in out.errors[0]["evalue"]
    assert any("only on 1" in line for line in out.errors[0]["traceback"])


def test_records_come_back_to_be_drawn(kernel):
    kernel.ok(
        "%%spmd\n"
        "report = shardlab.analyze(lambda a, b: a @ b, jnp.ones((64, 32)), jnp.ones((32, 16)),\n"
        "    mesh=mesh, in_shardings=(P('data', 'model'), P('model', None)))\n"
    )
    kernel.ok("%cluster pull report")
    out = kernel.ok(
        "print(type(report).__name__, report.mesh_shape if hasattr(report, 'mesh_shape') else '')\nreport"
    )
    assert out.stdout.startswith("Report"), out.stdout
    assert any("text/html" in r["data"] for r in out.results), "drawn in the notebook"


def test_release_devices_and_memory_per_process(kernel):
    release = kernel.ok("%spmd --all %release").stdout
    assert "[p0]" in release and "[p1]" in release
    devices = kernel.ok("%spmd --all %devices").stdout
    assert "[p1] pinned:   cpu:4" in devices, devices
    memory = kernel.ok("%%spmd --all\nshardlab.memory()")
    assert len(memory.displays) >= 2, memory.displays
    assert {d["metadata"].get("shardlab_process") for d in memory.displays} == {0, 1}


def test_timeouts_kill_and_restart(kernel):
    # a collective that waits for a peer: the timeout turns the hang into an error and
    # stops the cluster (an interrupted collective would pair with the peer's next one)
    stuck = kernel.execute(
        "%%spmd --timeout 3\n"
        "import jax, jax.numpy as jnp, shardlab\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "mesh = shardlab.mesh(data=2, model=4)\n"
        "batch = jax.device_put(jnp.ones(8), NamedSharding(mesh, P(('data', 'model'))))\n"
        "if jax.process_index() == 0:\n"
        "    float(jax.jit(lambda b: b.sum(), out_shardings=NamedSharding(mesh, P()))(batch))\n"
        "else:\n"
        "    import time; time.sleep(600)\n",
        timeout=60,
    )
    assert stuck.status == "error", stuck.stdout
    assert "timeout of 3 s" in stuck.errors[0]["evalue"], stuck.errors
    assert "%cluster restart" in stuck.errors[0]["evalue"]
    assert children(kernel.pid) == []

    started = time.monotonic()
    kernel.ok("%cluster restart", timeout=180)
    restart_s = time.monotonic() - started
    kernel.ok("kept = 41")  # the notebook's namespace survives what follows

    # kill -9 an engine while the other waits on it in collectives
    victim = engine_pids(kernel)[1]
    pending = kernel.send(
        "%%spmd\n"
        "import jax, jax.numpy as jnp, shardlab\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "mesh = shardlab.mesh(data=2, model=4)\n"
        "x = jax.device_put(jnp.ones(8), NamedSharding(mesh, P(('data', 'model'))))\n"
        "f = jax.jit(lambda a: a + a.sum() * 0)\n"
        "print('looping', flush=True)\n"
        "while True:\n"
        "    x = f(x).block_until_ready()\n"
    )
    time.sleep(4)
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    died = kernel.wait(pending, timeout=60)
    detect_s = time.monotonic() - killed
    message = died.errors[0]["evalue"]
    assert "process 1 died" in message and "the cluster is stopped" in message, message
    assert "`%cluster restart`" in message
    assert detect_s < 30, detect_s
    assert kernel.is_alive() and kernel.ok("kept + 1").text == "42"
    deadline = time.monotonic() + 10
    while children(kernel.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert children(kernel.pid) == [], "no process of the cluster is left"
    assert "died" in kernel.ok("%cluster status").stdout

    kernel.ok("%cluster restart", timeout=180)
    assert "psum" in kernel.ok("%spmd import jax; print('psum', jax.process_count())").stdout
    started = time.monotonic()
    kernel.ok("%cluster stop")
    stop_s = time.monotonic() - started
    assert children(kernel.pid) == [], "%cluster stop leaves no process"

    # an idle cluster whose process 0 (the coordinator) is killed: seen without any cell
    kernel.ok("%cluster start", timeout=180)  # the defaults: -n 2, 1 CPU device each
    coordinator = engine_pids(kernel)[0]
    os.kill(coordinator, signal.SIGKILL)
    killed = time.monotonic()
    while children(kernel.pid) and time.monotonic() - killed < 30:
        time.sleep(0.1)
    idle_s = time.monotonic() - killed
    assert children(kernel.pid) == []
    assert "process 0 died" in kernel.ok("%cluster status").stdout
    print(
        f"start {kernel.start_s:.1f} s, restart {restart_s:.1f} s, death seen {detect_s:.2f} s "
        f"(busy) {idle_s:.2f} s (idle), stop {stop_s:.1f} s"
    )


HEARTBEAT_S = 3
# collectives in a loop on every process: each waits for all the others
COLLECTIVES = (
    "%%spmd\n"
    "import time\n"
    "from jax.experimental import multihost_utils\n"
    "print('looping', flush=True)\n"
    "while True:\n"
    "    multihost_utils.sync_global_devices('step')\n"
    "    time.sleep(0.05)\n"
)


def _resume(pids: list[int]) -> None:
    for pid in pids:  # a stopped process left behind would hold its ports
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGCONT)


def test_a_hung_process_is_named_not_the_ones_jax_aborted(kernel):
    """SIGSTOP one engine: JAX's runtime aborts the others (SIGABRT) about one heartbeat
    timeout later. The cell that was running fails within the timeout naming the stopped
    engine as hung, with the aborts as consequences; a hang while no cell runs is told to
    the next cell, with its time."""
    start = f"%cluster restart -n 3 --heartbeat-timeout {HEARTBEAT_S}"
    stopped: list[int] = []
    try:
        kernel.ok(start, timeout=180)
        pids = engine_pids(kernel)
        assert len(pids) == 3
        pending = kernel.send(COLLECTIVES)
        time.sleep(4)
        stopped.append(pids[2])
        os.kill(pids[2], signal.SIGSTOP)
        at = time.monotonic()
        hung = kernel.wait(pending, timeout=60)
        detect_s = time.monotonic() - at
        assert hung.status == "error" and "looping" in hung.stdout, hung.stdout
        message = hung.errors[0]["evalue"]
        named = f"process 2 (pid {pids[2]}) hung: it stopped answering for "
        assert message.startswith(named), message
        assert "it is stopped: SIGSTOP" in message, message
        found = re.search(r"answering for ([\d.]+) s", message)
        assert found is not None, message
        silent_s = float(found.group(1))
        assert 0.3 * HEARTBEAT_S <= silent_s <= HEARTBEAT_S + 1, message
        # the processes JAX's runtime aborted are consequences, not deaths of their own
        assert "died" not in message and "PollForError" not in message, message
        if "aborted" in message:
            assert re.search(
                r"aborted processes? [01](, [01])? \(killed by SIGABRT\) as a "
                r"consequence",
                message,
            ), message
        assert message.endswith("the cluster is stopped; `%cluster restart`"), message
        assert detect_s < HEARTBEAT_S + 2, detect_s
        assert hung.stderr == "", "no notice besides the cell's own error"
        deadline = time.monotonic() + 10
        while children(kernel.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert children(kernel.pid) == [], "no process of the cluster is left"
        later = kernel.ok("after = 1")
        assert later.stdout == later.stderr == "", "no notice lands under a later cell"
        status = kernel.ok("%cluster status").stdout
        assert status.startswith("cluster: stopped — at ") and named in status, status

        # the coordinator (process 0) stops while no cell runs: the next cell is told
        kernel.ok(start, timeout=180)
        pids = engine_pids(kernel)
        stopped.append(pids[0])
        os.kill(pids[0], signal.SIGSTOP)
        stopped_at = time.time()
        at = time.monotonic()
        while children(kernel.pid) and time.monotonic() - at < HEARTBEAT_S + 10:
            time.sleep(0.1)
        idle_s = time.monotonic() - at
        assert children(kernel.pid) == [], "the hang stopped the cluster without any cell"
        time.sleep(1)
        told = kernel.execute("%spmd print('never runs')")
        assert told.status == "error"
        message = told.errors[0]["evalue"]
        when = re.match(
            r"earlier, at (\d\d:\d\d:\d\d) \((\d+) s ago, while no cell ran "
            r"on it\): ",
            message,
        )
        assert when is not None, message
        happened = time.mktime(
            time.strptime(
                time.strftime("%Y-%m-%d ", time.localtime(stopped_at)) + when.group(1),
                "%Y-%m-%d %H:%M:%S",
            )
        )
        assert stopped_at - 1 <= happened <= stopped_at + HEARTBEAT_S + 3, message
        assert message[when.end() :].startswith(
            f"process 0 (pid {pids[0]}) hung: it stopped answering for "
        ), message
        assert "never runs" not in told.stdout

        # restartable, as the message says
        kernel.ok("%cluster restart", timeout=180)
        count = kernel.ok("%spmd import jax; print('processes', jax.process_count())").stdout
        assert "processes 3" in count, count
        print(f"hang seen {detect_s:.2f} s (busy), {idle_s:.2f} s to no process (idle)")
    finally:
        _resume(stopped)


def cluster_folders(root) -> list[str]:
    """The cluster folders (ipyparallel's profile: connection files with their keys, logs)
    under ``root``, the kernel's TMPDIR."""
    return sorted(p.name for p in root.iterdir() if p.name.startswith("shardlab-cluster-"))


def test_a_killed_kernel_leaves_no_process_and_no_folder(tmp_path):
    k = Kernel(extra_env={"TMPDIR": str(tmp_path)})
    try:
        pid = int(k.ok("import os; os.getpid()").text)
        k.ok("%cluster start -n 2", timeout=180)
        spawned = children(pid)
        assert len(spawned) >= 3  # controller, 2 engines (and their helpers)
        assert len(cluster_folders(tmp_path)) == 1
        os.kill(pid, signal.SIGKILL)  # no clean-up runs in the kernel
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in spawned) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [p.pid for p in spawned if _alive(p)]
        for orphan in left:  # do not leave them to the next test
            os.kill(orphan, signal.SIGKILL)
        assert left == [], "every engine and the controller exit with their kernel"
        # the orphaned processes remove the folder they were started with
        while cluster_folders(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert cluster_folders(tmp_path) == [], "the cluster's keys stay behind"
    finally:
        k.shutdown()  # reaps the killed kernel's process


def test_shutting_the_kernel_down_removes_the_cluster_folder(tmp_path):
    k = Kernel(extra_env={"TMPDIR": str(tmp_path)})
    try:
        k.ok("%cluster start -n 1", timeout=180)
        assert len(cluster_folders(tmp_path)) == 1
        k.client.stop_channels()
        k.manager.shutdown_kernel(now=False)  # a shutdown_request, as JupyterLab sends
        assert cluster_folders(tmp_path) == [], "the cluster's keys stay behind"
    finally:
        if k.manager.has_kernel:
            k.manager.shutdown_kernel(now=True)
