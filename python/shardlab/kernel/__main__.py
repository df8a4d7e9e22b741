"""Kernel launcher: ``python -m shardlab.kernel [--devices cpu:8] -f {connection_file}``.

``--devices`` is applied to the environment before JAX is imported (VS Code may drop a
kernelspec's ``env``, so pinning travels as launcher arguments).
"""

from __future__ import annotations

import sys


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


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    devices, rest = _pop_devices(args)
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
    from ipykernel.kernelapp import IPKernelApp

    from shardlab.kernel.kernel import ShardlabKernel

    IPKernelApp.launch_instance(argv=rest, kernel_class=ShardlabKernel)


if __name__ == "__main__":
    main()
