"""The status record and the ``shardlab`` comm that carries it to the front end.

A front end (the lab extension, a test) opens a comm with target ``shardlab``; the kernel
answers at once with the status record and sends it again after every cell that changed it
(mode, devices, mesh, arrays or per-device bytes; the execution count, durations and the
history alone do not count, so trivial cells cost no message).

Requests on the comm (each gets exactly one reply; a reply echoes the request's ``id``):

======================================  =================================================
``{"request": "status"}``               ``{"type": "status", "status": record}``
``{"request": "release"}``              ``{"type": "release", "text", "before", "after"}``
                                        (device bytes, all devices), then a status
``{"request": "set_default_mode",``     ``{"type": "status", ...}`` with the new default
``"mode": "eager"|"jit"|"graph"}``
``{"request": "switch_devices",``       ``{"type": "devices", "ok", "text"}``, then a status;
``"spec": "cpu:4"}``                    GPU sets cannot change in a running kernel: ok is
                                        false and the text gives the kernelspec command
anything else                           ``{"type": "error", "request", "message"}``
======================================  =================================================

"Then a status" goes to every open comm. The record: default mode, last effective mode,
devices, per-device live bytes, the active mesh, the target planned for (``%target``), the
largest named arrays, the last cells'
modes and ``memory_history``, per-device live bytes over time (``engine/resources/memory_history.py``,
recorded from the first comm on; at most ``MAX_SENT`` samples with the newest markers, or
None before; volatile like the history, so it rides along when something else changed). The arrays are computed only while a comm is open, over a bounded walk.

``comm_info_request`` lists open comms, not registered targets, so the kernel also keeps one
dormant comm with target ``shardlab`` (it sends nothing): a front end asks
``comm_info(target_name="shardlab")`` and opens its comm only where that lists one, which a
stock kernel without ``%load_ext shardlab`` never does.

A :class:`StatusChannel` belongs to one session, which it is given; the session only sees it
as its ``status`` sink (``session.py`` does not import this module).
"""

from __future__ import annotations

import json
import math
import os
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardlab.kernel.session import ShardlabSession

TARGET = "shardlab"
REQUESTS = ("status", "release", "set_default_mode", "switch_devices")
MAX_ARRAYS = 10
MAX_HISTORY = 10
# Fields that change with every cell: a record that differs only in these is not re-sent.
VOLATILE = ("execution_count", "last_duration_s", "last_mode_source", "history", "memory_history")


def mesh_shape(namespace: dict[str, Any] | None) -> dict[str, int] | None:
    """The active mesh as ``{axis: size}``: the one set with ``jax.set_mesh``, else the
    last ``Mesh`` bound to a name in ``namespace``; None when there is neither."""
    import jax
    from jax.sharding import Mesh

    try:
        abstract = jax.sharding.get_abstract_mesh()
        if abstract is not None and not abstract.empty:
            return {str(k): int(v) for k, v in dict(abstract.shape).items()}
    except Exception:
        pass
    found = None
    for name, value in (namespace or {}).items():
        if isinstance(value, Mesh) and not name.startswith("_"):
            found = value
    if found is None:
        return None
    return {str(k): int(v) for k, v in dict(found.shape).items()}


def target_info(namespace: dict[str, Any] | None) -> dict[str, Any] | None:
    """The machine being planned for: the ``%target`` in effect, else the target of the mesh
    the status shows (one made with ``devices=shardlab.target(...)``); None for this
    kernel's own devices."""
    from shardlab.parallel.targets.target import default_target, target_of

    found = default_target()
    if found is None:
        from jax.sharding import Mesh

        meshes = [v for k, v in (namespace or {}).items() if isinstance(v, Mesh) and k[:1] != "_"]
        found = target_of(meshes[-1]) if meshes else None
    if found is None:
        return None
    return {
        "kind": found.kind,
        "label": found.label,
        "count": found.device_count,
        "description": found.description,
    }


def sharding_text(array: Any) -> str:
    """A short description of an array's sharding: ``P('data', None) on 2×4``, ``1 device``."""
    sharding = array.sharding
    spec = getattr(sharding, "spec", None)
    mesh = getattr(sharding, "mesh", None)
    if spec is not None and mesh is not None:
        inner = ", ".join(repr(p) for p in tuple(spec))
        sizes = "×".join(str(int(s)) for s in dict(mesh.shape).values())
        return f"P({inner}) on {sizes}"
    count = len(sharding.device_set)
    return "1 device" if count == 1 else f"{count} devices"


def largest_arrays(namespace: dict[str, Any] | None, limit: int = MAX_ARRAYS) -> list[dict]:
    """Up to ``limit`` of the largest arrays that names in ``namespace`` hold, largest first
    (by bytes per device)."""
    import jax

    from shardlab.engine.resources import live_memory as memory

    names = memory.array_names(namespace)
    rows = []
    for array in jax.live_arrays():
        name = names.get(id(array))
        if name is None:
            continue
        try:
            if array.is_deleted():
                continue
            rows.append(
                {
                    "name": name,
                    "shape": [int(s) for s in array.shape],
                    "dtype": str(array.dtype),
                    "sharding": sharding_text(array),
                    "bytes_per_device": int(memory.shard_nbytes(array)),
                }
            )
        except Exception:  # deleted between listing and reading
            continue
    rows.sort(key=lambda row: (-row["bytes_per_device"], row["name"]))
    return rows[:limit]


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def status_record(session: ShardlabSession, *, details: bool = True) -> dict[str, Any]:
    """The status record as a JSON-able dict (``details=False``: no arrays list)."""
    import jax

    from shardlab.engine.resources import live_memory as memory

    devices = jax.devices()
    last = session.history[-1] if session.history else None
    shell = session.shell
    namespace = getattr(shell, "user_ns", None) if shell is not None else None
    history = list(session.history)[-MAX_HISTORY:]
    bytes_per_device = memory.live_bytes_per_device()
    return {
        "version": 1,
        "default_mode": session.default_mode,
        "last_mode": last.mode if last else None,
        "last_mode_source": last.source if last else None,
        "execution_count": last.execution_count if last else None,
        "last_duration_s": _finite(last.duration_s) if last else None,
        "devices": {
            "platform": devices[0].platform if devices else None,
            "count": len(devices),
            "kinds": sorted({d.device_kind for d in devices}),
            "pinned": os.environ.get("SHARDLAB_DEVICES"),
        },
        "bytes_per_device": bytes_per_device,
        "mesh": mesh_shape(namespace),
        "target": target_info(namespace),
        "largest_arrays": largest_arrays(namespace) if details else [],
        "history": [
            {
                "execution_count": item.execution_count,
                "mode": item.mode,
                "source": item.source,
                "duration_s": _finite(item.duration_s),
            }
            for item in history
        ],
        "memory_history": memory_over_time(shell, bytes_per_device),
    }


def memory_over_time(shell: Any, bytes_per_device: dict[str, int]) -> dict[str, Any] | None:
    """The shell's memory recorder in its compact form (``MAX_SENT`` samples at most), ending
    at ``bytes_per_device``; None while no recorder is active."""
    from shardlab.engine.resources import memory_history

    found = memory_history.existing(shell) if shell is not None else None
    if found is None:
        return None
    found.sample_if_changed(bytes_per_device)
    return found.compact()


class RequestError(ValueError):
    """A request that cannot be served; the message names the valid requests or values."""


class StatusChannel:
    """Open ``shardlab`` comms of one session."""

    def __init__(self, session: ShardlabSession) -> None:
        self.session = session
        self.comms: list[Any] = []
        self._last_key: str | None = None
        self._beacon: Any = None

    def register_target(self) -> None:
        """Lets front ends open ``shardlab`` comms to this session's kernel, and advertises
        the target to ``comm_info`` requests through a dormant comm."""
        kernel = getattr(self.session.shell, "kernel", None)
        manager = getattr(kernel, "comm_manager", None)
        if manager is None:  # a terminal IPython: no front end to talk to
            return
        manager.register_target(TARGET, self._on_open)
        try:
            from comm import create_comm

            beacon = create_comm(
                target_name=TARGET, primary=False, comm_id=f"shardlab-target-{uuid.uuid4().hex}"
            )
            manager.register_comm(beacon)
            self._beacon = beacon
        except Exception as error:  # front ends then find no target; cells are unaffected
            self.session.log.warning("shardlab comm target not advertised: %s", error)

    def _on_open(self, comm: Any, message: dict[str, Any]) -> None:
        self.comms.append(comm)
        if self.session.shell is not None:  # the panel's memory over time, from now on
            from shardlab.engine.resources import memory_history

            memory_history.recorder(self.session.shell).activate()

        def on_msg(msg: dict[str, Any]) -> None:
            data = msg.get("content", {}).get("data", {})
            self.handle(comm, data)

        def on_close(msg: dict[str, Any]) -> None:
            if comm in self.comms:
                self.comms.remove(comm)

        comm.on_msg(on_msg)
        comm.on_close(on_close)
        self._send_to(comm)

    # -- requests --------------------------------------------------------------------------
    def handle(self, comm: Any, data: Any) -> None:
        """Answers one request from ``comm``; never raises."""
        request_id = data.get("id") if isinstance(data, dict) else None
        request = data.get("request") if isinstance(data, dict) else None
        try:
            if not isinstance(data, dict) or not isinstance(request, str):
                raise RequestError(
                    f"a request is an object with a string 'request' field, one of "
                    f"{', '.join(REQUESTS)}; got {_short(data)}"
                )
            if request == "status":
                self._send_to(comm, request_id=request_id)
            elif request == "release":
                self._release(comm, request_id)
            elif request == "set_default_mode":
                self._set_default_mode(comm, data, request_id)
            elif request == "switch_devices":
                self._switch_devices(comm, data, request_id)
            else:
                raise RequestError(
                    f"unknown request {_short(request)}; valid requests: {', '.join(REQUESTS)}"
                )
        except Exception as error:
            message = str(error) if isinstance(error, RequestError) else _error_text(error)
            self._reply(comm, {"type": "error", "request": request, "message": message}, request_id)

    def _release(self, comm: Any, request_id: Any) -> None:
        from shardlab.kernel.release import release_shell

        report = release_shell(self.session.shell, self.session)
        from shardlab.engine.resources import memory_history

        found = memory_history.existing(self.session.shell)
        if found is not None:
            found.mark("release", "Release (panel)")
        self._reply(
            comm,
            {
                "type": "release",
                "text": report.text(),
                "before": int(sum(report.bytes_before.values())),
                "after": int(sum(report.bytes_after.values())),
            },
            request_id,
        )
        self.send(force=True)

    def _set_default_mode(self, comm: Any, data: dict[str, Any], request_id: Any) -> None:
        from shardlab.engine.modes import MODES, ModeError, parse_mode

        try:
            mode = parse_mode(data.get("mode"), origin="set_default_mode")
        except ModeError as error:
            raise RequestError(f"{error} (valid modes: {', '.join(MODES)})") from None
        self.session.set_default(mode)
        record = status_record(self.session)
        self._send_to(comm, record, request_id=request_id)
        self._broadcast(record, skip=comm)

    def _switch_devices(self, comm: Any, data: dict[str, Any], request_id: Any) -> None:
        from IPython.core.error import UsageError

        from shardlab.engine.resources.devices import DeviceSpecError
        from shardlab.kernel.magics import switch_devices

        spec = data.get("spec")
        if not isinstance(spec, str) or not spec.strip():
            raise RequestError(f"switch_devices needs a 'spec' such as 'cpu:4'; got {_short(spec)}")
        try:
            text = switch_devices(self.session.shell, self.session, spec)
            ok = True
        except (UsageError, DeviceSpecError) as error:
            text, ok = str(error), False
        self._reply(comm, {"type": "devices", "ok": ok, "text": text}, request_id)
        if ok:
            self.send(force=True)

    # -- sending ---------------------------------------------------------------------------
    def _reply(self, comm: Any, message: dict[str, Any], request_id: Any = None) -> None:
        if request_id is not None:
            message = {**message, "id": request_id}
        try:
            comm.send(message)
        except Exception as error:  # a closed comm, an unserialisable id
            self.session.log.warning("shardlab reply not sent: %s", error)

    def _send_to(
        self, comm: Any, record: dict[str, Any] | None = None, *, request_id: Any = None
    ) -> None:
        try:
            record = record or status_record(self.session)
        except Exception as error:  # a status update must never break a cell
            self.session.log.warning("shardlab status not computed: %s", error)
            if request_id is not None:
                self._reply(
                    comm,
                    {"type": "error", "request": "status", "message": _error_text(error)},
                    request_id,
                )
            return
        self._reply(comm, {"type": "status", "status": record}, request_id)

    def _broadcast(self, record: dict[str, Any], *, skip: Any = None) -> None:
        self._last_key = _key(record)
        for comm in list(self.comms):
            if comm is not skip:
                self._send_to(comm, record)

    def send(self, *, force: bool = False) -> None:
        """Sends the status to every open comm if it changed (no-op when none is open)."""
        if not self.comms:
            return
        try:
            record = status_record(self.session)
        except Exception as error:
            self.session.log.warning("shardlab status not computed: %s", error)
            return
        if _key(record) == self._last_key and not force:
            return
        self._broadcast(record)


def _key(record: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in record.items() if k not in VOLATILE}, sort_keys=True)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
