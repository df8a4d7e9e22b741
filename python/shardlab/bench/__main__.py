"""``python -m shardlab.bench [--only NAME ...] [--out docs/benchmarks.md]``.

Runs each benchmark section and writes them, with the machine and the command, to one
markdown file. Every figure in docs/benchmarks.md comes from here.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import sys
import time

SECTIONS = ("kernel", "fidelity", "editor", "search", "corpus", "graph", "ranking", "budgets")
MODULES = {  # the rest: shardlab.bench.<name>
    "corpus": "shardlab.bench.corpus.section",
    "graph": "shardlab.bench.graph_suite",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shardlab.bench")
    parser.add_argument("--only", nargs="*", choices=SECTIONS, help="run only these sections")
    parser.add_argument("--out", help="write the markdown here (default: stdout)")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
    import jax  # already imported by the shardlab package; the backend is not started yet

    jax.config.update("jax_num_cpu_devices", int(os.environ["JAX_NUM_CPU_DEVICES"]))

    names = args.only or list(SECTIONS)
    parts = [
        "# Benchmarks",
        "",
        "Every figure here is produced by `make bench` (`python -m shardlab.bench --out "
        "docs/benchmarks.md`); re-run it to refresh. Machines are shared and noisy: figures "
        "are medians, and compared figures are measured side by side in one run.",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- machine: {os.cpu_count()} CPU cores, {platform.machine()}, Python "
        f"{platform.python_version()}, jax {jax.__version__}",
        f"- devices: {os.environ['JAX_NUM_CPU_DEVICES']} simulated CPU devices",
        "",
    ]
    for name in names:
        module = importlib.import_module(MODULES.get(name, f"shardlab.bench.{name}"))
        start = time.perf_counter()
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        parts.append(module.run())
        print(f"[bench] {name}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    text = "\n".join(parts).rstrip() + "\n"
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
