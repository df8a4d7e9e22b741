"""Fixtures for browser tests: a JupyterLab server, headless Chromium and a page per test.

    from lab import open_and_run, screenshot

    pytestmark = pytest.mark.browser

    def test_my_view(lab_server, lab_page):
        name = lab_server.add(NOTEBOOKS / "my_view.ipynb")   # copy into the server's root
        open_and_run(lab_page, lab_server.base_url, lab_server.token, name)
        lab_page.locator("#my-view").wait_for()
        screenshot(lab_page, "my_view")                     # test-artifacts/browser/my_view.png

On a failing test the page is saved as test-artifacts/browser/<test>-failure.png and the
notebook's text and the server log are added to the report. Without /usr/bin/chromium or
Playwright the tests skip, except in CI (``CI=true``), where they fail.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil

import pytest
from lab import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, KERNEL_NAME, LabServer, notebook_text

HERE = pathlib.Path(__file__).parent
NOTEBOOKS = HERE / "notebooks"
VIEWPORT = {"width": 1400, "height": 1000}
CONSOLE = pytest.StashKey[list]()


def _unavailable(reason: str) -> None:
    hint = "install it as root with: bash tools/install-browser.sh (or `make browser`)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"browser tests must run in CI: {reason}; {hint}", pytrace=False)
    pytest.skip(f"{reason}; {hint}")


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory):
    """JupyterLab on a free port, token auth, root dir = a tmp copy of tests/browser/notebooks.

    ``lab_server.add(path)`` copies another notebook into the root; ``base_url``, ``token``,
    ``root_dir`` and ``api(path)`` (REST with the token) are there for the tests.
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    except NoSuchKernel:
        pytest.fail(f"no {KERNEL_NAME!r} kernelspec: run `make setup`", pytrace=False)
    root = tmp_path_factory.mktemp("lab-root")
    for notebook in NOTEBOOKS.glob("*.ipynb"):
        shutil.copyfile(notebook, root / notebook.name)
    server = LabServer(root, tmp_path_factory.mktemp("lab-state"))
    try:
        server.start()
        yield server
    finally:
        server.stop()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        if server.log_path.exists():
            shutil.copyfile(server.log_path, ARTIFACTS / "jupyter-lab.log")


@pytest.fixture(scope="session")
def chromium():
    """Headless Debian chromium through Playwright (never Playwright's own browsers)."""
    if not CHROMIUM.exists():
        _unavailable(f"chromium ({CHROMIUM}) is not installed")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("Python Playwright is not installed (pip install -e '.[dev]')")
    shutil.rmtree(ARTIFACTS, ignore_errors=True)  # this run's screenshots only
    playwright = sync_playwright().start()
    try:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()
    finally:
        playwright.stop()


@pytest.fixture
def lab_page(chromium, lab_server, request):
    """A page in a fresh browser context (own cookies and storage), closed after the test."""
    context = chromium.new_context(viewport=VIEWPORT)
    context.set_default_timeout(30_000)
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    request.node.stash[CONSOLE] = console  # for the failure report
    try:
        yield page
    finally:
        context.close()
        lab_server.shutdown_kernels()


def _artifact_name(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid.split("::", 1)[-1]).strip("_")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On a failing browser test: a screenshot, the notebook text and the server log."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    page = item.funcargs.get("lab_page") if hasattr(item, "funcargs") else None
    if page is not None and not page.is_closed():
        path = ARTIFACTS / f"{_artifact_name(item.nodeid)}-failure.png"
        try:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(path))
            report.sections.append(("browser screenshot", str(path)))
        except Exception as error:
            report.sections.append(("browser screenshot", f"failed: {error!r}"))
        report.sections.append(("browser: notebook text", notebook_text(page)[-8000:]))
        console = item.stash.get(CONSOLE, [])
        if console:
            report.sections.append(("browser: console", "\n".join(console[-60:])))
    server = item.funcargs.get("lab_server") if hasattr(item, "funcargs") else None
    if server is not None:
        report.sections.append(("jupyter lab log (tail)", server.log_tail(4000)))
