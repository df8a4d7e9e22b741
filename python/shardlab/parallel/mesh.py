"""``shardlab.mesh``: a named device mesh with Auto axes, with errors a person can act on."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import jax
import numpy as np
from jax.sharding import Mesh

if TYPE_CHECKING:
    from shardlab.parallel.targets.target import Target


def mesh(
    axes: Mapping[str, int] | None = None,
    /,
    *,
    shape: Sequence[int] | None = None,
    names: Sequence[str] | None = None,
    devices: Sequence[Any] | Target | None = None,
    **axis_sizes: int,
) -> Mesh:
    """A ``jax.sharding.Mesh`` with Auto axes over the current (or given) devices.

    Args:
        axes: ``{name: size}`` in major-to-minor order, e.g. ``{"data": 2, "model": 4}``.
        shape: axis sizes, with ``names``, as an alternative to ``axes``.
        names: axis names for ``shape``.
        devices: the devices to use (default: the kernel's ``%target`` when one is set, else
            ``jax.devices()``), or a ``shardlab.target``:
            the axes are laid over its hosts or slices, the last axes innermost (inside a
            host's NVLink or a slice's ICI), and programs over the mesh are compiled by the
            target's compiler (``parallel/targets/``).
        **axis_sizes: keyword form, e.g. ``mesh(data=2, model=4)``.

    Returns:
        The mesh. CPU devices are laid out in ``jax.devices()`` order, row-major. Over a
        target, and over real GPUs or TPUs, as ``parallel/targets/layout.py`` says (the last
        axes inside a host or slice), so a plan made for a target lays its axes the same way
        when ``plan.to_code()`` runs on the cluster itself.

    Raises:
        ValueError: when the sizes do not multiply to the number of devices (the message
            lists the devices available and valid shapes), or the axes are given twice.
    """
    forms = [axes is not None, shape is not None or names is not None, bool(axis_sizes)]
    if sum(forms) != 1:
        raise ValueError(
            "give the mesh axes one way: mesh(data=2, model=4), mesh({'data': 2, 'model': 4}) "
            "or mesh(shape=(2, 4), names=('data', 'model'))"
        )
    if axes is not None:
        names, shape = tuple(axes), tuple(axes.values())
    elif axis_sizes:
        names, shape = tuple(axis_sizes), tuple(axis_sizes.values())
    else:
        if shape is None or names is None or len(shape) != len(names):
            raise ValueError(
                f"shape={shape!r} and names={names!r} must both be given, with equal length"
            )
        shape, names = tuple(shape), tuple(names)
    if len(set(names)) != len(names):
        raise ValueError(f"mesh axis names must be distinct, got {names}")
    for name, size in zip(names, shape, strict=True):
        if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 1:
            raise ValueError(f"mesh axis {name!r} needs a positive int size, got {size!r}")
    if devices is None:  # the kernel's %target, when one is set
        from shardlab.parallel.targets.target import default_target

        devices = default_target()
    target = _as_target(devices)
    if target is not None:
        pool = list(target.devices)
    elif devices is None:
        pool = list(jax.devices())
    else:
        pool = list(cast("Sequence[Any]", devices))
    need = math.prod(shape)
    if need != len(pool):
        raise ValueError(
            _mismatch_message(dict(zip(names, shape, strict=True)), pool, target=target)
        )
    if target is not None:
        from shardlab.parallel.targets.target import target_mesh

        return target_mesh(target, names, shape)
    platform = getattr(pool[0], "platform", "cpu")
    if platform in ("gpu", "tpu"):  # a real cluster: laid out as over a target of it
        from shardlab.parallel.targets.layout import place

        placed, _ = place(tuple(shape), pool, platform)
        return Mesh(placed, tuple(names))
    grid = np.empty(len(pool), dtype=object)
    grid[:] = pool
    return Mesh(grid.reshape(shape), tuple(names))


def _as_target(devices: Any) -> Any:
    """``devices`` when it is a ``shardlab.target`` (imported only then), else None."""
    if devices is None or isinstance(devices, (list, tuple, np.ndarray)):
        return None
    from shardlab.parallel.targets.target import Target

    return devices if isinstance(devices, Target) else None


def _mismatch_message(wanted: dict[str, int], pool: list[Any], *, target: Any = None) -> str:
    n = len(pool)
    kinds = sorted({f"{d.platform}:{d.device_kind}" for d in pool})
    shown = ", ".join(str(d) for d in pool[:8]) + (", ..." if n > 8 else "")
    if target is not None:
        kinds, shown = [target.description], f"{n} abstract devices"
    sizes = " × ".join(f"{k}={v}" for k, v in wanted.items())
    names = list(wanted)
    suggestion = ""
    if len(names) == 2:
        pairs = [(a, n // a) for a in range(1, n + 1) if n % a == 0]
        suggestion = " e.g. " + ", ".join(
            f"mesh({names[0]}={a}, {names[1]}={b})" for a, b in pairs[:4]
        )
    elif len(names) == 1:
        suggestion = f" e.g. mesh({names[0]}={n})"
    subset = "" if target is not None else "; or pass devices=[...] to use a subset"
    return (
        f"mesh {sizes} needs {math.prod(wanted.values())} devices, but {n} are available "
        f"({', '.join(kinds)}: {shown}). Choose sizes whose product is {n},{suggestion}"
        f"{subset}."
    )


def axes_of_groups(
    mesh_shape: Mapping[str, int], groups: Sequence[Sequence[int]]
) -> tuple[str, ...]:
    """The mesh axes a set of device groups spans.

    Group members are logical partition indices, i.e. positions in ``mesh.devices.flat``.
    An axis is spanned when the members of some group differ in their coordinate on it.
    """
    names = tuple(mesh_shape)
    sizes = tuple(mesh_shape.values())
    total = math.prod(sizes)
    spanned: set[str] = set()
    for group in groups:
        members = [m for m in group if 0 <= m < total]
        if len(members) < 2:
            continue
        coords = np.array(np.unravel_index(members, sizes))
        for i, name in enumerate(names):
            if np.any(coords[i] != coords[i][0]):
                spanned.add(name)
    return tuple(n for n in names if n in spanned)


def mesh_shape_of(m: Mesh) -> dict[str, int]:
    """``{axis: size}`` of a mesh, in mesh order."""
    return {str(k): int(v) for k, v in m.shape.items()}
