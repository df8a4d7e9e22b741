"""With the target compilers installed and no accelerator attached, a plain script that
imports shardlab keeps JAX on the CPU: no CUDA traceback, no libtpu hostname notes, and
targets still compile deviceless. A platform the user chose is left alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from compilers import needs
from shardlab._core.platforms import accelerator_present

SCRIPT = (
    "import os, shardlab, jax\n"
    "print(os.environ.get('JAX_PLATFORMS'), jax.devices()[0].platform)\n"
    "print(shardlab.target('tpu-v5e', topology='2x4').device_count)\n"
)


def _run(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **env},
    )


def test_a_script_without_accelerators_keeps_jax_on_the_cpu_quietly():
    needs("cuda", "tpu")
    if accelerator_present():
        pytest.skip("this machine has a GPU or TPU: JAX may use it")
    done = _run(SCRIPT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["cpu cpu", "8"]
    for noise in ("Unable to load CUDA", "TPU_WORKER_HOSTNAMES", "Traceback"):
        assert noise not in done.stderr, done.stderr[-2000:]
    # JAX imported first, shardlab second, before any backend started: the same
    done = _run("import jax, shardlab\nprint(jax.devices()[0].platform)\n")
    assert done.stdout.strip() == "cpu" and "Unable to load CUDA" not in done.stderr


def test_a_platform_the_user_chose_is_left_alone():
    done = _run(
        "import os, shardlab\nprint(os.environ['JAX_PLATFORMS'])\n", JAX_PLATFORMS="cpu,tpu"
    )
    assert done.stdout.strip() == "cpu,tpu", done.stderr[-2000:]
