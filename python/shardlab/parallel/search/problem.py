"""The currency of one search: ``Problem`` (the traced function, the mesh, the device
profile, the compiled reports), built once by ``search()`` (``driver.py``) and read by every
step — the solvers' space, the budget's seeds, the mixes, the stages, the confirmation."""

from __future__ import annotations

import dataclasses
import functools

from jax.sharding import Mesh

from shardlab.parallel.cost.compilers import held_graph
from shardlab.parallel.cost.profiles import DeviceProfile
from shardlab.parallel.errors import SearchError
from shardlab.parallel.graph.opgraph import OpGraph
from shardlab.parallel.graph.trace import Traced
from shardlab.parallel.mesh import mesh_shape_of
from shardlab.parallel.plan.plan import Plan
from shardlab.parallel.search.confirm import Reports
from shardlab.parallel.search.strategies.baselines import baselines, zero

__all__ = ["Problem"]


@dataclasses.dataclass(frozen=True)
class Problem:
    """What one search works on, built once in ``search()`` and passed to every step: the
    traced function (``graph/trace.py``: its graph, arguments and ties), the mesh, the device
    profile, and the compiled reports of the plans compiled so far (no plan twice).

    The baselines are made on the same trace once, when a step first asks for them."""

    traced: Traced
    mesh: Mesh
    profile: DeviceProfile
    reports: Reports = dataclasses.field(default_factory=Reports, compare=False)

    @functools.cached_property
    def sizes(self) -> dict[str, int]:
        """The mesh's axis sizes, ``{"data": 2, "model": 4}``."""
        return mesh_shape_of(self.mesh)

    @property
    def graph(self) -> OpGraph:
        """The traced graph with each value's bytes as the profile's compiler holds it
        (``compilers.held_graph``: XLA:CPU computes bfloat16 in float32)."""
        return held_graph(self.traced.graph, self.profile.compiler)

    @functools.cached_property
    def baselines(self) -> dict[str, Plan]:
        """The standard baselines on the same trace, made once per search (the portfolio,
        budget seeds and the compiled fallback all read them); ``{}`` for an argument
        structure they do not fit."""
        try:
            return baselines(
                self.traced.fn,
                *self.traced.args,
                mesh=self.mesh,
                device=self.profile,
                traced=self.traced,
            )
        except SearchError:  # unusual argument structure: no baselines
            return {}

    @functools.cached_property
    def budget_baselines(self) -> dict[str, Plan]:
        """The baselines and ZeRO-3 (parameters split too; with Megatron on the last axis
        of a 2-D mesh): what a memory budget mixes with remat (``mix.py``)."""
        out = dict(self.baselines)
        if not out:
            return out
        names = [str(a) for a in self.mesh.axis_names]
        kw = {"mesh": self.mesh, "device": self.profile, "traced": self.traced, "stage": 3}
        fn, args = self.traced.fn, self.traced.args
        try:
            out["zero3"] = zero(fn, *args, **kw)
            if len(names) > 1:
                out["zero3+megatron"] = zero(
                    fn, *args, axes=tuple(names[:-1]), model_axis=names[-1], **kw
                )
        except SearchError:  # ZeRO-3 does not fit this argument structure
            pass
        return out
