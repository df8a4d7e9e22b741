"""Graph mode vs ``%%jit``: tutorial-style cells run in two real kernels, compared run by run.

Each :class:`Item` is a notebook cell written the way JAX tutorials write them (training
loops, RNG keys, flax nnx and equinox modules, optax, dataclass state, closures over config,
magics, lax control flow, sharded arrays). The harness starts two shardlab kernels, runs the
item's setup once in each, then runs the cell body the same number of times in both: as
``%%graph`` (or with the cell metadata ``{"shardlab": {"mode": "graph"}}``) in one, as
``%%jit`` in the other. After every run it pulls back, from both kernels, every name the
cell binds or reads (a read name may be changed in place: an nnx module, a config dict), as
plain NumPy data through a pickle file, and compares them (rtol 1e-5, atol 1e-6; integers,
booleans, strings and RNG key data exactly), with the printed output (stdout, ``x?`` pages
and the cell's result, timings of ``%time`` ignored). In the graph kernel it also counts
tracers reachable from the user namespace and the graph cache's traces.

Finally :func:`alternating_rss` runs 300 small cells alternating eager / jit / graph in a
fresh kernel and samples the process RSS after a warm-up and at the end.

Run: ``python -m benchmarks --only graph`` (the section of docs/benchmarks.md) or
``python -m benchmarks.graph_suite [ITEM ...]``.

The package: ``items.py`` (the cells), ``harness.py`` (the kernels, the probe, the
comparisons, :func:`run_suite`), ``report.py`` (the markdown section, :func:`run`).
"""

from __future__ import annotations

from benchmarks.graph_suite.harness import (
    ATOL,
    GRAPH_METADATA,
    JIT_METADATA,
    PROBE_CODE,
    RSS_CELLS,
    RSS_TARGET,
    RSS_WARMUP,
    RTOL,
    STABLE_BODY,
    STABLE_SETUP,
    TIMEOUT,
    ItemResult,
    Mismatch,
    Reply,
    SuiteKernel,
    SuiteResult,
    alternating_rss,
    compare_line,
    compare_output,
    compare_values,
    names_of,
    output_lines,
    run_item,
    run_suite,
    stable_traces,
)
from benchmarks.graph_suite.items import (
    ITEMS,
    PRELUDE,
    SUBSET,
    Item,
    items,
)
from benchmarks.graph_suite.report import (
    main,
    run,
    section,
)

__all__ = [
    "ATOL",
    "GRAPH_METADATA",
    "ITEMS",
    "JIT_METADATA",
    "PRELUDE",
    "PROBE_CODE",
    "RSS_CELLS",
    "RSS_TARGET",
    "RSS_WARMUP",
    "RTOL",
    "STABLE_BODY",
    "STABLE_SETUP",
    "SUBSET",
    "TIMEOUT",
    "Item",
    "ItemResult",
    "Mismatch",
    "Reply",
    "SuiteKernel",
    "SuiteResult",
    "alternating_rss",
    "compare_line",
    "compare_output",
    "compare_values",
    "items",
    "main",
    "names_of",
    "output_lines",
    "run",
    "run_item",
    "run_suite",
    "section",
    "stable_traces",
]
