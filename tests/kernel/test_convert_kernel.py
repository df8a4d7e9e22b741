"""Converted control flow on a real kernel: a graph cell with ``if x.sum() > 0:`` (which used
to stop and ask for ``jnp.where``) stages as ``lax.cond``; conversions show in the execute
reply's metadata and in ``%mode``; ``--show-converted`` and ``--strict``; errors name the cell
line; ``shardlab.to_static`` on a function defined in a cell reads ``In [N], line k``."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.kernel


KERNEL_SETUP = "import jax, jax.numpy as jnp, numpy as np, shardlab"


def test_graph_cell_with_traced_if_works_and_counts_its_conversions(kernel):
    kernel.ok("x = jnp.arange(4.0) - 1")
    out = kernel.ok("%%graph\nif x.sum() > 0:\n    y = x * 2\nelse:\n    y = -x\ny.sum()")
    assert out.text == "Array(4., dtype=float32)"
    conversions = out.metadata["shardlab"]["conversions"]
    assert conversions["converted"] == 1 and conversions["staged"] == {"cond": 1}
    assert kernel.ok("type(y).__name__, y.tolist()").text == "('ArrayImpl', [-2.0, 0.0, 2.0, 4.0])"
    # the other path, same program (no retrace for the same shapes)
    kernel.ok("x = -x")
    kernel.ok("%%graph\nif x.sum() > 0:\n    y = x * 2\nelse:\n    y = -x\ny.sum()")
    assert kernel.ok("y.tolist()").text == "[-1.0, 0.0, 1.0, 2.0]"
    listing = kernel.ok("%mode").stdout
    assert "1 converted: cond 1" in listing


def test_graph_cell_loops_and_break(kernel):
    kernel.ok("rows = jnp.arange(6.0).reshape(3, 2)")
    out = kernel.ok(
        "%%graph\ntotal = 0.0\nfor row in rows:\n    if row.sum() > 6:\n        break\n"
        "    total = total + row.sum()\nfloat_total = total"
    )
    assert out.metadata["shardlab"]["conversions"]["staged"].get("scan") == 1
    assert kernel.ok("float(float_total)").text == "6.0"


def test_show_converted_prints_the_converted_source(kernel):
    out = kernel.ok("%%graph --show-converted\nif x.sum() > 0:\n    w = x\nelse:\n    w = x * 0")
    assert "__sl__.if_stmt(" in out.stdout and "def __sl_fn_if_true_" in out.stdout


def test_one_branch_name_is_an_error_at_the_cell_line(kernel):
    bad = kernel.execute("%%graph\nv = x * 2\nif v.sum() > 0:\n    only = v\n")
    assert bad.status == "error"
    text = bad.reply["content"]["evalue"]
    assert "cell line 3" in text and "`only` is bound only when the condition is true" in text
    assert kernel.ok("'only' in dir()").text == "False"


def test_strict_refuses_a_loop_that_stays_python(kernel):
    kernel.ok("%%graph\nlog = []\nfor v in x:\n    log.append(v)\n")
    bad = kernel.execute("%%graph --strict\nlog = []\nfor v in x:\n    log.append(v)\n")
    assert bad.status == "error"
    assert "cannot be converted for staging" in bad.reply["content"]["evalue"]


def test_to_static_in_a_cell_names_in_n_line_k(kernel):
    defined = kernel.ok(
        "@shardlab.to_static\ndef pick(v):\n    if v.sum() > 0:\n        r = v\n    return r"
    )
    count = defined.reply["content"]["execution_count"]
    bad = kernel.execute("pick(x)")
    assert bad.status == "error"
    text = bad.reply["content"]["evalue"]
    assert f"In [{count}], line 3" in text and "`r` is bound only" in text
    assert "__sl__" not in "".join(bad.reply["content"]["traceback"]).split("ControlFlowError")[-1]
    kernel.ok(
        "@shardlab.to_static\ndef relu_total(v):\n    if v.sum() > 0:\n        return v.sum()\n"
        "    return jnp.zeros(())"
    )
    assert kernel.ok("float(relu_total(jnp.ones(3)))").text == "3.0"
    assert "__sl__.if_stmt" in kernel.ok("print(shardlab.converted(relu_total))").stdout
