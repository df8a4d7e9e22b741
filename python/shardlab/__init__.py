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

from ._version import __version__ as __version__

if TYPE_CHECKING:  # the same names for type checkers (``X as X``: re-exported)
    from . import data as data
    from . import examples as examples
    from . import strategies as strategies
    from .engine.bisect import BisectReport as BisectReport
    from .engine.bisect import bisect as bisect
    from .engine.compare import CompareReport as CompareReport
    from .engine.compare import compare as compare
    from .engine.convert import ControlFlowError as ControlFlowError
    from .engine.convert import converted as converted
    from .engine.convert import to_static as to_static
    from .engine.devices import DeviceSpecError as DeviceSpecError
    from .engine.devices import SwitchReport as SwitchReport
    from .engine.graph import GraphCache as GraphCache
    from .engine.graph import GraphStagingError as GraphStagingError
    from .engine.memory import ReleaseReport as ReleaseReport
    from .engine.modes import ModeError as ModeError
    from .engine.numerics import Tolerance as Tolerance
    from .kernel.release import release as release
    from .parallel.compiled.analyze import analyze as analyze
    from .parallel.cost.calibrate import calibrate as calibrate
    from .parallel.cost.calibrate import load_profile as load_profile
    from .parallel.cost.predict import predict as predict
    from .parallel.cost.profiles import DEVICE_PROFILES as DEVICE_PROFILES
    from .parallel.cost.profiles import DeviceProfile as DeviceProfile
    from .parallel.errors import SearchError as SearchError
    from .parallel.mesh import mesh as mesh
    from .parallel.plan.pipeline import with_pipeline as with_pipeline
    from .parallel.plan.plan import Plan as Plan
    from .parallel.plan.remat import with_remat as with_remat
    from .parallel.records import Collective as Collective
    from .parallel.records import CostBreakdown as CostBreakdown
    from .parallel.records import Layout as Layout
    from .parallel.records import MemoryBreakdown as MemoryBreakdown
    from .parallel.records import PipelineSpec as PipelineSpec
    from .parallel.records import PlanRow as PlanRow
    from .parallel.records import RematSpec as RematSpec
    from .parallel.records import Report as Report
    from .parallel.search.driver import confirm_plan as confirm  # noqa: F401 (in __all__)
    from .parallel.search.driver import search as search
    from .parallel.specs import ShardingSpecError as ShardingSpecError
    from .widgets.bokeh_explorer import explore as explore
    from .widgets.commgraph import commgraph as commgraph
    from .widgets.editor import editor as editor
    from .widgets.layout import show as show
    from .widgets.memory import memory as memory
    from .widgets.pipeline_view import pipeline_timeline as pipeline_timeline
    from .widgets.timeline import timeline as timeline
    from .widgets.watch import watch as watch

# The public face, once: name -> "module" or "module:attribute" (the module defining it).
# ``__all__`` is this table's names; the ``TYPE_CHECKING`` imports above are the same names
# for type checkers, and tests/test_architecture.py checks that the two agree.
_PUBLIC: dict[str, str] = {
    "data": ".data",
    "examples": ".examples",
    "strategies": ".strategies",
    "GraphCache": ".engine.graph:GraphCache",
    "GraphStagingError": ".engine.graph:GraphStagingError",
    "ModeError": ".engine.modes:ModeError",
    "ReleaseReport": ".engine.memory:ReleaseReport",
    "compare": ".engine.compare:compare",
    "CompareReport": ".engine.compare:CompareReport",
    "bisect": ".engine.bisect:bisect",
    "BisectReport": ".engine.bisect:BisectReport",
    "Tolerance": ".engine.numerics:Tolerance",
    "ControlFlowError": ".engine.convert:ControlFlowError",
    "converted": ".engine.convert:converted",
    "to_static": ".engine.convert:to_static",
    "DeviceSpecError": ".engine.devices:DeviceSpecError",
    "SwitchReport": ".engine.devices:SwitchReport",
    "release": ".kernel.release:release",
    "DEVICE_PROFILES": ".parallel.cost.profiles:DEVICE_PROFILES",
    "DeviceProfile": ".parallel.cost.profiles:DeviceProfile",
    "Collective": ".parallel.records:Collective",
    "CostBreakdown": ".parallel.records:CostBreakdown",
    "Layout": ".parallel.records:Layout",
    "MemoryBreakdown": ".parallel.records:MemoryBreakdown",
    "Report": ".parallel.records:Report",
    "PlanRow": ".parallel.records:PlanRow",
    "PipelineSpec": ".parallel.records:PipelineSpec",
    "RematSpec": ".parallel.records:RematSpec",
    "ShardingSpecError": ".parallel.specs:ShardingSpecError",
    "analyze": ".parallel.compiled.analyze:analyze",
    "mesh": ".parallel.mesh:mesh",
    "predict": ".parallel.cost.predict:predict",
    "calibrate": ".parallel.cost.calibrate:calibrate",
    "load_profile": ".parallel.cost.calibrate:load_profile",
    "SearchError": ".parallel.errors:SearchError",
    "Plan": ".parallel.plan.plan:Plan",
    "with_pipeline": ".parallel.plan.pipeline:with_pipeline",
    "with_remat": ".parallel.plan.remat:with_remat",
    "search": ".parallel.search.driver:search",
    "confirm": ".parallel.search.driver:confirm_plan",
    "commgraph": ".widgets.commgraph:commgraph",
    "editor": ".widgets.editor:editor",
    "explore": ".widgets.bokeh_explorer:explore",
    "memory": ".widgets.memory:memory",
    "pipeline_timeline": ".widgets.pipeline_view:pipeline_timeline",
    "show": ".widgets.layout:show",
    "timeline": ".widgets.timeline:timeline",
    "watch": ".widgets.watch:watch",
}


def __getattr__(name: str) -> Any:
    """Loads a public name on first use: just the module that defines it (PEP 562)."""
    target = _PUBLIC.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attr = target.partition(":")
    loaded = importlib.import_module(module, __name__)
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
    from .kernel.register import register

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
    from .kernel.register import unregister

    unregister(ipython)
