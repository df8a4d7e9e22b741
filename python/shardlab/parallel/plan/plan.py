"""``Plan``: a sharding strategy as a record, and what runs it.

A plan holds the layout of every input and output, the intermediate constraints it relies on
(``{node index: spec per output}`` and, where the model reshards an operand before an op,
``{node index: {operand: spec}}``), its predicted ``CostBreakdown`` and a table of what was
chosen per operation and what else was considered. ``jit()`` re-evaluates the traced
function equation by equation with those constraints (``graph/interpret.py``); ``verify()``
compiles it and reads the collectives. JSON round-trips are validated on load (``io.py``)
and never use pickle.
"""

from __future__ import annotations

import dataclasses
import json
import keyword
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from shardlab._core.views import view_for
from shardlab.parallel.arguments import abstract_args, place, split
from shardlab.parallel.compiled.analyze import analyze
from shardlab.parallel.cost import layouts as L
from shardlab.parallel.cost.profiles import comm_time
from shardlab.parallel.display import (
    PlanTable,
    function_name,
    html_of,
    human_bytes,
    human_time,
    mesh_text,
    progress_bar,
)
from shardlab.parallel.errors import SearchError
from shardlab.parallel.graph.interpret import ScanRunner
from shardlab.parallel.graph.trace import Traced, trace
from shardlab.parallel.labels import path_label, source_label
from shardlab.parallel.mesh import mesh_shape_of
from shardlab.parallel.plan.binding import Binding, checked_binding
from shardlab.parallel.plan.code import (
    TEMPLATE_NAMES,
    PlanCode,
    Spec,
    argument_names,
    literal,
    structural_lines,
    tree_of,
)
from shardlab.parallel.plan.io import (
    FORMAT,
    comment,
    mesh_code,
    parse_json,
    plan_fields,
    portable,
    short,
    spec_code,
)
from shardlab.parallel.plan.pipeline import pipeline_runners
from shardlab.parallel.plan.remat import remat_runners
from shardlab.parallel.plan.table import plan_table
from shardlab.parallel.records import (
    CostBreakdown,
    PipelineSpec,
    PlanRow,
    RematSpec,
    Report,
    _Record,
)
from shardlab.parallel.specs import make_spec
from shardlab.parallel.targets.target import placement_note, refuse_to_run


@dataclasses.dataclass(frozen=True)
class Plan(_Record):
    """A sharding strategy for one function, mesh and argument shapes.

    Attributes:
        method: ``propagate``, ``recursive``, ``ilp``, a baseline's name or ``hand`` (the
            editor's hand-specified plan).
        mesh_shape: ``{axis: size}``.
        input_paths: per flat argument leaf, its path (``params/w1``).
        input_shapes: per flat argument leaf, its shape.
        input_specs: per flat argument leaf, its layout (per-dimension mesh axes).
        output_shapes: per flat output leaf, its shape.
        output_specs: per flat output leaf, its layout.
        constraints: ``(node index, primitive, layout or None per output)`` the plan applies
            inside the function.
        operand_constraints: ``(node index, operand position, layout)``: reshards before ops.
        cost: the predicted ``CostBreakdown``.
        optimal: the ILP proved optimality (``None``: not an exact method).
        complete: False when the search was interrupted (the best plan found so far).
        search_time: seconds, tracing included.
        fingerprint: primitive/shape digest of the traced function (checked on ``bind``).
        rows: the table of decisions.
        notes: what the search did (which method ``auto`` used, budgets, warnings).
        memory_budget: the per-device budget the plan was made for (bytes), if any.
        pipeline: pipeline stages (``PipelineSpec``), or ``None``.
        remat: rematerialisation of the layer scans (``RematSpec``), or ``None``.
    """

    method: str
    mesh_shape: dict[str, int]
    input_paths: tuple[str, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    input_specs: tuple[L.DimAxes, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    output_specs: tuple[L.DimAxes, ...]
    constraints: tuple[tuple[int, str, tuple[L.DimAxes | None, ...]], ...]
    operand_constraints: tuple[tuple[int, int, L.DimAxes], ...]
    cost: CostBreakdown
    optimal: bool | None = None
    complete: bool = True
    search_time: float = 0.0
    fingerprint: str = ""
    rows: tuple[PlanRow, ...] = ()
    notes: tuple[str, ...] = ()
    memory_budget: int | None = None
    pipeline: PipelineSpec | None = None
    remat: RematSpec | None = None
    binding: Binding | None = dataclasses.field(default=None, repr=False, compare=False)
    # ``search(..., confirm="background")``: the confirmed plan, being compiled
    # (a ``concurrent.futures.Future``); ``confirmed()`` waits for it.
    confirmation: Any = dataclasses.field(default=None, repr=False, compare=False)
    # The report of a compile of this very program (its layouts, constraints, stages, remat
    # and binding), made while searching: ``verify()`` returns it instead of compiling again.
    compiled: tuple[Any, Any, Report] | None = dataclasses.field(
        default=None, repr=False, compare=False
    )

    @classmethod
    def of_binding(
        cls,
        binding: Binding,
        *,
        method: str,
        input_specs: Sequence[L.DimAxes],
        output_specs: Sequence[L.DimAxes],
        cost: CostBreakdown,
        constraints: tuple[tuple[int, str, tuple[L.DimAxes | None, ...]], ...] = (),
        operand_constraints: tuple[tuple[int, int, L.DimAxes], ...] = (),
        **fields: Any,
    ) -> Plan:
        """A plan for a bound function: the mesh, argument paths and shapes, output shapes
        and fingerprint come from the binding (searched and hand-specified plans alike)."""
        g = binding.graph
        return cls(
            method=method,
            mesh_shape=mesh_shape_of(binding.mesh),
            input_paths=binding.traced.paths,
            input_shapes=tuple(tuple(s) for s in binding.traced.input_shapes()),
            input_specs=tuple(input_specs),
            output_shapes=tuple(tuple(g.shapes[v]) for v in g.outputs),
            output_specs=tuple(output_specs),
            cost=cost,
            fingerprint=binding.traced.fingerprint,
            binding=binding,
            constraints=constraints,
            operand_constraints=operand_constraints,
            **fields,
        )

    # -- shardings -----------------------------------------------------------------------
    def _bound(self) -> Binding:
        if self.binding is None:
            raise SearchError(
                "this plan is not bound to a function (it was loaded from JSON): call "
                "plan.bind(fn, *args, mesh=mesh) first"
            )
        return self.binding

    @property
    def mesh(self) -> Mesh:
        return self._bound().mesh

    @property
    def in_shardings(self) -> Any:
        """Pytree of ``NamedSharding`` matching the arguments."""
        b = self._bound()
        leaves = [NamedSharding(b.mesh, make_spec(s)) for s in self.input_specs]
        return jax.tree_util.tree_unflatten(b.in_tree, leaves)

    @property
    def out_shardings(self) -> Any:
        """Pytree of ``NamedSharding`` matching the outputs."""
        b = self._bound()
        leaves = [NamedSharding(b.mesh, make_spec(s)) for s in self.output_specs]
        return jax.tree_util.tree_unflatten(b.out_tree, leaves)

    def intermediate_specs(self) -> dict[int, tuple[PartitionSpec | None, ...]]:
        """``{node index: spec per output}`` of the constraints inside the function."""
        return {
            i: tuple(None if s is None else make_spec(s) for s in specs)
            for i, _, specs in self.constraints
        }

    # -- running -------------------------------------------------------------------------
    def function(self, *, dynamic: bool = False) -> Callable[..., Any]:
        """The traced function re-evaluated with the plan's constraints (not jitted).

        It takes the arguments as given to the search (static leaves such as an activation
        function equal to the traced ones, or ``None``) and returns the whole output;
        ``dynamic``: it takes and returns the dynamic trees (static leaves ``None``,
        ``parallel/arguments.py``), what ``jax.jit`` takes.
        """
        ins: dict[int, dict[int, PartitionSpec]] = {}
        for node, pos, lay in self.operand_constraints:
            ins.setdefault(node, {})[pos] = make_spec(lay)
        b = self._bound()
        return b.constrained(
            self.intermediate_specs(), ins, dynamic=dynamic, runners=self._scan_runners(b)
        )

    def _scan_runners(self, b: Binding) -> dict[int, ScanRunner]:
        """How the plan runs its layer scans: pipelined over stages, with residuals
        recomputed, both (remat wraps the pipelined scan), or ``lax.scan`` (empty)."""
        runners: dict[int, ScanRunner] = {}
        if self.pipeline is not None:
            runners = pipeline_runners(b.graph, b.mesh, self.pipeline)
        if self.remat is not None and self.remat.policy != "none":
            runners = remat_runners(b.graph, self.remat, base=runners)
        return runners

    def show(self) -> Any:
        """The plan's communication graph: predicted (this plan's cost) beside compiled.

        Rendered by ``shardlab.widgets``, loaded on first use (``_core/views.py``); the
        parallel core itself never imports a view library.
        """
        viewer = view_for("plan")
        if viewer is None:
            raise RuntimeError(
                "plan.show() needs the views (ipywidgets, bokeh): pip install shardlab"
            )
        return viewer(self)

    def jit(self, **jit_kwargs: Any) -> PlannedJit:
        """``jax.jit`` of the function with the plan's in/out shardings and constraints.

        The returned function takes the arguments as the user passes them, in any layout:
        an array placed otherwise than the plan's ``in_shardings`` (another spec or mesh,
        one device) is moved there first (``jax.device_put``; one already there is not
        touched, and under an outer ``jax.jit`` or trace the arguments pass through).
        Static leaves (an equinox module's activation functions) must equal the traced
        ones; the output comes back whole, static leaves included. ``.lower(*args)`` lowers
        it on the arguments' shapes. ``plan.shard(*args)`` places the arguments once (a
        training loop then moves nothing per step).
        """
        kwargs = {"in_shardings": self.in_shardings, "out_shardings": self.out_shardings}
        own = "in_shardings" not in jit_kwargs
        kwargs.update(jit_kwargs)
        b = self._bound()
        jitted = jax.jit(self.function(dynamic=True), **kwargs)
        shardings = self._in_sharding_leaves() if own else None
        return PlannedJit(jitted, b.traced, shardings, mesh=b.mesh)

    def shard(self, *args: Any) -> tuple[Any, ...]:
        """The arguments placed as the plan wants, to place them once before a loop.

        Every array leaf not already on its ``in_shardings`` entry is moved there
        (``jax.device_put``; a tracer is passed through); static leaves and Python numbers
        are returned as they are. Returns a tuple of the same pytrees, one per argument::

            step = plan.jit()
            params, opt_state, batch = plan.shard(params, opt_state, batch)
            for _ in range(steps):
                params, opt_state, loss = step(params, opt_state, batch)

        Raises:
            TypeError: the arguments have another structure than the plan's.
            ArgumentError: a static leaf differs from the one the plan was made for.
        """
        refuse_to_run(self.mesh, "plan.shard(...) (placing arrays on the plan's devices)")
        traced = self._bound().traced
        parts = traced.arguments or split(traced.args, check=False)
        args = tuple(args)
        dynamic = parts.dynamic(args)
        leaves = jax.tree_util.tree_leaves(dynamic)
        placed = [place(x, s) for x, s in zip(leaves, self._in_sharding_leaves(), strict=True)]
        if jax.tree_util.tree_structure(args) == parts.treedef:
            return tuple(parts.with_traced(placed))
        return tuple(jax.tree_util.tree_unflatten(parts.dynamic_treedef, placed))

    def _in_sharding_leaves(self) -> list[NamedSharding]:
        b = self._bound()
        return [NamedSharding(b.mesh, make_spec(s)) for s in self.input_specs]

    def program_key(self) -> Any:
        """What decides the compiled program besides the function, arguments and mesh it is
        bound to: the layouts, the constraints, the stages and remat."""
        return (
            self.input_specs,
            self.output_specs,
            self.constraints,
            self.operand_constraints,
            self.pipeline,
            self.remat,
        )

    def with_compiled(self, report: Report) -> Plan:
        """This plan carrying ``report``, a compile of exactly this program (these layouts,
        bound to this binding)."""
        return dataclasses.replace(self, compiled=(self.program_key(), self.binding, report))

    def verify(self) -> Report:
        """Compile the plan and read the actual collectives and per-device memory (on the
        arguments' shapes: what the example arguments were placed on does not matter).

        A plan that ``search`` already compiled (to confirm its choice or check the memory
        budget) returns that compile's report: the same program, compiled once."""
        b = self._bound()
        if self.compiled is not None:
            key, binding, report = self.compiled
            if binding is b and key == self.program_key():
                return report
        with progress_bar("verify") as bar:  # shown after about a second of compiling
            bar(0.1, f"compiling the plan on {mesh_text(self.mesh_shape)}")
            report = analyze(
                self.function(dynamic=True),
                *b.traced.dynamic_args,
                mesh=b.mesh,
                in_shardings=self.in_shardings,
                out_shardings=self.out_shardings,
            )
            bar(1.0, "compiled")
            bar.done(f"compiled: {len(report.collectives)} collectives")
        return report

    # -- views ---------------------------------------------------------------------------
    @property
    def input_labels(self) -> tuple[str, ...]:
        """Per flat argument leaf, its path as the user indexes it
        (``params["blocks"][3]["w1"]``, ``batch[0]``): the labels every view uses."""
        return tuple(path_label(p) for p in self.input_paths)

    def optimality(self) -> str:
        """In words: proved optimal, interrupted (best so far), or a heuristic's plan."""
        if not self.complete:
            return "interrupted: the best plan found so far"
        if self.optimal is True:
            return "optimal (proved by the ILP)"
        if self.optimal is False:
            return "not proved optimal (ILP stopped at its limit)"
        return "heuristic (not proved optimal)"

    def summary(self) -> str:
        """One line: method, mesh, predicted step time, communication, memory, optimality."""
        c = self.cost
        return (
            f"{self.method} on {mesh_text(self.mesh_shape)}: predicted {human_time(c.time)} "
            f"(compute {human_time(c.compute_time)}, {c.comm_words(human_time)}), "
            f"{human_bytes(c.total_comm_bytes)} on the wire, "
            f"{human_bytes(c.memory.peak)} per device; {self.optimality()}"
        )

    def __repr__(self) -> str:
        return (
            f"Plan({self.summary()}; {len(self.input_paths)} inputs, "
            f"{len(self.constraints)} constraints)"
        )

    def _repr_html_(self) -> str:
        return html_of("plan", self)

    def table(self, limit: int | None = 40) -> PlanTable:
        """Per operation: the chosen split, its cost, the alternatives considered and why a
        costlier one was taken, most expensive first; ops that only follow their operands
        folded per line; a plan made without a search lists its layouts and collectives
        (``plan/table.py``). Renders as an HTML table in a notebook, aligned text when
        printed."""
        return plan_table(self, limit)

    def to_code(self, *, name: str | None = None) -> PlanCode:
        """A complete snippet that jits the function with the plan's shardings, ready to
        paste.

        The function is called by the name the user gave it (a global of the notebook bound
        to the traced function), ``name`` if given, else ``fn`` with a comment saying so.
        Intermediate constraints the plan relies on are listed as comments by source line
        (``plan.jit()`` applies them).

        It runs in a fresh namespace: argument trees of dicts, lists, tuples and importable
        named tuples (optax states) are written out with their imports; trees of modules or
        states (equinox, flax nnx) take their structure from the arguments, bound by the
        function's parameter names (``plan/code.py``). The result is a ``str`` that a
        notebook shows as a code block.

        Nothing is copied into it unescaped (``io.py``): axis names are string literals or,
        as ``shardlab.mesh`` keywords, checked identifiers (else the dict form
        ``shardlab.mesh({'a b': 2})``); sizes are checked ints; the function's name is a
        checked identifier; the method, primitives and source lines appear only in comments,
        with line breaks and other unprintable characters escaped. That holds for any plan,
        loaded or built in memory.
        """
        in_leaves = [
            Spec(spec_code(s, f"input_specs[{i}]")) for i, s in enumerate(self.input_specs)
        ]
        out_leaves = [
            Spec(spec_code(s, f"output_specs[{i}]")) for i, s in enumerate(self.output_specs)
        ]
        fn_name = (
            name
            if name is not None
            else function_name(self.binding.traced.fn if self.binding is not None else None)
        )
        if fn_name is not None and not (
            fn_name.isascii() and fn_name.isidentifier() and not keyword.iskeyword(fn_name)
        ):
            raise SearchError(f"to_code(name=...): {short(fn_name)} is not a Python identifier")
        if fn_name in TEMPLATE_NAMES:
            fn_name = None
        imports: set[str] = set()
        if self.binding is not None:
            ins = literal(tree_of(self.binding.in_tree, in_leaves), imports)
            outs = literal(tree_of(self.binding.out_tree, out_leaves), imports)
        else:  # a loaded plan: the flat leaves
            ins, outs = literal(tuple(in_leaves), imports), literal(tuple(out_leaves), imports)
        if fn_name is not None and any(m.split(".")[0] == fn_name for m in imports):
            ins = outs = None  # ``import optax`` would shadow a function named optax
        structural = ins is None or outs is None
        statics = structural and self._has_statics()
        lines = [
            "# "
            + comment(
                f"shardlab plan ({self.method}): predicted {human_time(self.cost.time)}, "
                f"{human_bytes(self.cost.memory.peak)} per device"
            ),
            "import jax",
            *([] if structural else [f"import {m}" for m in sorted(imports)]),
            *(["import equinox as eqx"] if statics else []),
            "import shardlab",
            "from jax.sharding import NamedSharding, PartitionSpec as P",
            "",
            f"mesh = shardlab.mesh({mesh_code(self.mesh_shape)})",
            *self._placement_comment(),
            "",
            "",
        ]
        if fn_name is None:
            lines += [
                "# fn: the function this plan was made for. It was passed as an expression",
                "# (e.g. jax.grad(loss)) or is not a global, so bind it first: fn = ...",
            ]
        if structural:
            assert self.binding is not None  # a loaded plan's flat tuples are literals
            names = argument_names(self.binding.traced.fn, len(self.binding.args))
            lines += structural_lines(
                fn_name or "fn", names, in_leaves, out_leaves, statics=statics
            )
        else:
            lines += [
                "def _named(tree):",
                "    return jax.tree.map(",
                "        lambda s: NamedSharding(mesh, s), tree, is_leaf=lambda s: isinstance(s, P)",
                "    )",
                "",
                "",
                f"in_shardings = _named({ins})",
                f"out_shardings = _named({outs})",
                f"step = jax.jit({fn_name or 'fn'}, in_shardings=in_shardings, "
                "out_shardings=out_shardings)",
            ]
        lines += self._constraint_comments()
        return PlanCode("\n".join(lines) + "\n")

    def _has_statics(self) -> bool:
        """Whether the bound arguments or outputs hold static leaves (not arrays)."""
        traced = self.binding.traced if self.binding is not None else None
        parts = (getattr(traced, "arguments", None), getattr(traced, "outputs", None))
        return any(p is not None and p.has_statics for p in parts)

    def _placement_comment(self) -> list[str]:
        """For a plan made over a target: where its axes run there, which is where
        ``shardlab.mesh`` lays them on the cluster's own GPUs or TPUs (``parallel/mesh.py``)."""
        note = placement_note(self.binding.mesh) if self.binding is not None else ""
        if not note:
            return []
        return [
            "# " + comment(f"planned for {note}."),
            "# " + comment("On that machine shardlab.mesh lays the axes out the same way."),
        ]

    def _constraint_comments(self, limit: int = 8) -> list[str]:
        """The intermediate constraints, by the user's source line (no node numbers)."""
        if not (self.constraints or self.operand_constraints):
            return []
        where = {r.op_index: r.source for r in _index_rows(self)}
        grouped: dict[tuple[str, str, str], int] = {}
        for i, prim, specs in self.constraints:
            text = ", ".join("-" if s is None else spec_code(s, "constraint") for s in specs)
            key = (source_label(where.get(i, ""), missing="(no source line)"), prim, text)
            grouped[key] = grouped.get(key, 0) + 1
        for _, _, lay in self.operand_constraints:
            key = ("(before an operation)", "reshard", spec_code(lay, "operand constraint"))
            grouped[key] = grouped.get(key, 0) + 1
        total = len(self.constraints) + len(self.operand_constraints)
        lines = [
            "",
            f"# The plan also constrains {total} intermediate values inside the function;",
            "# plan.jit() applies them. By hand, at these lines:",
            "#   x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))",
        ]
        items = list(grouped.items())
        for (src, prim, text), n in items[:limit]:
            times = f" ×{n}" if n > 1 else ""
            lines.append("#   " + comment(f"{src} ({prim}{times}): {text}"))
        if len(items) > limit:
            lines.append(f"#   … and {len(items) - limit} more source lines")
        return lines

    def confirmed(self, timeout: float | None = None) -> Plan:
        """The plan confirmed on compiled programs, from ``search(..., confirm="background")``:
        waits (up to ``timeout`` seconds) for the compiles; the search's plan or a baseline
        that compiles faster, with the compiled comparison in its notes.

        Raises:
            SearchError: no confirmation is running for this plan (use
                ``shardlab.confirm(plan)``).
            TimeoutError: ``timeout`` passed first.
        """
        if self.confirmation is None:
            raise SearchError(
                "this plan is not being confirmed: shardlab.confirm(plan) compiles it and the "
                'baselines now, or search(..., confirm="background") does so in the background'
            )
        return self.confirmation.result(timeout=timeout)

    # -- records -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        # what is bound in this process (function, future, compiled report) is not the plan's
        unbound = dataclasses.replace(self, binding=None, confirmation=None, compiled=None)
        out = super(Plan, unbound).to_dict()
        for name in ("binding", "confirmation", "compiled"):
            out.pop(name, None)
        out["format"] = FORMAT
        out["cost"] = self.cost.to_dict()
        return out

    def to_json(self) -> str:
        """JSON text (``Plan.from_json`` reads it back, validated); source lines relative,
        without this machine's absolute paths."""
        return json.dumps(portable(self.to_dict()), indent=1, sort_keys=True)

    @classmethod
    def from_json(
        cls,
        text: str,
        *,
        fn: Callable[..., Any] | None = None,
        args: tuple[Any, ...] | None = None,
        mesh: Mesh | None = None,
    ) -> Plan:
        """Load a plan; with ``fn``, ``args`` and ``mesh`` it is bound and runnable.

        The text is validated field by field (``io.py``: strict types, finite non-negative
        costs, identifier axis names, bounded sizes and nesting) and never evaluated.

        Raises:
            SearchError: for every bad file (and only that error): malformed or oversized
                JSON, a wrong format, a field of the wrong type or range (the message names
                it), specs naming unknown mesh axes, specs that do not fit their shapes, or
                a mesh that differs from the plan's.
        """
        plan = cls(**plan_fields(parse_json(text)))
        if fn is not None:
            if args is None or mesh is None:
                raise SearchError("Plan.from_json(text, fn=..., args=(...), mesh=...): give all")
            plan = plan.bind(fn, *args, mesh=mesh)
        return plan

    def bind(self, fn: Callable[..., Any], *args: Any, mesh: Mesh) -> Plan:
        """This plan attached to ``fn`` and example ``args`` (traced again and checked)."""
        return self.bind_traced(trace(fn, *args), mesh)

    def bind_traced(self, traced: Traced, mesh: Mesh) -> Plan:
        """This plan attached to an already traced function (checked like ``bind``)."""
        binding = checked_binding(
            traced,
            mesh,
            mesh_shape=self.mesh_shape,
            input_shapes=self.input_shapes,
            fingerprint=self.fingerprint,
        )
        return dataclasses.replace(self, binding=binding)

    def compiled_comm_time(self, report: Report, device: Any = None) -> float:
        """Alpha-beta seconds of a compiled report's collectives (the target-1 metric)."""
        return comm_time(report.collectives, device or self.cost.device)


class PlannedJit:
    """What ``Plan.jit()`` returns: the jitted plan, taking arguments as the user passes
    them (any layout; static leaves equal to the traced ones) and returning the whole output.

    Attributes:
        jitted: the ``jax.jit`` function of the dynamic trees (static leaves ``None``).
    """

    def __init__(
        self,
        jitted: Any,
        traced: Traced,
        shardings: list[NamedSharding] | None,
        *,
        mesh: Mesh | None = None,
    ):
        self.jitted = jitted
        self._mesh = mesh
        self._arguments = traced.arguments or split(traced.args, check=False)
        self._outputs = traced.outputs
        self._shardings = shardings
        self.__name__ = getattr(traced.fn, "__name__", "planned")

    def _dynamic(self, args: tuple[Any, ...]) -> Any:
        dynamic = self._arguments.dynamic(args)
        if self._shardings is None:
            return dynamic
        leaves, tree = jax.tree_util.tree_flatten(dynamic)
        if len(leaves) != len(self._shardings):  # the interpreter names the mismatch
            return dynamic
        placed = [place(x, s) for x, s in zip(leaves, self._shardings, strict=True)]
        return jax.tree_util.tree_unflatten(tree, placed)

    def __call__(self, *args: Any) -> Any:
        if self._mesh is not None:
            refuse_to_run(self._mesh, "running a plan")
        out = self.jitted(*self._dynamic(args))
        return out if self._outputs is None else self._outputs.combine(out)

    def lower(self, *args: Any) -> Any:
        """``jax.jit(...).lower`` on the arguments' shapes (their placement is not read)."""
        return self.jitted.lower(*self._arguments.dynamic(abstract_args(tuple(args))))


@dataclasses.dataclass(frozen=True)
class _IndexRow:
    op_index: int
    source: str


def _index_rows(plan: Plan) -> list[_IndexRow]:
    if plan.binding is None:
        return []
    nodes = plan.binding.graph.nodes
    return [_IndexRow(i, nodes[i].source) for i, _, _ in plan.constraints if i < len(nodes)]
