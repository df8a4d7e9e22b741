"""shardlab: an interactive workbench for parallel JAX.

The public API; everything else is private to its package. Importing ``shardlab`` does not
import IPython or widget libraries (the kernel parts load on demand), nor JAX: the names
below load on first use (PEP 562), all together, so that ``python -m shardlab --help`` and
the kernel launcher (which pins devices before JAX starts) stay fast. The first use also
loads the views, which ``Plan.show()`` needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from . import data, examples, strategies
    from .engine import GraphCache, GraphStagingError, ModeError, ReleaseReport
    from .engine.bisect import BisectReport, bisect
    from .engine.compare import CompareReport, compare
    from .engine.convert import ControlFlowError, converted, to_static
    from .engine.devices import DeviceSpecError, SwitchReport
    from .engine.numerics import Tolerance
    from .kernel.release import release
    from .parallel import (
        DEVICE_PROFILES,
        Collective,
        CostBreakdown,
        DeviceProfile,
        Layout,
        MemoryBreakdown,
        Report,
        ShardingSpecError,
        analyze,
        mesh,
        predict,
    )
    from .parallel.cost.calibrate import calibrate, load_profile
    from .parallel.errors import SearchError
    from .parallel.plan.pipeline import with_pipeline
    from .parallel.plan.plan import Plan
    from .parallel.plan.remat import with_remat
    from .parallel.records import PipelineSpec, PlanRow, RematSpec
    from .parallel.search.driver import confirm_plan as confirm
    from .parallel.search.driver import search
    from .widgets import (
        commgraph,
        editor,
        explore,
        memory,
        pipeline_timeline,
        show,
        timeline,
        watch,
    )

# Public name -> (module, attribute; None: the module itself).
_LAZY: dict[str, tuple[str, str | None]] = {
    "data": (".data", None),
    "examples": (".examples", None),
    "strategies": (".strategies", None),
    **{n: (".engine", n) for n in ("GraphCache", "GraphStagingError", "ModeError")},
    "ReleaseReport": (".engine", "ReleaseReport"),
    "compare": (".engine.compare", "compare"),
    "CompareReport": (".engine.compare", "CompareReport"),
    "bisect": (".engine.bisect", "bisect"),
    "BisectReport": (".engine.bisect", "BisectReport"),
    "Tolerance": (".engine.numerics", "Tolerance"),
    **{n: (".engine.convert", n) for n in ("ControlFlowError", "converted", "to_static")},
    "DeviceSpecError": (".engine.devices", "DeviceSpecError"),
    "SwitchReport": (".engine.devices", "SwitchReport"),
    "release": (".kernel.release", "release"),
    **{
        n: (".parallel", n)
        for n in (
            "DEVICE_PROFILES",
            "Collective",
            "CostBreakdown",
            "DeviceProfile",
            "Layout",
            "MemoryBreakdown",
            "Report",
            "ShardingSpecError",
            "analyze",
            "mesh",
            "predict",
        )
    },
    "calibrate": (".parallel.cost.calibrate", "calibrate"),
    "load_profile": (".parallel.cost.calibrate", "load_profile"),
    "SearchError": (".parallel.errors", "SearchError"),
    "Plan": (".parallel.plan.plan", "Plan"),
    "PlanRow": (".parallel.records", "PlanRow"),
    "PipelineSpec": (".parallel.records", "PipelineSpec"),
    "RematSpec": (".parallel.records", "RematSpec"),
    "with_pipeline": (".parallel.plan.pipeline", "with_pipeline"),
    "with_remat": (".parallel.plan.remat", "with_remat"),
    "search": (".parallel.search.driver", "search"),
    "confirm": (".parallel.search.driver", "confirm_plan"),
    **{
        n: (".widgets", n)
        for n in (
            "commgraph",
            "editor",
            "explore",
            "memory",
            "pipeline_timeline",
            "show",
            "timeline",
            "watch",
        )
    },
}


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _load()
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _load() -> None:
    """Imports every lazy name at once (the views register ``Plan.show()``'s viewer)."""
    values = {}
    for public, (module, attr) in _LAZY.items():
        loaded = importlib.import_module(module, __name__)
        values[public] = loaded if attr is None else getattr(loaded, attr)
    globals().update(values)


__all__ = [
    "DEVICE_PROFILES",
    "BisectReport",
    "Collective",
    "CompareReport",
    "ControlFlowError",
    "CostBreakdown",
    "DeviceProfile",
    "DeviceSpecError",
    "GraphCache",
    "GraphStagingError",
    "Layout",
    "MemoryBreakdown",
    "ModeError",
    "PipelineSpec",
    "Plan",
    "PlanRow",
    "ReleaseReport",
    "RematSpec",
    "Report",
    "SearchError",
    "ShardingSpecError",
    "SwitchReport",
    "Tolerance",
    "__version__",
    "analyze",
    "bisect",
    "calibrate",
    "commgraph",
    "compare",
    "confirm",
    "converted",
    "data",
    "editor",
    "examples",
    "explore",
    "load_ipython_extension",
    "load_profile",
    "memory",
    "mesh",
    "pipeline_timeline",
    "predict",
    "release",
    "search",
    "show",
    "strategies",
    "timeline",
    "to_static",
    "unload_ipython_extension",
    "watch",
    "with_pipeline",
    "with_remat",
]


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
