"""The status record and the ``shardlab`` comm that carries it to the front end.

A front end (the lab extension, a test) opens a comm with target ``shardlab``; the kernel
answers at once with the status record and sends it again after every cell that changed it
(mode, devices or per-device bytes; the execution count and duration alone do not count, so
trivial cells cost no message). A message ``{"request": "status"}`` on the comm asks for it
on demand. The record is small: default mode, last effective mode, devices, per-device live
bytes.

A :class:`StatusChannel` belongs to one session, which it is given; the session only sees it
as its ``status`` sink (``session.py`` does not import this module).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .session import ShardlabSession

TARGET = "shardlab"


def status_record(session: ShardlabSession) -> dict[str, Any]:
    """The status record as a JSON-able dict."""
    import jax

    from ..engine import memory

    devices = jax.devices()
    last = session.history[-1] if session.history else None
    return {
        "version": 1,
        "default_mode": session.default_mode,
        "last_mode": last.mode if last else None,
        "last_mode_source": last.source if last else None,
        "execution_count": last.execution_count if last else None,
        "last_duration_s": last.duration_s if last else None,
        "devices": {
            "platform": devices[0].platform if devices else None,
            "count": len(devices),
            "kinds": sorted({d.device_kind for d in devices}),
            "pinned": os.environ.get("SHARDLAB_DEVICES"),
        },
        "bytes_per_device": memory.live_bytes_per_device(),
    }


class StatusChannel:
    """Open ``shardlab`` comms of one session."""

    def __init__(self, session: ShardlabSession) -> None:
        self.session = session
        self.comms: list[Any] = []
        self._last_key: str | None = None

    def register_target(self) -> None:
        """Lets front ends open ``shardlab`` comms to this session's kernel."""
        kernel = getattr(self.session.shell, "kernel", None)
        manager = getattr(kernel, "comm_manager", None)
        if manager is None:  # a terminal IPython: no front end to talk to
            return
        manager.register_target(TARGET, self._on_open)

    def _on_open(self, comm: Any, message: dict[str, Any]) -> None:
        self.comms.append(comm)

        def on_msg(msg: dict[str, Any]) -> None:
            data = msg.get("content", {}).get("data", {})
            if isinstance(data, dict) and data.get("request") == "status":
                self._send_to(comm)

        def on_close(msg: dict[str, Any]) -> None:
            if comm in self.comms:
                self.comms.remove(comm)

        comm.on_msg(on_msg)
        comm.on_close(on_close)
        self._send_to(comm)

    def _send_to(self, comm: Any, record: dict[str, Any] | None = None) -> None:
        try:
            record = record or status_record(self.session)
            comm.send({"type": "status", "status": record})
        except Exception as error:  # a status update must never break a cell
            self.session.log.warning("shardlab status not sent: %s", error)

    def send(self, *, force: bool = False) -> None:
        """Sends the status to every open comm if it changed (no-op when none is open)."""
        if not self.comms:
            return
        try:
            record = status_record(self.session)
        except Exception as error:
            self.session.log.warning("shardlab status not computed: %s", error)
            return
        volatile = ("execution_count", "last_duration_s", "last_mode_source")
        key = json.dumps({k: v for k, v in record.items() if k not in volatile}, sort_keys=True)
        if key == self._last_key and not force:
            return
        self._last_key = key
        for comm in list(self.comms):
            self._send_to(comm, record)
