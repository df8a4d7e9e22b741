"""Predicted ÷ compiled communication and memory of every corpus baseline (issue 17).

The quick loop for work on the cost model: each baseline plan of each corpus model on the
meshes (8,), (2, 4), (4, 2) is compiled once and its compiled figures cached in a JSON file
(the baselines' layouts do not depend on the cost model), then every run re-predicts all
plans with the current model and prints the ratios, flagging those outside 5% (``C``) and
10% (``M``). The full corpus section (auto's plans too, equality) is
``python -m benchmarks --only corpus``.

``--suite search`` does the same for the strategy-search benchmark's cases
(``shardlab.examples.cases()``, the 252 plans of ``python -m benchmarks --only search``);
with ``--methods`` the search methods' plans are included, cached by their layouts.

Run: ``.venv/bin/python tools/corpus_fidelity.py [--suite corpus|search] [--cache FILE]
[model ...]`` (first run about 7 minutes here, later ones about 35 s).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="corpus model names (default: all)")
    parser.add_argument("--suite", choices=("corpus", "search"), default="corpus")
    parser.add_argument("--methods", action="store_true", help="search methods' plans too")
    parser.add_argument("--cache", default="", help="compiled figures (default per suite)")
    parser.add_argument(
        "--detail",
        action="store_true",
        help="compile each plan again and print its collectives per kind, predicted and compiled",
    )
    parser.add_argument("--match", default="", help="only plans whose key contains this")
    ns = parser.parse_args()
    ns.cache = ns.cache or f".{ns.suite}_fidelity.json"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    # benchmarks/ and examples/ (the model zoo) are at the repository root, not installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.corpus.section import COMM_WITHIN, MEMORY_WITHIN, MESHES, PROFILE, ratio
    from examples.zoo.models import MODELS
    from shardlab import examples
    from shardlab.parallel.cost.profiles import comm_time
    from shardlab.parallel.mesh import mesh as make_mesh
    from shardlab.parallel.search.driver import search
    from shardlab.parallel.search.strategies.baselines import baselines

    if ns.suite == "corpus":
        cases = [make() for make in MODELS if not ns.models or make.__name__ in ns.models]
    else:
        cases = [c for c in examples.cases() if not ns.models or c.name in ns.models]

    cache = json.load(open(ns.cache)) if os.path.exists(ns.cache) else {}
    rows = []
    for case in cases:
        for shape in MESHES:
            mesh = make_mesh(shape=shape, names=("data", "model")[: len(shape)])
            text = "x".join(map(str, shape))
            plans = baselines(case.fn, *case.args, mesh=mesh, device=PROFILE)
            if ns.methods:
                for method in ("propagate", "recursive", "ilp", "auto"):
                    plans[method] = search(
                        case.fn, *case.args, mesh=mesh, method=method, device=PROFILE
                    )
            for name, plan in plans.items():
                key = f"{case.name}|{text}|{name}"
                if name in ("propagate", "recursive", "ilp", "auto"):
                    key += "|" + _layouts(plan)
                if ns.match not in key:
                    continue
                if key not in cache:
                    start = time.perf_counter()
                    report = plan.verify()
                    cache[key] = {
                        "comm": comm_time(report.collectives, PROFILE),
                        "memory": report.memory.total,
                    }
                    with open(ns.cache, "w") as f:
                        json.dump(cache, f)
                    print(f"compiled {key}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
                got = cache[key]
                if ns.detail:
                    _detail(key, plan)
                rows.append(
                    (
                        key,
                        ratio(plan.cost.comm_time, got["comm"]),
                        ratio(plan.cost.memory.peak, got["memory"]),
                    )
                )
            jax.clear_caches()
            gc.collect()
    for key, c, m in rows:
        flag = ("C" if abs(c - 1) > COMM_WITHIN else " ") + (
            "M" if abs(m - 1) > MEMORY_WITHIN else " "
        )
        print(f"{flag} {key:55s} comm {c:.3f} memory {m:.3f}")
    comm_ok = sum(abs(c - 1) <= COMM_WITHIN for _, c, _ in rows)
    mem_ok = sum(abs(m - 1) <= MEMORY_WITHIN for _, _, m in rows)
    print(
        f"communication within 5%: {comm_ok}/{len(rows)}; memory within 10%: {mem_ok}/{len(rows)}"
    )


def _layouts(plan) -> str:
    """A short digest of everything a plan constrains (its compiled figures depend on nothing
    else)."""
    import hashlib

    text = repr((plan.input_specs, plan.output_specs, plan.constraints, plan.operand_constraints))
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def _detail(key, plan) -> None:
    """Per (kind, mesh axes): count and bytes per call, predicted then compiled."""
    from collections import Counter

    def table(collectives):
        count, nbytes = Counter(), Counter()
        for c in collectives:
            k = (c.kind, ",".join(c.mesh_axes))
            count[k] += c.count
            nbytes[k] += c.bytes * c.count
        return count, nbytes

    pc, pb = table(plan.cost.collectives)
    report = plan.verify()
    cc, cb = table(report.collectives)
    print(f"-- {key}: memory predicted {plan.cost.memory.peak} compiled {report.memory.total}")
    for k in sorted(set(pc) | set(cc)):
        print(
            f"   {k[0]:18s} {k[1]:10s} predicted {pc[k]:4d} x {pb[k]:>10,d} B"
            f"   compiled {cc[k]:4d} x {cb[k]:>10,d} B"
        )


if __name__ == "__main__":
    main()
