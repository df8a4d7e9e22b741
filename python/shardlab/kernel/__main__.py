"""Kernel launcher: ``python -m shardlab.kernel [--devices cpu:8] -f {connection_file}``.

``--devices`` is applied to the environment before JAX is imported (VS Code may drop a
kernelspec's ``env``, so pinning travels as launcher arguments).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any


def _pop_devices(argv: list[str]) -> tuple[str | None, list[str]]:
    rest: list[str] = []
    devices = None
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--devices" and index + 1 < len(argv):
            devices = argv[index + 1]
            index += 2
            continue
        if arg.startswith("--devices="):
            devices = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        index += 1
    return devices, rest


def _compilers_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("jax_cuda12_plugin") is not None
    except (ImportError, ValueError):
        return False


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    devices, rest = _pop_devices(args)
    # With the target compilers installed (shardlab[targets]), ``import jax`` and JAX's first
    # backend start load the CUDA plugin, whose runtime stub says it found no driver: both
    # happen here, before the kernel forwards fd 2 into cells, with that line dropped
    # (``_core/native_log.py``), on the devices just pinned. Without the compilers JAX starts
    # in the first cell that needs it, as before.
    compilers = _compilers_installed()
    quiet: Any = contextlib.nullcontext()
    if compilers:
        from shardlab._core.native_log import quiet_native_stderr

        quiet = quiet_native_stderr()
    with quiet:
        if devices is not None:
            from shardlab.engine.resources.devices import (
                DeviceSpecError,
                parse_devices,
                pin_environment,
            )

            try:
                pin_environment(parse_devices(devices))
            except DeviceSpecError as error:
                sys.exit(f"shardlab kernel: {error}")
        if compilers:
            import jax

            jax.devices()
    from ipykernel.kernelapp import IPKernelApp

    from shardlab.kernel.kernel import ShardlabKernel

    IPKernelApp.launch_instance(argv=rest, kernel_class=ShardlabKernel)


if __name__ == "__main__":
    main()
