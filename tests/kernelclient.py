"""A small driver for a real shardlab kernel process through jupyter_client."""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.manager import KernelManager

TIMEOUT = 120


class KernelDied(RuntimeError):
    """The kernel process exited while a request waited for its reply."""


@dataclass
class Execution:
    reply: dict[str, Any]
    stdout: str = ""
    stderr: str = ""
    results: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    comm_msgs: list[dict[str, Any]] = field(default_factory=list)
    comm_opens: list[dict[str, Any]] = field(default_factory=list)
    displays: list[dict[str, Any]] = field(default_factory=list)
    updates: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        return self.reply["content"]["status"]

    @property
    def metadata(self) -> dict[str, Any]:
        return self.reply["metadata"]

    @property
    def text(self) -> str:
        """The plain-text result of the cell's last expression ('' when none)."""
        return "".join(r["data"].get("text/plain", "") for r in self.results)

    def widget(self, description: str) -> str:
        """The comm id of the widget this execution opened with that ``description``."""
        for opened in self.comm_opens:
            if opened["data"].get("state", {}).get("description") == description:
                return opened["comm_id"]
        raise LookupError(f"no widget {description!r} was opened by this execution")

    @property
    def error_text(self) -> str:
        return "\n".join(
            e["ename"] + ": " + e["evalue"] + "\n" + "\n".join(e["traceback"]) for e in self.errors
        )


class Kernel:
    """A running kernel and a blocking client, with execute helpers."""

    def __init__(
        self,
        name: str = "shardlab",
        *,
        extra_env: dict[str, str] | None = None,
        kernel_dirs: list[str] | None = None,
    ):
        import os

        from jupyter_client.kernelspec import KernelSpecManager

        env = dict(os.environ)
        env.update(extra_env or {})
        specs = KernelSpecManager(kernel_dirs=kernel_dirs) if kernel_dirs else KernelSpecManager()
        self.manager = KernelManager(kernel_name=name, kernel_spec_manager=specs)
        self.manager.start_kernel(env=env)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=TIMEOUT)

    def send(
        self, code: str, *, metadata: dict[str, Any] | None = None, silent: bool = False
    ) -> str:
        """Sends an execute request; returns its msg_id (collect the result with wait)."""
        content = {
            "code": code,
            "silent": silent,
            "store_history": not silent,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": False,
        }
        msg = self.client.session.msg("execute_request", content, metadata=metadata or {})
        self.client.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    def wait(self, msg_id: str, *, timeout: float = TIMEOUT, label: str = "") -> Execution:
        """The reply and output of the request ``msg_id``."""
        client = self.client
        deadline = time.monotonic() + timeout
        reply = None
        while reply is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no execute_reply for {label!r}")
            try:
                candidate = client.get_shell_msg(timeout=min(remaining, 1.0))
            except queue.Empty:  # a dead kernel never replies: say so now, not at the timeout
                if not self.is_alive():
                    raise KernelDied(f"the kernel died running {label!r}") from None
                continue
            if candidate["parent_header"].get("msg_id") == msg_id:
                reply = candidate
        execution = Execution(reply=reply)
        return self._collect(msg_id, execution, deadline, label)

    def _collect(self, msg_id: str, execution: Execution, deadline: float, label: str):
        """iopub output of request ``msg_id`` until the kernel is idle for it."""
        while True:
            remaining = deadline - time.monotonic()
            try:
                message = self.client.get_iopub_msg(timeout=max(remaining, 1))
            except queue.Empty:
                raise TimeoutError(f"no idle status for {label!r}") from None
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind = message["msg_type"]
            data = message["content"]
            if kind == "stream":
                if data["name"] == "stdout":
                    execution.stdout += data["text"]
                else:
                    execution.stderr += data["text"]
            elif kind in ("execute_result", "display_data"):
                execution.results.append(data)
                if kind == "display_data":
                    execution.displays.append(data)
            elif kind == "error":
                execution.errors.append(data)
            elif kind == "comm_msg":
                execution.comm_msgs.append(data)
            elif kind == "comm_open":
                execution.comm_opens.append(data)
            elif kind == "update_display_data":
                execution.updates.append(data)
            elif kind == "status" and data["execution_state"] == "idle":
                return execution

    def send_comm(self, comm_id: str, data: dict[str, Any], *, timeout: float = TIMEOUT):
        """Sends a comm_msg (as a front end does, e.g. a widget click); returns its outputs."""
        msg = self.client.session.msg("comm_msg", {"comm_id": comm_id, "data": data})
        self.client.shell_channel.send(msg)
        msg_id = msg["header"]["msg_id"]
        deadline = time.monotonic() + timeout
        return self._collect(msg_id, Execution(reply={}), deadline, f"comm_msg to {comm_id}")

    def execute(
        self,
        code: str,
        *,
        metadata: dict[str, Any] | None = None,
        silent: bool = False,
        timeout: float = TIMEOUT,
    ) -> Execution:
        msg_id = self.send(code, metadata=metadata, silent=silent)
        return self.wait(msg_id, timeout=timeout, label=code[:60])

    def ok(self, code: str, **kwargs: Any) -> Execution:
        """Executes and asserts success, showing the error otherwise."""
        execution = self.execute(code, **kwargs)
        assert execution.status == "ok", execution.error_text
        return execution

    def is_alive(self) -> bool:
        return self.manager.is_alive()

    def shutdown(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)
