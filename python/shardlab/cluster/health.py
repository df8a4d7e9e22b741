"""Which engine stopped answering, and which deaths only followed from it.

JAX's coordination service declares a process dead when its heartbeats stop (a process stopped
by SIGSTOP or a debugger, frozen, starved) and then aborts every other process (SIGABRT, "the
JAX distributed service detected fatal errors"). Watching exits alone, the first exit seen is
one of those consequences, and the user is told that a healthy process died. So the kernel
keeps its own heartbeat with every engine: each engine echoes pings on a loopback socket from a
thread that does not need Python's GIL (:func:`.worker.start_heartbeat`), as JAX's heartbeat
thread does not, so a cell that holds the GIL is not a hang here either. The engine that stopped
answering first is the culprit; the aborts that follow are consequences (:func:`blame`).

This module imports zmq only inside :class:`Heartbeats` (the kernel has it; a script driving a
cluster needs ipyparallel, which brings it).
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The line JAX's client logs before it aborts its own process because another one failed.
_ABORTED_BY_JAX = re.compile(r"JAX distributed service detected fatal errors")
# "The following tasks are unhealthy (stopped sending heartbeats):\n1\n" (JAX 0.10) or task
# names such as /job:jax_worker/replica:0/task:1 (older versions).
_UNHEALTHY = re.compile(r"stopped sending heartbeats\)?:?(.{0,300}?)(?:The tasks|\[type|$)", re.S)


@dataclass(frozen=True)
class Verdict:
    """What stopped the cluster, by index into its engines.

    ``hung``: the culprit stopped answering (it still exists) rather than exited.
    ``consequences``: engines that exited because of it (JAX's runtime aborted them).
    """

    culprit: int
    hung: bool
    silent_s: float = 0.0
    consequences: tuple[int, ...] = ()


def blame(
    exits: Mapping[int, int | None],
    silent_s: Sequence[float],
    *,
    hang_after_s: float,
    evidence_s: float,
    aborted_by_jax: frozenset[int] = frozenset(),
    named_by_jax: frozenset[int] = frozenset(),
) -> Verdict | None:
    """Who stopped the cluster, if anything did.

    Args:
        exits: engine index -> exit code (negative: the signal) of every engine that exited.
        silent_s: per engine, how long it has not answered its heartbeat.
        hang_after_s: a running engine silent this long is hung (the heartbeat timeout).
        evidence_s: a running engine silent this long when another one is aborted is why.
        aborted_by_jax: exited engines whose log says JAX's runtime aborted them.
        named_by_jax: engines JAX's log names as having stopped sending heartbeats.
    """
    running = [i for i in range(len(silent_s)) if i not in exits]
    if not exits:
        hung = [i for i in running if silent_s[i] >= hang_after_s]
        if not hung:
            return None
        culprit = max(hung, key=lambda i: silent_s[i])
        return Verdict(culprit, True, silent_s[culprit])
    abort = -int(signal.SIGABRT)
    suspects = [i for i in running if silent_s[i] >= evidence_s or i in named_by_jax]
    # An abort is a consequence when JAX says so, or when it is a plain SIGABRT while a
    # running peer has gone quiet; a SIGKILL, an exit code, a segfault never are.
    consequence = {
        i for i, code in exits.items() if i in aborted_by_jax or (code == abort and suspects)
    }
    if suspects and consequence == set(exits):
        culprit = max(suspects, key=lambda i: (i in named_by_jax, silent_s[i]))
        return Verdict(culprit, True, silent_s[culprit], tuple(sorted(exits)))
    causes = sorted(set(exits) - consequence) or sorted(exits)
    culprit = causes[0]
    return Verdict(culprit, False, 0.0, tuple(sorted(consequence - {culprit})))


def read_jax_abort(log_text: str) -> tuple[bool, frozenset[int]]:
    """Whether a log shows JAX's runtime aborting its process, and the process ids it names
    as having stopped sending heartbeats."""
    aborted = bool(_ABORTED_BY_JAX.search(log_text))
    named: set[int] = set()
    for found in _UNHEALTHY.finditer(log_text):
        block = found.group(1)
        ids = re.findall(r"task:(\d+)", block) or re.findall(r"\d+", block)
        named.update(int(i) for i in ids)
    return aborted, frozenset(named)


def process_state(pid: int) -> str:
    """Why a process that exists may not answer, from its scheduler state ('' when no
    reason shows)."""
    import psutil

    try:
        state = psutil.Process(pid).status()
    except psutil.Error:
        return ""
    return {
        psutil.STATUS_STOPPED: "it is stopped: SIGSTOP, Ctrl-Z or a debugger",
        psutil.STATUS_TRACING_STOP: "a debugger holds it stopped",
        psutil.STATUS_DISK_SLEEP: "it is waiting on the disk or a device",
    }.get(state, "")


class Heartbeats:
    """Pings every engine's echo (:func:`.worker.start_heartbeat`) and times the answers.

    One ping is outstanding per engine at any time: :meth:`beat` takes the answers that came
    and sends the next ping to each engine that answered. An engine's silence is the time
    since its last answer arrived. A kernel too busy to call :meth:`beat` for a while does
    not make an engine look silent: the ping it sent before is answered meanwhile, and the
    answer is taken at the next beat. Use from one thread only (zmq sockets).
    """

    def __init__(self, ports: Sequence[int], *, host: str = "127.0.0.1") -> None:
        import zmq

        self._zmq = zmq
        self._context = zmq.Context()
        self._sockets: list[Any] = []
        now = time.monotonic()
        self._answered = [now] * len(ports)  # monotonic time of each engine's last answer
        self._answered_wall = [time.time()] * len(ports)
        self._waiting = [False] * len(ports)
        for port in ports:
            sock = self._context.socket(zmq.DEALER)
            sock.linger = 0
            sock.connect(f"tcp://{host}:{port}")
            self._sockets.append(sock)

    def beat(self) -> None:
        """Takes the answers that arrived, then pings every engine that has answered."""
        zmq = self._zmq
        now, wall = time.monotonic(), time.time()
        for i, sock in enumerate(self._sockets):
            answered = False
            while True:
                try:
                    sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                answered = True
            if answered:
                self._answered[i], self._answered_wall[i] = now, wall
                self._waiting[i] = False
            if not self._waiting[i]:
                try:
                    sock.send(b"ping", zmq.NOBLOCK)
                    self._waiting[i] = True
                except zmq.Again:  # not connected yet: next beat
                    pass

    def silent_s(self) -> list[float]:
        """Per engine, seconds since its last answer."""
        now = time.monotonic()
        return [now - t for t in self._answered]

    def last_answer(self, index: int) -> float:
        """Wall-clock time (``time.time()``) of engine ``index``'s last answer."""
        return self._answered_wall[index]

    def close(self) -> None:
        for sock in self._sockets:
            sock.close(linger=0)
        self._context.term()
