"""Every call of the targets workflow, on every size issue 33 lists.

For each target (``h100`` with 1, 2, 8 and 32 hosts, ``a100`` with 4, ``tpu-v5e`` 2x4, 8x8
and 16x16, ``tpu-v5p`` 4x4x4 and 8x8x8), a bf16 MLP train step over a data × model mesh, on
abstract arguments (``jax.ShapeDtypeStruct``) and, where it says so, on arrays:

``mesh`` · ``analyze`` (shapes and arrays: equal reports) · ``predict`` · ``search`` (its
plan compiled by the target's compiler; shapes and arrays: the same plan) ·
``strategies.zero`` · ``commgraph`` · ``show`` · ``editor`` (its background compile) ·
``timeline`` · ``explore`` · ``plan.to_code()`` (it must compile as Python) ·
``to_json``/``load`` (round trip) · ``plan.jit()`` (must refuse, naming the alternative).

A row is ✓ when every call returned what it should; a failing call is named with its error.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

TARGETS: tuple[tuple[str, dict[str, Any], int], ...] = (
    ("h100", {"hosts": 1}, 8),
    ("h100", {"hosts": 2}, 8),
    ("h100", {"hosts": 8}, 8),
    ("h100", {"hosts": 32}, 8),
    ("a100", {"hosts": 4}, 8),
    ("tpu-v5e", {"topology": "2x4"}, 4),
    ("tpu-v5e", {"topology": "8x8"}, 8),
    ("tpu-v5e", {"topology": "16x16"}, 16),
    ("tpu-v5p", {"topology": "4x4x4"}, 8),
    ("tpu-v5p", {"topology": "8x8x8"}, 8),
)


def _mlp(batch: int) -> tuple[Callable[..., Any], dict[str, Any], Any]:
    params = {
        "w1": jax.ShapeDtypeStruct((512, 2048), jnp.bfloat16),
        "w2": jax.ShapeDtypeStruct((2048, 512), jnp.bfloat16),
    }
    x = jax.ShapeDtypeStruct((batch, 512), jnp.bfloat16)

    def step(p, x):
        loss, g = jax.value_and_grad(lambda p: jnp.mean(jnp.tanh(x @ p["w1"]) @ p["w2"]))(p)
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, g), loss

    return step, params, x


def _arrays(tree: Any) -> Any:
    return jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), tree)


def calls(kind: str, kwargs: dict[str, Any], model: int) -> tuple[list[tuple[str, str]], float]:
    """(call, "" or what went wrong) for every call on one target, and the seconds taken."""
    import shardlab
    from shardlab.parallel.plan.plan import Plan
    from shardlab.parallel.targets.target import TargetRunError

    done: list[tuple[str, str]] = []
    start = time.perf_counter()
    state: dict[str, Any] = {}

    def check(name: str, call: Callable[[], Any]) -> None:
        try:
            problem = call()
        except Exception as error:  # recorded in the table, the next call still runs
            tail = traceback.format_exception_only(type(error), error)[-1].strip()
            problem = tail[:160]
        done.append((name, problem or ""))

    t = shardlab.target(kind, **kwargs)
    data = t.device_count // model
    mesh = shardlab.mesh(data=data, model=model, devices=t)
    step, params, x = _mlp(batch=max(64, 4 * data))
    specs = ({"w1": P(None, "model"), "w2": P("model", None)}, P("data", None))
    real = _arrays((params, x))

    def analyze() -> str:
        a = shardlab.analyze(step, params, x, mesh=mesh, in_shardings=specs)
        b = shardlab.analyze(step, *real, mesh=mesh, in_shardings=specs)
        if a.collectives != b.collectives or a.memory != b.memory:
            return "arrays and shapes compiled differently"
        return "" if a.collectives and a.flops > 0 else "no collectives or no flops"

    def predict() -> str:
        cost = shardlab.predict(step, params, x, mesh=mesh, in_shardings=specs)
        return "" if cost.device == t.profile and cost.time > 0 else f"priced by {cost.device}"

    def search() -> str:
        plan = shardlab.search(step, params, x, mesh=mesh)
        # the same search (unconfirmed: compiling twice would double the time) on shapes
        # and on arrays
        shapes = shardlab.search(step, params, x, mesh=mesh, confirm=False)
        again = shardlab.search(step, *real, mesh=mesh, confirm=False)
        state["plan"] = plan
        if shapes.input_specs != again.input_specs:
            return "arrays and shapes gave different plans"
        report = plan.verify()
        return "" if report.memory.total > 0 else "plan did not compile"

    def zero() -> str:
        plan = shardlab.strategies.zero(step, params, x, mesh=mesh)
        return "" if plan.cost.device == t.profile else f"priced by {plan.cost.device}"

    def commgraph() -> str:
        view = shardlab.commgraph(step, params, x, mesh=mesh, in_shardings=specs)
        actual = getattr(view, "actual", None)  # the compiled report
        return "" if actual is not None and actual.collectives else "nothing compiled"

    def show() -> str:
        html = shardlab.show((4096, 2048), P("data", "model"), mesh=mesh).html()
        return "" if t.label in html else "no placement note"

    def editor() -> str:
        ed = shardlab.editor(step, params, x, mesh=mesh, compile=False)
        ed.model.set_all([P(None, "model"), P("model", None), P("data", None)])
        results: list[Any] = []
        ed.model.compile(results.append).join(600)
        if not results or results[0].error:
            return results[0].error if results else "no compile result"
        return ""

    def timeline() -> str:
        text = shardlab.timeline(state["plan"]).text()
        return "" if "nothing measured" in text and t.profile in text else text[:160]

    def explore() -> str:
        found = shardlab.explore(step, params, x, mesh=mesh)
        return "" if len(found.candidates) >= 2 else "fewer than two strategies"

    def to_code() -> str:
        code = state["plan"].to_code()
        compile(code, "<plan.to_code()>", "exec")
        return "" if "planned for" in code else "no placement comment"

    def json_round_trip() -> str:
        plan = state["plan"]
        loaded = Plan.from_json(plan.to_json())
        return "" if loaded.input_specs == plan.input_specs else "specs changed"

    def refuses() -> str:
        try:
            state["plan"].jit()(*real)
        except TargetRunError as error:
            return "" if "plan.to_code()" in str(error) else str(error)[:160]
        return "ran on abstract devices"

    for name, call in (
        ("analyze", analyze),
        ("predict", predict),
        ("search", search),
        ("strategies.zero", zero),
        ("commgraph", commgraph),
        ("show", show),
        ("editor", editor),
        ("timeline", timeline),
        ("explore", explore),
        ("to_code", to_code),
        ("to_json", json_round_trip),
        ("jit refuses", refuses),
    ):
        if name in ("timeline", "to_code", "to_json", "jit refuses") and "plan" not in state:
            done.append((name, "no plan (search failed)"))
            continue
        check(name, call)
    return done, time.perf_counter() - start


def run() -> str:
    import shardlab

    lines = [
        "## Targets: every call on every size",
        "",
        "A bf16 MLP train step (512 → 2048 → 512, returning the new parameters and the loss) over data × model on each target, on "
        "abstract arguments and on arrays: `analyze` (arrays and shapes give equal reports), "
        "`predict`, `search` (compiled by the target's compiler; arrays and shapes give the "
        "same plan), `strategies.zero`, `commgraph`, `show`, `editor` (background compile), "
        "`timeline` (the model's; nothing measured), `explore`, `plan.to_code()` (compiles "
        "as Python), `to_json`/`from_json`, and `plan.jit()` refusing to run.",
        "",
        "| target | mesh | calls ✓ | seconds (all calls) | failed |",
        "|---|---|---|---|---|",
    ]
    for kind, kwargs, model in TARGETS:
        jax.clear_caches()
        t = shardlab.target(kind, **kwargs)
        done, seconds = calls(kind, kwargs, model)
        ok = sum(1 for _, problem in done if not problem)
        failed = "; ".join(f"{n}: {p}" for n, p in done if p) or "—"
        lines.append(
            f"| {t.description} | data={t.device_count // model} × model={model} | "
            f"{ok}/{len(done)} | {seconds:.1f} | {failed} |"
        )
    return "\n".join(lines)
