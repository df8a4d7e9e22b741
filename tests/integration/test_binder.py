"""binder/ works as mybinder would run it: a clean clone, a fresh venv, binder/requirements.txt,
binder/postBuild, then under binder/start every module the notebooks import is importable and
one notebook runs whole on the shardlab kernel (the others run in test_notebooks.py).

Slow (minutes: a fresh venv installs JAX and JupyterLab, from pip's cache where it can).
Only the extension check may be skipped, and only where Node.js is missing to build it.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.notebook, pytest.mark.timeout(1800)]

REPO = pathlib.Path(__file__).resolve().parents[2]
TAIL = 4000


def run(cmd: list[str], *, cwd: pathlib.Path, env: dict[str, str], timeout: float, what: str):
    """Runs ``cmd``; on failure or timeout fails the test with the command and its output tail."""
    try:
        done = subprocess.run(
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as error:
        out = error.stdout or ""
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        pytest.fail(f"{what}: timed out after {timeout:.0f} s: {cmd}\n{out[-TAIL:]}", pytrace=False)
    return done


def check(done: subprocess.CompletedProcess, what: str) -> str:
    if done.returncode != 0:
        pytest.fail(
            f"{what} failed (exit {done.returncode}): {done.args}\n{done.stdout[-TAIL:]}",
            pytrace=False,
        )
    return done.stdout


def test_binder_files_are_there():
    assert (REPO / "binder" / "requirements.txt").is_file()
    assert (REPO / "binder" / "runtime.txt").read_text().strip() == "python-3.11"
    for script in ("postBuild", "start"):
        path = REPO / "binder" / script
        assert os.access(path, os.X_OK), f"binder/{script} is not executable"
        assert path.read_text().startswith("#!/bin/bash")
    assert 'exec "$@"' in (REPO / "binder" / "start").read_text()
    assert "set -e" in (REPO / "binder" / "postBuild").read_text()


def test_binder_environment_imports_what_the_notebooks_import_and_runs_one(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    clone = tmp_path / "repo"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "JUPYTER"))}
    base_env.pop("PYTHONPATH", None)
    check(
        run(
            ["git", "clone", "--quiet", str(REPO), str(clone)],
            cwd=tmp_path,
            env=base_env,
            timeout=300,
            what="git clone",
        ),
        "git clone",
    )
    # A fresh venv with the interpreter binder would use (3.11 there; this machine's here).
    venv = tmp_path / "venv"
    check(
        run(
            [sys.executable, "-m", "venv", str(venv)],
            cwd=tmp_path,
            env=base_env,
            timeout=300,
            what="python -m venv",
        ),
        "python -m venv",
    )
    bin_dir = venv / "bin"
    env = dict(base_env)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    # repo2docker's step, from the repository root (pip's cache is used; constraints pin it).
    check(
        run(
            [
                str(bin_dir / "python"),
                "-m",
                "pip",
                "install",
                "--quiet",
                "-r",
                "binder/requirements.txt",
            ],
            cwd=clone,
            env=env,
            timeout=1200,
            what="pip install -r binder/requirements.txt",
        ),
        "pip install -r binder/requirements.txt",
    )
    post = run(
        ["bash", "binder/postBuild"], cwd=clone, env=env, timeout=900, what="binder/postBuild"
    )
    extension_problem = None
    if post.returncode != 0:
        node = shutil.which("node", path=env["PATH"])
        if node is None and "Node.js" in post.stdout:
            extension_problem = "skip"
        else:
            extension_problem = (
                f"binder/postBuild failed (exit {post.returncode}):\n" + post.stdout[-TAIL:]
            )
        # Install the kernelspec as postBuild would have, so the notebooks still run.
        check(
            run(
                [
                    str(bin_dir / "python"),
                    "-m",
                    "shardlab",
                    "install",
                    "--sys-prefix",
                    "--name",
                    "shardlab",
                    "--devices",
                    "cpu:8",
                ],
                cwd=clone,
                env=env,
                timeout=300,
                what="python -m shardlab install",
            ),
            "python -m shardlab install",
        )
    # The kernelspec names the venv's interpreter and 8 CPU devices.
    spec = json.loads(
        (venv / "share" / "jupyter" / "kernels" / "shardlab" / "kernel.json").read_text()
    )
    assert spec["argv"][0] == str(bin_dir / "python") and "cpu:8" in spec["argv"]
    # Under binder/start's environment, in the new venv: every module any notebook imports is
    # importable there (what a missing requirement breaks), and one notebook runs whole on
    # the shardlab kernel. The others run on the same kernel code in test_notebooks.py.
    script = (
        "import ast, importlib, json, pathlib, sys, nbformat\n"
        "from nbclient import NotebookClient\n"
        "bad, modules = [], set()\n"
        "for path in sorted(pathlib.Path('notebooks').glob('*.ipynb')):\n"
        "    for cell in nbformat.read(path, as_version=4).cells:\n"
        "        if cell.cell_type != 'code':\n"
        "            continue\n"
        "        code = '\\n'.join(l for l in cell.source.splitlines()\n"
        "                         if not l.lstrip().startswith(('%', '!')))\n"
        "        try:\n"
        "            tree = ast.parse(code)\n"
        "        except SyntaxError:\n"
        "            continue\n"
        "        for node in ast.walk(tree):\n"
        "            if isinstance(node, ast.Import):\n"
        "                modules.update(a.name for a in node.names)\n"
        "            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:\n"
        "                modules.add(node.module)\n"
        "for name in sorted(modules):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as error:\n"
        "        bad.append(f'import {name}: {error!r}')\n"
        "print('imports', json.dumps(sorted(modules)), flush=True)\n"
        "path = pathlib.Path('notebooks/01_eager_jit_graph.ipynb')\n"
        "nb = nbformat.read(path, as_version=4)\n"
        "NotebookClient(nb, timeout=600, kernel_name='shardlab',\n"
        "               resources={'metadata': {'path': 'notebooks'}}).execute()\n"
        "for cell in nb.cells:\n"
        "    errors = [o for o in cell.get('outputs', []) if o.output_type == 'error']\n"
        "    expected = 'raises-exception' in cell.metadata.get('tags', [])\n"
        "    if bool(errors) != expected:\n"
        "        bad.append(f'{path.name}: {cell.source[:80]!r}: {errors}')\n"
        "print(path.name, 'ok', flush=True)\n"
        "print('\\n'.join(bad)); sys.exit(1 if bad else 0)\n"
    )
    # nbclient comes with jupyterlab (jupyter_server → nbconvert → nbclient) in binder too.
    out = check(
        run(
            ["bash", "binder/start", str(bin_dir / "python"), "-c", script],
            cwd=clone,
            env=env,
            timeout=1200,
            what="notebooks under binder/start",
        ),
        "the notebooks under binder/start",
    )
    assert "01_eager_jit_graph.ipynb ok" in out, out[-TAIL:]
    imported = json.loads(
        next(line for line in out.splitlines() if line.startswith("imports "))[8:]
    )
    assert {"jax", "shardlab"} <= {m.split(".")[0] for m in imported}, imported
    start_env = check(
        run(
            ["bash", "binder/start", "env"], cwd=clone, env=env, timeout=60, what="binder/start env"
        ),
        "binder/start env",
    )
    assert "JAX_NUM_CPU_DEVICES=8" in start_env
    assert "--xla_force_host_platform_device_count=8" in start_env
    if extension_problem == "skip":
        pytest.skip(
            "the notebooks ran; the lab extension check is skipped: it is not built in the "
            "clone and Node.js, which binder/postBuild needs to build it, is not installed"
        )
    if extension_problem:
        pytest.fail(f"the notebooks ran, but {extension_problem}", pytrace=False)
