"""The README's Python runs (issue 36 item 9): its ```python blocks, in order, as one program
in a fresh process on 8 simulated CPU devices, as a newcomer copying them would run them.

Skipped blocks say so in the README itself: a kernel cell (first line ``%%eager``), or a
block preceded by ``<!-- not run by tests/integration/test_readme.py: reason -->``.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = pathlib.Path(__file__).resolve().parents[2]
README = REPO / "README.md"
_BLOCK = re.compile(r"(?P<before>[^\n]*)\n```python\n(?P<code>.*?)```", re.S)
_NOT_RUN = "<!-- not run by tests/integration/test_readme.py"


def readme_blocks(text: str) -> list[tuple[str, bool]]:
    """``(code, runs)`` per ```python block of ``text``, in order."""
    blocks = []
    for match in _BLOCK.finditer(text):
        code = match["code"]
        kernel_cell = code.lstrip().startswith("%%")
        marked = match["before"].strip().startswith(_NOT_RUN)
        blocks.append((code, not (kernel_cell or marked)))
    return blocks


def test_the_skips_are_few_and_said():
    blocks = readme_blocks(README.read_text())
    runs = [code for code, ok in blocks if ok]
    assert len(runs) >= 5, "the README's runnable tour shrank"
    tour = "\n".join(runs)
    for needed in (
        "optax",
        "def step(params, opt_state, batch)",
        "shardlab.explore(",
        "shardlab.timeline(plan)",
        "plan.to_code()",
    ):
        assert needed in tour, needed


def test_readme_python_runs_in_order(tmp_path):
    blocks = readme_blocks(README.read_text())
    script = "\n\n".join(code for code, ok in blocks if ok)
    path = tmp_path / "readme.py"
    path.write_text(script + "\nprint('README OK')\n")
    env = dict(os.environ)
    env.update(
        JAX_PLATFORMS="cpu",
        JAX_NUM_CPU_DEVICES="8",
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
        MPLBACKEND="Agg",
    )
    done = subprocess.run(
        [sys.executable, str(path)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=850,
    )
    assert done.returncode == 0 and "README OK" in done.stdout, done.stdout[-6000:]
