"""The per-shell state of shardlab: modes, graph cache, hooks and status.

One ``ShardlabSession`` is attached to an IPython shell by :func:`.register.register` (which
the shardlab kernel and ``%load_ext shardlab`` in a stock IPython kernel call). It is a
traitlets ``Configurable``, so ``%config ShardlabSession.cache_reset = "off"`` and config
files work.

This module is the model: it imports no other module of ``kernel/`` (magics, the status
channel and the wiring import it). What it reports after each cell goes to ``status``, a
:class:`StatusSink` that the wiring plugs in.

How a cell runs — one route, one mode record (``CellMode``) per execute request:
  1. the record is made once: by the shardlab kernel, which hands the request's code and
     cell metadata to :meth:`ShardlabSession.begin_cell` before anything else; in a stock
     IPython kernel (``%load_ext shardlab``), where no metadata reaches the session, from the
     cell's text when IPython transforms it (a pure function of the text and the default
     mode, so ``pre_run_cell`` resolving it again gets the same record);
  2. an input transformer rewrites the cell by the record: graph cells become a ``%%graph``
     cell magic, ``%%eager``/``%%jit`` lines become blank lines (keeping line numbers);
  3. ``pre_run_cell`` enters ``jax.disable_jit()`` for eager cells; ``post_run_cell`` leaves
     it, records the mode, drops compilation caches after a cell that compiled when they
     hold more memory than their budget (``cache_reset``), releases memory after an
     out-of-memory error and sends the status record (on the ``shardlab`` comm, see
     ``status.py``).
While a cell runs, whatever IPython transforms or runs for it (the body of ``%%graph`` or
``%%compare``, a ``run_cell`` called from the cell) is part of that cell: it is not routed
again. IPython hands every cell magic its body untransformed, by design (``%%timeit`` and
``%%time`` transform theirs too), so ``%%graph`` transforms its own.
"""

from __future__ import annotations

import collections
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Protocol

from traitlets import Bool, Enum, Float, Instance, Int, observe
from traitlets.config import LoggingConfigurable

from shardlab._core.units import human_bytes
from shardlab.engine.cells.staging import GraphCache
from shardlab.engine.modes import (
    MODES,
    Mode,
    ModeError,
    ModeSource,
    parse_mode,
    parse_mode_magic,
    resolve_mode,
)
from shardlab.engine.resources import live_memory as memory
from shardlab.engine.resources import shape_guard
from shardlab.engine.resources.cache_budget import CacheBudget, default_budget

_GRAPH_MAGIC = "%%graph --shardlab-line-offset=0\n"


@dataclass(frozen=True)
class CellMode:
    """The mode a cell runs in, where it came from, or why it could not be resolved."""

    code: str
    mode: Mode | None
    source: ModeSource | None
    error: str | None = None


@dataclass(frozen=True)
class HistoryItem:
    execution_count: int
    mode: Mode
    source: ModeSource
    duration_s: float  # from pre_run_cell to post_run_cell: the cell's own run time
    # A graph cell's converted control flow (``GraphRun.conversions``, summed over its
    # staged segments); None for cells with nothing converted.
    conversions: dict[str, Any] | None = None


class StatusSink(Protocol):
    """Where a session reports after each cell: the ``shardlab`` comm (``status.py``)."""

    def send(self, *, force: bool = False) -> None: ...


class _NoStatus:
    """The status sink of a session nothing listens to."""

    def send(self, *, force: bool = False) -> None:
        return None


class ShardlabSession(LoggingConfigurable):
    """Modes, caches and hooks of one shell."""

    default_mode = Enum(MODES, default_value="jit", help="Mode of cells without a mode.").tag(
        config=True
    )
    cache_reset = Enum(
        ("memory", "programs", "off"),
        default_value="memory",
        help="When, after a cell that compiled, the kernel drops JAX's compiled programs and "
        "the staged graph cells. 'memory': when they hold more resident memory than "
        "cache_budget_mib (engine/resources/cache_budget.py). 'programs' (the old rule): at "
        "a mode switch, beyond max_cached_programs. 'off': never (memory_pressure and "
        "release_after_oom still apply).",
    ).tag(config=True)
    cache_budget_mib = Int(
        None,
        allow_none=True,
        help="The 'memory' rule's budget in MiB; None: an eighth of the host's memory "
        "(cgroup limit included), at least 1 GiB.",
    ).tag(config=True)
    reset_on_mode_switch = Bool(
        True,
        help="False turns every cache_reset rule off (kept for configs that predate "
        "cache_reset; the same as cache_reset = 'off').",
    ).tag(config=True)
    max_cached_programs = Int(
        256,
        help="The 'programs' rule's limit: compiled programs JAX may keep across a mode "
        "switch before they are dropped.",
    ).tag(config=True)
    memory_pressure = Float(
        0.8,
        help="After a cell that compiled, drop compilation caches and staged graph cells "
        "when the kernel's resident memory exceeds this fraction of the host's memory.",
    ).tag(config=True)
    release_after_oom = Bool(
        True, help="After a cell fails out of memory, release unreachable arrays and caches."
    ).tag(config=True)
    guard_array_sizes = Bool(
        True,
        help="Refuse, with an error naming the shape, programs with an array XLA cannot "
        "compile (its bytes overflow int64: XLA would abort the kernel) or results larger "
        "than the devices' memory, before XLA sees them (engine/resources/shape_guard.py).",
    ).tag(config=True)
    history_length = Int(
        20, help="How many cells' effective modes the session keeps (%mode lists the last 10)."
    ).tag(config=True)
    shell = Instance("IPython.core.interactiveshell.InteractiveShellABC", allow_none=True)

    def __init__(self, shell: Any, **kwargs: Any) -> None:
        super().__init__(shell=shell, parent=shell, **kwargs)
        self.graph_cache = GraphCache()
        # The execute request's record, made by begin_cell (the shardlab kernel); None in a
        # stock kernel, or for a silent request.
        self.requested: CellMode | None = None
        self.silent = False
        self.current: CellMode | None = None  # the record of the running cell
        # Cells executing, silent ones and run_cell from inside a cell included (IPython's
        # pre_execute .. post_execute, which come around pre_run_cell .. post_run_cell).
        self._depth = 0
        self.last_mode: Mode | None = None
        self.last_compiling_mode: Mode | None = None  # of the last cell that compiled
        self._compiles_before = 0
        # What the compilation caches hold, for cache_reset = "memory"; and how many times
        # the caches were dropped after a cell (any rule).
        self.cache_budget = CacheBudget()
        self.cache_resets = 0
        self._default_budget: int | None = None
        self.history: collections.deque[HistoryItem] = collections.deque(maxlen=self.history_length)
        self.status: StatusSink = _NoStatus()  # the wiring plugs in the comm channel
        self._eager_context: Any = None
        self._started = time.perf_counter()
        # Converted control flow of the running cell; kept after it for the execute reply.
        self.conversions: dict[str, Any] | None = None

    @property
    def _shell(self) -> Any:
        """The shell, which a session always has (``shell`` is optional only as a trait)."""
        assert self.shell is not None
        return self.shell

    @observe("guard_array_sizes")
    def _guard_changed(self, change: Any) -> None:
        self.apply_guard()

    def apply_guard(self) -> None:
        """Installs or removes the array-size guard as ``guard_array_sizes`` says."""
        if self.guard_array_sizes:
            shape_guard.install()
        else:
            shape_guard.uninstall()

    # -- mode resolution -------------------------------------------------------------------
    def begin_cell(self, code: str, cell_meta: dict[str, Any] | None, *, silent: bool) -> None:
        """Called by the shardlab kernel before it runs ``code``: makes the request's record."""
        self.silent = silent
        self.requested = None if silent else self._resolve(code, cell_meta)

    def end_cell(self) -> CellMode | None:
        """Called by the shardlab kernel after the request: its record, for the reply."""
        finished, self.requested, self.silent = self.requested, None, False
        return finished

    def _resolve(self, code: str, cell_meta: dict[str, Any] | None) -> CellMode:
        try:
            mode, source = resolve_mode(code, cell_meta, parse_mode(self.default_mode))
        except ModeError as error:
            return CellMode(code, None, None, str(error))
        return CellMode(code, mode, source)

    def _record(self, code: str) -> CellMode:
        """The record of the cell about to run: the request's, or one from its text."""
        return self.requested if self.requested is not None else self._resolve(code, None)

    # -- the input transformer -------------------------------------------------------------
    def transform(self, lines: list[str]) -> list[str]:
        """IPython cleanup transformer: routes a cell to its mode (see module docstring)."""
        if self.silent or self._depth or not lines:
            return lines
        code = "".join(lines)
        cell = self._record(code)
        if cell.error is not None:
            return [
                "raise __import__('shardlab.engine.modes', fromlist=['ModeError'])"
                f".ModeError({cell.error!r})\n"
            ]
        try:
            magic, body = parse_mode_magic(code)
        except ModeError:  # already reported through cell.error
            magic, body = None, code
        if cell.mode == "graph":
            if magic == "graph":
                if code.lstrip("\n").startswith("%%graph"):
                    return lines
                # ``%%mode graph``: one line above the body, as ``%%graph`` would be
                blank_lines = len(code) - len(code.lstrip("\n"))
                head = f"%%graph --shardlab-line-offset={blank_lines + 1}\n"
                return [head, *body.splitlines(True)]
            return [_GRAPH_MAGIC, *body.splitlines(True)]
        if magic is not None:  # %%eager / %%jit: a blank line keeps line numbers
            if body.lstrip("\n").startswith("%%"):  # ... unless a cell magic comes next
                return body.lstrip("\n").splitlines(True)
            blank_lines = len(code) - len(code.lstrip("\n"))
            return ["\n"] * (blank_lines + 1) + body.splitlines(True)
        return lines

    # IPython's ``check_complete`` (an is_complete request: a console's Enter) skips
    # transformers marked so. Routing must not change that answer: a graph cell becomes a
    # ``%%graph`` cell magic, which IPython counts complete only after a blank line, so with
    # ``%mode graph`` ``1`` was "incomplete"; the text the user typed is judged as stock
    # IPython judges it (``%%graph``/``%%jit``/``%%eager`` first lines as cell magics).
    transform.has_side_effects = True  # type: ignore[attr-defined]

    # -- events ----------------------------------------------------------------------------
    def pre_execute(self) -> None:
        self._depth += 1

    def post_execute(self) -> None:
        self._depth = max(0, self._depth - 1)  # an empty cell ends without starting

    def pre_run_cell(self, info: Any) -> None:
        if self._depth > 1:  # run_cell from inside a cell: part of that cell
            return
        cell = self._record(info.raw_cell or "")
        self.current = cell
        self.conversions = None
        self._started = time.perf_counter()
        self._compiles_before = compile_count()
        if cell.mode is None:
            return
        if cell.mode == "eager":
            import jax

            self._eager_context = jax.disable_jit()
            self._eager_context.__enter__()

    def post_run_cell(self, result: Any) -> None:
        if self._depth > 0:  # the end of a cell run from inside a cell
            return
        if self._eager_context is not None:
            context, self._eager_context = self._eager_context, None
            context.__exit__(None, None, None)
        cell, self.current = self.current, None
        duration = time.perf_counter() - self._started
        if cell is not None and cell.mode is not None and cell.source is not None:
            self.last_mode = cell.mode
            count = getattr(result, "execution_count", None) or self._shell.execution_count
            self.history.append(
                HistoryItem(int(count), cell.mode, cell.source, duration, self.conversions)
            )
            if compile_count() > self._compiles_before:
                self._compiled_in(cell.mode)
        error = getattr(result, "error_in_exec", None)
        if error is not None and self.release_after_oom and _is_out_of_memory(error):
            report = memory.release(
                self._shell.user_ns,
                skip_names=frozenset(self._shell.user_ns_hidden),
                stop_at=kernel_objects(self._shell),
            )
            print(
                "[shardlab] the cell ran out of memory; released temporaries and caches:\n"
                + report.text()
            )
        self.status.send()

    def _compiled_in(self, mode: Mode) -> None:
        """After a cell that compiled: memory pressure, or the cache_reset rule, may release."""
        before, self.last_compiling_mode = self.last_compiling_mode, mode
        rss = memory.process_rss()
        programs = memory.cache_stats().get("executables", 0)
        self.cache_budget.observe(rss, programs)
        rule = self.cache_reset if self.reset_on_mode_switch else "off"
        pressure = _rss_fraction(rss)
        if pressure > self.memory_pressure:
            self._release_caches(f"the kernel uses {pressure:.0%} of the host's memory", rss)
        elif rule == "memory" and self.cache_budget.over(self.cache_budget_bytes()):
            self._release_caches(
                f"compilation caches hold about {human_bytes(self.cache_budget.held())} "
                f"(budget {human_bytes(self.cache_budget_bytes())}, cache_budget_mib)",
                rss,
            )
        elif rule == "programs" and before is not None and before != mode:
            if programs > self.max_cached_programs:
                self._release_caches(
                    f"mode {before} → {mode} with {programs} compiled programs (more than "
                    f"max_cached_programs={self.max_cached_programs})",
                    rss,
                )

    def cache_budget_bytes(self) -> int:
        """The 'memory' rule's budget in bytes (``cache_budget_mib``, or the default)."""
        if self.cache_budget_mib is not None:
            return max(0, self.cache_budget_mib) * 2**20
        if self._default_budget is None:  # the host's memory, read once
            self._default_budget = default_budget()
        return self._default_budget

    def _release_caches(self, why: str, rss_before: int) -> None:
        """Drops the staged graph cells and JAX's caches; says so, with what it freed."""
        import gc

        import jax

        stats = memory.cache_stats()
        cells = self.graph_cache.clear()
        jax.clear_caches()
        gc.collect()
        memory.malloc_trim()  # freed heap back to the OS, so that the measure below is real
        freed = self.cache_budget.wiped(rss_before, memory.process_rss())
        self.cache_resets += 1
        print(
            f"[shardlab] {why}: cleared {cells} graph cell(s) and "
            f"{stats.get('executables', 0)} compiled program(s), freed {human_bytes(freed)}",
        )

    # -- helpers for magics ----------------------------------------------------------------
    def effective_history(self) -> list[HistoryItem]:
        return list(self.history)

    def set_default(self, mode: Mode) -> None:
        self.default_mode = mode

    def add_conversions(self, conversions: dict[str, Any]) -> None:
        """Counts a staged segment's converted control flow into the running cell's."""
        if self.conversions is None:
            self.conversions = {"converted": 0, "staged": {}, "python": 0, "left_as_python": []}
        total = self.conversions
        total["converted"] += conversions["converted"]
        total["python"] += conversions["python"]
        total["left_as_python"] = [*total["left_as_python"], *conversions["left_as_python"]]
        for kind, count in conversions["staged"].items():
            total["staged"][kind] = total["staged"].get(kind, 0) + count


def _rss_fraction(rss: int) -> float:
    """``rss`` resident bytes as a fraction of the host's memory (0 where unknown)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0.0
    return rss / total if total > 0 else 0.0


_COMPILES = [0]


def _count_compile(event: str, duration_secs: float, **_: Any) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _COMPILES[0] += 1


def compile_count() -> int:
    """How many programs JAX compiled in this process since shardlab started counting
    (listening starts once JAX is imported; shardlab never imports it for this)."""
    if not _COMPILES[1:] and "jax" in sys.modules:
        from jax import monitoring

        monitoring.register_event_duration_secs_listener(_count_compile)
        _COMPILES.append(1)  # marks the listener as installed
    return _COMPILES[0]


def _is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, MemoryError):
        return True
    text = f"{type(error).__name__}: {error}"
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def kernel_objects(shell: Any) -> tuple[object, ...]:
    """The shell and kernel objects: a walk for the user's arrays must not enter them."""
    kernel = getattr(shell, "kernel", None)
    return tuple(o for o in (shell, kernel, getattr(shell, "displayhook", None)) if o is not None)


# -- the session of a shell ----------------------------------------------------------------
# A shell keeps its session in ``shell._shardlab_session``; only these functions touch it.


def session_of(shell: Any) -> ShardlabSession | None:
    """The session attached to ``shell``, if any."""
    session = getattr(shell, "_shardlab_session", None)
    return session if isinstance(session, ShardlabSession) else None


def attach(shell: Any, session: ShardlabSession) -> None:
    shell._shardlab_session = session


def detach(shell: Any) -> None:
    del shell._shardlab_session


def current_session() -> ShardlabSession | None:
    """The session of the running IPython shell, if shardlab is loaded there."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    return session_of(ipython.get_ipython())
