"""``python -m benchmarks [--only NAME ...] [--out docs/benchmarks.md]``.

Runs each benchmark section and writes it, with the date, the machine and the command, into
one markdown file. Each generated section sits between ``<!-- bench:NAME -->`` and
``<!-- /bench:NAME -->``: a run replaces the sections it ran, in place, and keeps the others
and every hand-written part (a run of one section no longer starts a second document).
Every generated figure in docs/benchmarks.md comes from here.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import inspect
import os
import platform
import sys
import time

SECTIONS = (
    "kernel",
    "fidelity",
    "editor",
    "search",
    "corpus",
    "graph",
    "ranking",
    "budgets",
    "targets",
    "target_calls",
    "compilers",
    "published",
)
MODULES = {  # the rest: benchmarks.<name>
    "corpus": "benchmarks.corpus.section",
    "graph": "benchmarks.graph_suite",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--only", nargs="*", choices=SECTIONS, help="run only these sections")
    parser.add_argument("--out", help="write the markdown here (default: stdout)")
    parser.add_argument(
        "--cached",
        action="store_true",
        help="sections that cache compiled figures (compilers) re-price from the cache",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
    import jax  # the backend is not started yet: the device count still applies

    jax.config.update("jax_num_cpu_devices", int(os.environ["JAX_NUM_CPU_DEVICES"]))

    names = args.only or list(SECTIONS)
    machine = (
        f"{datetime.date.today().isoformat()}, {os.cpu_count()} CPU cores, "
        f"{platform.machine()}, Python {platform.python_version()}, jax {jax.__version__}, "
        f"{os.environ['JAX_NUM_CPU_DEVICES']} simulated CPU devices"
    )
    sections: dict[str, str] = {}
    for name in names:
        module = importlib.import_module(MODULES.get(name, f"benchmarks.{name}"))
        start = time.perf_counter()
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        cached = args.cached and "cached" in inspect.signature(module.run).parameters
        body = (module.run(cached=True) if cached else module.run()).strip()
        print(f"[bench] {name}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
        sections[name] = _with_run_line(body, machine, name + (" --cached" if cached else ""))
    old = ""
    if args.out and os.path.exists(args.out):
        with open(args.out) as handle:
            old = handle.read()
    text = splice(old, sections)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text)
    return 0


HEADER = (
    "# Benchmarks\n\n"
    "Every generated section is produced by `make bench` (`python -m benchmarks --out "
    "docs/benchmarks.md`; one section: `--only NAME`), which replaces it in place; each "
    "says when and where it ran. Machines are shared and noisy: figures are medians, and "
    "compared figures are measured side by side in one run.\n"
)


def _with_run_line(body: str, machine: str, name: str) -> str:
    """The section with the run's date, machine and command under its heading."""
    heading, _, rest = body.partition("\n")
    run = f"Run {machine}: `python -m benchmarks --only {name}`."
    return f"{heading}\n\n{run}\n{rest}".rstrip()


def splice(old: str, sections: dict[str, str]) -> str:
    """``old`` with each named section replaced between its markers (appended when absent);
    everything outside the markers is kept as written."""
    text = old.strip() or HEADER.strip()
    for name, body in sections.items():
        block = f"<!-- bench:{name} -->\n{body}\n<!-- /bench:{name} -->"
        start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
        if start in text and end in text:
            head, _, rest = text.partition(start)
            _, _, tail = rest.partition(end)
            text = head + block + tail
        else:
            text = text.rstrip() + "\n\n" + block
    return text.rstrip() + "\n"


if __name__ == "__main__":
    sys.exit(main())
