"""JAX stays on the CPU where the target compilers are installed but no accelerator is.

``pip install "shardlab[targets]"`` installs libtpu and JAX's CUDA plugin, for compiling
deviceless (``shardlab.target``). JAX then also tries them as *backends* the first time a
program asks for devices (``jax.devices()``, the first ``jnp`` array): on a laptop with no
GPU or TPU that prints a ``RuntimeError: Unable to load CUDA`` traceback and libtpu's notes
about TPU hostnames, and costs a second, in every script. Deviceless compiles need neither
backend (they describe a topology, ``parallel/targets/devices.py``).

So, once, when shardlab is imported: if the user has not chosen platforms (``JAX_PLATFORMS``
unset), one of those compilers is installed, and this machine has no NVIDIA driver and no
TPU device files, JAX is kept on the CPU (``JAX_PLATFORMS=cpu`` before JAX starts its
backends). Set ``JAX_PLATFORMS`` to anything to decide yourself.
"""

from __future__ import annotations

import importlib.util
import os
import sys

__all__ = [
    "accelerator_present",
    "installed",
    "nvidia_driver_present",
    "prefer_cpu_without_accelerators",
    "tpu_attached",
]

_NVIDIA = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/nvidia0")
_TPU = ("/dev/accel0", "/dev/vfio/0")
_PLUGINS = ("libtpu", "jax_cuda12_plugin", "jax_cuda13_plugin")


def nvidia_driver_present() -> bool:
    """An NVIDIA driver is loaded on this machine."""
    return any(os.path.exists(p) for p in _NVIDIA)


def tpu_attached() -> bool:
    """TPU chips are attached to this machine (``/dev/accel*``, ``/dev/vfio``)."""
    return any(os.path.exists(p) for p in _TPU)


def accelerator_present() -> bool:
    """An NVIDIA driver or TPU chips are attached to this machine."""
    return nvidia_driver_present() or tpu_attached()


def installed(module: str) -> bool:
    """``module`` can be imported (without importing it); False for a module blocked in
    ``sys.modules`` or whose parent package is missing."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def prefer_cpu_without_accelerators() -> str | None:
    """Keep JAX on the CPU as the module docstring says; returns what was set, or None."""
    if "JAX_PLATFORMS" in os.environ or not sys.platform.startswith("linux"):
        return None
    if accelerator_present() or not any(installed(m) for m in _PLUGINS):
        return None
    if "jax" in sys.modules:  # JAX read its configuration already: only before backends start
        try:
            import jax
            from jax._src import xla_bridge

            if getattr(xla_bridge, "_backends", None):
                return None
            if getattr(jax.config, "jax_platforms", None):
                return None
            jax.config.update("jax_platforms", "cpu")
        except Exception:  # pragma: no cover - private API moved: leave JAX as it is
            return None
        return "cpu"
    os.environ["JAX_PLATFORMS"] = "cpu"
    return "cpu"
