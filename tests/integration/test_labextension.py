"""The JupyterLab extension as installed: version, `jupyter labextension list`, shared data."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

import shardlab

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILT = REPO / "python" / "shardlab" / "labextension"
INSTALLED = pathlib.Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "shardlab"


def _require_built() -> None:
    """Skip where the extension was never built (no Node.js), except in CI."""
    if (BUILT / "package.json").exists() or (INSTALLED / "package.json").exists():
        return
    reason = (
        "the lab extension is not built (no Node.js when `make setup` ran); "
        "install it with tools/install-node.sh as root, then `make setup`"
    )
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI must build the lab extension: {reason}", pytrace=False)
    pytest.skip(reason)


def test_package_version_is_the_python_version():
    package = json.loads((REPO / "package.json").read_text())
    assert package["name"] == "shardlab"
    assert package["version"] == shardlab.__version__
    assert package["jupyterlab"]["outputDir"] == "python/shardlab/labextension"


def test_labextension_list_shows_it_enabled():
    _require_built()
    jupyter = pathlib.Path(sys.executable).with_name("jupyter")
    result = subprocess.run(
        [str(jupyter), "labextension", "list"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
        check=False,
    )
    output = result.stdout + result.stderr  # the list goes to stderr
    plain = re.sub(r"\x1b\[[0-9;]*m", "", output)  # colours
    assert f"shardlab v{shardlab.__version__} enabled OK" in plain, output


def test_install_puts_the_extension_in_shared_data():
    _require_built()
    package = json.loads((INSTALLED / "package.json").read_text())
    assert package["name"] == "shardlab" and package["version"] == shardlab.__version__
    assert package["jupyterlab"]["_build"]["load"].startswith("static/remoteEntry.")
    install = json.loads((INSTALLED / "install.json").read_text())
    assert install["packageManager"] == "python" and install["packageName"] == "shardlab"
    schemas = INSTALLED / "schemas" / "shardlab"
    settings = json.loads((schemas / "plugin.json").read_text())
    assert set(settings["properties"]) >= {
        "defaultCellMode",
        "showCellToolbar",
        "refreshIntervalMs",
    }
