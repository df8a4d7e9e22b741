"""Kernelspecs that name their interpreter and their device set."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

from ..engine.devices import DeviceSet, parse_devices

DEFAULT_NAME = "shardlab"
DEFAULT_DEVICES = "cpu:8"


def kernel_json(devices: DeviceSet, *, python: str | None = None) -> dict[str, object]:
    """The kernel.json for ``devices``; ``argv[0]`` is an absolute interpreter path.

    VS Code lists a kernelspec only when ``argv[0]`` is an absolute path to a real
    interpreter, and may drop ``env``: the device set is a launcher argument instead.
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
        "display_name": f"JAX · shardlab ({devices.label})",
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
) -> str:
    """Installs a kernelspec; returns the directory it was written to."""
    from jupyter_client.kernelspec import KernelSpecManager

    device_set = parse_devices(devices)
    spec = kernel_json(device_set)
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
