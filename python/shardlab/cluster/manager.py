"""A local cluster: ipyparallel engines joined by ``jax.distributed``, and their health.

The notebook's kernel is only the controller: it starts an ipyparallel controller and ``n``
engines (all listening on 127.0.0.1), sends every engine :func:`.worker.initialize` at once
(process 0 hosts JAX's coordinator on a free loopback port) and watches the engine processes.
It never joins the distributed runtime itself: when a peer dies, JAX aborts the surviving
processes (SIGABRT, not a Python exception), and that must never be the user's kernel.

Any engine's death is the cluster's death (JAX's runtime cannot lose a process): a watcher
thread notices it within :data:`POLL_S`, kills the other engines and the controller, and the
cell waiting on the engines raises :class:`ProcessDied` with the message the user acts on (a
death while no cell ran is raised by the next call, with its time). An engine that stops
answering (stopped, frozen) is named the same way as :class:`ProcessHung` within the heartbeat
timeout, and the aborts JAX's runtime then sends the other processes are told as its
consequences, not as deaths of their own (:mod:`.health`). ipyparallel is imported when a
cluster starts (it imports IPython).

The cluster's folder (``shardlab-cluster-*`` in the temporary folder: ipyparallel's profile,
with the connection files that hold its keys, and the engines' logs) goes with it: ``stop``
and the kernel's exit remove it; a killed kernel's engines and controller remove it as they
exit (``watched.py``), and :func:`sweep_leftovers` — run when a kernel or a cluster starts —
removes any whose kernel is gone.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import json
import logging
import os
import re
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from shardlab.cluster.health import Heartbeats, Verdict, blame, process_state, read_jax_abort

POLL_S = 0.25  # how often the watcher looks at the engine processes
STOP_GRACE_S = 3.0  # how long engines may take to shut down before they are killed
RESTART_HINT = "`%cluster restart`"
# ipyparallel's own engine log lines and gloo's connection notices: not what killed a process.
# A native stack trace's frames say nothing to the user either.
_LOG_NOISE = re.compile(
    r"\[(IPEngine|KernelNanny)(\.\d+)?\]|^\[Gloo\]|^\s*@\s+0x[0-9a-f]+|^\*\*\* Check failure stack"
)
_GLOO_NOTICE = re.compile(r"^\[Gloo\] Rank \d+ is connected to \d+ peer ranks")
FOLDER_PREFIX = "shardlab-cluster-"
OWNER_FILE = "owner.json"  # {"pid", "started"} of the kernel that made the folder
# A folder with no owner record (made by an older shardlab, or being made right now) is a
# leftover once it is this old.
UNOWNED_AGE_S = 24 * 3600


class ClusterError(RuntimeError):
    """A cluster that cannot start, is not running, or failed."""

    def _render_traceback_(self) -> list[str]:
        """What IPython shows instead of a traceback through the cluster's internals."""
        return [f"\x1b[31m{type(self).__name__}\x1b[0m: {self}"]


class ProcessFailed(ClusterError):
    """A process of the cluster died or hung: the whole cluster is stopped.

    ``at`` is when the kernel noticed (``time.time()``); ``during_cell``, whether a cell was
    waiting on the cluster then (it raised this error; otherwise the next call does, through
    :meth:`earlier`).
    """

    process_id: int

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.at = time.time()
        self.during_cell = False

    def __copy__(self) -> ProcessFailed:
        twin = type(self).__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin.args = self.args
        return twin

    def when(self) -> str:
        return time.strftime("%H:%M:%S", time.localtime(self.at))

    def earlier(self) -> ProcessFailed:
        """This failure as a later cell is told it: when it happened, and that it is old."""
        ago = max(0.0, time.time() - self.at)
        during = "during an earlier cell" if self.during_cell else "while no cell ran on it"
        twin = copy.copy(self)
        twin.args = (f"earlier, at {self.when()} ({ago:.0f} s ago, {during}): {self}",)
        return twin


def _consequence_text(consequences: Sequence[tuple[int, int | None]]) -> str:
    """``; JAX's runtime then aborted process 0 (SIGABRT) as a consequence``."""
    if not consequences:
        return ""
    how = {_exit_text(code) for _, code in consequences}
    if len(how) == 1:  # processes 0, 2 (killed by SIGABRT)
        named = ", ".join(str(p) for p, _ in consequences) + how.pop()
    else:
        named = ", ".join(f"{p}{_exit_text(code)}" for p, code in consequences)
    which = "process" if len(consequences) == 1 else "processes"
    return f"; JAX's runtime then aborted {which} {named} as a consequence"


class ProcessDied(ProcessFailed):
    """An engine process exited: the whole cluster is stopped."""

    def __init__(
        self,
        process_id: int,
        exit_code: int | None,
        log_tail: str = "",
        *,
        consequences: Sequence[tuple[int, int | None]] = (),
    ) -> None:
        self.process_id = process_id
        self.exit_code = exit_code
        self.log_tail = log_tail
        how = _exit_text(exit_code)
        text = (
            f"process {process_id} died{how}{_consequence_text(consequences)}; the cluster is "
            f"stopped; {RESTART_HINT}"
        )
        if log_tail:
            text += f"\nlast lines of process {process_id}'s log:\n{log_tail}"
        super().__init__(text)


class ProcessHung(ProcessFailed):
    """An engine stopped answering its heartbeat (stopped, frozen): the cluster is stopped.

    The processes JAX's runtime aborted because of it are ``consequences`` (process id, exit
    code), not deaths of their own.
    """

    def __init__(
        self,
        process_id: int,
        pid: int,
        silent_s: float,
        *,
        state: str = "",
        consequences: Sequence[tuple[int, int | None]] = (),
    ) -> None:
        self.process_id = process_id
        self.pid = pid
        self.silent_s = silent_s
        self.consequences = tuple(consequences)
        why = f" ({state})" if state else ""
        super().__init__(
            f"process {process_id} (pid {pid}) hung: it stopped answering for {silent_s:.1f} s"
            f"{why}{_consequence_text(consequences)}; the cluster is stopped; {RESTART_HINT}"
        )


class CellTimeout(ClusterError):
    """A cell ran past its timeout on some processes (a stuck collective, a hang)."""


def _exit_text(code: int | None) -> str:
    if code is None:
        return ""
    if code < 0:
        try:
            return f" (killed by {signal.Signals(-code).name})"
        except ValueError:
            return f" (killed by signal {-code})"
    return f" (exit code {code})"


@dataclass(frozen=True)
class ProcessInfo:
    """One engine of the cluster, as it describes itself (:func:`.worker.describe`)."""

    process_id: int
    engine_id: int
    pid: int
    platform: str
    local_devices: tuple[int, ...]
    global_devices: int
    live_bytes: int
    rss: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ClusterStatus:
    """What ``%cluster status`` shows."""

    state: str  # "running", "stopped" or "died"
    processes: tuple[ProcessInfo, ...] = ()
    coordinator: str = ""
    devices: tuple[str, ...] = ()  # per process: cpu:4, gpu:0 ...
    message: str = ""  # why it stopped, for "died"
    listeners: tuple[str, ...] = ()  # ip:port of every listening socket of the cluster

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        if self.state != "running":
            head = f"cluster: {self.state}"
            return head + (f" — {self.message}" if self.message else "")
        lines = [
            f"cluster: running, {len(self.processes)} processes, coordinator {self.coordinator}, "
            f"{self.processes[0].global_devices if self.processes else 0} devices",
        ]
        for info in self.processes:
            devices = ",".join(map(str, info.local_devices))
            lines.append(
                f"  process {info.process_id}: pid {info.pid}, {self.devices[info.process_id]} "
                f"({info.platform} devices {devices}), live {info.live_bytes:,} bytes, "
                f"rss {info.rss / 2**20:.0f} MiB"
            )
        return "\n".join(lines)


@dataclass(frozen=True)
class ProcessOutput:
    """What one process's run of a cell produced."""

    process_id: int
    stdout: str = ""
    stderr: str = ""
    outputs: tuple[dict[str, Any], ...] = ()  # display_data contents (data, metadata)
    result: dict[str, Any] | None = None  # the execute_result content, if any
    error: tuple[str, str, str] | None = None  # ename, evalue, traceback text


@dataclass
class _Engine:
    process_id: int
    engine_id: int
    launcher: Any  # ipyparallel's LocalEngineLauncher
    devices: str
    pid: int = 0
    heartbeat_port: int = 0  # where it echoes the kernel's pings (worker.start_heartbeat)


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 now (the coordinator binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def device_sets(
    n: int, *, devices_per_process: int | None = None, gpus: str | None = None
) -> list[str]:
    """Each process's device set: ``cpu:4`` each, or its share of ``gpus``.

    ``gpus``: ``0,1,2,3`` (split in order, the same number to each process) or
    ``per-process`` (process ``i`` sees GPU ``i``).
    """
    if n < 1:
        raise ClusterError(f"-n {n}: a cluster needs at least 1 process")
    if gpus is None:
        count = 1 if devices_per_process is None else devices_per_process
        if count < 1:
            raise ClusterError(f"--devices-per-process {count}: give 1 or more")
        return [f"cpu:{count}"] * n
    if devices_per_process is not None:
        raise ClusterError("give --devices-per-process (CPU) or --gpus, not both")
    if gpus == "per-process":
        return [f"gpu:{i}" for i in range(n)]
    try:
        ids = [int(g) for g in gpus.split(",")]
    except ValueError:
        raise ClusterError(f"--gpus {gpus!r}: use a list such as 0,1 or per-process") from None
    if len(ids) % n:
        raise ClusterError(
            f"--gpus {gpus}: {len(ids)} GPUs do not split evenly over {n} processes; "
            f"give a multiple of {n} GPUs, or --gpus per-process"
        )
    each = len(ids) // n
    return ["gpu:" + ",".join(map(str, ids[i * each : (i + 1) * each])) for i in range(n)]


@dataclass
class LocalCluster:
    """``n`` engines on this host, each one JAX process of one distributed runtime.

    Args:
        n: number of processes.
        devices: each process's device set (:func:`device_sets`).
        init_timeout_s: how long processes wait for each other at start.
        heartbeat_timeout_s: after how long without heartbeats JAX declares a peer dead,
            and the watcher here an engine hung (it is faster for a process that exits).
        engine_timeout_s: how long to wait for the engines to register.
    """

    n: int
    devices: Sequence[str]
    init_timeout_s: int = 30
    heartbeat_timeout_s: int = 10
    engine_timeout_s: int = 60
    coordinator: str = ""
    _cluster: Any = None
    _client: Any = None
    _view: Any = None
    _engines: list[_Engine] = field(default_factory=list)
    _helpers: list[int] = field(default_factory=list)  # the engines' own children (nannies)
    _profile_dir: str = ""
    _death: ProcessFailed | None = None
    _waiting: int = 0  # calls waiting on the engines now (a cell, a setup, a status)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _watcher: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # Told the death message from the watcher thread, as soon as it is known.
    on_death: Callable[[str], None] | None = None

    @property
    def running(self) -> bool:
        return self._client is not None and self._death is None

    # -- start and stop -------------------------------------------------------------------
    def start(self) -> ClusterStatus:
        """Starts the controller and engines and joins them into one JAX runtime."""
        import ipyparallel as ipp

        if len(self.devices) != self.n:
            raise ClusterError(f"{len(self.devices)} device sets for {self.n} processes")
        sweep_leftovers()
        self._profile_dir = make_folder()
        atexit.register(self._at_exit)
        os.makedirs(os.path.join(self._profile_dir, "log"), exist_ok=True)
        self._cluster = ipp.Cluster(
            n=self.n,
            parent=None,
            profile_dir=self._profile_dir,
            load_profile=False,
            controller_ip="127.0.0.1",
            controller_location="127.0.0.1",
            engine_timeout=self.engine_timeout_s,
            # ipyparallel logs a stopped engine's whole output at WARNING; the death message
            # here quotes what matters (engine logs are in the profile dir until stop)
            log_level=logging.ERROR,
            shutdown_atexit=False,  # stop() and an atexit hook here kill by pid
        )
        try:
            watched = [sys.executable, "-m", "shardlab.cluster.watched"]
            watched += ["--owned-folder", self._profile_dir]
            self._cluster.start_controller_sync(controller_cmd=[*watched, "ipyparallel.controller"])
            self._cluster.start_engines_sync(n=self.n, engine_cmd=[*watched, "ipyparallel.engine"])
            self._client = self._cluster.connect_client_sync()
            self._client.wait_for_engines(self.n, timeout=self.engine_timeout_s, interactive=False)
            self._join()
        except BaseException:
            self._kill_all()
            self._cleanup()
            raise
        self._watcher = threading.Thread(target=self._watch, name="shardlab-cluster-watch")
        self._watcher.daemon = True
        self._watcher.start()
        return self.status()

    def _join(self) -> None:
        """Maps engines to process ids and initialises ``jax.distributed`` on all of them."""
        client = self._client
        engine_ids = sorted(client.ids)[: self.n]
        pids = {eid: client[eid].apply_sync(os.getpid) for eid in engine_ids}
        launchers = {
            el.pid: el
            for engine_set in self._cluster.engines.values()
            for el in engine_set.launchers.values()
        }
        self._engines = [
            _Engine(rank, eid, launchers.get(pids[eid]), self.devices[rank])
            for rank, eid in enumerate(engine_ids)
        ]
        self._helpers = _children([e.launcher.pid for e in self._engines if e.launcher])
        self._view = client[engine_ids]
        self._view.block = False
        self.coordinator = f"127.0.0.1:{free_loopback_port()}"
        results = []
        for engine in self._engines:
            results.append(
                client[engine.engine_id].apply_async(
                    _initialize_remote,
                    process_id=engine.process_id,
                    num_processes=self.n,
                    coordinator=self.coordinator,
                    devices=engine.devices,
                    init_timeout_s=self.init_timeout_s,
                    heartbeat_timeout_s=self.heartbeat_timeout_s,
                )
            )
        deadline = time.monotonic() + self.init_timeout_s + 30
        for engine, result in zip(self._engines, results, strict=True):
            remaining = deadline - time.monotonic()
            try:
                joined = result.get(timeout=max(remaining, 1))
                engine.pid = int(joined["pid"])
                engine.heartbeat_port = int(joined["heartbeat_port"])
            except Exception as error:
                raise ClusterError(
                    f"process {engine.process_id} could not join the JAX runtime at "
                    f"{self.coordinator}: {_short(error)}\n{self._log_tail(engine)}"
                ) from None

    def execute(self, code: str, *, timeout_s: float = 60) -> None:
        """Runs setup ``code`` on every engine (silently), raising on the first error."""
        self._check()
        result = self._view.execute(code, silent=True, block=False)
        self._wait(result, timeout_s=timeout_s)
        outputs = self._outputs(result)
        failed = [o for o in outputs if o.error is not None]
        if failed:
            first = failed[0]
            assert first.error is not None
            raise ClusterError(f"process {first.process_id}: {first.error[0]}: {first.error[1]}")

    def stop(self) -> None:
        """Stops engines and controller; leaves no process behind.

        A live cluster is asked to shut down (engines first, then the controller); what is
        still there after :data:`STOP_GRACE_S` is killed. ipyparallel's own ``stop_cluster``
        is not used: it waits on engines that may already be gone.
        """
        self._stopping.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=5)
        if self._death is None and self._client is not None:
            # leave the JAX runtime together first: a process exiting alone waits at JAX's
            # shutdown barrier for the others
            with contextlib.suppress(Exception):
                self._view.apply_async(_shutdown_remote).get(timeout=STOP_GRACE_S)
            with contextlib.suppress(Exception):
                self._client.shutdown(targets="all", hub=True, block=False)
            deadline = time.monotonic() + STOP_GRACE_S
            while time.monotonic() < deadline and any(_running(p) for p in self.pids()):
                time.sleep(0.05)
        self._kill_all()
        self._cleanup()

    def _cleanup(self) -> None:
        with contextlib.suppress(Exception):
            if self._client is not None:
                self._client.close()
        self._client = None
        self._remove_folder()
        atexit.unregister(self._at_exit)

    def _remove_folder(self) -> None:
        if self._profile_dir:
            shutil.rmtree(self._profile_dir, ignore_errors=True)

    def _at_exit(self) -> None:
        """The kernel exits (a shutdown, the end of a script): nothing of the cluster stays."""
        self._kill_all()
        self._remove_folder()

    def pids(self) -> list[int]:
        """The engines' and the controller's process ids."""
        found = [e.launcher.pid for e in self._engines if e.launcher is not None]
        found += self._helpers
        controller = getattr(self._cluster, "controller", None)
        if controller is not None and getattr(controller, "pid", None):
            found.append(controller.pid)
        return found

    def _kill_all(self) -> None:
        """SIGKILLs every process of the cluster that is still there (by pid, no names)."""
        import psutil

        for pid in self.pids():
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(pid)
                for child in process.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        child.kill()
                process.kill()
        for pid in self.pids():
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).wait(timeout=5)

    # -- health ---------------------------------------------------------------------------
    def _watch(self) -> None:
        """Every :data:`POLL_S`: which engines exited, and how long each has not answered its
        heartbeat; :func:`.health.blame` says whether that stops the cluster, and whom."""
        heartbeats = None
        if all(e.heartbeat_port for e in self._engines):
            with contextlib.suppress(Exception):
                heartbeats = Heartbeats([e.heartbeat_port for e in self._engines])
        try:
            while not self._stopping.wait(POLL_S):
                if heartbeats is not None:
                    heartbeats.beat()
                verdict, exits = self._verdict(heartbeats)
                if verdict is not None:
                    self._fail(verdict, exits)
                    return
        finally:
            if heartbeats is not None:
                heartbeats.close()

    def _verdict(
        self, heartbeats: Heartbeats | None
    ) -> tuple[Verdict | None, dict[int, int | None]]:
        exits: dict[int, int | None] = {}
        for index, engine in enumerate(self._engines):
            code = _exit_code(engine.launcher)
            if code is not False:
                exits[index] = None if code is None else int(code)
        silent = heartbeats.silent_s() if heartbeats is not None else [0.0] * len(self._engines)
        aborted: set[int] = set()
        named: set[int] = set()
        for index in exits:
            by_jax, names = read_jax_abort(self._log_text(self._engines[index]))
            if by_jax:
                aborted.add(index)
                if exits[index] is None:  # reaped elsewhere; JAX's runtime aborts
                    exits[index] = -int(signal.SIGABRT)
            named.update(names)
        verdict = blame(
            exits,
            silent,
            hang_after_s=self.heartbeat_timeout_s,
            # a running engine this quiet when another is aborted is why: the runtime aborts
            # only after a heartbeat timeout, and an answer normally comes within a beat
            evidence_s=max(2 * POLL_S, min(1.0, self.heartbeat_timeout_s / 4)),
            aborted_by_jax=frozenset(aborted),
            named_by_jax=frozenset(i for i in named if i < len(self._engines)) - exits.keys(),
        )
        return verdict, exits

    def _fail(self, verdict: Verdict, exits: dict[int, int | None]) -> None:
        """Records what stopped the cluster and kills what is left of it."""
        engine = self._engines[verdict.culprit]
        consequences = [(self._engines[i].process_id, exits[i]) for i in verdict.consequences]
        error: ProcessFailed
        if verdict.hung:
            error = ProcessHung(
                engine.process_id,
                engine.pid or (engine.launcher.pid if engine.launcher else 0),
                verdict.silent_s,
                state=process_state(engine.pid) if engine.pid else "",
                consequences=consequences,
            )
        else:
            error = ProcessDied(
                engine.process_id,
                exits.get(verdict.culprit),
                self._log_tail(engine),
                consequences=consequences,
            )
        with self._lock:
            if self._death is not None:
                return
            error.during_cell = self._waiting > 0
            self._death = error
        self._stopping.set()
        self._kill_all()
        if self.on_death is not None:
            with contextlib.suppress(Exception):
                self.on_death(str(error).splitlines()[0])

    def _check(self) -> None:
        """Raises what stopped the cluster, if anything did (saying when: it is older than the
        call that is told)."""
        if self._death is not None:
            raise self._death.earlier()
        if self._client is None:
            raise ClusterError(f"the cluster is stopped; {RESTART_HINT}")

    @property
    def died(self) -> ProcessFailed | None:
        """What stopped the cluster: a process that died or hung (None while it runs)."""
        return self._death

    def _log_text(self, engine: _Engine) -> str:
        launcher = engine.launcher
        path = getattr(launcher, "output_file", "") if launcher is not None else ""
        try:
            with open(path, errors="replace") as log:
                return log.read()
        except OSError:
            return ""

    def _log_tail(self, engine: _Engine, lines: int = 6) -> str:
        text = self._log_text(engine)
        wanted = [
            line for line in text.splitlines() if line.strip() and not _LOG_NOISE.search(line)
        ]
        return "\n".join("  " + line for line in wanted[-lines:])

    # -- running cells --------------------------------------------------------------------
    def run(
        self,
        code: str,
        *,
        timeout_s: float | None = None,
        on_stdout: Callable[[int, str], None] | None = None,
        interrupt_grace_s: float = 3.0,
    ) -> list[ProcessOutput]:
        """Runs ``code`` on every process (as a cell: its last expression is its result).

        ``on_stdout(process_id, text)`` is called with output as it arrives. With
        ``timeout_s``, a cell still running then stops the cluster (see :meth:`_wait`).

        Raises:
            ProcessDied: an engine exited before or while the cell ran.
            CellTimeout: the cell ran past ``timeout_s``.
        """
        self._check()
        result = self._view.execute(code, silent=False, block=False)
        self._wait(result, timeout_s=timeout_s, on_stdout=on_stdout, grace_s=interrupt_grace_s)
        return self._outputs(result)

    def _wait(
        self,
        result: Any,
        *,
        timeout_s: float | None,
        on_stdout: Callable[[int, str], None] | None = None,
        grace_s: float = 3.0,
    ) -> None:
        started = time.monotonic()
        seen = [0] * len(self._engines)
        with self._lock:
            self._waiting += 1
        try:
            while True:
                done = result.ready()
                if on_stdout is not None:
                    for i, text in enumerate(result.stdout):
                        if len(text) > seen[i]:
                            self._emit(on_stdout, i, text, seen)
                if done:
                    with contextlib.suppress(Exception):
                        result.wait_for_output(timeout=2)
                    if on_stdout is not None:
                        for i, text in enumerate(result.stdout):
                            if len(text) > seen[i]:
                                tail = "" if text.endswith("\n") else "\n"
                                self._emit(on_stdout, i, text + tail, seen)
                    return
                if self._death is not None:
                    raise self._death
                elapsed = time.monotonic() - started
                if timeout_s is not None and elapsed > timeout_s:
                    # Interrupting is not safe: a collective interrupted on one process stays
                    # pending in the runtime and pairs with the next one its peers start
                    # (measured: a sum came back 20.0 instead of 24.0). So the cluster stops.
                    names = ", ".join(str(p) for p in self._unanswered(result))
                    self._stopping.set()
                    self._kill_all()
                    self._client = None
                    raise CellTimeout(
                        f"the cell ran past its timeout of {timeout_s:g} s: process(es) "
                        f"{names} had not finished (a hang, or a collective waiting for a "
                        f"peer); the cluster is stopped; {RESTART_HINT}"
                    )
                result.wait(timeout=0.1)
        except KeyboardInterrupt:
            # The user interrupted the notebook: interrupt the engines too. A collective
            # interrupted on some processes only leaves the runtime inconsistent (see above).
            self._signal(self._unanswered(result), signal.SIGINT)
            with contextlib.suppress(Exception):
                result.wait(timeout=grace_s)
            print(
                "[shardlab] the engines were interrupted too; if the cell was inside a "
                f"collective, later results may be wrong: {RESTART_HINT}",
                file=sys.stderr,
            )
            raise
        finally:
            with self._lock:
                self._waiting -= 1

    def _emit(
        self, on_stdout: Callable[[int, str], None], i: int, text: str, seen: list[int]
    ) -> None:
        """Passes on process ``i``'s new complete lines (a partial line waits for its end)."""
        end = text.rfind("\n", seen[i]) + 1
        if end <= seen[i]:
            return
        chunk = clean_stdout(text[seen[i] : end])
        seen[i] = end
        if chunk:
            on_stdout(self._engines[i].process_id, chunk)

    def _unanswered(self, result: Any) -> list[int]:
        waiting = []
        for engine, child in zip(self._engines, getattr(result, "_children", []), strict=False):
            if not child.done():
                waiting.append(engine.process_id)
        return waiting or [e.process_id for e in self._engines]

    def _signal(self, process_ids: Sequence[int], signum: int) -> None:
        for engine in self._engines:
            if engine.process_id in process_ids and engine.launcher is not None:
                with contextlib.suppress(Exception):
                    os.kill(engine.launcher.pid, signum)

    def _outputs(self, result: Any) -> list[ProcessOutput]:
        outputs = []
        for engine, meta in zip(self._engines, result._metadata, strict=True):
            error = None
            raw = meta.get("error")
            if raw is not None:
                error = (
                    getattr(raw, "ename", type(raw).__name__),
                    getattr(raw, "evalue", str(raw)),
                    getattr(raw, "traceback", "") or "",
                )
            outputs.append(
                ProcessOutput(
                    process_id=engine.process_id,
                    stdout=clean_stdout(meta.get("stdout", "")),
                    stderr=meta.get("stderr", ""),
                    outputs=tuple(meta.get("outputs", ())),
                    result=meta.get("execute_result"),
                    error=error,
                )
            )
        return outputs

    def pull(self, name: str, *, process_id: int = 0) -> Any:
        """The value of ``name`` in process ``process_id``'s namespace (pickled across)."""
        self._check()
        engine = self._engines[process_id]
        pulled = self._client[engine.engine_id].pull(name, block=False)
        self._wait(pulled, timeout_s=None)  # raises if the process dies or hangs meanwhile
        return pulled.get()

    # -- status ---------------------------------------------------------------------------
    def status(self) -> ClusterStatus:
        if self._death is not None:
            state = "stopped" if isinstance(self._death, ProcessHung) else "died"
            first = str(self._death).splitlines()[0]
            return ClusterStatus(state, message=f"at {self._death.when()}: {first}")
        if self._client is None:
            return ClusterStatus("stopped")
        described = self._view.apply_async(_describe_remote)
        self._wait(described, timeout_s=30)
        infos = [
            ProcessInfo(
                process_id=d["process_id"],
                engine_id=engine.engine_id,
                pid=d["pid"],
                platform=d["platform"],
                local_devices=tuple(d["local_devices"]),
                global_devices=d["global_devices"],
                live_bytes=d["live_bytes"],
                rss=d["rss"],
            )
            for engine, d in zip(self._engines, described.get(), strict=True)
        ]
        return ClusterStatus(
            "running",
            processes=tuple(infos),
            coordinator=self.coordinator,
            devices=tuple(self.devices),
            listeners=tuple(listeners(self.pids())),
        )


def make_folder() -> str:
    """A new cluster folder (private to this user, as ``mkdtemp`` makes it) recording which
    process owns it."""
    import psutil

    path = tempfile.mkdtemp(prefix=FOLDER_PREFIX)
    me = psutil.Process()
    with open(os.path.join(path, OWNER_FILE), "w") as record:
        json.dump({"pid": me.pid, "started": me.create_time()}, record)
    return path


def folder_owner_alive(path: str) -> bool | None:
    """Whether the process that made the cluster folder ``path`` still runs (the same
    process: its pid and start time); None when the folder has no owner record."""
    import psutil

    try:
        with open(os.path.join(path, OWNER_FILE)) as record:
            owner = json.load(record)
        pid, started = int(owner["pid"]), float(owner["started"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        process = psutil.Process(pid)
        return (
            abs(process.create_time() - started) < 1.0 and process.status() != psutil.STATUS_ZOMBIE
        )
    except psutil.Error:
        return False


def sweep_leftovers(root: str | None = None) -> list[str]:
    """Removes this user's cluster folders under ``root`` (the temporary folder) whose kernel
    is gone — killed, so that no clean-up ran — and returns their paths. Folders of running
    kernels, other users' folders and links are left alone."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        names = [n for n in os.listdir(root) if n.startswith(FOLDER_PREFIX)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(root, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        getuid = getattr(os, "getuid", None)
        if not stat.S_ISDIR(info.st_mode) or (getuid is not None and info.st_uid != getuid()):
            continue
        alive = folder_owner_alive(path)
        if alive is None:
            alive = time.time() - info.st_mtime < UNOWNED_AGE_S
        if not alive:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def listeners(pids: Sequence[int]) -> list[str]:
    """``ip:port`` of every listening TCP socket of the processes ``pids``."""
    import psutil

    found = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            for conn in psutil.Process(pid).net_connections("inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append(f"{conn.laddr.ip}:{conn.laddr.port}")
    return sorted(found)


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _children(pids: Sequence[int]) -> list[int]:
    import psutil

    found = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            found += [c.pid for c in psutil.Process(pid).children(recursive=True)]
    return found


def clean_stdout(text: str) -> str:
    """Drops gloo's connection notices, which its C++ code prints on every engine."""
    if "[Gloo]" not in text:
        return text
    return "".join(line for line in text.splitlines(True) if not _GLOO_NOTICE.match(line))


def _exit_code(launcher: Any) -> int | bool | None:
    """False while the engine process runs; else its exit code (negative: signal), or
    None when unknown."""
    if launcher is None:
        return False
    process = launcher.process
    try:
        if process.is_running() and process.status() != "zombie":
            return False
    except Exception:
        pass
    try:
        return process.wait(timeout=0)
    except Exception:
        return None


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[-1] if text else type(error).__name__


# These two run on the engines (ipyparallel pickles them by reference to this module).
def _initialize_remote(**kwargs: Any) -> dict[str, Any]:
    from shardlab.cluster import worker

    return worker.initialize(**kwargs)


def _shutdown_remote() -> None:
    import jax

    jax.distributed.shutdown()


def _describe_remote() -> dict[str, Any]:
    from shardlab.cluster import worker

    return worker.describe()


__all__ = [
    "CellTimeout",
    "ClusterError",
    "ClusterStatus",
    "LocalCluster",
    "ProcessDied",
    "ProcessFailed",
    "ProcessHung",
    "ProcessInfo",
    "ProcessOutput",
    "device_sets",
    "free_loopback_port",
    "listeners",
    "sweep_leftovers",
]
