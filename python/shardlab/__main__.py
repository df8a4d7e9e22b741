"""``python -m shardlab``: install or remove shardlab kernelspecs.

``--help`` imports neither JAX nor jupyter_client (``import shardlab`` is lazy too): the
device set is parsed, and the kernelspec written, only once a command runs.
"""

from __future__ import annotations

import argparse
import sys

from shardlab.kernel.kernelspec import DEFAULT_DEVICES, DEFAULT_NAME

_EPILOG = """\
examples:
  python -m shardlab install --sys-prefix                 # 8 simulated CPU devices
  python -m shardlab install --user --devices gpu:0,1 --name shardlab-gpu01
  python -m shardlab install --user --name big --devices cpu:64 --display-name "JAX 64"
  python -m shardlab uninstall shardlab-gpu01

The kernelspec's argv[0] is this interpreter's absolute path (VS Code needs that) and the
device set is passed to the launcher as arguments, applied before JAX is imported. A kernel
picker shows "JAX · shardlab (8 CPU devices)" for the default name and
"JAX · shardlab · NAME (...)" for any other, unless --display-name says otherwise.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shardlab",
        description="shardlab: a workbench for parallel JAX in Jupyter and VS Code.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    add = commands.add_parser("install", help="install a kernelspec for this interpreter")
    where = add.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="into the user's Jupyter dir")
    where.add_argument(
        "--sys-prefix", action="store_true", help="into this environment (sys.prefix)"
    )
    where.add_argument("--prefix", metavar="DIR", help="into DIR/share/jupyter/kernels")
    add.add_argument("--name", default=DEFAULT_NAME, help=f"kernel name (default {DEFAULT_NAME})")
    add.add_argument(
        "--devices",
        default=DEFAULT_DEVICES,
        help=f"cpu:N | gpu:I,J,... | gpu:all (default {DEFAULT_DEVICES})",
    )
    add.add_argument(
        "--display-name",
        metavar="TEXT",
        help="the name kernel pickers show (default: JAX · shardlab[ · NAME] (DEVICES))",
    )
    add.add_argument("--dry-run", action="store_true", help="print kernel.json, install nothing")
    remove = commands.add_parser("uninstall", help="remove a kernelspec by name")
    remove.add_argument("name")
    args = parser.parse_args(argv)
    if args.command == "install":
        return _install(parser, args)
    if args.command == "uninstall":
        from shardlab.kernel.kernelspec import uninstall

        print(f"removed {uninstall(args.name)}")
        return 0
    parser.print_help()
    return 0


def _install(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from shardlab.engine.resources.devices import DeviceSpecError, parse_devices
    from shardlab.kernel.kernelspec import install, kernel_json, same_display_name

    try:
        device_set = parse_devices(args.devices)
    except DeviceSpecError as error:
        parser.error(str(error))
    display = args.display_name
    if display is not None and not display.strip():
        parser.error(f"--display-name {display!r} is empty; e.g. --display-name 'JAX 64'")
    spec = kernel_json(device_set, name=args.name, display=display)
    if args.dry_run:
        import json

        print(json.dumps(spec, indent=1))
        return 0
    prefix = sys.prefix if args.sys_prefix else args.prefix
    path = install(
        name=args.name, devices=args.devices, user=args.user, prefix=prefix, display=display
    )
    shown = spec["display_name"]
    print(f"installed kernelspec {args.name!r} ({device_set.label}) as {shown!r} in {path}")
    clashes = same_display_name(str(shown), args.name)
    if clashes:
        print(
            f"note: kernelspec(s) {', '.join(clashes)} show the same name {shown!r} in kernel "
            "pickers; give this one another with --display-name",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
