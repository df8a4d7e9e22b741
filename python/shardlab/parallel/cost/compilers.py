"""What differs between the compilers a plan is compiled by: one record per XLA backend.

The cost model prices what the compiler will emit, and XLA:CPU, XLA:GPU and XLA:TPU emit
different programs from one sharded jaxpr. A ``DeviceProfile`` names its platform, and the
platform chooses the compiler (``compiler_of``): a mesh over CPU devices is priced as XLA:CPU
compiles it, a target (``shardlab.target``) or a GPU/TPU mesh as its compiler does. Each rule
here is stated in general and was read off compiled HLO (docs/parallel.md has the excerpts):

* **Which dtypes it computes in** (``computes_in``). XLA:CPU has no bfloat16 arithmetic: its
  float normalization upcasts every bfloat16 operation to float32, collectives included, and
  rounds back only where a value leaves the program. A bfloat16 train step on a CPU mesh
  all-gathers ``f32[512,1024]`` where the parameter is ``bf16[64,1024]``
  (``%all-gather = f32[512,1024] all-gather(%wrapped_convert.1)``), and every temporary is
  float32. Arguments and outputs stay bfloat16 (the caller's buffers). float16 is different:
  its collectives stay float16 (``%all-gather = f16[512,1024] all-gather(%param.1)``), so
  it is not listed. XLA:GPU and XLA:TPU compute bfloat16 natively.
* **Whether reduce-scatter forms** (``forms_reduce_scatter``): GPU and TPU turn an all-reduce
  followed by a dynamic slice into a reduce-scatter; XLA:CPU keeps the all-reduce and slices.
* **Reassociating partial sums** (``reassociates_partial_sums``): GPU and TPU run XLA's
  ``AllReduceReassociate``: ``all-reduce(a) + all-reduce(b)`` over the same devices, each
  all-reduce read by the add alone, becomes ``all-reduce(a + b)``. A Megatron attention
  block's input gradient sums the q, k and v projections' partial sums and all-reduces once
  per layer; XLA:CPU all-reduces each of the three.
* **Asynchronous collectives** (``async_collectives``): GPU and TPU split each collective into
  a start and a done (``all-reduce-start`` … ``all-reduce-done``) and schedule independent
  compute between them; XLA:CPU runs each collective to its end before the next operation.
  The schedule (``schedule.py``) hides communication behind compute only where it is
  asynchronous.
* **Folding an add into a scatter** (``folds_add_into_scatter``): GPU and TPU rewrite
  ``add(scatter-add(zeros, i, u), x)`` as ``scatter-add(x, i, u)`` before partitioning; an
  embedding's gradient added into momentum split over the devices that scattered it is
  then gathered whole as the scatter's operand (``%loop_multiply_fusion.2 = f32[128,256]
  fusion(%param.44)``, all-gathered to ``f32[1024,256]``); XLA:CPU reduces the gradient and
  adds.
* **Max pooling's gradient** (``expands_select_and_scatter``): XLA:CPU rewrites
  select-and-scatter into iotas, a reduce-window and a scatter, with scratch buffers for the
  indices; GPU and TPU have a native kernel.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from shardlab.parallel.graph.opgraph import OpGraph, itemsize_of
from shardlab.parallel.records import _Record

__all__ = ["COMPILERS", "Compiler", "compiler_of", "held_graph"]


@dataclasses.dataclass(frozen=True)
class Compiler(_Record):
    """One XLA backend's rules that the cost model follows.

    Attributes:
        name: ``XLA:CPU``, ``XLA:GPU`` or ``XLA:TPU``.
        platform: the JAX platform it compiles for (``cpu``, ``gpu``, ``tpu``).
        computes_in: ``(dtype, computed as)`` pairs: a value of ``dtype`` is computed, held
            in temporary buffers and moved by collectives as the second dtype.
        forms_reduce_scatter: whether an all-reduce whose result is sliced per device
            becomes a reduce-scatter.
        expands_select_and_scatter: whether max pooling's gradient is expanded into a
            reduce-window and a scatter with index scratch buffers.
        reassociates_partial_sums: whether partial sums over the same devices that are only
            added together are added first and all-reduced once.
        async_collectives: whether collectives run asynchronously beside compute.
        folds_add_into_scatter: whether ``add(scatter-add(0, i, u), x)`` becomes
            ``scatter-add(x, i, u)`` before partitioning.
        fuses_into_dots: whether a dot computes the elementwise values it reads (and a dot
            read only through them) inside its own fusion, tile by tile.
        library_reductions: whether large reductions are library calls that take no
            broadcast or shared producer inside, and convolutions run in one layout (the
            copies ``cost/memory/fusion.py`` adds).
    """

    name: str
    platform: str
    computes_in: tuple[tuple[str, str], ...] = ()
    forms_reduce_scatter: bool = True
    expands_select_and_scatter: bool = False
    reassociates_partial_sums: bool = True
    async_collectives: bool = True
    folds_add_into_scatter: bool = True
    fuses_into_dots: bool = False
    library_reductions: bool = False

    def computed_dtype(self, dtype: Any) -> Any:
        """The dtype a value of ``dtype`` is computed in (itself unless promoted)."""
        name = getattr(dtype, "name", None)
        for low, high in self.computes_in:
            if name == low:
                return np.dtype(high)
        return dtype

    def held_itemsize(self, dtype: Any) -> int:
        """Bytes per element of a value of ``dtype`` as the compiled program holds it."""
        return itemsize_of(self.computed_dtype(dtype))

    def describe(self) -> str:
        """``XLA:CPU (computes bfloat16 in float32; no reduce-scatter)``."""
        parts = [f"computes {a} in {b}" for a, b in self.computes_in]
        if not self.forms_reduce_scatter:
            parts.append("no reduce-scatter")
        return f"{self.name} ({'; '.join(parts)})" if parts else self.name


COMPILERS: dict[str, Compiler] = {
    c.platform: c
    for c in (
        Compiler(
            "XLA:CPU",
            "cpu",
            computes_in=(("bfloat16", "float32"),),
            forms_reduce_scatter=False,
            expands_select_and_scatter=True,
            reassociates_partial_sums=False,
            async_collectives=False,
            folds_add_into_scatter=False,
            library_reductions=True,
        ),
        Compiler("XLA:GPU", "gpu"),
        Compiler("XLA:TPU", "tpu", fuses_into_dots=True),
    )
}


def compiler_of(platform: str) -> Compiler:
    """The compiler for a JAX platform name (``cuda``/``rocm`` are XLA:GPU).

    Raises:
        ValueError: an unknown platform.
    """
    key = "gpu" if platform in ("cuda", "rocm") else platform
    if key not in COMPILERS:
        raise ValueError(
            f"unknown platform {platform!r}; known: {', '.join(COMPILERS)} (cuda, rocm: gpu)"
        )
    return COMPILERS[key]


def held_graph(graph: OpGraph, compiler: Compiler, *, entry: bool = True) -> OpGraph:
    """``graph`` with each value's bytes as ``compiler``'s program holds it
    (``OpGraph.held_as``); the graph itself when nothing changes size."""
    if not compiler.computes_in:
        return graph
    return graph.held_as(compiler.held_itemsize, entry=entry)
