"""The layout view: how an array's tiles map onto the devices of a mesh.

``shardlab.show(x)`` draws a live array; ``shardlab.show((1024, 512), P("data"), mesh=m)``
draws a layout that does not exist yet. Both go through a ``TileMap`` record.
"""

from __future__ import annotations

import math
from typing import Any

from shardlab.parallel.compiled.tiles import TileMap, tile_map, tile_map_of
from shardlab.parallel.labels import spec_label, typed_shape
from shardlab.parallel.specs import ShardingSpecError
from shardlab.widgets._base.html import View, color, error_html, esc, fmt_bytes, panel

MAX_TILES = 256  # beyond this the view shows a summary instead of every tile
CELL = 34
LONG_PX = 280  # the longer side of an array drawn to scale
MIN_TILE_PX = 14  # tiles are never thinner than this (the drawing is then stretched)


def _draw_dims(record: TileMap) -> tuple[int, ...]:
    """Which two dimensions to draw: split ones first, then the largest; others fold."""
    dims = list(range(len(record.shape)))
    dims.sort(key=lambda d: (not record.dim_axes[d], -record.shape[d]))
    return tuple(sorted(dims[:2]))


def _extent(
    record: TileMap, row_dim: int | None, col_dim: int, n_rows: int, n_cols: int
) -> tuple[float, float, bool]:
    """Width and height of the drawing: the array's aspect ratio (a 64×512 batch is wide
    and short, a 512×512 weight square), the longer side ``LONG_PX``; a side is stretched
    only where its tiles would be thinner than ``MIN_TILE_PX`` (then not to scale)."""
    n_r = record.shape[row_dim] if row_dim is not None else 1
    n_c = record.shape[col_dim]
    if row_dim is None:  # one drawn dimension: a strip
        return float(max(LONG_PX // 2, MIN_TILE_PX * n_cols)), float(CELL), True
    scale = LONG_PX / max(n_r, n_c, 1)
    width, height = n_c * scale, n_r * scale
    stretched_w, stretched_h = max(width, MIN_TILE_PX * n_cols), max(height, MIN_TILE_PX * n_rows)
    to_scale = stretched_w == width and stretched_h == height
    return min(stretched_w, 2 * LONG_PX), min(stretched_h, 2 * LONG_PX), to_scale


def _tile_groups(record: TileMap) -> dict[tuple[int, ...], int]:
    return {tile.devices: i for i, tile in enumerate(record.tiles)}


def _array_svg(record: TileMap) -> str:
    """The array's tiles on a grid over the drawn dims; hover shows devices, slices, bytes."""
    drawn = _draw_dims(record)
    if len(drawn) == 0:  # a scalar
        tile = record.tiles[0]
        return _svg_rect(0, 0, CELL * 2, CELL, 0, tile, record, "scalar")
    row_dim = drawn[0] if len(drawn) == 2 else None
    col_dim = drawn[-1]
    # Distinct (start, stop) per drawn dim give the grid lines.
    cols = sorted({t.index[col_dim] for t in record.tiles})
    rows = sorted({t.index[row_dim] for t in record.tiles}) if row_dim is not None else [(0, 1)]
    width, height, to_scale = _extent(record, row_dim, col_dim, len(rows), len(cols))
    parts = []
    groups = _tile_groups(record)
    seen: set[tuple[int, int]] = set()
    # every tile labelled, or none: a label takes ~6 px a character of 10 px text plus a
    # margin; where the longest does not fit (hundreds of devices), hover names them
    longest = max(len(",".join(map(str, t.devices))) for t in record.tiles)
    cell_w, cell_h = width / len(cols), height / len(rows)
    labelled = min(longest, 5) * 6 + 4 <= cell_w and cell_h >= 12
    for tile in record.tiles:
        c = cols.index(tile.index[col_dim])
        r = rows.index(tile.index[row_dim]) if row_dim is not None else 0
        if (r, c) in seen:  # folded dims: the first tile at this cell represents them
            continue
        seen.add((r, c))
        x0, x1 = width * c / len(cols), width * (c + 1) / len(cols)
        y0, y1 = height * r / len(rows), height * (r + 1) / len(rows)
        parts.append(
            _svg_rect(
                x0,
                y0,
                x1 - x0,
                y1 - y0,
                groups[tile.devices],
                tile,
                record,
                "tile",
                labelled=labelled,
            )
        )
    labels = []
    if row_dim is not None:
        labels.append(
            f"<text x='-4' y='{height / 2}' text-anchor='end' font-size='10'>dim {row_dim}</text>"
        )
    scale_note = "" if to_scale else " (not to scale)"
    labels.append(
        f"<text x='{width / 2}' y='{height + 12}' text-anchor='middle' font-size='10'>"
        f"dim {col_dim}{scale_note}</text>"
    )
    return (
        f"<svg class='sl-array' width='{width + 60:.0f}' height='{height + 18:.0f}' "
        f"viewBox='-50 0 {width + 60:.0f} {height + 18:.0f}'>{''.join(parts)}{''.join(labels)}</svg>"
    )


def _svg_rect(
    x: float,
    y: float,
    w: float,
    h: float,
    group: int,
    tile: Any,
    record: TileMap,
    cls: str,
    *,
    labelled: bool = True,
) -> str:
    slices = ", ".join(f"{a}:{b}" for a, b in tile.index)
    devices = ",".join(map(str, tile.devices))
    title = (
        f"devices {devices}\nindex [{slices}]\nshard {record.shard_shape} = "
        f"{fmt_bytes(record.shard_bytes)} per device"
    )
    label = devices if len(devices) <= max(4, int(w / 6)) else f"{len(tile.devices)} dev"
    if not labelled:
        label = ""
    return (
        f"<g class='sl-{cls}' data-devices='{devices}'><title>{esc(title)}</title>"
        f"<rect x='{x:.1f}' y='{y:.1f}' width='{w:.1f}' height='{h:.1f}' "
        f"fill='{color(group)}' fill-opacity='0.75' stroke='#333' stroke-width='0.5'/>"
        f"<text x='{x + w / 2:.1f}' y='{y + h / 2 + 4:.1f}' text-anchor='middle' "
        f"font-size='10'>{esc(label)}</text></g>"
    )


MESH_ROWS = 12  # a mesh with more rows shows the first and last ones, the rest summed up
MESH_COLS = 16


def _shown(n: int, limit: int) -> list[int | None]:
    """Indices drawn along a side of ``n``: all of them, or the first ones, a gap (None) and
    the last two, so that a mesh of thousands of devices stays on one screen."""
    if n <= limit:
        return list(range(n))
    head = limit - 3
    return [*range(head), None, n - 2, n - 1]


def _mesh_svg(record: TileMap) -> str:
    """The mesh: each device coloured by the tile it holds (same colour = same data). Rows
    are the first mesh axis, columns the others; beyond ``MESH_ROWS`` × ``MESH_COLS`` the
    middle rows (columns) are left out and counted, every drawn device keeps its place."""
    sizes = [size for _, size in record.mesh_axes]
    names = [name for name, _ in record.mesh_axes]
    rows = sizes[0] if len(sizes) >= 2 else 1
    cols = math.prod(sizes[1:]) if len(sizes) >= 2 else sizes[0]
    group_of: dict[tuple[int, int], tuple[int, int, tuple[int, ...]]] = {}
    for group, tile in enumerate(record.tiles):
        for device, coords in zip(tile.devices, tile.mesh_coords, strict=True):
            r = coords[0] if len(coords) >= 2 else 0
            rest = coords[1:] if len(coords) >= 2 else coords
            c = 0
            for index, extent in zip(rest, sizes[1:] if len(sizes) >= 2 else sizes, strict=True):
                c = c * extent + index
            group_of[(r, c)] = (group, device, coords)
    shown_rows, shown_cols = _shown(rows, MESH_ROWS), _shown(cols, MESH_COLS)
    size = 26
    parts = []
    for y, r in enumerate(shown_rows):
        for x, c in enumerate(shown_cols):
            if r is None or c is None:
                if (r is None and x == 0) or (c is None and y == 0):
                    hidden = rows - len(shown_rows) + 1 if r is None else cols - len(shown_cols) + 1
                    what = names[0] if r is None else " × ".join(names[1:]) or names[0]
                    parts.append(
                        f"<text class='sl-gap' x='{x * size + 2}' y='{y * size + 16}' "
                        f"font-size='10' fill='#555'>{'⋮' if r is None else '…'}"
                        f"<title>{hidden} more {esc(what)} {'rows' if r is None else 'columns'}"
                        "</title></text>"
                    )
                continue
            group, device, coords = group_of[(r, c)]
            where = ", ".join(f"{n}={i}" for n, i in zip(names, coords, strict=True))
            parts.append(
                f"<g class='sl-device' data-device='{device}'><title>device {device} ({where})"
                f"</title><rect x='{x * size}' y='{y * size}' width='{size - 2}' "
                f"height='{size - 2}' rx='3' fill='{color(group)}' fill-opacity='0.75' "
                f"stroke='#333' stroke-width='0.5'/><text x='{x * size + (size - 2) / 2}' "
                f"y='{y * size + size / 2 + 2}' text-anchor='middle' font-size='10'>{device}"
                "</text></g>"
            )
    axis_text = " × ".join(f"{n}={s}" for n, s in record.mesh_axes)
    left_out = []
    if len(shown_rows) < rows:
        left_out.append(f"{names[0]} {len(shown_rows) - 3}–{rows - 3}")
    if len(shown_cols) < cols:
        left_out.append(f"columns {len(shown_cols) - 3}–{cols - 3}")
    note = f" (not drawn: {', '.join(left_out)})" if left_out else ""
    height = len(shown_rows) * size
    return (
        f"<svg class='sl-mesh' width='{max(len(shown_cols) * size, 7 * len(axis_text + note) + 40)}'"
        f" height='{height + 14}'>{''.join(parts)}<text x='0' y='{height + 11}' font-size='10'>"
        f"mesh {esc(axis_text)}{esc(note)}</text></svg>"
    )


class LayoutView(View):
    """The layout of one array (or an error naming the dimension and sizes)."""

    def __init__(self, record: TileMap | None, *, error: str | None = None, name: str = ""):
        self.record = record
        self.error = error
        self.name = name

    def text(self) -> str:
        if self.record is None:
            return f"layout error: {self.error}"
        r = self.record
        lines = [
            f"{self.name + ': ' if self.name else ''}{typed_shape(r.dtype, r.shape, r.dim_axes)} "
            f"{spec_label(r.spec)} on mesh " + " × ".join(f"{n}={s}" for n, s in r.mesh_axes),
            f"shard {list(r.shard_shape)} = {fmt_bytes(r.shard_bytes)} per device; "
            f"{len(r.tiles)} distinct tile(s)",
        ]
        if r.placement:
            lines.append(r.placement)
        copies = math.prod(dict(r.mesh_axes)[a] for a in r.replicated_axes)
        if math.prod(s for _, s in r.mesh_axes) == 1:
            lines.append("1 device: the whole array on it")
        elif r.replicated_axes and copies > 1:
            lines.append(f"replicated over {', '.join(r.replicated_axes)} ({copies} copies)")
        for tile in r.tiles[:16]:
            index = ", ".join(f"{a}:{b}" for a, b in tile.index)
            on = list(tile.devices)
            shown = f"{on}" if len(on) <= 16 else f"{on[:8]} … {on[-2:]} ({len(on)} devices)"
            lines.append(f"  [{index}] on devices {shown}")
        if len(r.tiles) > 16:
            lines.append(f"  ... {len(r.tiles) - 16} more tiles")
        return "\n".join(lines)

    def html(self) -> str:
        if self.record is None:
            return error_html("sl-layout", f"layout error: {self.error}")
        r = self.record
        copies = math.prod(dict(r.mesh_axes)[a] for a in r.replicated_axes)
        devices = math.prod(s for _, s in r.mesh_axes)
        if devices == 1:
            replicated = "1 device: the whole array on it"
        elif r.replicated_axes and copies > 1:
            replicated = (
                "replicated over "
                + ", ".join(f"<b>{esc(a)}</b>" for a in r.replicated_axes)
                + f" (each tile on {copies} devices)"
            )
        else:
            replicated = "no replication: every device holds a different tile"
        head = (
            f"<div>{esc(self.name + ': ' if self.name else '')}"
            f"<code>{esc(typed_shape(r.dtype, r.shape, r.dim_axes))}</code> "
            f"<code>{esc(spec_label(r.spec))}</code> — shard "
            f"<code>{esc(list(r.shard_shape))}</code>, {fmt_bytes(r.shard_bytes)} per device "
            f"(total {fmt_bytes(r.total_bytes)})</div><div class='sl-note'>{replicated}</div>"
            + (f"<div class='sl-note sl-placement'>{esc(r.placement)}</div>" if r.placement else "")
        )
        if len(r.tiles) > MAX_TILES:
            body = (
                f"<div class='sl-note sl-summary'>{len(r.tiles)} tiles: more than the "
                f"{MAX_TILES} this view draws; the text form lists the first 16.</div>"
            )
        else:
            folded = [d for d in range(len(r.shape)) if d not in _draw_dims(r)]
            fold_note = (
                f"<div class='sl-note'>dims {folded} folded (tiles along them are stacked)</div>"
                if folded
                else ""
            )
            body = (
                "<div style='display:flex;gap:24px;align-items:flex-start'>"
                f"{_mesh_svg(r)}{_array_svg(r)}</div>{fold_note}"
            )
        return panel("sl-layout", head + body, title="layout")


def show(
    x_or_shape: Any, spec: Any = None, *, mesh: Any = None, dtype: Any = "float32", name: str = ""
) -> LayoutView:
    """Draws how an array is (or would be) laid out on a mesh.

    Args:
        x_or_shape: a JAX array (its live sharding is drawn) or a shape tuple.
        spec: a ``PartitionSpec`` for a shape (ignored for a live array).
        mesh: the mesh for a shape and spec.
        dtype: element type for a shape (for shard bytes).
        name: a label.

    A spec that does not fit shows an error naming the dimension and axis sizes.
    """
    import jax

    if isinstance(x_or_shape, jax.Array):
        return LayoutView(tile_map_of(x_or_shape), name=name)
    if mesh is None:
        return LayoutView(
            None, error="show(shape, spec, mesh=...) needs a mesh, e.g. shardlab.mesh(data=8)"
        )
    try:
        shape = tuple(getattr(x_or_shape, "shape", x_or_shape))
        dtype = getattr(x_or_shape, "dtype", dtype)
        return LayoutView(tile_map(shape, spec, mesh, dtype=dtype), name=name)
    except ShardingSpecError as error:
        return LayoutView(None, error=str(error), name=name)
    except TypeError as error:
        return LayoutView(None, error=f"cannot draw {x_or_shape!r} with spec {spec!r}: {error}")
