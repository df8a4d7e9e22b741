"""Shared helpers for the notebook generators (tools/make_notebook_*.py)."""

from __future__ import annotations

import nbformat
from nbformat.v4 import new_notebook

KERNELSPEC = {
    "name": "shardlab",
    "display_name": "JAX · shardlab (8 CPU devices)",
    "language": "python",
}


def write(cells: list, path: str) -> None:
    """Writes ``cells`` as a notebook on the shardlab kernel (no outputs)."""
    notebook = new_notebook(
        cells=cells, metadata={"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    )
    nbformat.write(notebook, path)
