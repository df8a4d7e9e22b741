"""The shardlab kernel as a real process, driven through jupyter_client."""

from __future__ import annotations

import re
import time

import pytest

from kernelclient import Kernel

pytestmark = pytest.mark.kernel

SETUP = """\
import jax, jax.numpy as jnp, numpy as np
x0 = jnp.ones(1)
def which_mode(v):
    if isinstance(v + 0, jax.core.Tracer):
        return "graph"
    seen = []
    jax.jit(lambda a: (seen.append(isinstance(a, jax.core.Tracer)), a)[1])(v)
    return "jit" if seen[0] else "eager"
"""
PROBE = "m = which_mode(x0)\nm"


KERNEL_SETUP = SETUP


def probe(kernel, prefix="", metadata=None):
    execution = kernel.ok(prefix + PROBE, metadata=metadata)
    return execution.text.strip("'\""), execution.metadata["shardlab"]


def test_eight_simulated_devices_by_default(kernel):
    assert kernel.ok("len(jax.devices())").text == "8"


def test_modes_and_their_precedence(kernel):
    assert probe(kernel) == ("jit", {"mode": "jit", "mode_source": "default", "mode_error": None})
    assert probe(kernel, "%%eager\n")[0] == "eager"
    assert probe(kernel, "%%graph\n")[0] == "graph"
    meta = {"shardlab": {"mode": "eager"}}
    assert probe(kernel, metadata=meta) == (
        "eager",
        {"mode": "eager", "mode_source": "metadata", "mode_error": None},
    )
    # magic beats metadata
    assert probe(kernel, "%%graph\n", metadata=meta)[1]["mode_source"] == "magic"
    assert probe(kernel, "%%graph\n", metadata=meta)[0] == "graph"
    kernel.ok("%mode graph")
    try:
        assert probe(kernel) == (
            "graph",
            {"mode": "graph", "mode_source": "default", "mode_error": None},
        )
        assert probe(kernel, metadata={"shardlab": {"mode": "jit"}})[0] == "jit"
    finally:
        kernel.ok("%mode jit")
    listing = kernel.ok("%mode").stdout
    assert "default mode: jit" in listing
    assert re.search(r"\] graph +\(from default\) ", listing)  # no space inside
    assert re.search(r"\] eager +\(from metadata\) ", listing)


def test_eager_cell_prints_concrete_values_inside_jit(kernel):
    out = kernel.ok(
        "%%eager\n@jax.jit\ndef show(v):\n    print('value', v)\n    return v\nshow(x0)"
    )
    assert "value [1.]" in out.stdout


def test_graph_cell_is_cached_by_input_shapes(kernel):
    kernel.ok(
        "traces = [0]\ndef counted(v):\n    traces[0] += 1\n    return v * 2\nxs = jnp.arange(4.)"
    )
    cell = "%%graph\nys = counted(xs)\ntotal = ys.sum()\nprint('total', total)\ntotal"
    outputs = [kernel.ok(cell) for _ in range(3)]
    assert [o.text for o in outputs] == ["Array(12., dtype=float32)"] * 3
    assert [o.stdout.strip().splitlines()[-1] for o in outputs] == ["total 12.0"] * 3
    assert kernel.ok("traces[0]").text == "1"
    kernel.ok("xs = jnp.arange(6.)")
    assert kernel.ok(cell).text == "Array(30., dtype=float32)"
    assert kernel.ok("traces[0]").text == "2"


def test_graph_error_names_line_and_fix_and_keeps_data(kernel):
    kernel.ok("keep = jnp.arange(3.)")
    execution = kernel.execute("%%graph\nkeep = keep + 1\nif keep.sum() > 0:\n    other = 1\n")
    assert execution.status == "error"
    error = execution.errors[0]
    # the `if` is converted to lax.cond; `other`, bound on one path only, is the error
    # (ControlFlowError, a GraphStagingError)
    assert error["ename"] == "ControlFlowError"
    assert "`other` is bound only when the condition is true" in error["evalue"]
    assert "cell line 3: `if keep.sum() > 0:`" in error["evalue"]
    assert "jnp.where" in error["evalue"]
    assert not any("shardlab/" in line for line in error["traceback"])
    assert kernel.ok("keep.tolist()").text == "[0.0, 1.0, 2.0]"
    assert kernel.ok("'other' in dir()").text == "False"


def test_bad_modes_are_clear_errors_and_cells_do_not_run(kernel):
    cell = kernel.execute("%%mode fast\nran = True")
    assert cell.status == "error" and "%%mode: unknown mode 'fast'" in cell.errors[0]["evalue"]
    assert probe(kernel, "%%mode eager\n")[0] == "eager"
    bad = kernel.execute("%mode fast")
    assert bad.status == "error" and "unknown mode 'fast'" in bad.reply["content"]["evalue"]
    assert "'eager', 'jit' and 'graph'" in bad.stderr
    meta = kernel.execute("ran = True", metadata={"shardlab": {"mode": "grpah"}})
    assert meta.status == "error"
    assert (
        meta.errors[0]["ename"] == "ModeError"
        and "Did you mean 'graph'" in meta.errors[0]["evalue"]
    )
    assert meta.metadata["shardlab"]["mode_error"]
    shape = kernel.execute("ran = True", metadata={"shardlab": "graph"})
    assert shape.status == "error" and "expected an object" in shape.errors[0]["evalue"]
    assert kernel.ok("'ran' in dir()").text == "False"


def test_graph_cell_that_raises_keeps_namespace(kernel):
    kernel.ok("g = jnp.ones(2)")
    failed = kernel.execute("%%graph\ng = g * 10\nboom = 1 / 0\n")
    assert failed.status == "error" and failed.errors[0]["ename"] == "ZeroDivisionError"
    assert kernel.ok("float(g[0]), 'boom' in dir()").text == "(1.0, False)"


def test_status_comm_sends_record_on_open_and_after_each_cell(kernel):
    client = kernel.client
    comm_id = "status-test"
    msg = client.session.msg(
        "comm_open", {"comm_id": comm_id, "target_name": "shardlab", "data": {}}
    )
    client.shell_channel.send(msg)
    first = None
    deadline = time.monotonic() + 30
    while first is None and time.monotonic() < deadline:
        message = client.get_iopub_msg(timeout=30)
        if message["msg_type"] == "comm_msg" and message["content"]["comm_id"] == comm_id:
            first = message["content"]["data"]
    assert first is not None and first["type"] == "status"
    assert first["status"]["devices"]["count"] == 8
    assert first["status"]["devices"]["pinned"] == "cpu:8"
    execution = kernel.ok("%%eager\nbytes_probe = jnp.zeros(1024)")
    updates = [m["data"]["status"] for m in execution.comm_msgs if m["comm_id"] == comm_id]
    assert updates, "no status after the cell"
    status = updates[-1]
    assert status["last_mode"] == "eager" and status["default_mode"] == "jit"
    assert sum(status["bytes_per_device"].values()) >= 4096
    close = client.session.msg("comm_close", {"comm_id": comm_id, "data": {}})
    client.shell_channel.send(close)


def test_out_of_memory_error_releases_and_says_so(kernel):
    execution = kernel.execute("big = np.empty(2**52, dtype=np.uint8)")
    assert execution.status == "error" and execution.errors[0]["ename"] in (
        "MemoryError",
        "_ArrayMemoryError",
    )
    assert "ran out of memory; released" in execution.stdout
    assert kernel.ok("1 + 1").text == "2"


def test_interrupt_during_long_graph_trace_keeps_data():
    kernel = Kernel()
    try:
        kernel.ok(
            "import time, jax.numpy as jnp\nv = jnp.ones(3)\n"
            "def slow(a):\n    time.sleep(20)\n    return a * 5"
        )
        msg_id = kernel.send("%%graph\nv = slow(v)\n")
        time.sleep(2)
        kernel.manager.interrupt_kernel()
        interrupted = kernel.wait(msg_id, timeout=60)
        assert interrupted.status == "error"
        assert interrupted.reply["content"]["ename"] == "KeyboardInterrupt"
        assert kernel.ok("float(v[0])").text == "1.0"
        assert kernel.is_alive()
    finally:
        kernel.shutdown()
