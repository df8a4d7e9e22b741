"""shardlab: an interactive workbench for parallel JAX.

The public API; everything else is private to its package. Importing ``shardlab`` does not
import IPython or widget libraries (the kernel parts load on demand), nor JAX: each name
below loads on first use (PEP 562) with just the module defining it, so that
``python -m shardlab --help`` and the kernel launcher (which pins devices before JAX starts)
stay fast, and ``shardlab.mesh`` or ``shardlab.search`` load no view library (a record's
view loads when it is first displayed, ``_core/views.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shardlab._core.platforms import prefer_cpu_without_accelerators
from shardlab._version import __version__ as __version__

# With the target compilers installed and no GPU or TPU here, JAX stays on the CPU instead of
# trying (noisily) to start a CUDA or TPU backend (``_core/platforms.py``).
prefer_cpu_without_accelerators()

if TYPE_CHECKING:  # the same names for type checkers (``X as X``: re-exported)
    from shardlab import data as data
    from shardlab import examples as examples
    from shardlab import strategies as strategies
    from shardlab.engine.cells.staging import GraphCache as GraphCache
    from shardlab.engine.cells.staging import GraphStagingError as GraphStagingError
    from shardlab.engine.compare.bisect import BisectReport as BisectReport
    from shardlab.engine.compare.bisect import bisect as bisect
    from shardlab.engine.compare.numerics import Tolerance as Tolerance
    from shardlab.engine.compare.run import CompareReport as CompareReport
    from shardlab.engine.compare.run import compare as compare
    from shardlab.engine.convert.api import ControlFlowError as ControlFlowError
    from shardlab.engine.convert.api import converted as converted
    from shardlab.engine.convert.api import to_static as to_static
    from shardlab.engine.modes import ModeError as ModeError
    from shardlab.engine.resources.devices import DeviceSpecError as DeviceSpecError
    from shardlab.engine.resources.live_memory import ReleaseReport as ReleaseReport
    from shardlab.engine.resources.switch import SwitchReport as SwitchReport
    from shardlab.kernel.release import release as release
    from shardlab.parallel.compiled.analyze import analyze as analyze
    from shardlab.parallel.cost.calibrate import calibrate as calibrate
    from shardlab.parallel.cost.predict import predict as predict
    from shardlab.parallel.cost.profile_file import load_profile as load_profile
    from shardlab.parallel.cost.profiles import DEVICE_PROFILES as DEVICE_PROFILES
    from shardlab.parallel.cost.profiles import DeviceProfile as DeviceProfile
    from shardlab.parallel.errors import SearchError as SearchError
    from shardlab.parallel.mesh import mesh as mesh
    from shardlab.parallel.plan.pipeline import with_pipeline as with_pipeline
    from shardlab.parallel.plan.plan import Plan as Plan
    from shardlab.parallel.plan.remat import with_remat as with_remat
    from shardlab.parallel.records import Collective as Collective
    from shardlab.parallel.records import CostBreakdown as CostBreakdown
    from shardlab.parallel.records import Layout as Layout
    from shardlab.parallel.records import MemoryBreakdown as MemoryBreakdown
    from shardlab.parallel.records import PipelineSpec as PipelineSpec
    from shardlab.parallel.records import PlanRow as PlanRow
    from shardlab.parallel.records import RematSpec as RematSpec
    from shardlab.parallel.records import Report as Report
    from shardlab.parallel.search.auto import confirm_plan as confirm  # noqa: F401 (in __all__)
    from shardlab.parallel.search.driver import search as search
    from shardlab.parallel.specs import ShardingSpecError as ShardingSpecError
    from shardlab.parallel.targets.catalog import TargetError as TargetError
    from shardlab.parallel.targets.target import Target as Target
    from shardlab.parallel.targets.target import target as target
    from shardlab.widgets.commgraph import commgraph as commgraph
    from shardlab.widgets.editor.widget import editor as editor
    from shardlab.widgets.explore.bokeh import explore as explore
    from shardlab.widgets.layout import show as show
    from shardlab.widgets.memory.panel import memory as memory
    from shardlab.widgets.timeline.pipeline import pipeline_timeline as pipeline_timeline
    from shardlab.widgets.timeline.svg import timeline as timeline
    from shardlab.widgets.watch import watch as watch

# The public face, once: name -> "module" or "module:attribute" (the module defining it).
# ``__all__`` is this table's names; the ``TYPE_CHECKING`` imports above are the same names
# for type checkers, and tests/core/test_architecture.py checks that the two agree.
_PUBLIC: dict[str, str] = {
    "data": "shardlab.data",
    "examples": "shardlab.examples",
    "strategies": "shardlab.strategies",
    "GraphCache": "shardlab.engine.cells.staging:GraphCache",
    "GraphStagingError": "shardlab.engine.cells.staging:GraphStagingError",
    "ModeError": "shardlab.engine.modes:ModeError",
    "ReleaseReport": "shardlab.engine.resources.live_memory:ReleaseReport",
    "compare": "shardlab.engine.compare.run:compare",
    "CompareReport": "shardlab.engine.compare.run:CompareReport",
    "bisect": "shardlab.engine.compare.bisect:bisect",
    "BisectReport": "shardlab.engine.compare.bisect:BisectReport",
    "Tolerance": "shardlab.engine.compare.numerics:Tolerance",
    "ControlFlowError": "shardlab.engine.convert.api:ControlFlowError",
    "converted": "shardlab.engine.convert.api:converted",
    "to_static": "shardlab.engine.convert.api:to_static",
    "DeviceSpecError": "shardlab.engine.resources.devices:DeviceSpecError",
    "SwitchReport": "shardlab.engine.resources.switch:SwitchReport",
    "release": "shardlab.kernel.release:release",
    "DEVICE_PROFILES": "shardlab.parallel.cost.profiles:DEVICE_PROFILES",
    "DeviceProfile": "shardlab.parallel.cost.profiles:DeviceProfile",
    "Collective": "shardlab.parallel.records:Collective",
    "CostBreakdown": "shardlab.parallel.records:CostBreakdown",
    "Layout": "shardlab.parallel.records:Layout",
    "MemoryBreakdown": "shardlab.parallel.records:MemoryBreakdown",
    "Report": "shardlab.parallel.records:Report",
    "PlanRow": "shardlab.parallel.records:PlanRow",
    "PipelineSpec": "shardlab.parallel.records:PipelineSpec",
    "RematSpec": "shardlab.parallel.records:RematSpec",
    "ShardingSpecError": "shardlab.parallel.specs:ShardingSpecError",
    "analyze": "shardlab.parallel.compiled.analyze:analyze",
    "mesh": "shardlab.parallel.mesh:mesh",
    "target": "shardlab.parallel.targets.target:target",
    "Target": "shardlab.parallel.targets.target:Target",
    "TargetError": "shardlab.parallel.targets.catalog:TargetError",
    "predict": "shardlab.parallel.cost.predict:predict",
    "calibrate": "shardlab.parallel.cost.calibrate:calibrate",
    "load_profile": "shardlab.parallel.cost.profile_file:load_profile",
    "SearchError": "shardlab.parallel.errors:SearchError",
    "Plan": "shardlab.parallel.plan.plan:Plan",
    "with_pipeline": "shardlab.parallel.plan.pipeline:with_pipeline",
    "with_remat": "shardlab.parallel.plan.remat:with_remat",
    "search": "shardlab.parallel.search.driver:search",
    "confirm": "shardlab.parallel.search.auto:confirm_plan",
    "commgraph": "shardlab.widgets.commgraph:commgraph",
    "editor": "shardlab.widgets.editor.widget:editor",
    "explore": "shardlab.widgets.explore.bokeh:explore",
    "memory": "shardlab.widgets.memory.panel:memory",
    "pipeline_timeline": "shardlab.widgets.timeline.pipeline:pipeline_timeline",
    "show": "shardlab.widgets.layout:show",
    "timeline": "shardlab.widgets.timeline.svg:timeline",
    "watch": "shardlab.widgets.watch:watch",
}


def __getattr__(name: str) -> Any:
    """Loads a public name on first use: just the module that defines it (PEP 562)."""
    target = _PUBLIC.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attr = target.partition(":")
    loaded = importlib.import_module(module)
    value = getattr(loaded, attr) if attr else loaded
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# (pyright reads names from a literal list only; the TYPE_CHECKING imports give them)
__all__ = sorted(  # pyright: ignore[reportUnsupportedDunderAll]
    [*_PUBLIC, "__version__", "load_ipython_extension", "unload_ipython_extension"]
)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext shardlab``: modes, magics and hooks in a stock IPython kernel.

    Device pinning must happen before JAX starts; if JAX is already running, ``%devices``
    explains the options (an in-process CPU switch, or a pinned kernelspec).
    """
    from shardlab.kernel.register import register

    register(ipython)
    print(_pinning_note())


def _pinning_note() -> str:
    """What ``%load_ext`` can and cannot do about devices in an already running kernel."""
    from jax._src import xla_bridge

    note = "shardlab loaded: %mode, %%eager/%%jit/%%graph, %release, %devices."
    if getattr(xla_bridge, "_backends", None):
        import jax

        note += (
            f" JAX is already running on {len(jax.devices())} {jax.devices()[0].platform} "
            "device(s): pinning devices happens before JAX starts, so here it is too late. "
            "Use a shardlab kernel (python -m shardlab install --devices cpu:8 | gpu:0,1) "
            "or switch the CPU device count in-process with %devices cpu:N."
        )
    return note


def unload_ipython_extension(ipython: Any) -> None:
    from shardlab.kernel.register import unregister

    unregister(ipython)
