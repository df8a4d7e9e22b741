"""The graph suite's section of docs/benchmarks.md: :func:`section` writes it from a
:class:`SuiteResult`; :func:`run` is what ``python -m benchmarks --only graph`` calls, and
:func:`main` is ``python -m benchmarks.graph_suite [ITEM ...]``.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence

from benchmarks.graph_suite.harness import (
    ATOL,
    RSS_TARGET,
    RSS_WARMUP,
    RTOL,
    SuiteResult,
    run_suite,
)

# -- the section ----------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def section(suite: SuiteResult, command: str = "python -m benchmarks --only graph") -> str:
    results = suite.results
    equal_items = sum(r.equal for r in results)
    total_runs = sum(r.item.runs for r in results)
    equal_runs = sum(r.equal_runs for r in results)
    expected = [r for r in results if r.item.traces is not None]
    as_expected = sum(bool(r.traces_as_expected) for r in expected)
    lines = [
        "## Graph mode vs %%jit",
        "",
        f"Command: `{command}` (section `benchmarks.graph_suite`). "
        f"{len(results)} tutorial-style cells (training loops, RNG, flax nnx, equinox, optax, "
        "dataclass state, closures over config, prints, magics, lax control flow, "
        "transformations, sharded arrays on 8 CPU devices), each run the same number of times "
        "in two real kernels, as `%%graph` (or graph cell metadata) and as `%%jit`, state "
        "carried across runs. After every run, every name the cell binds or reads is "
        f"compared (rtol {RTOL:g}, atol {ATOL:g}; integers, strings and RNG key data "
        "exactly), and so is the printed output (numbers within the tolerance or one unit "
        "of the last printed digit; `%time` timings and `%devices` live-byte counts "
        "ignored).",
        "",
        "| figure | value | target |",
        "|---|---|---|",
        f"| items | {len(results)} | ≥ 40 |",
        f"| runs (all items) | {total_runs} | |",
        f"| **items equal on every run** | **{equal_items}/{len(results)}** | all |",
        f"| runs equal | {equal_runs}/{total_runs} | all |",
        f"| **tracers reachable from the namespace** (graph kernel, after every run) | "
        f"**{suite.tracers}** | 0 |",
        f"| items traced as expected (1 trace, or one per run where state changes) | "
        f"{as_expected}/{len(expected)} | all |",
    ]
    if suite.stable_traces is not None:
        lines.append(
            f"| `traces_of` a cell re-run 3× with unchanged inputs | {suite.stable_traces} | 1 |"
        )
    if suite.rss is not None:
        mib = 2**20
        rss = suite.rss
        lines += [
            f"| RSS after a warm-up of {RSS_WARMUP} cells | {rss['start'] / mib:.0f} MiB | |",
            f"| RSS after {int(rss['cells'])} more cells alternating eager / jit / graph | "
            f"{rss['end'] / mib:.0f} MiB | |",
            f"| **RSS end / start** | **{rss['ratio']:.3f}** | ≤ {RSS_TARGET:.2f} |",
        ]
    lines += ["", f"Total time {suite.seconds:.0f} s.", ""]
    differing = [r for r in results if r.mismatches]
    if differing:
        lines += [
            "Items that differ (expected = `%%jit`, got = graph; the first differing name of "
            "the first differing run):",
            "",
            "| item | runs differing | first differing name | difference (that run) |",
            "|---|---|---|---|",
        ]
        for r in differing:
            first = r.mismatches[0]
            lines.append(
                f"| {r.item.name} | {len(r.mismatches)}/{r.item.runs} | `{first.name}` | "
                f"run {first.run}: {_cell(first.detail)} |"
            )
        lines.append("")
    noted = [(r.item.name, n) for r in results for n in dict.fromkeys(r.notes)]
    if noted:
        lines += ["Notes shardlab printed in the graph kernel (not compared):", ""]
        lines += [f"- {name}: {_cell(note)}" for name, note in noted]
        lines.append("")
    walked = max((r.walked for r in results), default=0)
    lines += [
        f"The tracer walk visits the namespace after every run (up to {walked} values in "
        "one walk here): dict/list/tuple items, pytree leaves, object attributes and "
        "closures, 12 levels deep.",
        "",
    ]
    lines += [
        "| item | what it does | runs | equal | traces per run | expected traces |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        expect = "—" if r.item.traces is None else str(r.item.traces)
        mark = "" if r.traces_as_expected in (None, True) else " ✗"
        lines.append(
            f"| {r.item.name} | {_cell(r.item.summary)} | {r.item.runs} | "
            f"{r.equal_runs}/{r.item.runs} | {r.traces_per_run}{mark} | {expect} |"
        )
    lines.append("")
    return "\n".join(lines)


def run() -> str:
    """The graph-suite section of docs/benchmarks.md."""

    def progress(line: str) -> None:
        print(f"[bench] graph: {line}", file=sys.stderr, flush=True)

    return section(run_suite(progress=progress))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    suite = run_suite(
        args or None, rss=not args, progress=lambda line: print(line, file=sys.stderr, flush=True)
    )
    print(section(suite, "python -m benchmarks.graph_suite " + " ".join(args)))
    median = statistics.median(r.seconds for r in suite.results) if suite.results else 0.0
    print(f"median seconds per item: {median:.1f}", file=sys.stderr)
    return 0
