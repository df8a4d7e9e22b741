"""The ``shardlab`` comm on a real kernel: the status record and every request (status.py)."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from kernelclient import Execution, Kernel

pytestmark = pytest.mark.kernel

_ids = itertools.count()


class Comm:
    """A front end's end of a ``shardlab`` comm."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.comm_id = f"status-comm-test-{next(_ids)}"
        msg = kernel.client.session.msg(
            "comm_open", {"comm_id": self.comm_id, "target_name": "shardlab", "data": {}}
        )
        kernel.client.shell_channel.send(msg)
        opened = kernel._collect(
            msg["header"]["msg_id"], Execution(reply={}), time.monotonic() + 60, "comm_open"
        )
        self.first = self.mine(opened)

    def mine(self, execution: Execution) -> list[dict[str, Any]]:
        return [m["data"] for m in execution.comm_msgs if m["comm_id"] == self.comm_id]

    def ask(self, data: Any, *, timeout: float = 120) -> list[dict[str, Any]]:
        """The messages this comm got while the kernel handled ``data``."""
        return self.mine(self.kernel.send_comm(self.comm_id, data, timeout=timeout))

    def close(self) -> None:
        msg = self.kernel.client.session.msg("comm_close", {"comm_id": self.comm_id, "data": {}})
        self.kernel.client.shell_channel.send(msg)


def comm_info(kernel: Kernel) -> dict[str, Any]:
    reply = kernel.client.comm_info(target_name="shardlab", reply=True, timeout=60)
    return reply["content"]["comms"]


KERNEL_SETUP = "import jax, jax.numpy as jnp, shardlab\nfrom jax.sharding import PartitionSpec as P"


@pytest.fixture
def comm(kernel):
    c = Comm(kernel)
    yield c
    c.close()


def test_comm_info_advertises_the_target(kernel):
    comms = comm_info(kernel)
    assert any(c["target_name"] == "shardlab" for c in comms.values()), comms


def test_open_sends_the_record_with_mesh_arrays_and_history(kernel, comm):
    assert [m["type"] for m in comm.first] == ["status"]
    status = comm.first[0]["status"]
    assert status["devices"]["count"] == 8 and status["devices"]["kinds"] == ["cpu"]
    assert {"mesh", "largest_arrays", "history"} <= set(status)
    kernel.ok(
        "mesh = shardlab.mesh(data=2, model=4)\n"
        "big = jax.device_put(jnp.ones((64, 256)), jax.NamedSharding(mesh, P('data', None)))\n"
        "small = jnp.ones(3)\n"
        "tree = {'w': jnp.zeros((16, 16), jnp.bfloat16)}"
    )
    (reply,) = comm.ask({"request": "status", "id": "s1"})
    assert reply["type"] == "status" and reply["id"] == "s1"
    status = reply["status"]
    assert status["mesh"] == {"data": 2, "model": 4}
    rows = {row["name"]: row for row in status["largest_arrays"]}
    assert rows["big"] == {
        "name": "big",
        "shape": [64, 256],
        "dtype": "float32",
        "sharding": "P('data', None) on 2×4",
        "bytes_per_device": 32 * 256 * 4,
    }
    assert rows["small"]["sharding"] == "1 device"
    assert rows["tree['w']"]["dtype"] == "bfloat16"
    assert status["largest_arrays"][0]["name"] == "big"  # largest first
    assert len(status["largest_arrays"]) <= 10
    last = status["history"][-1]
    assert last["mode"] == "jit" and last["source"] == "default"
    assert last["execution_count"] == status["execution_count"]
    assert len(status["history"]) <= 10


def test_set_mesh_is_the_active_mesh(kernel, comm):
    kernel.ok("other = shardlab.mesh(data=8)")
    (reply,) = comm.ask({"request": "status"})
    assert reply["status"]["mesh"] == {"data": 8}  # the last Mesh bound to a name
    assert "id" not in reply
    try:
        kernel.ok("_previous = jax.set_mesh(shardlab.mesh(model=2, data=4))")
        (reply,) = comm.ask({"request": "status"})
        assert reply["status"]["mesh"] == {"model": 2, "data": 4}  # the set mesh wins
    finally:
        kernel.ok("_previous.__exit__(None, None, None)")
    (reply,) = comm.ask({"request": "status"})
    assert reply["status"]["mesh"] == {"data": 8}


def test_history_lists_the_last_ten_cells(kernel, comm):
    for i in range(12):
        kernel.ok(f"%%eager\nh{i} = {i}")
    (reply,) = comm.ask({"request": "status"})
    history = reply["status"]["history"]
    assert len(history) == 10
    assert all(item["mode"] == "eager" and item["source"] == "magic" for item in history)
    counts = [item["execution_count"] for item in history]
    assert counts == sorted(counts) and isinstance(history[0]["duration_s"], float)


def test_trivial_cells_send_nothing(kernel, comm):
    kernel.ok("t = 1")
    second = comm.mine(kernel.ok("t = 2"))
    assert second == []  # only volatile fields (count, duration, history) changed
    changed = comm.mine(kernel.ok("tbig = jnp.zeros(4096)"))
    assert [m["type"] for m in changed] == ["status"]


def test_release_replies_then_sends_status(kernel, comm):
    kernel.ok("junk = [jnp.ones(1000) for _ in range(3)]\ndel junk")
    messages = comm.ask({"request": "release", "id": 7})
    assert [m["type"] for m in messages] == ["release", "status"]
    release = messages[0]
    assert release["id"] == 7
    assert "device bytes" in release["text"] and "per device" in release["text"]
    assert isinstance(release["before"], int) and isinstance(release["after"], int)
    assert release["after"] <= release["before"]
    assert kernel.ok("float(big.sum())").text == "16384.0"  # named arrays are kept


def test_memory_history_a_line_per_device_with_release_and_mode_markers(kernel, comm):
    kernel.ok(
        "mem_a = jax.device_put(jnp.ones((512, 256)), jax.NamedSharding(shardlab.mesh(data=8), P('data')))"
    )
    kernel.ok("%%eager\nmem_b = jnp.ones((256, 256))")
    kernel.ok("del mem_a, mem_b\n%release")
    (reply,) = comm.ask({"request": "status"})
    history = reply["status"]["memory_history"]
    assert len(history["devices"]) == 8
    assert len(history["t"]) == len(history["bytes"]) >= 3
    assert history["t"] == sorted(history["t"])
    assert all(len(row) == 8 for row in history["bytes"])
    # the last sample is the record's bytes, device by device
    last = dict(zip(history["devices"], history["bytes"][-1], strict=True))
    assert last == reply["status"]["bytes_per_device"]
    # mem_a held 512 * 256 * 4 / 8 bytes on every device at some point
    peak = max(row[-1] for row in history["bytes"])
    assert peak >= 512 * 256 * 4 // 8
    kinds = [m["kind"] for m in history["markers"]]
    assert "release" in kinds and "mode" in kinds
    assert len(history["t"]) <= 240 and len(history["markers"]) <= 40


def test_memory_history_compact_is_capped_keeps_peaks_and_gaps():
    from shardlab.engine.resources.memory_history import MemoryRecorder

    values = {"n": 2, "big": 0}

    def sampler():
        return tuple((f"TFRT_CPU_{d}", 100 + values["big"] * (d + 1)) for d in range(values["n"]))

    rec = MemoryRecorder(None, sampler=sampler)
    for i in range(1000):
        values["big"] = 10_000 if i == 517 else 0
        rec.sample()
    values["n"] = 3
    rec.sample()
    rec.mark("release", "release (cell 4)")
    short = rec.compact(limit=50, max_markers=1)
    assert len(short["t"]) == 50 and short["samples"] == 1002
    assert short["devices"] == ["TFRT_CPU_0", "TFRT_CPU_1", "TFRT_CPU_2"]
    assert max(row[1] for row in short["bytes"] if row[1] is not None) == 100 + 20_000
    assert short["bytes"][0][2] is None and short["bytes"][-1][2] == 100  # absent: null
    assert [m["kind"] for m in short["markers"]] == ["release"]  # the newest kept


def test_set_default_mode(kernel, comm):
    try:
        messages = comm.ask({"request": "set_default_mode", "mode": "graph", "id": "m"})
        assert [m["type"] for m in messages] == ["status"]
        assert messages[0]["id"] == "m" and messages[0]["status"]["default_mode"] == "graph"
        assert "default mode: graph" in kernel.ok("%mode").stdout
    finally:
        comm.ask({"request": "set_default_mode", "mode": "jit"})
    (error,) = comm.ask({"request": "set_default_mode", "mode": "fast", "id": "bad"})
    assert error["type"] == "error" and error["request"] == "set_default_mode"
    assert error["id"] == "bad"
    assert "'fast'" in error["message"] and "eager" in error["message"]
    (missing,) = comm.ask({"request": "set_default_mode"})
    assert missing["type"] == "error" and "graph" in missing["message"]


def test_switch_devices(kernel, comm):
    kernel.ok("keep = jnp.arange(6.0)")
    try:
        messages = comm.ask({"request": "switch_devices", "spec": "cpu:4", "id": "d"})
        assert [m["type"] for m in messages] == ["devices", "status"]
        assert messages[0]["ok"] is True and messages[0]["id"] == "d"
        assert messages[0]["text"]
        assert messages[1]["status"]["devices"]["count"] == 4
        assert kernel.ok("float(keep.sum()), len(jax.devices())").text == "(15.0, 4)"
    finally:
        comm.ask({"request": "switch_devices", "spec": "cpu:8"})
    assert kernel.ok("len(jax.devices())").text == "8"


def test_switch_devices_to_gpus_says_how(kernel, comm):
    (reply,) = comm.ask({"request": "switch_devices", "spec": "gpu:0,1", "id": 1})
    assert reply["type"] == "devices" and reply["ok"] is False and reply["id"] == 1
    assert "python -m shardlab install --devices gpu:0,1" in reply["text"]
    (bad,) = comm.ask({"request": "switch_devices", "spec": "tpu:3"})
    assert bad["type"] == "devices" and bad["ok"] is False and "cpu:N" in bad["text"]
    (missing,) = comm.ask({"request": "switch_devices"})
    assert missing["type"] == "error" and "cpu:4" in missing["message"]


@pytest.mark.parametrize(
    "data",
    [{"request": "explode", "id": "x"}, {"id": "x"}, {"request": 3, "id": "x"}],
)
def test_bad_requests_get_an_error_naming_the_valid_ones(comm, data):
    (reply,) = comm.ask(data)
    assert reply["type"] == "error" and reply["id"] == "x"
    for name in ("status", "release", "set_default_mode", "switch_devices"):
        assert name in reply["message"]


def test_a_request_that_is_not_an_object(comm):
    (reply,) = comm.ask(["status"])
    assert reply["type"] == "error" and reply["request"] is None


def test_stock_kernel_advertises_the_target_after_load_ext():
    kernel = Kernel("python3")
    try:
        assert comm_info(kernel) == {}
        kernel.ok("%load_ext shardlab")
        assert any(c["target_name"] == "shardlab" for c in comm_info(kernel).values())
        comm = Comm(kernel)
        assert comm.first and comm.first[0]["type"] == "status"
        (reply,) = comm.ask({"request": "status", "id": "s"})
        assert reply["status"]["default_mode"] == "jit"
    finally:
        kernel.shutdown()
