"""Every notebook under notebooks/ executes on the shardlab kernel with nbclient."""

from __future__ import annotations

import pathlib
import re

import nbformat
import pytest

pytestmark = pytest.mark.notebook

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def stream_text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")


# 05 compiles about twenty plans and runs a budgeted search: minutes on 2 shared cores.
LONG = {"05_memory_budget.ipynb": pytest.mark.timeout(900)}


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=[LONG[p.name]] if p.name in LONG else []) for p in NOTEBOOKS],
    ids=[p.name for p in NOTEBOOKS],
)
def test_notebook_executes(path, tmp_path, executed_notebook):
    notebook = executed_notebook(path.name)
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.outputs if o.output_type == "error"]
        expected = "raises-exception" in cell.metadata.get("tags", [])
        assert bool(errors) == expected, (cell.source, errors)
    nbformat.write(notebook, tmp_path / path.name)  # the executed copy, for inspection


def test_eager_jit_graph_notebook_shows_its_story(executed_notebook):
    path = next(p for p in NOTEBOOKS if p.name == "01_eager_jit_graph.ipynb")
    notebook = executed_notebook(path.name)
    text = "\n".join(stream_text(c) for c in notebook.cells if c.cell_type == "code")
    assert "hidden mean" in text  # eager: print inside a jitted function saw a value
    assert "graph step: loss" in text
    for label in ("eager", "jit  ", "graph"):
        assert f"{label} " in text and "ms/step" in text
    failing = [c for c in notebook.cells if "raises-exception" in c.metadata.get("tags", [])]
    error = next(o for o in failing[0].outputs if o.output_type == "error")
    assert error.ename == "GraphStagingError" and "cell line 3" in error.evalue
    # switching modes keeps staged cells: no reset below max_cached_programs (issue 16)
    assert "[shardlab] mode" not in text


def test_layouts_notebook_saves_static_views(tmp_path, executed_notebook):
    path = next(p for p in NOTEBOOKS if p.name == "02_sharding_layouts.ipynb")
    notebook = executed_notebook(path.name)
    saved = tmp_path / path.name
    nbformat.write(notebook, saved)
    reread = nbformat.read(saved, as_version=4)  # what a reader without a kernel sees
    html = [
        o["data"]["text/html"]
        for c in reread.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type in ("display_data", "execute_result") and "text/html" in o["data"]
    ]
    joined = "\n".join(html)
    for view in ("sl-layout", "sl-commgraph", "sl-memory", "sl-watch"):
        assert view in joined, view
    assert "which the mesh does not have" in joined  # a bad spec renders as an error
    for cell in reread.cells:
        for output in cell.get("outputs", []):
            if "text/html" in output.get("data", {}):
                assert "text/plain" in output["data"]  # every view has a text form too
    # the watch view was updated in place when x2d was rebound
    watch_html = next(h for h in html if "sl-watch" in h)
    assert "P(None, &#x27;model&#x27;)" in watch_html or "P(None, 'model')" in watch_html


def test_eager_vs_compiled_notebook_shows_its_story(executed_notebook):
    path = next(p for p in NOTEBOOKS if p.name == "04_eager_vs_compiled.ipynb")
    notebook = executed_notebook(path.name)

    def shown(cell) -> str:
        return stream_text(cell) + "".join(
            o.get("data", {}).get("text/plain", "")
            for o in cell.get("outputs", [])
            if o.output_type in ("display_data", "execute_result")
        )

    def after(marker: str) -> str:  # the output of the first code cell containing marker
        cell = next(c for c in notebook.cells if c.cell_type == "code" and marker in c.source)
        return shown(cell)

    assert "__sl__.if_stmt" in after("shardlab.converted(loss)")  # the loss converted
    assert "agree on all 5 outputs" in after("%%compare\ngrads")  # the whole step agrees
    assert "graph step: loss" in after("%%graph")
    assert "Python differs when traced" in after("%%compare\nl = jittery")
    assert "no equation diverges" in after("shardlab.bisect(jittery_loss")
    assert "compiled closer to float64" in after("shardlab.compare(bf16_loss,")
    assert "`convert_element_type`" in after("shardlab.bisect(bf16_loss")
    assert "Python differs when traced" in after("shardlab.compare(dropout_loss,")
    assert "`sub` at In [" in after("shardlab.bisect(offset_loss") and "rewrite" in (
        after("shardlab.bisect(offset_loss")
    )
    for fixed in ("scaled_loss", "bf16_loss_fixed", "dropout_loss_keyed", "offset_loss_fixed"):
        assert "eager and compiled agree" in after(f"def {fixed}"), fixed
    html = [
        o["data"]["text/html"]
        for c in notebook.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "text/html" in o.get("data", {})
    ]
    compares = [h for h in html if "sl-compare" in h]
    assert len(compares) >= 9 and all("<table" in h for h in compares)  # one row per output
    assert sum("sl-bisect" in h and "<table" in h for h in html) == 2  # the two found


MIB = r"(\d+\.\d\d) MiB"
BAR = re.compile(rf"^(?P<name>.{{24}}) +{MIB}  [█▓░ ]+  (?P<verdict>fits|over by {MIB})$")


def bar_blocks(text: str) -> list[dict[str, tuple[float, str, float | None]]]:
    """Each printed set of memory bars: {plan: (MiB, "fits"/"over", MiB over or None)}."""
    blocks: list[dict[str, tuple[float, str, float | None]]] = []
    for line in text.splitlines():
        if "▏budget" in line:
            blocks.append({})
        elif (match := BAR.match(line)) and blocks:
            over = match.group(4)
            blocks[-1][match.group("name").strip()] = (
                float(match.group(2)),
                "fits" if over is None else "over",
                None if over is None else float(over),
            )
    return blocks


@pytest.mark.timeout(900)
def test_memory_budget_notebook_shows_its_story(executed_notebook):
    """05: data parallel is over the budget (half of its own compiled memory), ZeRO-3, remat
    and pipeline stages each cut their part, the searched plan fits, and every plan computes
    the plain step."""
    import jax

    from shardlab.examples import gpt_scan
    from shardlab.parallel.mesh import mesh
    from shardlab.strategies import data_parallel

    path = next(p for p in NOTEBOOKS if p.name == "05_memory_budget.ipynb")
    notebook = executed_notebook(path.name)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    errors = [(c.source, o) for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    text = "\n".join(stream_text(c) for c in code)

    # the budget is half of data parallel's compiled memory, and that figure is XLA's
    dp_bytes = int(re.search(r"data parallel: ([\d,]+) bytes", text).group(1).replace(",", ""))
    budget = int(
        re.search(r"budget: \S+ MiB per device \(([\d,]+) bytes\)", text).group(1).replace(",", "")
    )
    assert budget == dp_bytes // 2
    case = gpt_scan(4, batch=16, seq=16, d=32, heads=2, vocab=128)
    assert jax.device_count() == 8
    assert data_parallel(case.fn, *case.args, mesh=mesh(data=8)).verify().memory.total == dp_bytes

    # every bar agrees with the budget: fits iff at most the budget, "over by" the difference
    blocks = bar_blocks(text)
    assert len(blocks) == 5, text
    budget_mib = budget / 2**20
    for block in blocks:
        for name, (total, verdict, over) in block.items():
            assert (verdict == "fits") == (total <= budget_mib + 0.005), (name, total)
            if over is not None:
                assert abs(over - (total - budget_mib)) <= 0.011, (name, total, over)
    assert blocks[0]["data parallel"][1] == "over"
    for block in blocks:  # the same plan has the same figure wherever it is drawn
        for name, row in block.items():
            assert row == blocks[-1].get(name, row), name
    assert set(blocks[-2]) == {
        "data parallel",
        "ZeRO-3",
        "remat dots",
        "remat nothing",
        "pipeline 4 × 4",
    }
    assert all(row[1] == "over" for row in blocks[-2].values())  # "none of them fits alone"
    dp_mib = blocks[0]["data parallel"][0]
    assert all(blocks[-2][name][0] < dp_mib for name in blocks[-2] if name != "data parallel")
    assert blocks[-1]["searched plan"][1] == "fits"  # whichever mix the search chose

    # remat: the temporaries fall with both policies, and the recompute is stated
    temps = re.findall(rf"^(dots|nothing) +temporaries {MIB} → {MIB}; compute \+(\d+)%", text, re.M)
    assert [t[0] for t in temps] == ["dots", "nothing"], text
    for _, before, after, extra in temps:
        assert float(after) < float(before) and int(extra) > 0
    assert text.count("flops recomputed per device") >= 2

    # every shown plan: the plain step's loss (the notebook asserts rtol 1e-5 on the params)
    plain = re.search(r"^plain step +loss (\S+)$", text, re.M).group(1)
    rows = re.findall(
        r"^(.+?) +loss (\S+), new parameters within (\S+) of the plain step$", text, re.M
    )
    assert [r[0] for r in rows] == [
        "data parallel",
        "ZeRO-3",
        "remat dots",
        "remat nothing",
        "pipeline 4 × 4",
        "searched plan",
    ]
    assert all(loss == plain and float(diff) < 1e-4 for _, loss, diff in rows), rows

    # the views: layouts, the memory panel, timelines, the pipeline schedule with its 4 lanes
    html = "\n".join(
        o["data"]["text/html"]
        for c in code
        for o in c.outputs
        if o.output_type in ("display_data", "execute_result") and "text/html" in o["data"]
    )
    assert html.count("shardlab sl-layout") >= 3
    assert "sl-memory" in html and html.count("sl-timeline-view") >= 2
    assert "sl-pipeline" in html
    assert all(f">stage {s}</text>" in html for s in range(4))


def test_plan_a_cluster_notebook_shows_its_story(executed_notebook):
    """07: a Llama-style step planned for 64 H100s and a v5p slice from 8 CPU devices, each
    compiled by its own compiler, with the collectives that leave a host named, and the plan
    exported and refused to run here."""
    from compilers import needs

    needs("cuda", "tpu")
    path = next(p for p in NOTEBOOKS if p.name == "07_plan_a_cluster.ipynb")
    notebook = executed_notebook(path.name)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    errors = [(c.source, o) for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    text = "\n".join(stream_text(c) for c in code)
    assert "8 cpu devices in this kernel" in text
    assert "target: 64 × H100 SXM (8 hosts × 8, NVLink within a host, InfiniBand across)" in text
    assert "data across 8 hosts; model within a host" in text
    found = re.search(r"per device: predicted ([\d.]+) GiB, compiled ([\d.]+) GiB of 80 GiB", text)
    assert found, text
    predicted, compiled = float(found.group(1)), float(found.group(2))
    assert 0 < compiled < 80 and 0.5 < predicted / compiled < 2
    rows = re.findall(
        r"^(all-\S+|reduce-scatter|collective-permute)\s+(\S+)\s.*MiB\s+(crosses hosts|within a host)",
        text,
        re.M,
    )
    assert rows, text
    for _, axes, where in rows:  # a collective leaves a host exactly when it spans data
        assert (where == "crosses hosts") == ("data" in axes.split("×")), (axes, where)
    assert "target: 64 × TPU v5p (slice 4x4x4, 16 hosts, ICI within a slice)" in text
    assert "data within a slice; model within a slice (ICI within a slice)" in text
    assert "mesh = shardlab.mesh(data=8, model=8)" in text
    assert "TargetRunError : running a plan needs the devices themselves" in text
