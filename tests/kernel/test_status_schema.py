"""The status record (``status_record`` in kernel/status.py) against its one definition,
``labextension/protocol/status.schema.json``, which the lab extension's validator is checked
against too (``labextension/test/status-schema.test.ts``).

The records come from a real session on an in-process IPython shell (no kernel process):
before any cell, and after cells in every mode with a mesh, named arrays and memory recorded.
"""

from __future__ import annotations

import copy
import json
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from shardlab.engine.resources import memory_history
from shardlab.kernel.register import register, unregister
from shardlab.kernel.session import ShardlabSession
from shardlab.kernel.status import status_record

REPO = pathlib.Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO / "labextension" / "protocol" / "status.schema.json"
SCHEMA = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)

CELLS = [
    "import jax, jax.numpy as jnp, shardlab\nfrom jax.sharding import PartitionSpec as P",
    "mesh = shardlab.mesh(data=2, model=4)\n"
    "big = jax.device_put(jnp.ones((64, 256)), jax.NamedSharding(mesh, P('data', None)))",
    "%%eager\nsmall = jnp.ones(3)",
    "%%graph\ntree = {'w': jnp.zeros((16, 16), jnp.bfloat16)}",
    "%%mode jit\ntotal = big.sum()",
]


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    """An in-process shell with a shardlab session (no history file, no kernel)."""
    existing = InteractiveShell.initialized()
    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=config)
    register(shell)
    yield shell
    unregister(shell)
    if not existing:
        InteractiveShell.clear_instance()


def _session(shell: InteractiveShell) -> ShardlabSession:
    session = register(shell)  # idempotent: the shell's session
    assert isinstance(session, ShardlabSession)
    return session


def _sent(record: dict[str, Any]) -> dict[str, Any]:
    """The record as the comm carries it: JSON, with no NaN or infinity."""
    return json.loads(json.dumps(record, allow_nan=False))


@pytest.fixture(scope="module")
def fresh(shell: InteractiveShell) -> dict[str, Any]:
    """The record before any cell: nulls, no memory recorded."""
    return _sent(status_record(_session(shell)))


@pytest.fixture(scope="module")
def full(shell: InteractiveShell, fresh: dict[str, Any]) -> dict[str, Any]:
    """The record after cells in every mode, with a mesh, arrays and memory over time."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SHARDLAB_DEVICES", "cpu:8")
        memory_history.recorder(shell).activate()  # as a comm opening does
        for code in CELLS:
            result = shell.run_cell(code, store_history=True)
            assert result.success, (code, result.error_before_exec, result.error_in_exec)
        return _sent(status_record(_session(shell)))


def test_the_schema_is_a_valid_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_the_record_before_any_cell_is_valid(fresh):
    VALIDATOR.validate(fresh)
    assert fresh["last_mode"] is None and fresh["execution_count"] is None
    assert fresh["memory_history"] is None and fresh["history"] == []


def test_the_record_after_cells_is_valid(full):
    VALIDATOR.validate(full)
    assert full["mesh"] == {"data": 2, "model": 4}
    assert full["devices"]["pinned"] == "cpu:8"
    assert {row["name"] for row in full["largest_arrays"]} >= {"big", "small", "tree['w']"}
    assert [item["mode"] for item in full["history"]][-4:] == ["jit", "eager", "graph", "jit"]
    assert full["memory_history"]["markers"], "mode switches are marked"


def test_the_record_without_details_is_valid(shell, full):
    record = _sent(status_record(_session(shell), details=False))
    VALIDATOR.validate(record)
    assert record["largest_arrays"] == []


def test_the_schema_names_every_field_the_kernel_sends(full):
    """Not only valid: every field of the record is one the schema describes."""
    properties = SCHEMA["properties"]
    assert set(full) == set(properties)
    assert set(full["devices"]) == set(properties["devices"]["properties"])
    array_fields = set(properties["largest_arrays"]["items"]["properties"])
    assert all(set(row) == array_fields for row in full["largest_arrays"])
    history_fields = set(properties["history"]["items"]["properties"])
    assert all(set(item) == history_fields for item in full["history"])
    memory = SCHEMA["$defs"]["memoryHistory"]["properties"]
    assert set(full["memory_history"]) == set(memory)
    marker_fields = set(memory["markers"]["items"]["properties"])
    assert all(set(m) == marker_fields for m in full["memory_history"]["markers"])


def test_a_history_duration_that_is_not_finite_is_null_and_valid(full):
    """The kernel sends no NaN (``_finite``): a row whose duration it could not measure says
    null, and the record is still valid (the front end shows no duration for it)."""
    record = copy.deepcopy(full)
    record["history"][0]["duration_s"] = None
    VALIDATOR.validate(record)


def test_fields_from_newer_kernels_are_allowed(full):
    VALIDATOR.validate({**full, "a_future_field": {"anything": True}})


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(record: dict[str, Any]) -> None:
        target = record
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def _drop(path: tuple[Any, ...]) -> Callable[[dict[str, Any]], None]:
    def change(record: dict[str, Any]) -> None:
        target = record
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return change


BROKEN = {
    # wrong types and values
    "version as a string": _set(("version",), "1"),
    "an unknown default mode": _set(("default_mode",), "fast"),
    "a null default mode": _set(("default_mode",), None),
    "a negative device count": _set(("devices", "count"), -1),
    "device kinds that are not strings": _set(("devices", "kinds"), [1]),
    "bytes as a string": _set(("bytes_per_device", "cpu:0"), "12"),
    "a mesh size that is not a count": _set(("mesh",), {"data": 1.5}),
    "an array shape with a float": _set(("largest_arrays", 0, "shape"), [64.5]),
    "a history row with a bad mode": _set(("history", 0, "mode"), "x"),
    "memory bytes that are not numbers": _set(("memory_history", "bytes", 0, 0), "x"),
    "devices as a list": _set(("devices",), []),
    # missing required fields
    "no history": _drop(("history",)),
    "no devices": _drop(("devices",)),
    "no last_mode": _drop(("last_mode",)),
    "devices without kinds": _drop(("devices", "kinds")),
    "an array row without a name": _drop(("largest_arrays", 0, "name")),
    "a memory history without samples": _drop(("memory_history", "samples")),
}


@pytest.mark.parametrize("change", BROKEN.values(), ids=list(BROKEN))
def test_a_broken_record_is_rejected(full, change):
    broken = copy.deepcopy(full)
    change(broken)
    assert not VALIDATOR.is_valid(broken)
    with pytest.raises(jsonschema.ValidationError):
        VALIDATOR.validate(broken)


def test_a_record_planning_for_a_target_is_valid(shell, full):
    from compilers import needs

    needs("tpu")
    assert full["target"] is None  # the kernel's own devices
    result = shell.run_cell("%target tpu-v5e topology=2x4")
    assert result.success
    try:
        record = _sent(status_record(_session(shell)))
        VALIDATOR.validate(record)
        assert record["target"] == {
            "kind": "tpu-v5e",
            "label": "TPU v5e",
            "count": 8,
            "description": "8 × TPU v5e (slice 2x4, 2 hosts, ICI within a slice)",
        }
        assert set(record["target"]) == set(
            SCHEMA["properties"]["target"]["anyOf"][0]["properties"]
        )
    finally:
        assert shell.run_cell("%target off").success
    assert _sent(status_record(_session(shell)))["target"] is None
