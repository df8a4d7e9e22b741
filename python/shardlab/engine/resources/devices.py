"""Device sets: parsing ``cpu:8``/``gpu:0,1``/``gpu:all``, what the host can hold, and pinning
before JAX starts. The in-process switch of the CPU device count is ``switch.py``.

Pinning must happen before ``import jax`` (``JAX_PLATFORMS``, ``CUDA_VISIBLE_DEVICES``), so
:func:`pin_environment` only touches ``os.environ`` and never imports JAX. A CPU device count
is bounded by what the host can hold (:func:`cpu_device_limit`).
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Literal

_SPEC = re.compile(r"^(cpu|gpu):(all|\d+(?:,\d+)*)$")

# Host memory one simulated CPU device costs (jaxlib 0.10, x86-64, measured as process RSS):
# about 0.1 MiB once the backend starts, about 1.1 MiB once a program has run on every device
# (each device gets a worker thread and buffers): RSS 217 MiB at cpu:8, 798 MiB at cpu:512,
# 2.5 GiB at cpu:2048. The bound uses the larger figure.
DEVICE_HOST_BYTES = 5 * 2**20 // 4
# Simulated devices may use at most this share of the memory available; the rest is left for
# arrays and compilation.
DEVICE_MEMORY_SHARE = 0.5
# A hard cap whatever the memory: one OS thread per device, and a program over 2048 simulated
# devices already takes about 25 s to compile.
MAX_CPU_DEVICES = 4096


class DeviceSpecError(ValueError):
    """A device set that is malformed or not available."""


@dataclass(frozen=True)
class DeviceSet:
    """A parsed ``--devices`` value."""

    platform: Literal["cpu", "gpu"]
    count: int | None = None  # cpu: number of simulated devices
    ids: tuple[int, ...] | None = None  # gpu: visible device ids; None means all

    @property
    def label(self) -> str:
        if self.platform == "cpu":
            return f"{self.count} CPU device{'s' if self.count != 1 else ''}"
        if self.ids is None:
            return "all GPUs"
        return f"GPU{'s' if len(self.ids) != 1 else ''} {','.join(map(str, self.ids))}"

    @property
    def spec(self) -> str:
        if self.platform == "cpu":
            return f"cpu:{self.count}"
        return "gpu:all" if self.ids is None else "gpu:" + ",".join(map(str, self.ids))


def parse_devices(value: str) -> DeviceSet:
    """Parses ``cpu:N``, ``gpu:I,J,...`` or ``gpu:all``.

    Raises:
        DeviceSpecError: naming the value and the valid forms.
    """
    text = value.strip().lower()
    match = _SPEC.match(text) if len(text) <= 200 else None
    shown = value if len(value) <= 40 else value[:39] + "…"
    if not match:
        raise DeviceSpecError(
            f"device set {shown!r} is not valid; use cpu:N (N ≥ 1 simulated CPU devices, "
            "e.g. cpu:8), gpu:I,J,... (e.g. gpu:0,1) or gpu:all"
        )
    value = shown
    if any(len(number) > 9 for number in match.group(2).split(",")):
        raise DeviceSpecError(
            f"device set {value!r}: a number that long names no device; e.g. cpu:8 or gpu:0,1"
        )
    platform, rest = match.group(1), match.group(2)
    if platform == "cpu":
        if rest == "all":
            raise DeviceSpecError(f"device set {value!r}: give a CPU device count, e.g. cpu:8")
        count = int(rest)
        if count < 1:
            raise DeviceSpecError(
                f"device set {value!r}: a CPU device count must be at least 1, e.g. cpu:8"
            )
        if count > MAX_CPU_DEVICES:
            raise DeviceSpecError(_too_many(count, _hard_cap_limit()))
        return DeviceSet("cpu", count=count)
    if rest == "all":
        return DeviceSet("gpu", ids=None)
    ids = tuple(int(i) for i in rest.split(","))
    if len(set(ids)) != len(ids):
        raise DeviceSpecError(f"device set {value!r} names a GPU twice; e.g. gpu:0,1")
    return DeviceSet("gpu", ids=ids)


@dataclass(frozen=True)
class DeviceLimit:
    """The most simulated CPU devices this process may create, and why."""

    count: int
    reason: str


def _hard_cap_limit() -> DeviceLimit:
    return DeviceLimit(
        MAX_CPU_DEVICES,
        "shardlab's cap: each simulated device is an OS thread, and compiling for "
        "thousands of them takes minutes",
    )


def _read_int(path: str) -> int | None:
    try:
        with open(path) as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_memory() -> tuple[int, int] | None:
    """This process's cgroup memory limit and usage in bytes (v2 or v1); None if unlimited."""
    paths = [""]
    try:
        with open("/proc/self/cgroup") as handle:
            for line in handle:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers in ("", "memory") or "memory" in controllers.split(","):
                    paths.insert(0, path)
    except (OSError, ValueError):
        pass
    for path in paths:
        for limit_file, usage_file in (
            (f"/sys/fs/cgroup{path}/memory.max", f"/sys/fs/cgroup{path}/memory.current"),
            (
                f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes",
                f"/sys/fs/cgroup/memory{path}/memory.usage_in_bytes",
            ),
        ):
            limit = _read_int(limit_file)
            if limit is None or limit >= 2**60:  # "max", or v1's "unlimited"
                continue
            return limit, _read_int(usage_file) or 0
    return None


def _cgroup_available() -> int | None:
    """Bytes left under this process's cgroup memory limit (v2 or v1); None if unlimited."""
    found = _cgroup_memory()
    return None if found is None else max(0, found[0] - found[1])


def host_memory() -> int | None:
    """Bytes of memory this host has for this process in all: its physical memory, lowered
    to a cgroup limit (None where neither can be read). What no array may exceed, however
    much is free."""
    try:
        total: int | None = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        total = None
    cgroup = _cgroup_memory()
    if cgroup is not None:
        total = cgroup[0] if total is None else min(total, cgroup[0])
    return total


def available_memory() -> int | None:
    """Bytes of host memory this process can still use: ``MemAvailable`` from
    ``/proc/meminfo`` (``os.sysconf`` elsewhere), lowered to what a cgroup limit leaves."""
    available = None
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            available = None
    cgroup = _cgroup_available()
    if cgroup is not None:
        available = cgroup if available is None else min(available, cgroup)
    return available


def _gib(num: float) -> str:
    return f"{num / 2**30:.1f} GiB"


def cpu_device_limit(available: int | None = None) -> DeviceLimit:
    """The most simulated CPU devices this host can hold.

    Each costs about :data:`DEVICE_HOST_BYTES` of host memory once programs run on it; the
    devices may take :data:`DEVICE_MEMORY_SHARE` of ``available`` (default: what
    :func:`available_memory` reads now), and never more than :data:`MAX_CPU_DEVICES`.
    """
    if available is None:
        available = available_memory()
    hard = _hard_cap_limit()
    if available is None:
        return hard
    by_memory = max(1, int(available * DEVICE_MEMORY_SHARE) // DEVICE_HOST_BYTES)
    if by_memory >= hard.count:
        return hard
    return DeviceLimit(
        by_memory,
        f"each simulated device costs about {DEVICE_HOST_BYTES / 2**20:.2f} MiB of host "
        f"memory once programs run on it, and this process has {_gib(available)} available, "
        f"of which devices may take {DEVICE_MEMORY_SHARE:.0%}",
    )


def _too_many(count: int, limit: DeviceLimit) -> str:
    example = min(8, limit.count)
    return (
        f"cpu:{count}: too many simulated CPU devices, at most {limit.count} here "
        f"({limit.reason}). Use cpu:{limit.count} or fewer, e.g. cpu:{example}."
    )


def check_cpu_device_count(count: int, *, available: int | None = None) -> None:
    """Refuses a CPU device count beyond :func:`cpu_device_limit`.

    Raises:
        DeviceSpecError: naming ``count``, the limit, why, and a count that fits.
    """
    if count < 1:
        raise DeviceSpecError(f"cpu:{count}: a CPU device count must be at least 1, e.g. cpu:8")
    limit = cpu_device_limit(available)
    if count > limit.count:
        raise DeviceSpecError(_too_many(count, limit))


def pin_environment(devices: DeviceSet, environ: MutableMapping[str, str] | None = None) -> None:
    """Sets the environment so that JAX, once imported, sees exactly ``devices``.

    When JAX is already imported (but its backends not yet started) the same settings are
    applied to ``jax.config`` too. Pinning this process (``environ`` None) to more CPU
    devices than the host can hold raises :class:`DeviceSpecError`
    (:func:`check_cpu_device_count`).
    """
    import sys

    if environ is None and devices.platform == "cpu" and devices.count is not None:
        check_cpu_device_count(devices.count)
    env = os.environ if environ is None else environ
    env["SHARDLAB_DEVICES"] = devices.spec
    if devices.platform == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
        env["JAX_NUM_CPU_DEVICES"] = str(devices.count)
    else:
        env["JAX_PLATFORMS"] = "cuda,cpu"
        if devices.ids is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices.ids))
    jax = sys.modules.get("jax")
    if environ is None and jax is not None:
        jax.config.update("jax_platforms", env["JAX_PLATFORMS"])
        if devices.platform == "cpu":
            jax.config.update("jax_num_cpu_devices", devices.count)
