"""The compilation-cache reset acts on memory, not on a count of programs (issue 37).

An eager cell with a new shape compiles ~26 programs, so the old rule (more than 256 cached
programs at a mode switch) wiped every ~27 cells of a mixed session and made the cells after
it compile again. The default rule drops the caches when they hold more resident memory than
``cache_budget_mib``; these tests drive a real kernel through jupyter_client.
"""

from __future__ import annotations

import json

import pytest

from kernelclient import Kernel

pytestmark = pytest.mark.kernel

SETUP = """\
import json
import jax, jax.numpy as jnp
from shardlab.engine.resources.live_memory import cache_stats, process_rss

@jax.jit
def step(x, w):
    h = jnp.tanh(x @ w)
    h = h * jax.nn.sigmoid(h) + 0.1 * jnp.sin(x)
    return (h ** 2).mean(axis=-1), jnp.max(jnp.abs(h))

w = jnp.eye(32) * 0.5
"""
CELL = "x = jnp.linspace(-1.0, 1.0, {n} * 32).reshape({n}, 32)\nm, top = step(x, w)\n"
STATE = (
    "s = get_ipython()._shardlab_session\n"
    "json.dumps({'programs': cache_stats()['executables'], 'rss': process_rss(), "
    "'resets': s.cache_resets, 'budget': s.cache_budget_bytes(), "
    "'floor': s.cache_budget.floor})"
)
MiB = 2**20


@pytest.fixture()
def kernel():
    k = Kernel()
    k.ok(SETUP)
    yield k
    k.shutdown()


def state(kernel: Kernel) -> dict[str, int]:
    return json.loads(kernel.ok(STATE).text.strip("'"))


def run_shapes(kernel: Kernel, shapes: range) -> str:
    """An eager cell per new shape, each followed by a jit cell: a mode switch every cell."""
    out = ""
    for n in shapes:
        for mode in ("eager", "jit"):
            run = kernel.ok(CELL.format(n=n), metadata={"shardlab": {"mode": mode}})
            out += run.stdout
    return out


@pytest.mark.slow
def test_many_small_eager_shapes_under_the_budget_keep_their_programs(kernel):
    start = state(kernel)
    out = run_shapes(kernel, range(1, 15))
    after = state(kernel)
    assert "[shardlab]" not in out and after["resets"] == 0
    # The old rule would have wiped: more than 256 programs, and a mode switch every cell.
    assert after["programs"] > 256
    assert after["rss"] - start["rss"] < after["budget"]  # the workload is under the budget
    # ... and the programs serve the same shapes again without compiling.
    compiles = "from shardlab.kernel.session import compile_count\ncompile_count()"
    before = int(kernel.ok(compiles).text)
    run_shapes(kernel, range(1, 15))
    assert int(kernel.ok(compiles).text) == before


@pytest.mark.slow
def test_caches_holding_more_than_the_budget_are_released_and_memory_stays_bounded(kernel):
    run_shapes(kernel, range(1, 8))
    held = state(kernel)
    assert held["rss"] - held["floor"] > 128 * MiB  # what ~180 programs hold
    kernel.ok("%config ShardlabSession.cache_budget_mib = 64")
    out = kernel.ok(CELL.format(n=100), metadata={"shardlab": {"mode": "eager"}}).stdout
    released = state(kernel)
    assert "[shardlab] compilation caches hold about" in out, out
    assert "budget 64.0 MiB" in out and "freed" in out
    assert released["resets"] == 1 and released["programs"] < 30
    assert held["rss"] - released["rss"] > 64 * MiB  # the wipe gave the memory back
    # More new shapes: the caches are dropped again each time they pass the budget, so the
    # kernel does not grow with them (without the rule, 8 shapes grow it by ~300 MiB).
    peaks = []
    for n in range(200, 208):
        kernel.ok(CELL.format(n=n), metadata={"shardlab": {"mode": "eager"}})
        peaks.append(state(kernel)["rss"])
    final = state(kernel)
    assert final["resets"] >= 3
    assert max(peaks) - released["rss"] < 3 * 64 * MiB


def test_reset_off_never_releases(kernel):
    kernel.ok('%config ShardlabSession.cache_reset = "off"')
    kernel.ok("%config ShardlabSession.cache_budget_mib = 0")
    out = run_shapes(kernel, range(1, 3))
    assert "[shardlab]" not in out and state(kernel)["resets"] == 0
