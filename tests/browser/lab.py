"""Drive JupyterLab in headless Chromium (Python Playwright, Debian's /usr/bin/chromium).

``LabServer`` runs ``jupyter lab`` on a free port with a random token, a throw-away root
directory, settings and workspaces, and nothing that reaches the network.
``open_and_run`` opens a notebook in a fresh workspace, waits for its kernel to be connected
and idle, runs every cell and waits until every code cell has run and the kernel is idle
again. ``screenshot`` saves test-artifacts/browser/<name>.png.

Every wait here polls a snapshot of the page (see ``notebook_state``), so a timeout says what
the page looked like: kernel status, cell prompts, open dialogs and the notebook's text.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "browser"
# Debian's chromium (tools/install-browser.sh); SHARDLAB_CHROMIUM points elsewhere.
CHROMIUM = pathlib.Path(os.environ.get("SHARDLAB_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
KERNEL_NAME = "shardlab"
POLL_S = 0.25

# Lab user settings for the test server: no news prompt, no update check, and every cell
# attached to the DOM (the default windowing detaches cells outside the viewport, which
# would hide their outputs from assertions).
WINDOWING_SETTINGS = "@jupyterlab/notebook-extension/tracker.jupyterlab-settings"
USER_SETTINGS = {
    WINDOWING_SETTINGS: {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}


class LabError(AssertionError):
    """A browser step failed; the message carries what the page showed."""


# --------------------------------------------------------------------------------------------
# The server


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LabServer:
    """``jupyter lab`` as a child process; ``start()`` returns once /api/status answers."""

    def __init__(
        self,
        root_dir: pathlib.Path,
        state_dir: pathlib.Path,
        user_settings: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """``user_settings`` ({settings file: {key: value}}) is merged over USER_SETTINGS,
        e.g. ``{WINDOWING_SETTINGS: {"windowingMode": "full"}}`` for Lab's windowing."""
        self.root_dir = pathlib.Path(root_dir)
        self.state_dir = pathlib.Path(state_dir)
        self.user_settings = {name: dict(values) for name, values in USER_SETTINGS.items()}
        for name, values in (user_settings or {}).items():
            self.user_settings.setdefault(name, {}).update(values)
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.state_dir / "jupyter-lab.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None

    def command(self) -> list[str]:
        settings = self.state_dir / "user-settings"
        workspaces = self.state_dir / "workspaces"
        return [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root_dir}",
            f"--MappingKernelManager.default_kernel_name={KERNEL_NAME}",
            # Nothing that goes to the network.
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly",
            # A throw-away Lab state; window.jupyterapp for running commands.
            f"--LabApp.user_settings_dir={settings}",
            f"--LabApp.workspaces_dir={workspaces}",
            "--LabApp.expose_app_in_browser=True",
        ]

    def start(self, timeout: float = 60.0) -> LabServer:
        settings = self.state_dir / "user-settings"
        for relative, values in self.user_settings.items():
            path = settings / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        (self.state_dir / "workspaces").mkdir(parents=True, exist_ok=True)
        self.root_dir.mkdir(parents=True, exist_ok=True)
        for _attempt in range(3):
            if self._launch(timeout):
                return self
            # Lost the free port to another process between choosing and binding it.
            self.stop()
            self.port = free_port()
            self.base_url = f"http://127.0.0.1:{self.port}"
        raise LabError("jupyter lab found no free port in 3 tries:\n" + self.log_tail())

    def _launch(self, timeout: float) -> bool:
        """Starts the server; True once it answers, False if its port was taken."""
        self._log_file = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            self.command(),
            cwd=self.root_dir,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        last_error = ""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = self.log_tail()
                if "already in use" in log:
                    return False
                raise LabError(
                    f"jupyter lab exited with {self.process.returncode} before answering:\n" + log
                )
            try:
                status = self.api("/api/status", timeout=2)
                if "started" in status:
                    return True
            except (OSError, ValueError) as error:
                last_error = repr(error)
            time.sleep(POLL_S)
        raise LabError(
            f"jupyter lab did not answer /api/status within {timeout:.0f} s ({last_error}):\n"
            + self.log_tail()
        )

    def api(self, path: str, *, method: str = "GET", timeout: float = 10.0) -> Any:
        """A REST call with the token; the decoded JSON ('' for an empty body)."""
        request = urllib.request.Request(
            self.base_url + path,
            method=method,
            headers={"Authorization": f"token {self.token}"},
            data=b"" if method == "POST" else None,
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else ""

    def add(self, source: str | os.PathLike[str], name: str | None = None) -> str:
        """Copies a file (a notebook) into the server's root dir; returns its name there."""
        source = pathlib.Path(source)
        target = self.root_dir / (name or source.name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        return target.relative_to(self.root_dir).as_posix()

    def shutdown_kernels(self) -> None:
        """Ends every session and kernel (between tests, so idle kernels do not pile up)."""
        for session in self.api("/api/sessions"):
            self.api(f"/api/sessions/{session['id']}", method="DELETE", timeout=30)
        for kernel in self.api("/api/kernels"):
            self.api(f"/api/kernels/{kernel['id']}", method="DELETE", timeout=30)

    def log_tail(self, chars: int = 6000) -> str:
        if self._log_file is not None:
            self._log_file.flush()
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (the server shuts its kernels down), then SIGKILL the whole process group."""
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        if process is not None:
            # Kernels and anything else the server started live in its process group.
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            process.wait(timeout=timeout)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        self.process = None


# --------------------------------------------------------------------------------------------
# The page

# A snapshot of the current notebook panel; every wait below polls it.
_STATE_JS = """
() => {
  const visible = (el) => el && !el.closest('.lm-mod-hidden') && el.offsetParent !== null;
  const dialogs = [...document.querySelectorAll('.jp-Dialog')].map((d) => d.innerText.trim());
  const panel = [...document.querySelectorAll('.jp-NotebookPanel')].find(visible);
  const state = {panel: !!panel, dialogs, app: !!window.jupyterapp};
  if (!panel) return state;
  // The session's kernel, from the app when exposed (LabServer does): display status is
  // the connection status until connected, then the kernel's own status.
  const widget = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const context = widget && widget.sessionContext;
  const kernel = context && context.session && context.session.kernel;
  state.session = context ? {
    display: context.kernelDisplayStatus,
    connection: kernel ? kernel.connectionStatus : null,
    kernel: kernel ? kernel.name : null,
  } : null;
  // The same, as the page shows it: the toolbar's execution indicator and the status bar's
  // "<kernel> | <status>" item (which reads the display status).
  const indicator = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  state.indicator = indicator ? indicator.getAttribute('data-status') : null;
  const item = [...document.querySelectorAll('.jp-StatusBar-TextItem')]
    .map((e) => e.innerText.trim()).find((t) => t.includes(' | '));
  state.statusBar = item || '';
  const name = panel.querySelector('.jp-Toolbar-kernelName');
  const cells = [...panel.querySelectorAll('.jp-Notebook .jp-Cell.jp-CodeCell')];
  state.kernelName = name ? name.innerText.trim() : '';
  state.prompts = cells.map((c) => {
    const p = c.querySelector('.jp-InputArea-prompt');
    return p ? p.textContent.trim() : '';
  });
  state.cells = panel.querySelectorAll('.jp-Notebook .jp-Cell').length;
  const run = window.__shardlabRunAll;
  state.run = run ? {done: run.done, ok: run.ok, error: run.error} : null;
  return state;
}
"""

_RUN_ALL_JS = """
async () => {
  const app = window.jupyterapp;
  window.__shardlabRunAll = {done: false, ok: null, error: null};
  await app.commands.execute('notebook:clear-all-cell-outputs');
  app.commands.execute('notebook:run-all-cells').then(
    (ok) => { window.__shardlabRunAll = {done: true, ok: ok !== false, error: null}; },
    (e) => { window.__shardlabRunAll = {done: true, ok: false, error: String(e)}; });
}
"""

# Error outputs of the current notebook, from the model (needs window.jupyterapp).
_ERRORS_JS = """
() => {
  const app = window.jupyterapp;
  const widget = app && app.shell.currentWidget;
  if (!widget || !widget.content || !widget.content.model) return null;
  const errors = [];
  const cells = widget.content.model.cells;
  for (let i = 0; i < cells.length; i++) {
    const cell = cells.get(i);
    if (cell.type !== 'code') continue;
    for (const o of cell.toJSON().outputs || []) {
      if (o.output_type !== 'error') continue;
      const tags = (cell.toJSON().metadata || {}).tags || [];
      errors.push({cell: i, ename: o.ename, evalue: o.evalue,
                   expected: tags.includes('raises-exception')});
    }
  }
  return errors;
}
"""


def notebook_state(page: Any) -> dict[str, Any]:
    """What the page shows now: panel, kernel status/name, code-cell prompts, dialogs."""
    return page.evaluate(_STATE_JS)


def notebook_text(page: Any) -> str:
    """The visible text of the notebook area (or of the whole page when there is none)."""
    try:
        return page.evaluate(
            """() => {
              const p = [...document.querySelectorAll('.jp-NotebookPanel')]
                .find((el) => !el.closest('.lm-mod-hidden'));
              return (p || document.body).innerText;
            }"""
        )
    except Exception as error:  # the page may be gone; this is for diagnostics only
        return f"(no page text: {error!r})"


def screenshot(page: Any, name: str) -> pathlib.Path:
    """Saves test-artifacts/browser/<name>.png (repo root) and returns its path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def _describe(state: dict[str, Any], page: Any) -> str:
    return (
        "page state: "
        + json.dumps(state, indent=1)
        + "\n--- notebook text ---\n"
        + notebook_text(page)[-6000:]
    )


def _wait(page: Any, what: str, ready: Any, timeout: float) -> dict[str, Any]:
    """Polls notebook_state until ready(state) is true; LabError with the state otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        state = notebook_state(page)
        if state.get("dialogs"):
            raise LabError(f"a dialog is open while waiting for {what}:\n{_describe(state, page)}")
        if ready(state):
            return state
        if time.monotonic() > deadline:
            raise LabError(
                f"timed out after {timeout:.0f} s waiting for {what}\n" + _describe(state, page)
            )
        page.wait_for_timeout(POLL_S * 1000)


def _kernel_idle(state: dict[str, Any]) -> bool:
    """The session's kernel is connected and idle, and the page shows it."""
    if not state.get("panel") or state.get("indicator") != "idle":
        return False
    if not state.get("statusBar", "").endswith("| Idle"):
        return False
    session = state.get("session")
    if state.get("app"):
        return (
            bool(session) and session["display"] == "idle" and session["connection"] == "connected"
        )
    return True


def _is_count(prompt: str) -> bool:
    return prompt.startswith("[") and prompt.rstrip(":").strip("[]").isdigit()


def open_notebook(
    page: Any,
    base_url: str,
    token: str,
    notebook_name: str,
    timeout: float = 60.0,
    *,
    kernel_name: str = KERNEL_NAME,
) -> dict[str, Any]:
    """Opens the notebook in a fresh workspace; returns once its kernel is connected and idle.

    Raises LabError if the notebook's kernel is not ``kernel_name`` (shardlab's by default).
    """
    page.goto(f"{base_url}/lab/tree/{notebook_name}?reset&token={token}")
    state = _wait(
        page,
        f"the notebook {notebook_name!r} and its kernel to be connected and idle",
        lambda s: _kernel_idle(s) and s.get("cells", 0) > 0,
        timeout,
    )
    session = state.get("session") or {}
    if session.get("kernel", kernel_name) != kernel_name:
        raise LabError(
            f"{notebook_name!r} runs on the kernel {session.get('kernel')!r}, not {kernel_name!r}"
        )
    return state


def run_all(page: Any, timeout: float = 120.0, *, allow_errors: bool = False) -> dict[str, Any]:
    """Clears outputs, runs every cell, waits until all code cells ran and the kernel is idle.

    Uses the app's commands when ``window.jupyterapp`` is exposed (``LabServer`` does), else
    the Edit and Run menus. As with nbclient, a cell tagged ``raises-exception`` may raise
    (Lab then runs on); any other error fails the run unless ``allow_errors``. Returns the
    final ``notebook_state`` with ``errors``: [{cell, ename, evalue, expected}] (from the
    notebook model; ``None`` without ``window.jupyterapp``).
    """
    if page.evaluate("() => !!window.jupyterapp"):
        page.evaluate(_RUN_ALL_JS)

        def finished(s: dict[str, Any]) -> bool:
            return bool(s.get("run") and s["run"]["done"]) and _kernel_idle(s)

    else:
        _menu(page, "Edit", "Clear Outputs of All Cells")
        _wait(
            page,
            "the outputs and execution counts to clear",
            lambda s: not any(_is_count(p) or "*" in p for p in s.get("prompts", [])),
            30,
        )
        _menu(page, "Run", "Run All Cells")

        def finished(s: dict[str, Any]) -> bool:
            prompts = s.get("prompts") or []
            busy = any("*" in p for p in prompts)
            return _kernel_idle(s) and not busy and any(_is_count(p) for p in prompts)

    state = _wait(page, "every cell to run and the kernel to be idle again", finished, timeout)
    not_run = [i for i, p in enumerate(state.get("prompts", [])) if not _is_count(p)]
    errors = page.evaluate(_ERRORS_JS)
    state["errors"] = errors
    unexpected = [e for e in errors or [] if not e["expected"]]
    if unexpected and not allow_errors:
        raise LabError(f"cells raised: {unexpected}\n" + _describe(state, page))
    if not_run:
        raise LabError(
            f"code cells {not_run} did not run (errors: {errors})\n" + _describe(state, page)
        )
    return state


def open_and_run(
    page: Any,
    base_url: str,
    token: str,
    notebook_name: str,
    timeout: float = 150.0,
    *,
    allow_errors: bool = False,
) -> Any:
    """Opens ``notebook_name`` (relative to the server's root) and runs it; returns the page.

    ``timeout`` bounds the whole thing: opening, kernel start-up and the run.
    """
    start = time.monotonic()
    open_notebook(page, base_url, token, notebook_name, timeout=timeout)
    remaining = max(timeout - (time.monotonic() - start), 10.0)
    run_all(page, timeout=remaining, allow_errors=allow_errors)
    return page


def _menu(page: Any, menu: str, item: str) -> None:
    """Clicks ``menu`` in the menu bar, then its item ``item`` (exact labels)."""
    exact = re.compile(rf"^\s*{re.escape(item)}\s*$")
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(rf"^{re.escape(menu)}$")).click()
    page.locator(".lm-Menu .lm-Menu-itemLabel", has_text=exact).first.click()


def cell_outputs(page: Any) -> list[str]:
    """The text of each code cell's output area, in order."""
    return page.evaluate(
        """() => {
          const p = [...document.querySelectorAll('.jp-NotebookPanel')]
            .find((el) => !el.closest('.lm-mod-hidden'));
          return [...(p || document).querySelectorAll('.jp-Notebook .jp-CodeCell')].map(
            (c) => (c.querySelector('.jp-OutputArea') || {innerText: ''}).innerText);
        }"""
    )
