"""Record views: layout, communication graph, memory — asserted through text and HTML."""

from __future__ import annotations

import gc
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardlab
from shardlab.parallel.compiled.tiles import tile_map
from shardlab.widgets.commgraph import CommGraphView, _scope
from shardlab.widgets.layout import MAX_TILES, LayoutView, show
from shardlab.widgets.memory.panel import MemoryView, snapshot


@pytest.fixture(scope="module")
def mesh24():
    return shardlab.mesh(data=2, model=4)


def test_tile_map_matches_jax_shards(mesh24):
    x = jax.device_put(jnp.arange(16 * 32.0).reshape(16, 32), NamedSharding(mesh24, P("data")))
    record = tile_map(x.shape, P("data"), mesh24)
    assert record.replicated_axes == ("model",)
    assert record.shard_shape == (8, 32)
    held = {}
    for shard in x.addressable_shards:
        index = tuple(
            (s.start or 0, s.stop or n) for s, n in zip(shard.index, x.shape, strict=True)
        )
        held.setdefault(index, set()).add(shard.device.id)
    assert {t.index: set(t.devices) for t in record.tiles} == held


def test_layout_view_of_a_planned_layout(mesh24):
    view = show((16, 32), P("data", "model"), mesh=mesh24, name="w")
    text, html = view.text(), view.html()
    assert "shard [8, 8] = 256 B per device; 8 distinct tile(s)" in text
    assert html.count("class='sl-tile'") == 8 and html.count("class='sl-device'") == 8
    assert "index [8:16, 24:32]" in html  # hover: slices
    assert "no replication" in html
    assert "<script" not in html and "http" not in html  # self-contained


def test_layout_view_shows_replication_and_folds_nd(mesh24):
    x = jax.device_put(jnp.ones((8, 4, 6)), NamedSharding(mesh24, P(None, "model")))
    view = show(x)
    assert "replicated over <b>data</b> (each tile on 2 devices)" in view.html()
    assert "dims [2] folded" in view.html()
    assert "[0:8, 3:4, 0:6] on devices [3, 7]" in view.text()


def test_layout_error_names_dimension_and_sizes(mesh24):
    view = show((15, 32), P("data", "modle"), mesh=mesh24)
    assert view.record is None
    message = view.text()
    assert "dimension 0 has size 15, not divisible by 2" in message
    assert "did you mean 'model'" in message and "Nearest valid spec: P(None, 'model')" in message
    assert "sl-error" in view.html()


def test_layout_of_many_tiles_degrades_to_a_summary():
    from shardlab.parallel.compiled.tiles import Tile, TileMap

    tiles = tuple(Tile(((i, i + 1),), (i,), ((i,),)) for i in range(MAX_TILES + 1))
    record = TileMap(
        (MAX_TILES + 1,),
        "float32",
        4,
        "P('d')",
        (("d",),),
        (("d", MAX_TILES + 1),),
        (),
        (1,),
        tiles,
    )
    html = LayoutView(record).html()
    assert "sl-summary" in html and str(MAX_TILES) in html and "sl-tile" not in html


def test_scope_names_are_readable():
    assert _scope("jit(step)/transpose(jvp(layer1))/dot_general") == "layer1/dot_general (backward)"
    assert _scope("jit(mlp)/dot_general") == "mlp/dot_general"


def test_commgraph_predicted_and_actual_side_by_side(mesh24):
    def loss(params, x):
        for w1, w2 in params:
            x = jnp.tanh(x @ w1) @ w2
        return (x**2).mean()

    params = [(jnp.ones((64, 256)), jnp.ones((256, 64))) for _ in range(3)]
    specs = ([(P(None, "model"), P("model", None))] * 3, P("data", None))
    view = shardlab.commgraph(
        jax.grad(loss), params, jnp.ones((32, 64)), mesh=mesh24, in_shardings=specs
    )
    assert isinstance(view, CommGraphView) and view.actual is not None
    actual_total = sum(c.wire_bytes * c.count for c in view.actual.collectives)
    assert actual_total == pytest.approx(view.actual.total_comm_bytes)
    html = view.html()
    assert html.count("class='sl-collective'") == len(view.actual.collectives)
    assert "sl-summary-table" in html and "by source line" in html
    # the megatron all-reduces repeat per layer from one line: collapsed with a count
    rows = re.findall(r"all-reduce [\d,]+ B over model ×(\d+)", view.text())
    assert rows and max(int(n) for n in rows) >= 3
    assert "test_widgets_views.py" in view.text()


def test_commgraph_bad_spec_is_an_inline_error(mesh24):
    view = shardlab.commgraph(
        lambda x: x * 2, jnp.ones((6, 4)), mesh=mesh24, in_shardings=(P("model"),)
    )
    assert "sl-error" in view.html() and "not divisible" in view.text()


def test_memory_snapshot_names_arrays_and_shardings(mesh24):
    gc.collect()  # earlier tests' garbage in reference cycles would crowd the top arrays
    big = jax.device_put(jnp.ones((1024, 256)), NamedSharding(mesh24, P("data")))
    # The snapshot lists the process's largest arrays: the nested one must be larger than
    # what other test modules keep alive, or it falls out of the list.
    snap = snapshot({"big": big, "tree": {"w": [jnp.zeros((512, 128))]}})
    top = snap.arrays[0]
    assert top.name == "big" and top.bytes_total == 1024 * 256 * 4
    assert top.bytes_per_device == 512 * 256 * 4 and "data" in top.spec
    assert any(e.name == "tree['w'][0]" for e in snap.arrays)
    html = MemoryView(snap).html()
    assert html.count("class='sl-bar-row'") == len(jax.devices())
    assert "big" in MemoryView(snap).text()


def test_a_layout_over_256_target_devices_fits_one_screen_and_says_where_axes_run():
    """The mesh of 32 hosts × 8 H100s: the first and last rows drawn, the rest counted, each
    drawn device in its place; the note says which axis leaves the hosts."""
    import re

    from jax.sharding import PartitionSpec as P

    import shardlab
    from compilers import needs

    needs("cuda")
    mesh = shardlab.mesh(data=32, model=8, devices=shardlab.target("h100", hosts=32))
    view = shardlab.show((8192, 4096), P("data", "model"), mesh=mesh, dtype="bfloat16")
    html = view.html()
    drawn = [int(d) for d in re.findall(r"class='sl-device' data-device='(\d+)'", html)]
    assert drawn == [*range(9 * 8), *range(30 * 8, 32 * 8)]  # rows 0-8 and 30-31
    assert "not drawn: data 9–29" in html
    height = int(re.search(r"<svg class='sl-mesh' width='\d+' height='(\d+)'", html).group(1))
    assert height < 400
    note = "256 × H100 SXM: data across 32 hosts; model within a host"
    assert note in html and note in view.text()
    replicated = shardlab.show((4096, 4096), P(None, "model"), mesh=mesh).text()
    assert "(32 devices)" in replicated and len(replicated.splitlines()) < 16


def test_commgraph_on_a_target_says_which_collectives_leave_a_host():
    from jax.sharding import PartitionSpec as P

    import shardlab
    from compilers import needs

    needs("cuda")
    mesh = shardlab.mesh(data=2, model=8, devices=shardlab.target("h100", hosts=2))
    w = jax.ShapeDtypeStruct((512, 1024), jax.numpy.bfloat16)
    x = jax.ShapeDtypeStruct((64, 512), jax.numpy.bfloat16)
    view = shardlab.commgraph(
        jax.grad(lambda w, x: jax.numpy.tanh(x @ w).sum()),
        w,
        x,
        mesh=mesh,
        in_shardings=(P(None, "model"), P("data", None)),
    )
    note = (
        "16 × H100 SXM: data across 2 hosts; model within a host (NVLink within a host, "
        "InfiniBand across); collectives over data cross hosts (InfiniBand)"
    )
    assert note in view.html() and note in view.text()
    assert [c.mesh_axes for c in view.actual.collectives] == [("data",)]
