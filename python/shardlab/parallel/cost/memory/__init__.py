"""Per-device memory of a strategy, accounted the way XLA allocates it.

XLA's compiled footprint is ``arguments + outputs + temp``: argument and output buffers live
for the whole program, and ``temp`` is one heap that packs every intermediate buffer by its
live range. Fusion decides which intermediates get a buffer at all, live ranges how long
each is held, and the output buffers which of them take no ``temp``. One module per job,
each importing only the ones above it:

* ``fusion``: which operations fuse, are free, only move data or are too expensive to
  recompute (``FUSIBLE``, ``ABSORBS``, ``EXPENSIVE``, ``SAME_ELEMENTS`` …), and the
  values XLA writes out although they would fuse.
* ``liveness``: ``Liveness`` and ``liveness()``, the shared walk: which values get a
  buffer (a scan's carries always do, ``scan_carries``) and each buffer's last effective
  use.
* ``sharing``: values computed in an output's buffer (``in_output_buffers``) or over a
  dying operand's (``written_over``).
* ``assign``: buffer assignment, temporaries first fit into the output buffers not yet
  written and the rest on the heap (``_assigned``), and the walks over program points
  (``handed_over``, ``peak_points``).
* ``traffic``: the bytes an operation moves through memory (``traffic``, ``moved``).
* ``model``: ``device_memory`` and the figures it is assembled from
  (``all_reduce_spans``, ``expansion_scratch``, ``held_at_peak``).

The op sets, the live ranges, the in-place rules and the buffer assignment are XLA's own,
common to its backends. XLA:CPU's rules: the library (YNNPACK) reductions and the
convolution's one layout (``fusion``, taken by ``liveness(copies=True)``; ``Liveness``'s
``in_copies``, ``direct`` and ``early``), max pooling's expanded gradient
(``liveness(selections=True)``, ``Liveness.selections``; in ``model``,
``_selection_scratch`` and ``expansion_scratch``), the library reductions in
``model._parts``, and a reduce-scatter compiled as an all-reduce and a slice
(``all_reduce_spans``).

Every public name of the modules is re-exported here; ``_Bins`` and ``_Reads`` too, for the
tests that check them against plain walks.
"""

from __future__ import annotations

from shardlab.parallel.cost.memory.assign import (
    Reductions,
    Transient,
    handed_over,
    peak_points,
)
from shardlab.parallel.cost.memory.assign import _Bins as _Bins
from shardlab.parallel.cost.memory.bytes_moved import IN_PLACE, SLICING, UPDATING, moved, traffic
from shardlab.parallel.cost.memory.fusion import (
    ABSORBS,
    EXPENSIVE,
    FUSED_DEPTH,
    FUSIBLE,
    LIBRARY_OPERANDS,
    LIBRARY_REDUCTION,
    REDUCING,
    REGENERATED,
    RESHAPES,
    SAME_ELEMENTS,
    SHAPE_ONLY,
    Wide,
)
from shardlab.parallel.cost.memory.live_ranges import REACH_BUDGET, Liveness, liveness, scan_carries
from shardlab.parallel.cost.memory.model import (
    all_reduce_spans,
    device_memory,
    expansion_scratch,
    held_at_peak,
)
from shardlab.parallel.cost.memory.sharing import (
    IN_PLACE_OPERAND,
    in_output_buffers,
    written_over,
)
from shardlab.parallel.cost.memory.sharing import _Reads as _Reads

__all__ = [
    "ABSORBS",
    "EXPENSIVE",
    "FUSED_DEPTH",
    "FUSIBLE",
    "IN_PLACE",
    "IN_PLACE_OPERAND",
    "LIBRARY_OPERANDS",
    "LIBRARY_REDUCTION",
    "REACH_BUDGET",
    "REDUCING",
    "REGENERATED",
    "RESHAPES",
    "SAME_ELEMENTS",
    "SHAPE_ONLY",
    "SLICING",
    "UPDATING",
    "Liveness",
    "Reductions",
    "Transient",
    "Wide",
    "all_reduce_spans",
    "device_memory",
    "expansion_scratch",
    "handed_over",
    "held_at_peak",
    "in_output_buffers",
    "liveness",
    "moved",
    "peak_points",
    "scan_carries",
    "traffic",
    "written_over",
]
