"""Fidelity of the cost model: predicted vs compiled communication, per collective kind.

For fully specified layouts (``FidelityLayout``: every intermediate constrained with
``with_sharding_constraint``, gradients and optimizer updates too) on three small models
(``shardlab.examples.mlp_layer``, ``gpt_layer``, ``conv_layer``), ``shardlab.predict`` (no
compilation) is compared with ``shardlab.analyze`` (the compiled HLO).

Run: ``make bench`` or ``python -m benchmarks.fidelity``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shardlab.examples import Case, Shard, conv_layer, gpt_layer, mlp_layer
from shardlab.parallel.compiled.analyze import analyze
from shardlab.parallel.cost.predict import predict
from shardlab.parallel.mesh import mesh as make_mesh
from shardlab.parallel.records import COLLECTIVE_KINDS


@dataclasses.dataclass(frozen=True)
class FidelityLayout:
    """A fully specified layout of one benchmark case, by the axes each kind of parallelism
    uses.

    Attributes:
        name: short label (the table's ``strategy`` column).
        batch: mesh axes the batch dimension is split over (data parallel).
        model: the mesh axis of Megatron tensor parallelism (``None``: none).
        zero: shard the optimizer state (and gradients) over the ``batch`` axes.
    """

    name: str
    batch: tuple[str, ...] = ()
    model: str | None = None
    zero: bool = False


class _Shardings:
    """One layout on one mesh: logical axes (``"batch"``, ``"model"``) to mesh specs, and the
    sharding hook (``shardlab.examples.Shard``) that constrains every intermediate."""

    def __init__(self, mesh: Mesh, layout: FidelityLayout) -> None:
        self.mesh, self.layout = mesh, layout
        batch = layout.batch if len(layout.batch) != 1 else layout.batch[0]
        self.axes: dict[str | None, Any] = {
            None: None,
            "batch": batch or None,
            "model": layout.model,
        }

    def spec(self, *axes: str | None) -> P:
        """The mesh spec of logical axes."""
        return P(*(self.axes[a] for a in axes))

    def constrain(self, x: jax.Array, spec: P) -> jax.Array:
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, P(*spec)))

    def __call__(self, x: jax.Array, *axes: str | None) -> jax.Array:
        return self.constrain(x, self.spec(*axes))

    def zero_spec(self, shape: tuple[int, ...], spec: P) -> P:
        """The optimizer-state spec: ``spec`` plus the batch axes on the first free dim."""
        if not self.layout.zero or not self.layout.batch:
            return spec
        n = math.prod(self.mesh.shape[a] for a in self.layout.batch)
        entries = list(spec) + [None] * (len(shape) - len(spec))
        for i, (d, e) in enumerate(zip(shape, entries, strict=True)):
            if e is None and d % n == 0:
                entries[i] = self.axes["batch"]
                return P(*entries)
        return spec


# The models (shardlab.examples), with the logical axes of their parameters (Megatron: the
# first weight of a pair split by columns, the second by rows) and of their batch.
MODELS: dict[str, Callable[[Shard], Case]] = {
    "mlp": mlp_layer,
    "gpt-layer": gpt_layer,
    "conv": conv_layer,
}
_COLUMNS, _ROWS = (None, "model"), ("model", None)
PARAM_AXES: dict[str, dict[str, tuple[str | None, ...]]] = {
    "mlp": {"w1": _COLUMNS, "w2": _ROWS},
    "gpt-layer": {
        "ln1_g": (),
        "ln1_b": (),
        "ln2_g": (),
        "ln2_b": (),
        "wq": _COLUMNS,
        "wk": _COLUMNS,
        "wv": _COLUMNS,
        "wo": _ROWS,
        "w1": _COLUMNS,
        "w2": _ROWS,
    },
    "conv": {"k1": (None, None, None, "model"), "k2": (None, None, "model", None), "dense": ()},
}
BATCH_AXES: dict[str, tuple[tuple[str | None, ...], ...]] = {
    "mlp": (("batch", None), ("batch", None)),
    "gpt-layer": (("batch", None, None), ("batch", None, None)),
    "conv": (("batch", None, None, None), ("batch", None)),
}


def sharded_model(model: str, mesh: Mesh, layout: FidelityLayout) -> tuple[Any, ...]:
    """One model under one layout: ``(params, specs, batch, batch_specs, loss)``, where
    ``loss(params, batch)`` constrains every intermediate.

    Args:
        model: a key of ``MODELS``.
        mesh: the mesh.
        layout: the layout.

    Returns:
        Parameters and their specs, the batch and its specs, the constrained loss.
    """
    return _sharded(model, _Shardings(mesh, layout))


def _sharded(model: str, shardings: _Shardings) -> tuple[Any, ...]:
    case = MODELS[model](shardings)
    params, batch = case.args
    specs = {k: shardings.spec(*axes) for k, axes in PARAM_AXES[model].items()}
    batch_specs = tuple(shardings.spec(*axes) for axes in BATCH_AXES[model])
    return params, specs, batch, batch_specs, case.fn


def train_case(model: str, mesh: Mesh, layout: FidelityLayout) -> tuple[Any, Any, Any]:
    """``(step, args, in_specs)`` of one SGD-with-momentum train step, fully constrained.

    Args:
        model: a key of ``MODELS``.
        mesh: the mesh.
        layout: the layout (ZeRO shards gradients and momentum over the batch axes).

    Returns:
        ``step(params, momentum, batch) -> (loss, params, momentum)``, its arguments and
        their specs.
    """
    shardings = _Shardings(mesh, layout)
    params, specs, batch, batch_specs, loss = _sharded(model, shardings)
    state_specs = {k: shardings.zero_spec(v.shape, specs[k]) for k, v in params.items()}
    momentum = jax.tree.map(jnp.zeros_like, params)
    c = shardings.constrain

    def step(params, momentum, batch):
        value, grads = jax.value_and_grad(loss)(params, batch)
        grads = {k: c(g, state_specs[k]) for k, g in grads.items()}
        new_m = {k: c(0.9 * momentum[k] + grads[k], state_specs[k]) for k in grads}
        new_p = {k: c(params[k] - 0.01 * new_m[k], specs[k]) for k in params}
        return value, new_p, new_m

    args = (params, momentum, batch)
    return step, args, (specs, state_specs, batch_specs)


MESHES: dict[tuple[int, ...], tuple[str, ...]] = {
    (8,): ("data",),
    (2, 4): ("data", "model"),
    (4, 2): ("data", "model"),
}


def layouts_for(shape: tuple[int, ...]) -> list[FidelityLayout]:
    """The layouts compared on a mesh of this shape."""
    if len(shape) == 1:
        return [
            FidelityLayout("dp", batch=("data",)),
            FidelityLayout("megatron", model="data"),
            FidelityLayout("zero", batch=("data",), zero=True),
        ]
    return [
        FidelityLayout("dp", batch=("data", "model")),
        FidelityLayout("dp+megatron", batch=("data",), model="model"),
        FidelityLayout("zero+megatron", batch=("data",), model="model", zero=True),
    ]


@dataclasses.dataclass(frozen=True)
class FidelityRow:
    """One (case, mesh, layout, kind) comparison."""

    case: str
    mesh: tuple[int, ...]
    layout: str
    kind: str
    predicted: float
    actual: float
    predicted_argument_bytes: int
    actual_argument_bytes: int

    @property
    def ratio(self) -> float:
        if self.actual == 0:
            return 1.0 if self.predicted == 0 else math.inf
        return self.predicted / self.actual


def compare(model: str, shape: tuple[int, ...], layout: FidelityLayout) -> list[FidelityRow]:
    """Predict and compile one case; one row per collective kind that either side has."""
    mesh = make_mesh(shape=shape, names=MESHES[shape])
    step, args, specs = train_case(model, mesh, layout)
    pred = predict(step, *args, mesh=mesh, in_shardings=specs)
    rep = analyze(step, *args, mesh=mesh, in_shardings=specs)
    rows = []
    for kind in COLLECTIVE_KINDS:
        p, a = pred.comm_bytes[kind], rep.comm_bytes[kind]
        if p or a:
            rows.append(
                FidelityRow(
                    model,
                    shape,
                    layout.name,
                    kind,
                    p,
                    a,
                    pred.memory.parameters,
                    rep.memory.argument,
                )
            )
    if not rows:
        rows.append(
            FidelityRow(
                model,
                shape,
                layout.name,
                "(none)",
                0.0,
                0.0,
                pred.memory.parameters,
                rep.memory.argument,
            )
        )
    return rows


def all_cases() -> list[tuple[str, tuple[int, ...], FidelityLayout]]:
    """Every (model, mesh shape, layout) of the benchmark."""
    return [(m, s, lay) for m in MODELS for s in MESHES for lay in layouts_for(s)]


def run() -> str:
    """The markdown section for docs/benchmarks.md."""
    start = time.perf_counter()
    rows = [r for case in all_cases() for r in compare(*case)]
    within = sum(1 for r in rows if abs(r.ratio - 1) <= 0.05)
    args_exact = sum(1 for r in rows if r.predicted_argument_bytes == r.actual_argument_bytes)
    lines = [
        "## Cost-model fidelity: predicted vs compiled communication",
        "",
        "Command: `make bench` (or `python -m benchmarks.fidelity`), on 8 simulated CPU "
        "devices. Bytes are per device, on the wire (ring model), summed per collective kind; "
        "`predicted` is `shardlab.predict` (no compilation), `actual` is `shardlab.analyze` "
        "(the compiled HLO). Every intermediate, gradient and update is constrained with "
        "`with_sharding_constraint`.",
        "",
        f"{within}/{len(rows)} rows within 5%; per-device argument bytes exact in "
        f"{args_exact}/{len(rows)} rows; {time.perf_counter() - start:.0f} s.",
        "",
        "| case | mesh | strategy | kind | predicted bytes | actual bytes | ratio | "
        "args predicted | args actual |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.case} | {r.mesh} | {r.layout} | {r.kind} | {r.predicted:,.0f} | "
            f"{r.actual:,.0f} | {r.ratio:.3f} | {r.predicted_argument_bytes:,} | "
            f"{r.actual_argument_bytes:,} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import os

    if "JAX_NUM_CPU_DEVICES" not in os.environ:
        jax.config.update("jax_num_cpu_devices", 8)
    print(run())
