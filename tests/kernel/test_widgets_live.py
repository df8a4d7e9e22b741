"""Live views in a real kernel: watch() refreshes on rebinding, the memory panel's button."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.kernel


KERNEL_SETUP = (
    "import jax, jax.numpy as jnp, shardlab\n"
    "from jax.sharding import NamedSharding, PartitionSpec as P\n"
    "m = shardlab.mesh(data=2, model=4)"
)


def display_id(content):
    return content.get("transient", {}).get("display_id")


def test_watch_refreshes_only_when_the_name_is_rebound(kernel):
    kernel.ok("x = jax.device_put(jnp.ones((8, 16)), NamedSharding(m, P('data')))")
    shown = kernel.ok("w = shardlab.watch('x', 'later')\nw")
    first = next(d for d in shown.displays if display_id(d))
    ident = display_id(first)
    assert "float32[8@data,16] P('data')" in first["data"]["text/plain"]
    assert "later: not defined yet" in first["data"]["text/plain"]
    assert "sl-watch" in first["data"]["text/html"]
    unchanged = kernel.ok("y = 1")
    assert not unchanged.updates
    rebound = kernel.ok("x = jax.device_put(x, NamedSharding(m, P(None, 'model')))")
    assert [display_id(u) for u in rebound.updates] == [ident]
    assert "P(None, 'model')" in rebound.updates[0]["data"]["text/plain"]
    kernel.ok("w.stop()")
    assert not kernel.ok("x = x + 1").updates


def test_watch_rejects_non_names(kernel):
    bad = kernel.execute("shardlab.watch(x)")
    assert bad.status == "error" and "variable names as strings" in bad.errors[0]["evalue"]


def test_memory_panel_release_button_frees_and_reports(kernel):
    # Named arrays, sharded and not, must survive a release from a widget callback even
    # though the panel object itself reaches the shell (and so everything) through its comm.
    kernel.ok(
        "keep_sharded = jax.device_put(jnp.arange(64.), NamedSharding(m, P('data')))\n"
        "keep_tree = {'w': [jnp.ones((256, 256))], 'b': jnp.zeros(4)}\n"
        "keep_shell_ref = get_ipython()"
    )
    kernel.ok("jnp.ones((1024, 1024)) * 2")  # 4 MiB held only by Out/_
    shown = kernel.ok("panel = shardlab.memory()\npanel")
    content = next(d for d in shown.displays if display_id(d))
    ident = display_id(content)
    assert "sl-memory" in content["data"]["text/html"]
    buttons = {
        o["data"]["state"].get("description"): o["comm_id"]
        for o in shown.comm_opens
        if o["data"].get("state", {}).get("_model_name") == "ButtonModel"
    }
    assert {"Release", "Refresh"} <= set(buttons)
    clicked = kernel.send_comm(
        buttons["Release"], {"method": "custom", "content": {"event": "click"}}
    )
    assert not clicked.errors
    update = next(u for u in clicked.updates if display_id(u) == ident)
    text = update["data"]["text/plain"]
    assert "released: device bytes:" in text
    freed = text.split("freed ")[1].split(";")[0]
    assert freed.endswith("MiB") and float(freed.split()[0]) >= 4.0
    survived = kernel.ok(
        "float(keep_sharded.sum()), float(keep_tree['w'][0].sum()), float(keep_tree['b'].sum())"
    )
    assert survived.text == "(2016.0, 65536.0, 0.0)"


def test_widget_callback_errors_show_in_the_view(kernel):
    created = kernel.ok(
        "panel2 = shardlab.memory()\n"
        "def broken():\n    raise RuntimeError('boom in refresh')\n"
        "panel2.refresh = broken  # the button looks the method up at click time"
    )
    shown = kernel.ok("panel2")
    ident = display_id(next(d for d in shown.displays if display_id(d)))
    clicked = kernel.send_comm(
        created.widget("Refresh"), {"method": "custom", "content": {"event": "click"}}
    )
    assert not clicked.errors
    update = next(u for u in clicked.updates if display_id(u) == ident)
    assert "RuntimeError: boom in refresh" in update["data"]["text/plain"]
    assert kernel.ok("1 + 1").text == "2"
