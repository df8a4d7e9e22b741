"""Every notebook under notebooks/ executes on the shardlab kernel with nbclient."""

from __future__ import annotations

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.notebook

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def stream_text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path):
    notebook = nbformat.read(path, as_version=4)
    assert notebook.metadata["kernelspec"]["name"] == "shardlab"
    client = NotebookClient(
        notebook, timeout=600, kernel_name="shardlab", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.outputs if o.output_type == "error"]
        expected = "raises-exception" in cell.metadata.get("tags", [])
        assert bool(errors) == expected, (cell.source, errors)
    nbformat.write(notebook, tmp_path / path.name)  # the executed copy, for inspection


def test_eager_jit_graph_notebook_shows_its_story(tmp_path):
    path = next(p for p in NOTEBOOKS if p.name == "01_eager_jit_graph.ipynb")
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="shardlab").execute()
    text = "\n".join(stream_text(c) for c in notebook.cells if c.cell_type == "code")
    assert "hidden mean" in text  # eager: print inside a jitted function saw a value
    assert "graph step: loss" in text
    for label in ("eager", "jit  ", "graph"):
        assert f"{label} " in text and "ms/step" in text
    failing = [c for c in notebook.cells if "raises-exception" in c.metadata.get("tags", [])]
    error = next(o for o in failing[0].outputs if o.output_type == "error")
    assert error.ename == "GraphStagingError" and "cell line 3" in error.evalue
    assert "[shardlab] mode" in text  # mode switches are announced
