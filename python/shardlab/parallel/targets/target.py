"""``shardlab.target``: the machine a plan is for — GPU hosts or TPU slices of any size.

A ``Target`` holds the target's abstract devices (made by its own compiler, ``devices.py``),
the datasheet profile that prices it and a line for people. ``shardlab.mesh(..., devices=t)``
lays named axes over it (``layout.py``); every program over such a mesh is compiled by
XLA:GPU or XLA:TPU, deviceless, on this machine. Nothing runs on a target.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from jax.sharding import Mesh

from shardlab.parallel.records import _Record
from shardlab.parallel.targets import layout
from shardlab.parallel.targets.catalog import TargetSpec, describe_spec, parse_target
from shardlab.parallel.targets.devices import target_devices

__all__ = [
    "Target",
    "TargetRunError",
    "default_target",
    "placement_note",
    "refuse_to_run",
    "target",
    "target_mesh",
    "target_of",
    "use_target",
]


class TargetRunError(RuntimeError):
    """Something that needs the real devices was asked of a target's abstract ones."""


@dataclasses.dataclass(frozen=True, eq=False)
class Target(_Record):
    """A machine to plan for (``shardlab.target``).

    Attributes:
        kind: the accelerator kind (``"h100"``, ``"tpu-v5p"``).
        label: the kind for people (``"H100 SXM"``).
        platform: ``"cuda"`` or ``"tpu"``: the compiler that builds for it.
        topology: what that compiler was asked for (``"1x8x8"``, ``"v5p:4x4x8"``).
        slices: TPU slices joined over the data-centre network (1 for GPUs).
        hosts: hosts in all.
        per_host: accelerators per host.
        device_count: accelerators in all.
        profile: the datasheet cost profile that prices it (``cost/profiles.py``).
        description: one line: ``64 × H100 SXM (8 hosts × 8, NVLink within a host,
            InfiniBand across)``.
    """

    kind: str
    label: str
    platform: str
    topology: str
    slices: int
    hosts: int
    per_host: int
    device_count: int
    profile: str
    description: str
    spec: TargetSpec = dataclasses.field(repr=False)

    @property
    def devices(self) -> tuple[Any, ...]:
        """The abstract devices, in the compiler's order (nothing can run on them)."""
        # The ones made with the target, held as long as it is: a mesh over them is known
        # by their identity (``target_of``), and ``target_devices`` keeps only 16 specs.
        return _DEVICES.get(self.spec) or target_devices(self.spec)

    @property
    def granule(self) -> str:
        """The unit of the slower network: ``"host"`` (GPUs) or ``"slice"`` (TPUs)."""
        return "host" if self.platform == "cuda" else "slice"

    def __repr__(self) -> str:
        return f"Target({self.description})"

    def __str__(self) -> str:
        return self.description

    def _repr_html_(self) -> str:
        import html

        return f"<code>shardlab.target</code>: {html.escape(self.description)}"


_MADE: dict[TargetSpec, Target] = {}
_DEVICES: dict[TargetSpec, tuple[Any, ...]] = {}  # each made target's devices, kept with it
_DEFAULT: list[Target] = []  # the kernel's %target: what shardlab.mesh(...) lays axes over


def use_target(t: Target | None) -> None:
    """Makes ``shardlab.mesh(...)`` without ``devices=`` lay its axes over ``t`` (the
    kernel's ``%target``); ``None``: back to this process's devices."""
    _DEFAULT.clear()
    if t is not None:
        _DEFAULT.append(t)


def default_target() -> Target | None:
    """The target set by :func:`use_target`, if any."""
    return _DEFAULT[-1] if _DEFAULT else None


def target(
    kind: str,
    *,
    hosts: int | None = None,
    gpus_per_host: int | None = None,
    topology: str | None = None,
    slices: int | None = None,
) -> Target:
    """The machine to plan for: GPU hosts or TPU slices, compiled for without the hardware.

    Args:
        kind: ``"h100"``, ``"h200"``, ``"a100"`` (GPU hosts) or ``"tpu-v5e"``, ``"tpu-v5p"``,
            ``"tpu-v6e"`` (TPU slices).
        hosts: GPU hosts (default 1).
        gpus_per_host: GPUs per host, 1 to 8 (default 8).
        topology: a TPU slice's chips along each ICI dimension: ``"2x4"``, ``"16x16"``
            (v5e, v6e), ``"4x4x8"`` (v5p).
        slices: TPU slices joined over the data-centre network (default 1).

    Returns:
        A ``Target``; pass it as ``shardlab.mesh(data=8, model=8, devices=t)``.

    Raises:
        TargetError: an unknown kind (lists the kinds), a topology the kind does not have
            (valid examples), arguments of the other platform, or the compiler not installed
            (the pip command).

    Example:
        >>> t = shardlab.target("h100", hosts=8)  # 64 GPUs
        >>> mesh = shardlab.mesh(data=8, model=8, devices=t)
    """
    spec = parse_target(
        kind, hosts=hosts, gpus_per_host=gpus_per_host, topology=topology, slices=slices
    )
    made = _MADE.get(spec)
    if made is not None:
        return made
    devices = target_devices(spec)
    _DEVICES[spec] = devices
    n_hosts = len({d.process_index for d in devices})
    per_host = len(devices) // max(n_hosts, 1)
    made = Target(
        kind=spec.kind.name,
        label=spec.kind.label,
        platform=spec.kind.platform,
        topology=spec.topology,
        slices=spec.slices,
        hosts=n_hosts,
        per_host=per_host,
        device_count=len(devices),
        profile=spec.kind.profile,
        description=describe_spec(spec, hosts=n_hosts),
        spec=spec,
    )
    _MADE[spec] = made
    return made


def target_of(mesh_or_devices: Mesh | Sequence[Any]) -> Target | None:
    """The target whose abstract devices a mesh (or a device list) is made of, or None for
    devices of this process."""
    if isinstance(mesh_or_devices, Mesh):
        first = mesh_or_devices.devices.flat[0]
    else:
        seq = list(mesh_or_devices)
        if not seq:
            return None
        first = seq[0]
    for made in _MADE.values():
        if any(first is d for d in made.devices):
            return made
    return None


@dataclasses.dataclass(frozen=True)
class TargetLayout:
    """Where a target mesh's axes run: ``inner`` devices inside a host or slice and
    ``outer`` hosts or slices, per axis; ``crossing`` names the axes that leave one."""

    target: Target
    names: tuple[str, ...]
    inner: tuple[int, ...]
    outer: tuple[int, ...]

    @property
    def crossing(self) -> tuple[str, ...]:
        return tuple(n for n, o in zip(self.names, self.outer, strict=True) if o > 1)

    def describe(self) -> str:
        """``data across 8 hosts; model within a host (NVLink within a host, InfiniBand
        across)``; an axis split both ways reads ``data 2 within × 8 hosts``."""
        kind = self.target.spec.kind
        parts = []
        for name, i, o in zip(self.names, self.inner, self.outer, strict=True):
            if o == 1:
                parts.append(f"{name} within a {self.target.granule}")
            elif i == 1:
                parts.append(f"{name} across {o} {self.target.granule}s")
            else:
                parts.append(f"{name} {i} within × {o} {self.target.granule}s")
        links = f"{kind.within}, {kind.across}" if self.crossing else kind.within
        return f"{'; '.join(parts)} ({links})"


_LAYOUTS: dict[Mesh, TargetLayout] = {}


def target_mesh(t: Target, names: Sequence[str], shape: Sequence[int]) -> Mesh:
    """A mesh with Auto axes over ``t`` (see ``layout.py``); ``mesh_layout`` says where
    its axes run."""
    grid, split = layout.place(tuple(shape), t.devices, t.platform)
    made = Mesh(grid, tuple(names))
    _LAYOUTS[made] = TargetLayout(t, tuple(names), split.inner, split.outer)
    return made


def mesh_layout(mesh: Mesh) -> TargetLayout | None:
    """Where the axes of a mesh made by ``target_mesh`` run; None for other meshes."""
    return _LAYOUTS.get(mesh)


def refuse_to_run(mesh: Mesh, what: str) -> None:
    """Raises ``TargetRunError`` when ``mesh`` is over a target: ``what`` (running a plan,
    placing arrays) needs devices this process does not have; the message names what works."""
    t = target_of(mesh)
    if t is None:
        return
    raise TargetRunError(
        f"{what} needs the devices themselves, and this mesh is over {t.description}: "
        "abstract devices that only a compiler can use. Here, plan.verify() compiles the "
        f"plan for them (XLA:{'GPU' if t.platform == 'cuda' else 'TPU'}: collectives, "
        "memory per device) and plan.to_code() writes it out to run on that machine; to run "
        "it in this process, make the plan again on shardlab.mesh(...) without devices=."
    )


def placement_note(mesh: Mesh, *, collectives: bool = False) -> str:
    """``64 × H100 SXM: data across 8 hosts; model within a host (NVLink …)`` for a mesh
    over a target ("" for other meshes); with ``collectives``, which of them leave a host or
    slice."""
    layout = mesh_layout(mesh)
    if layout is None:
        return ""
    t = layout.target
    note = f"{t.device_count} × {t.label}: {layout.describe()}"
    if collectives and layout.crossing:
        note += (
            f"; collectives over {', '.join(layout.crossing)} cross {t.granule}s "
            f"({t.spec.kind.across.removesuffix(' across')})"
        )
    return note
