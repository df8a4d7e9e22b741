"""Memory over time: per-device live bytes sampled while cells run, with markers at
releases, mode switches and device switches.

One :class:`MemoryRecorder` per shell (:func:`recorder`), hooked into the shell's cell events
once. It records only once active: the first ``shardlab.memory()`` (its bokeh plot,
``widgets/memory/history.py``) or the first ``shardlab`` comm a front end opens (the lab
extension's panel, through ``kernel/status.py``) activates it; until then its hooks return at
once. While active it samples ``engine.resources.live_memory.live_bytes_per_device`` when a cell starts and
ends and every ``SAMPLE_S`` seconds from a background thread while one runs, calling its
listeners after each sample (they throttle themselves). Past ``MAX_SAMPLES`` samples every
other old one is dropped (the newest half kept at full rate); markers are always kept.
:meth:`MemoryRecorder.compact` is the short JSON form the status comm sends (at most
``MAX_SENT`` samples, peak-preserving, and the newest ``MAX_MARKERS`` markers).

The shell is used duck-typed (``events``, ``execution_count``, the shardlab session's
``current`` cell mode): this module imports no IPython.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Callable
from typing import Any

SAMPLE_S = 0.5
MAX_SAMPLES = 4000
MAX_SENT = 240
MAX_MARKERS = 40
_RELEASE = re.compile(r"(^|\n)\s*%release\b|\brelease\(")


@dataclasses.dataclass(frozen=True)
class MemorySample:
    t: float  # seconds since the recorder started
    cell: int | None
    bytes_per_device: tuple[tuple[str, int], ...]


@dataclasses.dataclass(frozen=True)
class MemoryMarker:
    t: float
    kind: str  # "release" | "mode" | "devices"
    text: str


def _sample_bytes() -> tuple[tuple[str, int], ...]:
    from shardlab.engine.resources.live_memory import live_bytes_per_device

    return tuple(live_bytes_per_device().items())


class MemoryRecorder:
    """Samples and markers of one shell; listeners are told after each sample."""

    def __init__(
        self, shell: Any = None, *, sampler: Callable[[], Any] = _sample_bytes, active: bool = True
    ) -> None:
        self.shell = shell
        self.sampler = sampler
        self.started = time.perf_counter()
        self.samples: list[MemorySample] = []
        self.markers: list[MemoryMarker] = []
        self.listeners: list[Callable[[bool], None]] = []  # called with final=True after a cell
        self.lock = threading.Lock()
        self.active = False
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._cell: int | None = None
        self._cell_t = 0.0
        self._last_mode: str | None = None
        self._code = ""
        if active:
            self.activate()

    def activate(self) -> None:
        """Starts recording (idempotent): the first sample is taken now."""
        if not self.active:
            self.active = True
            self.sample()

    # -- recording -------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter() - self.started

    def sample(self, values: Any = None) -> MemorySample:
        values = tuple(values if values is not None else self.sampler())
        with self.lock:
            previous = self.samples[-1] if self.samples else None
            sample = MemorySample(self.now(), self._cell, values)
            self.samples.append(sample)
            if previous is not None:
                before = {d for d, _ in previous.bytes_per_device}
                after = {d for d, _ in values}
                if before != after:
                    self.markers.append(
                        MemoryMarker(sample.t, "devices", f"devices {len(before)} → {len(after)}")
                    )
            if len(self.samples) > MAX_SAMPLES:
                half = len(self.samples) // 2
                self.samples = self.samples[:half:2] + self.samples[half:]
        return sample

    def sample_if_changed(self, bytes_per_device: dict[str, int]) -> None:
        """Records ``bytes_per_device`` (read by the caller just now) unless the last sample
        holds the same, so what a front end is sent ends at the bytes it is shown."""
        if not self.active:
            return
        values = tuple(bytes_per_device.items())
        with self.lock:
            last = self.samples[-1].bytes_per_device if self.samples else None
        if last != values:
            self.sample(values)

    def mark(self, kind: str, text: str, t: float | None = None) -> None:
        if not self.active:
            return
        with self.lock:
            self.markers.append(MemoryMarker(self.now() if t is None else t, kind, text))
            self.markers.sort(key=lambda m: m.t)

    def _session_mode(self) -> str | None:
        session = getattr(self.shell, "_shardlab_session", None)  # the kernel's, if loaded
        mode = getattr(getattr(session, "current", None), "mode", None)
        return mode if isinstance(mode, str) else None

    def pre_run_cell(self, info: Any) -> None:
        if not self.active:
            return
        # IPython counts execution_count up before pre_run_cell: cell N runs with N + 1
        count = getattr(self.shell, "execution_count", None)
        self._cell = count - 1 if isinstance(count, int) and count > 0 else None
        self._code = getattr(info, "raw_cell", "") or ""
        self._mode = self._session_mode()  # set when the session's hook ran first
        self._cell_t = self.sample().t
        self._start_sampler()

    def post_run_cell(self, result: Any) -> None:
        if not self.active:
            return
        self._stop_sampler()
        # The session's hooks run after this recorder's (kernel/register.py): its current
        # cell is still set here, not yet in pre_run_cell.
        mode = self._session_mode() or getattr(self, "_mode", None)
        if mode is not None:
            if self._last_mode is not None and mode != self._last_mode:
                self.mark(
                    "mode", f"mode {self._last_mode} → {mode} (cell {self._cell})", self._cell_t
                )
            self._last_mode = mode
        if _RELEASE.search(self._code):
            self.mark("release", f"release (cell {self._cell})")
        self.sample()
        self._notify(True)

    def _notify(self, final: bool) -> None:
        for listener in list(self.listeners):
            try:
                listener(final)
            except Exception:  # a view that went away must not break the cell
                continue

    def _start_sampler(self) -> None:
        if self._thread is not None:
            return
        stopped = self._stopped = threading.Event()

        def run() -> None:
            while not stopped.wait(SAMPLE_S):
                try:
                    self.sample()
                    self._notify(False)
                except Exception:  # e.g. a sample between a device switch's steps: next time
                    continue

        self._thread = threading.Thread(target=run, name="shardlab-memory", daemon=True)
        self._thread.start()

    def _stop_sampler(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stopped.set()
            thread.join(timeout=2 * SAMPLE_S)

    def stop(self) -> None:
        self._stop_sampler()
        self.active = False
        if self.shell is not None:
            for name, hook in (
                ("pre_run_cell", self.pre_run_cell),
                ("post_run_cell", self.post_run_cell),
            ):
                try:
                    self.shell.events.unregister(name, hook)
                except ValueError:
                    pass
            if _RECORDERS.get(id(self.shell)) is self:
                del _RECORDERS[id(self.shell)]

    # -- the comm's form ------------------------------------------------------------------
    def compact(self, limit: int = MAX_SENT, max_markers: int = MAX_MARKERS) -> dict[str, Any]:
        """``{"devices": [...], "t": [s...], "bytes": [[per device, null where absent]...],
        "markers": [{"t", "kind", "text"}], "samples": n}``: at most ``limit`` samples
        (buckets keep their fullest sample, so peaks survive), the newest markers."""
        with self.lock:
            samples = list(self.samples)
            markers = list(self.markers)[-max_markers:]
        kept = thin(samples, limit)
        devices: list[str] = []
        for s in kept:
            for device, _ in s.bytes_per_device:
                if device not in devices:
                    devices.append(device)
        rows = []
        for s in kept:
            values = dict(s.bytes_per_device)
            rows.append([int(values[d]) if d in values else None for d in devices])
        return {
            "devices": devices,
            "t": [round(s.t, 3) for s in kept],
            "bytes": rows,
            "markers": [{"t": round(m.t, 3), "kind": m.kind, "text": m.text} for m in markers],
            "samples": len(samples),
        }


def thin(samples: list[MemorySample], limit: int) -> list[MemorySample]:
    """At most ``limit`` samples in time order: the first and last, and from each of
    ``limit - 2`` equal buckets between them the one holding the most bytes."""
    if len(samples) <= limit:
        return samples
    if limit < 3:
        return [samples[0], samples[-1]][:limit]
    inner = samples[1:-1]
    buckets = limit - 2
    kept = [samples[0]]
    for k in range(buckets):
        chunk = inner[k * len(inner) // buckets : (k + 1) * len(inner) // buckets]
        if chunk:
            kept.append(max(chunk, key=lambda s: sum(b for _, b in s.bytes_per_device)))
    kept.append(samples[-1])
    return kept


_RECORDERS: dict[int, MemoryRecorder] = {}


def recorder(shell: Any, *, activate: bool = True) -> MemoryRecorder:
    """The shell's recorder, hooked into its cells on first use (``activate=False``: hooked
    but dormant, as the shardlab kernel registers it before its own hooks)."""
    found = _RECORDERS.get(id(shell))
    if found is None or found.shell is not shell:
        found = MemoryRecorder(shell, active=False)
        shell.events.register("pre_run_cell", found.pre_run_cell)
        shell.events.register("post_run_cell", found.post_run_cell)
        _RECORDERS[id(shell)] = found
    if activate:
        found.activate()
    return found


def existing(shell: Any) -> MemoryRecorder | None:
    """The shell's recorder if one is active, else None (nothing is started)."""
    found = _RECORDERS.get(id(shell))
    return found if found is not None and found.shell is shell and found.active else None
