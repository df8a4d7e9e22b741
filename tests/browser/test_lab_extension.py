"""The shardlab lab extension in a real browser: per-cell modes in a windowed notebook, the
status bar, the side panel (Release), a palette command, a kernel restart, and a stock
python3 notebook that shows none of it.

One server for the module, with Lab's windowing on (``windowingMode: full``: cells outside
the viewport leave the DOM), unlike the other browser tests' server.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from typing import Any

import pytest
from lab import (
    ARTIFACTS,
    KERNEL_NAME,
    POLL_S,
    WINDOWING_SETTINGS,
    LabError,
    LabServer,
    open_notebook,
    screenshot,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

N_CELLS = 100
MiB = 1024 * 1024


# --------------------------------------------------------------------------------------------
# Notebooks


def _code(source: str, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "id": uuid.uuid4().hex[:12],
        "cell_type": "code",
        "execution_count": None,
        "metadata": metadata or {},
        "outputs": [],
        "source": source,
    }


def _notebook(cells: list[dict[str, Any]], kernel: str = KERNEL_NAME) -> dict[str, Any]:
    display = {"shardlab": "JAX · shardlab", "python3": "Python 3 (ipykernel)"}[kernel]
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"name": kernel, "display_name": display, "language": "python"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def _windowed_cells() -> list[dict[str, Any]]:
    cells = [
        _code("import jax.numpy as jnp\na = jnp.arange(8.0)"),
        _code("b = a * 2"),  # mode from the cell toolbar
        _code("c = a + 1"),  # mode from the command
        _code("d = a - 1"),  # mode from the shortcut G J
        _code("%%graph\ne = a * 3", {"shardlab": {"mode": "jit"}}),  # the magic overrides
        _code("f = 1", {"shardlab": {"mode": "grpah"}, "tags": ["raises-exception"]}),
    ]
    cells += [_code(f"x{i} = {i}") for i in range(len(cells), N_CELLS - 1)]
    cells.append(_code("last = a.sum()", {"shardlab": {"mode": "eager"}}))
    return cells


NOTEBOOKS = {
    "windowed.ipynb": _notebook(_windowed_cells()),
    "memory.ipynb": _notebook(
        [
            _code("import jax.numpy as jnp"),
            # unnamed: only the output history holds it, so Release frees it
            _code(
                "class Big:\n"
                "    def __init__(self):\n"
                "        self.x = jnp.ones((64, 1024, 1024), jnp.float32)\n"
                "    def __repr__(self):\n"
                "        return 'Big(256 MiB on one device)'\n"
                "Big()"
            ),
            _code("w = jnp.ones((1024, 256), jnp.float32)"),
        ]
    ),
    "stock.ipynb": _notebook(
        [_code("x = 1 + 1\nx"), _code("y = x * 2", {"shardlab": {"mode": "graph"}})], "python3"
    ),
}


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    """This module's server: windowing on, new cells in graph mode, the notebooks above."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    for name in (KERNEL_NAME, "python3"):
        try:
            KernelSpecManager().get_kernel_spec(name)
        except NoSuchKernel:
            pytest.fail(f"no {name!r} kernelspec: run `make setup`", pytrace=False)
    root = tmp_path_factory.mktemp("ext-root")
    for name, notebook in NOTEBOOKS.items():
        (root / name).write_text(json.dumps(notebook))
    server = LabServer(
        root,
        tmp_path_factory.mktemp("ext-state"),
        user_settings={
            WINDOWING_SETTINGS: {"windowingMode": "full"},
            "shardlab/plugin.jupyterlab-settings": {"defaultCellMode": "graph"},
        },
    )
    try:
        server.start()
        yield server
    finally:
        server.stop()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        if server.log_path.exists():
            shutil.copyfile(server.log_path, ARTIFACTS / "jupyter-lab-extension.log")


# --------------------------------------------------------------------------------------------
# Page helpers (window.jupyterapp is exposed by LabServer)

_NOTEBOOK_JS = "const w = window.jupyterapp.shell.currentWidget; const nb = w.content;"


def _js(page, body: str, arg: Any = None) -> Any:
    """Runs ``body`` (with ``w`` = the current panel, ``nb`` = its notebook, ``arg``)."""
    return page.evaluate(f"async (arg) => {{ {_NOTEBOOK_JS} {body} }}", arg)


def _wait_for(page, what: str, check, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        page.wait_for_timeout(POLL_S * 1000)
    raise LabError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def _activate(page, index: int) -> None:
    """Makes cell ``index`` active, in command mode, scrolled into view."""
    _js(
        page,
        """
        nb.activeCellIndex = arg; nb.mode = 'command';
        await nb.scrollToItem(arg, 'center');
        const cell = nb.widgets[arg]; await cell.ready;
        cell.node.setAttribute('data-test-cell', String(arg));
        nb.node.focus();
        """,
        index,
    )


def _run_cell(page, index: int) -> None:
    _activate(page, index)
    _js(page, "await window.jupyterapp.commands.execute('notebook:run-cell');")


def _cell_info(page, index: int) -> dict[str, Any]:
    """The cell's model metadata mode, whether its input is in the DOM (windowing detaches
    a code cell's children and hides its node), and its strip's text."""
    return _js(
        page,
        """
        const cell = nb.widgets[arg];
        const input = cell.inputArea;
        const connected = !!input && input.node.isConnected && cell.node.style.display !== 'none';
        const strip = connected ? cell.node.querySelector('.shardlab-CellMode') : null;
        const select = strip && strip.querySelector('select');
        return {
          meta: cell.model.getMetadata('shardlab') ?? null,
          connected,
          count: cell.model.executionCount,
          strip: strip ? strip.querySelector('.shardlab-CellMode-run').textContent : null,
          stripShown: !!strip && !strip.classList.contains('shardlab-mod-empty'),
          select: select ? select.options[select.selectedIndex].textContent : null,
        };
        """,
        index,
    )


def _wait_idle_all_run(page, timeout: float = 120.0) -> None:
    def done():
        return _js(
            page,
            """
            const cells = [...Array(nb.model.cells.length).keys()].map(i => nb.model.cells.get(i));
            const ran = cells.filter(c => c.type === 'code').every(c => c.executionCount !== null);
            return ran && w.sessionContext.kernelDisplayStatus === 'idle';
            """,
        )

    _wait_for(page, "every cell to have run and the kernel to be idle", done, timeout)


def _status_text(page) -> str:
    item = page.locator(".jp-shardlab-status")
    return item.inner_text() if item.count() and item.is_visible() else ""


_UNITS = {"B": 1, "KiB": 1024, "MiB": MiB, "GiB": 1024 * MiB}


def _status_bytes(page) -> float | None:
    """The status bar's memory figure ("257.0 MiB/device") in bytes."""
    match = re.search(r"([\d.]+) (B|KiB|MiB|GiB)/device", _status_text(page))
    return float(match.group(1)) * _UNITS[match.group(2)] if match else None


def _console(page) -> list[str]:
    messages: list[str] = []
    page.on("console", lambda m: messages.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: messages.append(f"pageerror: {e}"))
    return messages


def _shardlab_messages(messages: list[str]) -> list[str]:
    return [m for m in messages if "shardlab" in m.lower()]


# --------------------------------------------------------------------------------------------
# Tests


def test_cell_modes_in_a_windowed_notebook(lab_server, lab_page):
    page = lab_page
    console = _console(page)
    open_notebook(page, lab_server.base_url, lab_server.token, "windowed.ipynb")
    _wait_for(page, "the status bar's device set", lambda: "8 × CPU" in _status_text(page))
    assert _js(page, "return nb.widgets.length") == N_CELLS
    # Windowing is on: the last cells are not in the DOM.
    assert _cell_info(page, N_CELLS - 1)["connected"] is False

    # An invalid metadata mode shows in the cell's control before anything runs.
    _activate(page, 5)
    info = _wait_for(
        page, "cell 5's strip", lambda: _cell_info(page, 5)["stripShown"] and _cell_info(page, 5)
    )
    assert info["select"] == "invalid: 'grpah'"

    # Cell 1: the mode from the cell toolbar's control.
    _activate(page, 1)
    select = page.locator(
        '[data-test-cell="1"] .jp-cell-toolbar select.shardlab-CellModeToolbar-select'
    )
    select.wait_for(state="visible", timeout=15_000)
    select.select_option("graph")
    assert _cell_info(page, 1)["meta"] == {"mode": "graph"}
    screenshot(page, "ext_cell_toolbar_mode")
    # Cell 2: the command, as the palette or a menu would run it.
    _activate(page, 2)
    _js(
        page, "await window.jupyterapp.commands.execute('shardlab:set-cell-mode', {mode: 'eager'});"
    )
    assert _cell_info(page, 2)["meta"] == {"mode": "eager"}
    # Cell 3: the shortcut G J in command mode.
    _activate(page, 3)
    page.keyboard.press("g")
    page.keyboard.press("j")
    _wait_for(
        page, "G J to set cell 3's mode", lambda: _cell_info(page, 3)["meta"] == {"mode": "jit"}
    )

    # Run everything; Lab ends scrolled to the last cell.
    _js(page, "window.jupyterapp.commands.execute('notebook:run-all-cells');")
    _wait_idle_all_run(page)
    last = _wait_for(
        page,
        "the last cell's effective mode",
        lambda: (i := _cell_info(page, N_CELLS - 1))["strip"] and i,
    )
    assert last["connected"] and last["strip"].startswith("ran eager · "), last
    assert _cell_info(page, 1)["connected"] is False  # the top cells left the DOM
    screenshot(page, "ext_windowed_bottom")

    # A cell that was never in the DOM while it ran: its strip comes from the store.
    _activate(page, 50)
    info = _wait_for(page, "cell 50's strip", lambda: (i := _cell_info(page, 50))["strip"] and i)
    assert re.match(r"ran jit · \d", info["strip"]), info

    # Back to the top: the badges re-render on the re-attached cells.
    _activate(page, 0)
    _js(page, "await nb.scrollToItem(0, 'start');")
    expected = {
        1: r"^ran graph · \d+(\.\d)? (µs|ms|s)$",
        2: r"^ran eager · ",
        3: r"^ran jit · ",
        4: r"^ran graph · .* · %%graph overrode jit$",
        5: r"^not run: unknown mode 'grpah'$",
    }
    for index, pattern in expected.items():
        info = _wait_for(
            page,
            f"cell {index}'s strip",
            lambda index=index: (i := _cell_info(page, index))["connected"] and i["strip"] and i,
        )
        assert re.search(pattern, info["strip"]), (index, info)
    assert _cell_info(page, 1)["select"] == "graph"
    screenshot(page, "ext_windowed_top")

    # Scroll away and back once more: the cell leaves and re-enters the DOM, the badge stays.
    _js(page, f"await nb.scrollToItem({N_CELLS - 1}, 'end');")
    _wait_for(page, "cell 1 to leave the DOM", lambda: _cell_info(page, 1)["connected"] is False)
    _js(page, "await nb.scrollToItem(0, 'start');")
    info = _wait_for(
        page, "cell 1 back in the DOM", lambda: (i := _cell_info(page, 1))["connected"] and i
    )
    assert re.search(expected[1], info["strip"] or ""), info

    # defaultCellMode (set to "graph" for this server): a new cell gets that mode.
    _activate(page, N_CELLS - 1)
    _js(page, "await window.jupyterapp.commands.execute('notebook:insert-cell-below');")
    assert _js(page, "return nb.widgets.length") == N_CELLS + 1
    assert _cell_info(page, N_CELLS)["meta"] == {"mode": "graph"}
    # The command without a mode (the shardlab menu's entry) cycles: graph → default.
    _js(page, "await window.jupyterapp.commands.execute('shardlab:set-cell-mode');")
    assert _cell_info(page, N_CELLS)["meta"] is None
    assert _cell_info(page, 10)["meta"] is None  # the cells it loaded are left as they were
    assert not [m for m in _shardlab_messages(console) if not m.startswith("log:")], console


def test_status_bar_memory_and_release_from_the_panel(lab_server, lab_page):
    page = lab_page
    open_notebook(page, lab_server.base_url, lab_server.token, "memory.ipynb")
    _wait_for(page, "the status bar", lambda: "8 × CPU" in _status_text(page))
    assert _status_text(page).endswith("0 B/device"), _status_text(page)

    _run_cell(page, 0)
    _run_cell(page, 1)
    _run_cell(page, 2)
    _wait_for(
        page, "256 MiB on a device", lambda: (_status_bytes(page) or 0) >= 256 * MiB, timeout=60
    )

    # The panel, opened from the command palette.
    page.keyboard.press("Control+Shift+c")
    page.locator(".lm-CommandPalette-input").fill("Open the shardlab Panel")
    page.locator(".lm-CommandPalette-item", has_text="Open the shardlab Panel").first.click()
    panel = page.locator("#shardlab-panel")
    panel.wait_for(state="visible")
    panel.locator(".shardlab-Panel-bar").first.wait_for()
    assert panel.locator(".shardlab-Panel-bar").count() == 8
    assert "8 × CPU" in panel.locator(".shardlab-Panel-deviceSet").inner_text()
    # Largest arrays under the names the user wrote.
    panel.locator(".shardlab-Panel-name", has_text="w").first.wait_for()
    assert "1.0 MiB" in panel.locator(".shardlab-Panel-arrays").inner_text()
    assert "257.0 MiB" in panel.locator(".shardlab-Panel-memory").inner_text()
    assert "[3]" in panel.locator(".shardlab-Panel-history").inner_text()
    # Memory over time: a line per device, 256 MiB at the top of the fullest one's.
    chart = panel.locator("svg.shardlab-Panel-chart")
    chart.wait_for()
    lines = chart.locator(".shardlab-Panel-chartLine")
    assert lines.count() == 8
    assert all(lines.nth(k).locator("polyline").count() >= 1 for k in range(8))
    assert "500.0 MiB" in chart.inner_html()  # the byte axis, rounded up, in human units
    over_time = panel.locator(".shardlab-Panel-overTime").inner_text()
    assert "8 devices over" in over_time and "peak 257.0 MiB" in over_time, over_time
    screenshot(page, "ext_panel_before_release")

    panel.locator("button.shardlab-Panel-release").click()
    message = panel.locator('.shardlab-Panel-message[data-action="release"]')
    message.wait_for(timeout=60_000)
    assert re.match(r"Released 256\.0 MiB: 257\.0 MiB → 1\.0 MiB", message.inner_text()), (
        message.inner_text()
    )
    _wait_for(
        page,
        "the memory figure to fall",
        lambda: (_status_bytes(page) or MiB * 999) <= 2 * MiB,
        timeout=60,
    )
    release_marker = chart.locator('.shardlab-Panel-chartMarker[data-kind="release"]')
    _wait_for(page, "a release marker on the chart", lambda: release_marker.count() >= 1, 60)
    assert "Release (panel)" in release_marker.first.inner_html()
    screenshot(page, "ext_panel_after_release")

    # Switch devices in-process, from the panel, and back; the named array survives.
    for count in (4, 8):
        panel.locator("input.shardlab-Panel-cpuCount").fill(str(count))
        panel.locator("button.shardlab-Panel-switch").click()
        _wait_for(
            page, f"{count} CPU devices", lambda c=count: f"{c} × CPU" in _status_text(page), 60
        )
        assert panel.locator(".shardlab-Panel-bar").count() == count
    switched = panel.locator('.shardlab-Panel-message[data-action="switch"]')
    assert switched.count() == 1 and "shardlab-mod-error" not in (
        switched.get_attribute("class") or ""
    )
    assert "float32[1024, 256]" in panel.locator(".shardlab-Panel-arrays").inner_text()
    switch_marker = chart.locator('.shardlab-Panel-chartMarker[data-kind="devices"]')
    assert switch_marker.count() >= 2, chart.inner_html()  # 8 → 4 and 4 → 8
    assert chart.locator(".shardlab-Panel-chartLine").count() == 8
    screenshot(page, "ext_panel_switched")
    panel.locator(".shardlab-Panel-memory").screenshot(path="/tmp/shardlab_panel_memory.png")


def test_kernel_restart_reconnects_the_status_bar(lab_server, lab_page):
    page = lab_page
    open_notebook(page, lab_server.base_url, lab_server.token, "memory.ipynb")
    _wait_for(page, "the status bar", lambda: "8 × CPU" in _status_text(page))
    _run_cell(page, 0)
    _run_cell(page, 2)
    _wait_for(page, "1 MiB on a device", lambda: "1.0 MiB/device" in _status_text(page))

    _js(page, "await w.sessionContext.session.kernel.restart();")
    _wait_for(
        page,
        "the status bar after the restart",
        lambda: _status_text(page) and _status_text(page).endswith("0 B/device"),
        timeout=60,
    )
    # The new kernel's replies still reach the cells.
    _run_cell(page, 0)
    info = _wait_for(page, "cell 0's strip", lambda: (i := _cell_info(page, 0))["strip"] and i)
    assert info["strip"].startswith("ran jit · "), info
    assert "8 × CPU" in _status_text(page)
    screenshot(page, "ext_after_restart")


def test_stock_kernel_shows_no_shardlab_ui_and_logs_nothing(lab_server, lab_page):
    page = lab_page
    console = _console(page)
    open_notebook(page, lab_server.base_url, lab_server.token, "stock.ipynb", kernel_name="python3")
    _run_cell(page, 0)
    _run_cell(page, 1)
    _wait_for(page, "both cells to run", lambda: _cell_info(page, 1)["count"] is not None)
    page.wait_for_timeout(1000)  # any late status message would have come by now
    assert page.locator(".shardlab-CellMode").count() == 0
    toolbar_select = page.locator(".jp-cell-toolbar .shardlab-CellModeToolbar-select")
    assert toolbar_select.count() == 0 or not toolbar_select.first.is_visible()
    assert _status_text(page) == ""
    _js(page, "await window.jupyterapp.commands.execute('shardlab:open-panel');")
    panel = page.locator("#shardlab-panel")
    panel.wait_for(state="visible")
    assert "Not a shardlab kernel" in panel.inner_text()
    screenshot(page, "ext_stock_kernel")
    assert _shardlab_messages(console) == [], console
    errors = [m for m in console if m.startswith(("error:", "pageerror:"))]
    assert errors == [], errors
