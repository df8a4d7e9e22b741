"""The layering in DESIGN.md, checked: parallel/ and engine/ never import UI libraries."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import shardlab

ROOT = pathlib.Path(__file__).resolve().parents[1]
FORBIDDEN = ("IPython", "ipywidgets", "bokeh", "ipykernel", "jupyter_bokeh")


@pytest.mark.parametrize("module", ["shardlab", "shardlab.engine", "shardlab.parallel"])
def test_core_layers_import_no_ui_libraries(module):
    code = (
        f"import sys, json\nimport {module}\n"
        f"print(json.dumps([m for m in {list(FORBIDDEN)!r} if m in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_version_has_one_source_of_truth():
    version = (ROOT / "python" / "shardlab" / "_version.py").read_text()
    assert f'"{shardlab.__version__}"' in version
    package_json = ROOT / "package.json"
    if package_json.exists():  # the lab extension, once it exists, shares the version
        assert json.loads(package_json.read_text())["version"] == shardlab.__version__


def test_public_api_is_explicit():
    assert set(shardlab.__all__) <= set(dir(shardlab))
    assert "load_ipython_extension" in shardlab.__all__
