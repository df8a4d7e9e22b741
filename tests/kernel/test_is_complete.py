"""is_complete answers as stock ipykernel does, in every mode (issue 37).

A console client (jupyter console, qtconsole) sends an is_complete request on Enter and runs
the cell only on ``complete``. The shardlab kernel routes a graph cell by rewriting it into
a ``%%graph`` cell magic, which IPython counts complete only after a blank line: with
``%mode graph`` as the default, ``1`` answered ``incomplete`` and Enter never ran it. Each
answer here is compared with a stock ipykernel's for the same text, under each default mode.
"""

from __future__ import annotations

import pytest

from kernelclient import Kernel

pytestmark = pytest.mark.kernel

CODES = [
    "1",
    "x = 1\n",
    "print('a')",
    "for i in range(3):",
    "for i in range(3):\n    y = i",
    "for i in range(3):\n    y = i\n",
    "for i in range(3):\n    y = i\n\n",
    "def f(a,",
    "x = (1,\n     2",
    "'''open",
    "1)",
    "x = 1 +",
    "a = 1 \\",
    "%time 1",
    "!echo hi",
    "%mode graph",
    "%%graph\n1",
    "%%graph\nz = jnp.ones(3) * 2\n\n",
    "%%graph\nfor i in range(3):",
    "%%jit\n1",
    "%%jit\nif x:",
    "%%jit\nif x:\n    y = 2\n\n",
    "%%eager\nx = 1\n",
    "%%eager\n1)",
    "%%mode graph\n1",
    "\n%%graph\n1",
    "",
]


@pytest.fixture(scope="module")
def stock():
    k = Kernel("python3")
    yield k
    k.shutdown()


def is_complete(kernel: Kernel, code: str) -> dict[str, str]:
    msg_id = kernel.client.is_complete(code)
    while True:
        reply = kernel.client.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"]


@pytest.mark.parametrize("mode", ["graph", "jit", "eager"])
def test_is_complete_answers_as_stock_ipykernel_in_each_default_mode(kernel, stock, mode):
    kernel.ok(f"%mode {mode}")
    shardlab = {code: is_complete(kernel, code) for code in CODES}
    expected = {code: is_complete(stock, code) for code in CODES}
    assert shardlab == expected
    # the case, said plainly: Enter on `1` runs it
    assert shardlab["1"] == {"status": "complete"}


def test_cells_still_run_in_their_mode_after_is_complete(kernel):
    kernel.ok("%mode graph")
    assert is_complete(kernel, "gq = 3 * 4")["status"] == "complete"
    run = kernel.ok("gq = 3 * 4\ngq")
    assert run.metadata["shardlab"]["mode"] == "graph" and run.text == "12"
    kernel.ok("%mode jit")
