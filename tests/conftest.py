"""Test configuration: 8 simulated CPU devices, set before JAX starts.

Multi-device tests run on ``jax_num_cpu_devices=8`` (see ``shared/JAX_NOTES.md``). The
environment variables must be set before the first ``import jax`` anywhere in the test
process, which is why this happens at import time of the conftest.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAX_NUM_CPU_DEVICES"] = "8"
# A sharding rule that raises is a bug: surface it (users get a replicated fallback).
os.environ["SHARDLAB_STRICT_RULES"] = "1"

import jax

jax.config.update("jax_num_cpu_devices", 8)


# -- notebooks, executed once per test session -------------------------------------------------
import copy  # noqa: E402
import pathlib  # noqa: E402

import pytest  # noqa: E402

NOTEBOOK_DIR = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
_EXECUTED: dict[str, object] = {}


@pytest.fixture(scope="session")
def executed_notebook(tmp_path_factory):
    """``executed_notebook("01_eager_jit_graph.ipynb")`` (a name under notebooks/, or a
    path): the notebook run once per test
    session on the shardlab kernel with nbclient, as a user's "Run All" would (widget state
    stored, as JupyterLab saves it; errors kept in the outputs for the tests to judge), and a
    deep copy per call. Several tests read one run: each notebook takes up to minutes."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    from nbclient import NotebookClient

    def get(name: str | pathlib.Path):
        path = pathlib.Path(name) if isinstance(name, pathlib.Path) else NOTEBOOK_DIR / name
        name = str(path)
        if name not in _EXECUTED:
            try:
                KernelSpecManager().get_kernel_spec("shardlab")
            except NoSuchKernel:
                pytest.fail("no 'shardlab' kernelspec: run `make setup`", pytrace=False)
            notebook = nbformat.read(path, as_version=4)
            assert notebook.metadata["kernelspec"]["name"] == "shardlab"
            workdir = tmp_path_factory.mktemp(path.stem)
            NotebookClient(
                notebook,
                timeout=600,
                kernel_name="shardlab",
                allow_errors=True,
                store_widget_state=True,
                resources={"metadata": {"path": str(workdir)}},
            ).execute()
            _EXECUTED[name] = notebook
        return copy.deepcopy(_EXECUTED[name])

    return get


# -- two workers (pytest-xdist, `make test`): a test file is a unit, except for the browser ---
def _unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    if path.startswith("tests/browser/") or path.endswith("/test_notebooks.py"):
        return "browser and notebooks"
    return path


def pytest_collection_modifyitems(config, items):
    """Longest units first: the browser and notebook unit, then the files holding a test
    marked slow, then the rest, each in its own order. The workers take whole units in this
    order, so the many short files come last and even out when the two workers finish
    (longest-processing-time first); in collection order a minutes-long file could start
    last and leave the other worker idle."""
    slow = {_unit(item.nodeid) for item in items if item.get_closest_marker("slow")}

    def rank(item) -> int:
        unit = _unit(item.nodeid)
        return 0 if unit == "browser and notebooks" else 1 if unit in slow else 2

    items.sort(key=rank)  # stable: the order inside a unit is kept


def pytest_xdist_make_scheduler(config, log):
    """Whole files go to a worker (module fixtures such as a kernel or a compiled plan are
    made once), and the browser tests with the notebook tests form one unit: one JupyterLab
    server, and each notebook executed once (``executed_notebook``) for both."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return ByFile(config, log)
