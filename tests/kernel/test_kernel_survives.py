"""One cell must not kill the kernel (issue 37, item 1), in a real kernel.

An array whose bytes overflow int64 made XLA abort the kernel process (SIGABRT, "overflow in
static extent product"): ``jnp.ones((2**61,))``, the same in a ``%%graph`` cell, ``2**62`` in
an ``%%eager`` cell. The array-size guard refuses them (and results larger than the host's
memory) with an error naming the shape, its size and what fits; the kernel lives on with the
user's names. A death below Python that nothing can intercept is named, cell and all, by the
kernel Jupyter restarts in its place.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from kernelclient import Kernel
from shardlab.kernel.last_cell import SUFFIX, LastCell, first_line, note_path

pytestmark = pytest.mark.kernel

KERNEL_SETUP = "import jax, jax.numpy as jnp, numpy as np\nx = 1"


def refused(kernel: Kernel, code: str, shape: str) -> str:
    """The refusal's text, with the cell's own number in it."""
    execution = kernel.execute(code)
    assert execution.status == "error", execution.stdout
    text = execution.error_text
    assert "ArrayTooLargeError" in text, text
    assert shape in text, text
    assert "What fits: at most" in text and "GiB" in text, text
    assert kernel.ok("x").text == "1"  # the kernel and its names are still there
    assert kernel.ok("'big' in dir()").text == "False"
    return text.replace(f"In [{execution.reply['content']['execution_count']}]", "In [this]")


def test_huge_eager_op_is_refused_and_the_kernel_keeps_its_names(kernel):
    text = refused(kernel, "big = jnp.ones((2**61,))", "(2305843009213693952,)")
    assert "8.0 EiB" in text and "more than XLA can compile" in text
    assert "made at In [this], line 1 (broadcast_in_dim): `big = jnp.ones((2**61,))`" in text


def test_graph_cell_is_refused(kernel):
    text = refused(kernel, "%%graph\nbig = jnp.ones((2**61,))", "(2305843009213693952,)")
    assert "8.0 EiB" in text and "made at In [this], line 2" in text


def test_eager_cell_is_refused(kernel):
    text = refused(kernel, "%%eager\nbig = jnp.ones((2**62,))", "(4611686018427387904,)")
    assert "16.0 EiB" in text and "made at In [this], line 2" in text


def test_jit_and_other_ops_are_refused(kernel):
    refused(kernel, "big = jax.jit(lambda: jnp.zeros((2**61,)))()", "(2305843009213693952,)")
    refused(kernel, "big = jnp.arange(2**61, dtype=jnp.float32)", "(2305843009213693952,)")
    refused(
        kernel, "big = jnp.broadcast_to(jnp.float32(1), (2**31, 2**30))", "(2147483648, 1073741824)"
    )
    # an intermediate XLA would fuse away is refused too: XLA aborts on its shape all the same
    refused(kernel, "big = jax.jit(lambda: jnp.ones((2**61,)).sum())()", "(2305843009213693952,)")


def test_results_larger_than_the_host_are_refused(kernel):
    text = refused(kernel, "big = jnp.zeros((2**40,))", "(1099511627776,)")
    assert "4.0 TiB is more than this host's memory" in text
    # planning a program larger than this machine stays allowed: nothing is allocated
    compiled = kernel.ok("jax.jit(lambda: jnp.zeros((2**40,))).lower().compile() is not None")
    assert compiled.text == "True"


def test_the_guard_is_a_setting(kernel):
    installed = "from shardlab.engine.resources import shape_guard\nshape_guard.installed()"
    assert kernel.ok(installed).text == "True"
    kernel.ok("%config ShardlabSession.guard_array_sizes = False")
    assert kernel.ok(installed).text == "False"
    kernel.ok("%config ShardlabSession.guard_array_sizes = True")
    assert kernel.ok(installed).text == "True"


def test_normal_programs_run(kernel):
    assert kernel.ok("float(jnp.ones((1000, 1000)).sum())").text == "1000000.0"
    kernel.ok("%%graph\ny = jnp.arange(4.0) * 2")
    assert kernel.ok("float(y.sum())").text == "12.0"


def test_a_death_below_python_is_named_by_the_next_kernel():
    """``os.abort()`` stands for what no guard can catch (an abort in native code): Jupyter
    restarts the kernel on the same connection file, and its first cell says which cell
    the previous kernel died in."""
    k = Kernel()
    try:
        k.ok("import os\nx = 1")
        cell = "print('about to die')  # the doomed cell\nos.abort()"
        k.send(cell, metadata={"cellId": "doomed-cell"})
        deadline = time.monotonic() + 60
        while k.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not k.is_alive()
        k.manager.restart_kernel(now=True)
        k.client.wait_for_ready(timeout=120)
        first = k.ok("y = 2")
        assert "previous kernel" in first.stderr and "died while running In [2]" in first.stderr
        assert "`print('about to die')  # the doomed cell`" in first.stderr, first.stderr
        assert "Its variables are lost" in first.stderr
        # said once; cells that end normally leave nothing to say
        assert "previous kernel" not in k.ok("y").stderr
        k.manager.restart_kernel(now=False)
        k.client.wait_for_ready(timeout=120)
        assert "previous kernel" not in k.ok("z = 3").stderr
    finally:
        k.shutdown()


def test_a_killed_kernel_mid_cell_is_named_too():
    """SIGKILL (what the system's out-of-memory killer sends) mid-cell."""
    k = Kernel()
    try:
        pid = int(k.ok("import os, time\nos.getpid()").text)
        k.send("time.sleep(60)")
        note = note_path(k.manager.connection_file)
        assert note is not None
        deadline = time.monotonic() + 30
        while not note.exists() and time.monotonic() < deadline:  # the cell has begun
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while k.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        k.manager.restart_kernel(now=True)
        k.client.wait_for_ready(timeout=120)
        notice = k.ok("1").stderr
        assert f"previous kernel (pid {pid}) died while running In [2]" in notice, notice
        assert "`time.sleep(60)`" in notice
    finally:
        k.shutdown()


def test_the_note_of_the_running_cell(tmp_path):
    """``last_cell.py`` without a kernel: a note from another process is its predecessor's
    (read once); this process's own note, a torn or missing file is nothing."""
    path = note_path(tmp_path / "kernel-abc.json")
    assert path is not None and path.name == "kernel-abc" + SUFFIX
    mine = LastCell(path)
    mine.begin("\n%%eager\nbig = f()\n", execution_count=7, cell_id="c1", silent=False)
    assert LastCell(path).take_predecessor() is None  # this process: not a death
    mine.begin("x = 1", execution_count=8, cell_id=None, silent=False)
    mine.end()
    assert not path.exists()
    mine.begin("big = f()", execution_count=9, cell_id="c9", silent=False)
    note = json.loads(path.read_text())
    note["pid"] = 1  # as a dead predecessor left it
    path.write_text(json.dumps(note))
    found = LastCell(path).take_predecessor()
    assert found is not None and not path.exists()  # read once
    assert "died while running In [9] (cell id c9)" in found.notice()
    assert "`big = f()`" in found.notice()
    path.write_text('{"pid": 1, "first')  # torn by the death
    assert LastCell(path).take_predecessor() is None
    assert first_line("\n\n  %%graph  \nx = 1") == "%%graph"
    assert LastCell(None).take_predecessor() is None  # no connection file: no notes
