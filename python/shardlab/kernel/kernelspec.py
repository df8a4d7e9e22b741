"""Kernelspecs that name their interpreter and their device set.

Importing this module imports neither JAX nor jupyter_client (``python -m shardlab --help``
stays fast): they load when a kernelspec is written.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardlab.engine.resources.devices import DeviceSet

DEFAULT_NAME = "shardlab"
DEFAULT_DEVICES = "cpu:8"


def display_name(devices: DeviceSet, name: str = DEFAULT_NAME) -> str:
    """The name a kernel picker shows: ``JAX · shardlab (8 CPU devices)`` for the default
    kernelspec, ``JAX · shardlab · NAME (8 CPU devices)`` for any other, so that two
    kernelspecs of one device set are told apart."""
    if name == DEFAULT_NAME:
        return f"JAX · shardlab ({devices.label})"
    return f"JAX · shardlab · {name} ({devices.label})"


def kernel_json(
    devices: DeviceSet,
    *,
    python: str | None = None,
    name: str = DEFAULT_NAME,
    display: str | None = None,
) -> dict[str, object]:
    """The kernel.json for ``devices``; ``argv[0]`` is an absolute interpreter path.

    VS Code lists a kernelspec only when ``argv[0]`` is an absolute path to a real
    interpreter, and may drop ``env``: the device set is a launcher argument instead.
    ``display`` replaces the display name (default: :func:`display_name`).
    """
    interpreter = os.path.abspath(python or sys.executable)
    return {
        "argv": [
            interpreter,
            "-m",
            "shardlab.kernel",
            "--devices",
            devices.spec,
            "-f",
            "{connection_file}",
        ],
        "display_name": display if display is not None else display_name(devices, name),
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": {"debugger": True, "shardlab": {"devices": devices.spec}},
    }


def install(
    *,
    name: str = DEFAULT_NAME,
    devices: str = DEFAULT_DEVICES,
    user: bool = False,
    prefix: str | None = None,
    display: str | None = None,
) -> str:
    """Installs a kernelspec; returns the directory it was written to.

    ``display`` replaces the display name (default: :func:`display_name`).
    """
    from jupyter_client.kernelspec import KernelSpecManager

    from shardlab.engine.resources.devices import parse_devices

    device_set = parse_devices(devices)
    spec = kernel_json(device_set, name=name, display=display)
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, name)
        os.makedirs(folder)
        with open(os.path.join(folder, "kernel.json"), "w") as handle:
            json.dump(spec, handle, indent=1)
        logo = _logo_path()
        if logo:
            shutil.copy(logo, os.path.join(folder, "logo-64x64.png"))
        return KernelSpecManager().install_kernel_spec(
            folder, kernel_name=name, user=user, prefix=prefix
        )


def uninstall(name: str) -> str:
    """Removes the kernelspec ``name``; returns the removed directory."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    manager = KernelSpecManager()
    try:
        return manager.remove_kernel_spec(name)
    except (NoSuchKernel, KeyError):  # jupyter_client raises KeyError for unknown names
        names = sorted(manager.find_kernel_specs())
        raise SystemExit(
            f"no kernelspec named {name!r}; installed: {', '.join(names) or 'none'}"
        ) from None


def _logo_path() -> str | None:
    path = os.path.join(os.path.dirname(__file__), "logo-64x64.png")
    return path if os.path.exists(path) else None


def same_display_name(display: str, name: str) -> list[str]:
    """Installed kernelspecs other than ``name`` whose display name is ``display``."""
    from jupyter_client.kernelspec import KernelSpecManager

    clashes = []
    try:
        specs = KernelSpecManager().get_all_specs()
    except Exception:  # an unreadable kernelspec elsewhere is not this install's problem
        return []
    for other, info in specs.items():
        if other != name and info.get("spec", {}).get("display_name") == display:
            clashes.append(other)
    return sorted(clashes)
