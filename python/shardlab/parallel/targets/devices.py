"""Abstract devices of a target, made by its own compiler's topology description.

``jax.experimental.topologies.get_topology_desc`` builds the devices of a TPU slice (libtpu)
or of GPU hosts (the CUDA PJRT plugin, from an XLA target description) without the hardware:
programs laid over them are lowered and compiled deviceless, and nothing can run on them.
The simulated CPU devices of the process keep working beside them: no TPU or CUDA backend is
started (with ``JAX_PLATFORMS=cpu``, as the shardlab kernel and the tests set it, the CUDA
plugin registers without looking for a driver).

The compilers are an optional extra (``pip install "shardlab[targets]"``); without it, making
a target names that command.
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
from typing import Any

from shardlab._core.native_log import quiet_native_stderr
from shardlab._core.platforms import installed, nvidia_driver_present, tpu_attached
from shardlab.parallel.targets.catalog import TargetError, TargetSpec

__all__ = ["EXTRA", "compiler_missing", "target_devices"]

EXTRA = 'pip install "shardlab[targets]"'
_SPECS = pathlib.Path(__file__).with_name("gpu_specs")


def compiler_missing(platform: str) -> str | None:
    """Why the compiler for ``platform`` cannot load here (with the pip command), or None."""
    if platform == "tpu":
        if not installed("libtpu"):
            return f"compiling for TPUs needs libtpu (XLA:TPU): {EXTRA}, then restart the kernel"
        return None
    needed = {"jax_plugins.xla_cuda12": "jax-cuda12-plugin", "nvidia.cuda_nvcc": "ptxas"}
    for module, what in needed.items():
        if not installed(module):
            return (
                f"compiling for NVIDIA GPUs needs XLA:GPU ({what} is not installed): {EXTRA}, "
                "then restart the kernel"
            )
    return None


def _backends_started() -> bool:
    try:
        from jax._src import xla_bridge

        return bool(getattr(xla_bridge, "_backends", {}))
    except Exception:  # pragma: no cover - private API moved
        return True


def _prepare_cuda() -> None:
    """The CUDA plugin checks for a CUDA installation unless only other platforms were asked
    for; deviceless compiles need no driver, so the check is skipped when no NVIDIA driver
    is present (and only before JAX starts its backends, when it can still matter)."""
    if _backends_started() or nvidia_driver_present():
        return
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")


def _prepare_tpu() -> None:
    """libtpu takes a machine-wide lock (``/tmp/libtpu_lockfile``) when it loads, meant to
    keep two processes off the same TPU chips; here there are none, and a notebook's kernel,
    a second notebook and the test workers each describe slices. Without TPUs attached
    (``/dev/accel*``, ``/dev/vfio``) the lock is skipped, as libtpu allows
    (``ALLOW_MULTIPLE_LIBTPU_LOAD``)."""
    if tpu_attached():
        return
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def gpu_target_config(spec: TargetSpec) -> str:
    """The XLA GPU target description of the kind (package data)."""
    return (_SPECS / spec.kind.spec_file).read_text()


@functools.lru_cache(maxsize=16)
def target_devices(spec: TargetSpec) -> tuple[Any, ...]:
    """The target's abstract devices, in the order its compiler numbers them.

    Raises:
        TargetError: the compiler is not installed (the pip command), or it refuses the
            topology (valid examples for the kind).
    """
    kind = spec.kind
    missing = compiler_missing(kind.platform)
    if missing is not None:
        raise TargetError(missing)
    if kind.platform == "cuda":
        _prepare_cuda()
    else:
        _prepare_tpu()
    try:
        with quiet_native_stderr():  # libtpu's notes about the TPUs this machine has not
            topo = _describe(spec)
    except Exception as error:
        raise TargetError(_explain(spec, error)) from None
    devices = tuple(topo.devices)
    if len(devices) != spec.device_count:  # pragma: no cover - a compiler we do not know
        raise TargetError(
            f"the {kind.platform} compiler made {len(devices)} devices for {spec.topology}, "
            f"expected {spec.device_count}"
        )
    return devices


def _describe(spec: TargetSpec) -> Any:
    """The compiler's topology description of ``spec``."""
    from jax.experimental import topologies

    if spec.kind.platform == "cuda":
        return topologies.get_topology_desc(
            platform="cuda", topology=spec.topology, target_config=gpu_target_config(spec)
        )
    return topologies.get_topology_desc(
        topology_name=spec.topology, platform="tpu", num_slices=spec.slices
    )


def _explain(spec: TargetSpec, error: BaseException) -> str:
    kind = spec.kind
    text = re.sub(r"\s+", " ", str(error)).strip()[:300]
    if "libtpu multi-process lockfile" in text:
        return (
            "another process holds libtpu's lock (/tmp/libtpu_lockfile) and this one loaded "
            f"libtpu before shardlab could allow sharing it ({text}); restart this kernel, or "
            "set ALLOW_MULTIPLE_LIBTPU_LOAD=1 before libtpu loads"
        )
    if kind.platform == "tpu":
        shape = spec.topology.split(":", 1)[1]
        return (
            f"libtpu has no {kind.label} slice {shape!r} ({text}); valid for {kind.name}: "
            f"{', '.join(repr(e) for e in kind.examples)}"
        )
    if "not implemented for cuda" in text or "Unable to" in text:
        return (
            f"the CUDA compiler plugin did not load in this process ({text}). JAX started "
            "before shardlab could prepare it: restart the kernel (the shardlab kernel "
            "prepares it), or set JAX_PLATFORMS=cpu (or JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1) "
            "before importing jax"
        )
    return f"XLA:GPU could not describe {spec.topology} GPUs of kind {kind.name}: {text}"
