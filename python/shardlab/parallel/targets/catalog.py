"""The machines a plan can target: GPU hosts and TPU slices, as data, and their validation.

Nothing here imports JAX: a target is described (and bad input refused, with the valid
alternatives named) before any compiler is loaded. ``devices.py`` turns a described target
into abstract devices; ``layout.py`` lays a mesh over them.

A GPU target is ``hosts`` machines of ``gpus_per_host`` GPUs (NVLink within a host,
InfiniBand across), compiled by XLA:GPU from a target description shipped in
``gpu_specs/`` (the device's published properties; XLA needs them to compile without the
device). A TPU target is one or more slices of a topology (``"4x4x8"``: chips along each
ICI dimension), joined over the data-centre network when ``slices > 1``, compiled by
XLA:TPU (libtpu).
"""

from __future__ import annotations

import dataclasses
import math
import re

__all__ = [
    "KINDS",
    "Kind",
    "TargetError",
    "TargetSpec",
    "describe_spec",
    "parse_target",
]

MAX_DEVICES = 16384  # the largest slice sets people run (and XLA compiles in minutes)


class TargetError(ValueError):
    """A target that is not known or does not exist (the message names valid ones)."""


@dataclasses.dataclass(frozen=True)
class Kind:
    """One accelerator kind a target can be made of.

    Attributes:
        name: the name users type (``"h100"``, ``"tpu-v5p"``).
        label: how it is written for people (``"H100 SXM"``).
        platform: ``"cuda"`` or ``"tpu"`` (the compiler that builds for it).
        profile: the datasheet cost profile that prices it (``cost/profiles.py``).
        spec_file: GPU only: the XLA target description in ``gpu_specs/``.
        topology_prefix: TPU only: the libtpu topology name (``"v5p"``).
        dims: TPU only: ICI dimensions of a slice (2 for v5e/v6e, 3 for v5p).
        max_slice: TPU only: a bound on chips along each dimension (libtpu checks the exact
            shapes; ``devices.py`` turns its refusal into valid examples).
        examples: valid topology strings (TPU) or host counts (GPU), for error messages.
        within: the interconnect inside a host (GPU) or a slice (TPU).
        across: the network between hosts (GPU) or slices (TPU).
    """

    name: str
    label: str
    platform: str
    profile: str
    spec_file: str = ""
    topology_prefix: str = ""
    dims: int = 0
    max_slice: tuple[int, ...] = ()
    examples: tuple[str, ...] = ()
    within: str = ""
    across: str = ""


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind(
            "h100",
            "H100 SXM",
            "cuda",
            "h100-nvlink",
            spec_file="h100_sxm.txtpb",
            examples=("hosts=1", "hosts=8", "hosts=32"),
            within="NVLink within a host",
            across="InfiniBand across",
        ),
        Kind(
            "h200",
            "H200 SXM",
            "cuda",
            "h200",
            spec_file="h200_sxm.txtpb",
            examples=("hosts=1", "hosts=8", "hosts=32"),
            within="NVLink within a host",
            across="InfiniBand across",
        ),
        Kind(
            "a100",
            "A100 SXM 80GB",
            "cuda",
            "a100-nvlink",
            spec_file="a100_sxm_80.txtpb",
            examples=("hosts=1", "hosts=4", "hosts=16"),
            within="NVLink within a host",
            across="InfiniBand across",
        ),
        Kind(
            "tpu-v5e",
            "TPU v5e",
            "tpu",
            "tpu-v5e",
            topology_prefix="v5e",
            dims=2,
            max_slice=(32, 32),
            examples=("2x2", "2x4", "4x4", "8x8", "16x16"),
            within="ICI within a slice",
            across="data-centre network across slices",
        ),
        Kind(
            "tpu-v5p",
            "TPU v5p",
            "tpu",
            "tpu-v5p",
            topology_prefix="v5p",
            dims=3,
            max_slice=(32, 32, 32),
            examples=("2x2x1", "2x2x2", "4x4x4", "4x4x8", "8x8x8", "16x16x16"),
            within="ICI within a slice",
            across="data-centre network across slices",
        ),
        Kind(
            "tpu-v6e",
            "TPU v6e",
            "tpu",
            "tpu-v6e",
            topology_prefix="v6e",
            dims=2,
            max_slice=(32, 32),
            examples=("2x2", "2x4", "4x4", "8x8", "16x16"),
            within="ICI within a slice",
            across="data-centre network across slices",
        ),
    )
}
_ALIASES = {
    "v5e": "tpu-v5e",
    "v5p": "tpu-v5p",
    "v6e": "tpu-v6e",
    "tpu-v5litepod": "tpu-v5e",
    "tpu-v5-lite": "tpu-v5e",
    "h100-sxm": "h100",
    "h200-sxm": "h200",
    "a100-80gb": "a100",
}


@dataclasses.dataclass(frozen=True)
class TargetSpec:
    """A validated target, before any device exists.

    Attributes:
        kind: the accelerator kind.
        topology: what the compiler is asked for: ``"1x8x8"`` (slices × hosts × GPUs per
            host) for GPUs, ``"v5p:4x4x8"`` for TPUs.
        slices: TPU slices (1 for GPU targets).
        hosts: GPU hosts; for TPUs, the hosts of all slices (known once the devices exist;
            0 until then).
        per_host: GPUs per host (0 for TPUs until the devices exist).
        device_count: accelerators in all.
    """

    kind: Kind
    topology: str
    slices: int
    hosts: int
    per_host: int
    device_count: int


def _kind(name: object) -> Kind:
    if not isinstance(name, str):
        raise TargetError(f"a target kind is a string such as 'h100', got {name!r}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in KINDS:
        raise TargetError(
            f"unknown target kind {name!r}; known kinds: {', '.join(KINDS)} "
            "(e.g. shardlab.target('h100', hosts=8) or shardlab.target('tpu-v5p', "
            "topology='4x4x8'))"
        )
    return KINDS[key]


def _count(value: object, what: str, example: str, *, low: int = 1, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TargetError(f"{what} must be a whole number, got {value!r} (e.g. {example})")
    if not low <= value <= high:
        raise TargetError(f"{what} must be between {low} and {high}, got {value} (e.g. {example})")
    return value


def _topology_dims(kind: Kind, topology: object) -> tuple[int, ...]:
    examples = ", ".join(repr(e) for e in kind.examples)
    if not isinstance(topology, str):
        raise TargetError(
            f"{kind.name} needs topology='AxB{'xC' if kind.dims == 3 else ''}' (chips along each "
            f"ICI dimension of a slice), got {topology!r}; valid for {kind.name}: {examples}"
        )
    text = topology.strip().lower()
    if text.startswith(kind.topology_prefix + ":"):
        text = text[len(kind.topology_prefix) + 1 :]
    parts = text.split("x")
    if len(parts) != kind.dims or not all(re.fullmatch(r"[1-9]\d{0,3}", p) for p in parts):
        raise TargetError(
            f"topology {topology!r} is not a {kind.label} slice: it has {kind.dims} ICI "
            f"dimensions written '{'x'.join('ABC'[: kind.dims])}'; valid for {kind.name}: {examples}"
        )
    dims = tuple(int(p) for p in parts)
    too_big = [d for d, top in zip(dims, kind.max_slice, strict=True) if d > top]
    if too_big:
        largest = "x".join(str(d) for d in kind.max_slice)
        raise TargetError(
            f"topology {topology!r} is larger than a {kind.label} slice can be (at most "
            f"{largest}); join slices with slices=N instead; valid for {kind.name}: {examples}"
        )
    return dims


def parse_target(
    kind: object,
    *,
    hosts: object = None,
    gpus_per_host: object = None,
    topology: object = None,
    slices: object = None,
) -> TargetSpec:
    """Validates a target description (see ``shardlab.target``) without loading a compiler.

    Raises:
        TargetError: an unknown kind (the message lists the kinds), a bad topology (valid
            ones for that kind), an argument that does not apply to the kind, or a size out of
            range.
    """
    k = _kind(kind)
    if k.platform == "cuda":
        if topology is not None or slices is not None:
            raise TargetError(
                f"{k.name} is a GPU target: give hosts= and gpus_per_host= (e.g. "
                f"shardlab.target({k.name!r}, hosts=8)), not topology= or slices="
            )
        n_hosts = _count(1 if hosts is None else hosts, "hosts", "hosts=8", high=2048)
        per = _count(
            8 if gpus_per_host is None else gpus_per_host,
            "gpus_per_host",
            "gpus_per_host=8",
            high=8,
        )
        total = n_hosts * per
        if total > MAX_DEVICES:
            raise TargetError(
                f"{n_hosts} hosts × {per} GPUs is {total} GPUs; at most {MAX_DEVICES} are planned"
            )
        return TargetSpec(k, f"1x{n_hosts}x{per}", 1, n_hosts, per, total)
    if hosts is not None or gpus_per_host is not None:
        raise TargetError(
            f"{k.name} is a TPU target: give topology= (and slices= to join several), e.g. "
            f"shardlab.target({k.name!r}, topology={k.examples[-2]!r}); hosts come with the "
            "topology"
        )
    dims = _topology_dims(k, topology)
    n_slices = _count(1 if slices is None else slices, "slices", "slices=2", high=64)
    total = math.prod(dims) * n_slices
    if total > MAX_DEVICES:
        raise TargetError(
            f"{n_slices} slices of {'x'.join(map(str, dims))} is {total} chips; at most "
            f"{MAX_DEVICES} are planned"
        )
    name = f"{k.topology_prefix}:{'x'.join(map(str, dims))}"
    return TargetSpec(k, name, n_slices, 0, 0, total)


def describe_spec(spec: TargetSpec, *, hosts: int | None = None) -> str:
    """One line for people: ``64 × H100 SXM (8 hosts × 8, NVLink within a host, InfiniBand
    across)`` or ``128 × TPU v5p (slice 4x4x8, 32 hosts, ICI within a slice)``."""
    k = spec.kind
    n = spec.device_count
    if k.platform == "cuda":
        if spec.hosts == 1:
            return f"{n} × {k.label} (one host, {k.within})"
        return f"{n} × {k.label} ({spec.hosts} hosts × {spec.per_host}, {k.within}, {k.across})"
    shape = spec.topology.split(":", 1)[1]
    host_text = f", {hosts} hosts" if hosts else ""
    if spec.slices == 1:
        return f"{n} × {k.label} (slice {shape}{host_text}, {k.within})"
    return f"{n} × {k.label} ({spec.slices} slices of {shape}{host_text}, {k.within}, {k.across})"
