"""Device sets: parsing ``cpu:8``/``gpu:0,1``/``gpu:all``, pinning before JAX starts, and
switching the CPU device count inside a running process without losing the user's arrays.

Pinning must happen before ``import jax`` (``JAX_PLATFORMS``, ``CUDA_VISIBLE_DEVICES``), so
:func:`pin_environment` only touches ``os.environ`` and never imports JAX. The in-process
switch clears JAX's backends (``jax.extend.backend.clear_backends``) and re-creates them with
a new ``jax_num_cpu_devices``; arrays on the old client are moved to host before and back
after, because a committed old array cannot be mixed with new ones.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

_SPEC = re.compile(r"^(cpu|gpu):(all|\d+(?:,\d+)*)$")


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
    match = _SPEC.match(text)
    if not match:
        raise DeviceSpecError(
            f"device set {value!r} is not valid; use cpu:N (N ≥ 1 simulated CPU devices, "
            "e.g. cpu:8), gpu:I,J,... (e.g. gpu:0,1) or gpu:all"
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
        return DeviceSet("cpu", count=count)
    if rest == "all":
        return DeviceSet("gpu", ids=None)
    ids = tuple(int(i) for i in rest.split(","))
    if len(set(ids)) != len(ids):
        raise DeviceSpecError(f"device set {value!r} names a GPU twice; e.g. gpu:0,1")
    return DeviceSet("gpu", ids=ids)


def pin_environment(devices: DeviceSet, environ: MutableMapping[str, str] | None = None) -> None:
    """Sets the environment so that JAX, once imported, sees exactly ``devices``.

    When JAX is already imported (but its backends not yet started) the same settings are
    applied to ``jax.config`` too.
    """
    import sys

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


@dataclass(frozen=True)
class SwitchReport:
    """What an in-process device switch did."""

    before: str
    after: str
    moved: tuple[str, ...]  # namespace paths of arrays moved
    resharded: tuple[str, ...]  # of those, arrays that were sharded (now on one device)
    recompile: tuple[str, ...]  # names of jitted functions that will recompile
    stale_meshes: tuple[str, ...]  # names bound to meshes of the old devices
    bytes_moved: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        lines = [f"switched {self.before} → {self.after}"]
        if self.moved:
            lines.append(
                f"moved {len(self.moved)} array(s) ({self.bytes_moved} bytes) through host "
                f"memory and back: {', '.join(self.moved)}"
            )
        else:
            lines.append("no arrays in the namespace needed moving")
        if self.resharded:
            lines.append(
                "were sharded, now on one device (re-shard with jax.device_put): "
                + ", ".join(self.resharded)
            )
        if self.recompile:
            lines.append("will recompile on next call: " + ", ".join(self.recompile))
        if self.stale_meshes:
            lines.append(
                "meshes of the old devices (rebuild with shardlab.mesh(...)): "
                + ", ".join(self.stale_meshes)
            )
        lines.extend(self.notes)
        return "\n".join(lines)


def _is_jitted(value: object) -> bool:
    return callable(value) and hasattr(value, "_cache_size") and hasattr(value, "lower")


def switch_cpu_devices(count: int, namespace: MutableMapping[str, Any]) -> SwitchReport:
    """Switches this process to ``count`` simulated CPU devices, keeping user arrays.

    Every JAX array bound in ``namespace`` (also inside lists, dicts, tuples and registered
    pytrees) is copied to host memory, the backends are cleared and re-created with the new
    device count, and the arrays are put back (on the default device). Nothing is changed if
    copying to host fails.

    Raises:
        DeviceSpecError: ``count`` < 1, or the current platform is not CPU.
    """
    import jax
    import jax.extend
    import numpy as np
    from jax.sharding import Mesh

    if count < 1:
        raise DeviceSpecError(f"cpu:{count}: a CPU device count must be at least 1, e.g. cpu:8")
    platform = jax.devices()[0].platform
    if platform != "cpu":
        raise DeviceSpecError(
            f"this kernel runs on {platform}; switching to cpu:{count} in-process is not "
            "possible. Install a CPU kernelspec (python -m shardlab install --devices "
            f"cpu:{count} --name shardlab-cpu{count}) and restart with it."
        )
    before = f"cpu:{len(jax.devices())}"
    moved: list[str] = []
    resharded: list[str] = []
    bytes_moved = 0
    host: dict[str, Any] = {}
    for name, value in list(namespace.items()):
        if name.startswith("_"):
            continue
        paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(value)
        if not any(isinstance(leaf, jax.Array) for _, leaf in paths_leaves):
            continue
        leaves = []
        for path, leaf in paths_leaves:
            if isinstance(leaf, jax.Array):
                label = name + jax.tree_util.keystr(path)
                moved.append(label)
                if len(leaf.sharding.device_set) > 1:
                    resharded.append(label)
                array = np.asarray(leaf)
                bytes_moved += array.nbytes
                leaves.append(_HostArray(array))
            else:
                leaves.append(leaf)
        host[name] = (treedef, leaves)
    recompile = tuple(
        name for name, value in namespace.items() if _is_jitted(value) and value._cache_size() > 0
    )
    stale = tuple(name for name, value in namespace.items() if isinstance(value, Mesh))
    jax.clear_caches()
    jax.extend.backend.clear_backends()
    jax.config.update("jax_num_cpu_devices", count)
    os.environ["JAX_NUM_CPU_DEVICES"] = str(count)
    os.environ["SHARDLAB_DEVICES"] = f"cpu:{count}"
    for name, (treedef, leaves) in host.items():
        restored = [
            jax.numpy.asarray(leaf.array, dtype=leaf.array.dtype)
            if isinstance(leaf, _HostArray)
            else leaf
            for leaf in leaves
        ]
        namespace[name] = jax.tree_util.tree_unflatten(treedef, restored)
    return SwitchReport(
        before=before,
        after=f"cpu:{len(jax.devices())}",
        moved=tuple(moved),
        resharded=tuple(resharded),
        recompile=recompile,
        stale_meshes=stale,
        bytes_moved=bytes_moved,
    )


@dataclass(frozen=True)
class _HostArray:
    array: Any
