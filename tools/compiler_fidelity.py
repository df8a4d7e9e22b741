"""Every miss of the compilers bench, by collective kind: predicted against compiled bytes.

The counterpart of ``tools/corpus_fidelity.py`` for XLA:GPU and XLA:TPU: it re-prices each
row of ``benchmarks/compilers.py`` from the cached compiled figures
(``benchmarks/cache/compilers.json``, written by ``make bench``) in seconds, and prints the
rows whose communication is off by more than 5% (or memory by more than 10% with
``--memory``) with the bytes of each kind side by side, which is where a missing rule shows:

    python tools/compiler_fidelity.py                 # every compiler
    python tools/compiler_fidelity.py XLA:TPU gpt     # rows whose key has both words
    python tools/compiler_fidelity.py --memory

Rows not in the cache are skipped (run ``python -m benchmarks --only compilers`` first).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/compiler_fidelity.py")
    parser.add_argument("words", nargs="*", help="keep rows whose key contains every word")
    parser.add_argument("--memory", action="store_true", help="memory misses too")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, ROOT)
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    import shardlab
    from benchmarks import compilers as C
    from shardlab import strategies

    with open(C.CACHE) as handle:
        cache = json.load(handle)
    shown = total = 0
    for compiler, devices, shapes in C._meshes():
        chip = C._chip(devices)
        label = compiler if chip in ("", "h100", "tpu-v5e") else f"{compiler} {chip}"
        for shape in shapes:
            size = " × ".join(f"{k}={v}" for k, v in shape.items())
            mesh = shardlab.mesh(shape, devices=devices)
            for dtype in C.DTYPES:
                for name, fn, fargs in C._cases(dtype):
                    if not all(w in f"{label}|{size}|{dtype}|{name}" for w in args.words):
                        continue
                    plans = strategies.baselines(fn, *fargs, mesh=mesh)
                    for strategy, plan in plans.items():
                        key = f"{label}|{size}|{dtype}|{name}|{strategy}"
                        got = cache.get(key)
                        if strategy == "replicated" or got is None:
                            continue
                        total += 1
                        pred = {k: v for k, v in plan.cost.comm_bytes.items() if v}
                        comm = sum(pred.values()) / max(got["comm"], 1)
                        memory = plan.cost.memory.peak / max(got["memory"], 1)
                        if abs(comm - 1) <= 0.05 and not (args.memory and abs(memory - 1) > 0.1):
                            continue
                        shown += 1
                        print(f"{key}: communication {comm:.3f}, memory {memory:.3f}")
                        for kind in sorted(set(pred) | set(got["kinds"])):
                            a, b = pred.get(kind, 0.0), got["kinds"].get(kind, 0.0)
                            print(
                                f"    {kind:20s} predicted {a / 2**20:9.3f} MiB"
                                f"  compiled {b / 2**20:9.3f} MiB"
                            )
    print(f"{shown} of {total} rows off", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
