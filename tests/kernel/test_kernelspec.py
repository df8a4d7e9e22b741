"""Kernelspecs: install/uninstall, the interpreter path, pinning as launcher arguments."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kernelclient import Kernel
from shardlab.engine.resources.devices import DeviceSpecError, parse_devices, pin_environment


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shardlab", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_help_explains_commands():
    out = run_cli("--help").stdout
    for word in ("install", "uninstall", "--devices", "gpu:0,1"):
        assert word in out
    assert "--sys-prefix" in run_cli("install", "--help").stdout


def test_install_into_prefix_names_interpreter_and_devices(tmp_path):
    done = run_cli("install", "--prefix", str(tmp_path), "--name", "t4", "--devices", "cpu:4")
    assert done.returncode == 0, done.stderr
    spec_file = tmp_path / "share" / "jupyter" / "kernels" / "t4" / "kernel.json"
    spec = json.loads(spec_file.read_text())
    assert os.path.isabs(spec["argv"][0]) and os.path.exists(spec["argv"][0])
    assert spec["argv"][1:5] == ["-m", "shardlab.kernel", "--devices", "cpu:4"]
    assert "{connection_file}" in spec["argv"]
    assert spec["display_name"] == "JAX · shardlab · t4 (4 CPU devices)"  # not the default name
    assert "env" not in spec  # pinning travels as arguments: VS Code may drop env


def test_uninstall_removes_and_unknown_name_lists_installed(tmp_path):
    env = {"JUPYTER_DATA_DIR": str(tmp_path / "data")}
    assert run_cli("install", "--user", "--name", "gone", env=env).returncode == 0
    removed = run_cli("uninstall", "gone", env=env)
    assert removed.returncode == 0 and "removed" in removed.stdout
    again = run_cli("uninstall", "gone", env=env)
    assert again.returncode != 0 and "no kernelspec named 'gone'" in again.stderr


@pytest.mark.parametrize("bad", ["cpu:0", "gpu:", "tpu:1", "cpu:all", "gpu:1,1"])
def test_bad_device_sets_are_refused_with_valid_forms(bad):
    done = run_cli("install", "--dry-run", "--devices", bad)
    assert done.returncode != 0 and repr(bad) in done.stderr
    with pytest.raises(DeviceSpecError):
        parse_devices(bad)


def test_device_sets_parse_and_pin():
    env: dict[str, str] = {}
    pin_environment(parse_devices("gpu:0,1"), env)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["JAX_PLATFORMS"].startswith("cuda")
    env = {}
    pin_environment(parse_devices("gpu:all"), env)
    assert "CUDA_VISIBLE_DEVICES" not in env
    env = {}
    pin_environment(parse_devices("cpu:3"), env)
    assert env == {"SHARDLAB_DEVICES": "cpu:3", "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "3"}
    assert parse_devices("gpu:all").label == "all GPUs"


@pytest.mark.kernel
def test_launcher_pins_devices_before_jax_starts(tmp_path):
    done = run_cli("install", "--prefix", str(tmp_path), "--name", "pin3", "--devices", "cpu:3")
    assert done.returncode == 0, done.stderr
    kernel = Kernel(
        "pin3",
        extra_env={"JAX_NUM_CPU_DEVICES": "8"},  # the launcher's --devices must win
        kernel_dirs=[str(tmp_path / "share" / "jupyter" / "kernels")],
    )
    try:
        text = kernel.ok("import jax, os\nlen(jax.devices()), os.environ['SHARDLAB_DEVICES']").text
        assert text == "(3, 'cpu:3')"
    finally:
        kernel.shutdown()


def test_launcher_refuses_bad_devices():
    done = subprocess.run(
        [sys.executable, "-m", "shardlab.kernel", "--devices", "cpu:0", "-f", "/nonexistent"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "at least 1" in done.stderr
