"""Shared helpers for the notebook generators (tools/make_notebook_*.py)."""

from __future__ import annotations

import os

import nbformat
from nbformat.v4 import new_notebook

KERNELSPEC = {
    "name": "shardlab",
    "display_name": "JAX · shardlab (8 CPU devices)",
    "language": "python",
}


def write(cells: list, path: str) -> None:
    """Writes ``cells`` as a notebook on the shardlab kernel (no outputs).

    Cells keep the ids of the notebook at ``path`` (by position) when it exists, so that
    regenerating a notebook changes only the cells whose content changed.
    """
    if os.path.exists(path):
        old = nbformat.read(path, as_version=4).cells
        for cell, previous in zip(cells, old, strict=False):
            if "id" in previous:
                cell["id"] = previous["id"]
    notebook = new_notebook(
        cells=cells, metadata={"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    )
    nbformat.write(notebook, path)
