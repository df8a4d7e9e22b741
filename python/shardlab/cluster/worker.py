"""What runs on each engine: devices set before JAX starts, then ``jax.distributed``.

The notebook's kernel sends ``initialize(...)`` to every engine at once (the coordinator, hosted
by process 0, waits for all of them). Everything here happens inside the engine process; this
module imports JAX only inside its functions, so that the engine can set its devices first.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from typing import Any

# ``XLA_FLAGS`` may carry the notebook's own device count (the kernel launcher pins 8):
# an engine sets its own, so the flag is dropped from what it inherits.
_DEVICE_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count=\d+\s*")


def set_devices(devices: str) -> None:
    """Pins this process's devices; must run before JAX starts its backend.

    Args:
        devices: ``cpu:N`` (N simulated CPU devices) or ``gpu:I,J`` (the GPUs this process
            sees, as ``CUDA_VISIBLE_DEVICES``).
    """
    backends = getattr(sys.modules.get("jax._src.xla_bridge"), "_backends", None)
    if backends:
        raise RuntimeError(
            f"this engine's JAX backend is already running; devices {devices!r} cannot be set "
            "(run %cluster restart)"
        )
    platform, _, rest = devices.partition(":")
    os.environ["SHARDLAB_DEVICES"] = devices
    flags = _DEVICE_COUNT_FLAG.sub("", os.environ.get("XLA_FLAGS", "")).strip()
    if flags:
        os.environ["XLA_FLAGS"] = flags
    else:
        os.environ.pop("XLA_FLAGS", None)
    if platform == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["JAX_NUM_CPU_DEVICES"] = rest
    elif platform == "gpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = rest
        os.environ.pop("JAX_NUM_CPU_DEVICES", None)
        if os.environ.get("JAX_PLATFORMS") == "cpu":
            os.environ.pop("JAX_PLATFORMS")
    else:
        raise ValueError(f"devices {devices!r}: use cpu:N or gpu:I,J")
    import jax

    if platform == "cpu":
        jax.config.update("jax_num_cpu_devices", int(rest))
        # CPU collectives across processes go through gloo, on loopback (``_loopback_gloo``).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        _loopback_gloo()


def _loopback_gloo() -> None:
    """Makes gloo's TCP pairs listen on 127.0.0.1.

    JAX creates gloo's collectives with no hostname, and gloo then binds the address the
    machine's hostname resolves to, which may be a public interface. JAX offers no option for
    it (0.10), so the factory it calls gets ``hostname="127.0.0.1"``.
    """
    from jax._src import xla_bridge

    make = xla_bridge._jax.make_gloo_tcp_collectives
    if getattr(make, "_shardlab_loopback", False):
        return

    def loopback(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("hostname", "127.0.0.1")
        return make(*args, **kwargs)

    loopback._shardlab_loopback = True  # type: ignore[attr-defined]
    xla_bridge._jax.make_gloo_tcp_collectives = loopback  # type: ignore[attr-defined]


def initialize(
    *,
    process_id: int,
    num_processes: int,
    coordinator: str,
    devices: str,
    init_timeout_s: int = 30,
    heartbeat_timeout_s: int = 10,
) -> dict[str, Any]:
    """Sets devices, joins the distributed runtime and returns :func:`describe`.

    ``coordinator`` is ``127.0.0.1:PORT``; process 0 hosts the coordination service and binds
    it to that address only (JAX's default binds every interface). Auto-detection of a batch
    system is off: a local cluster inside a SLURM job must not read the job's variables.
    """
    heartbeat_port = start_heartbeat()
    set_devices(devices)
    import jax

    jax.distributed.initialize(
        coordinator_address=coordinator,
        coordinator_bind_address=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        cluster_detection_method="deactivate",
        initialization_timeout=init_timeout_s,
        heartbeat_timeout_seconds=heartbeat_timeout_s,
    )
    jax.devices()  # the backend starts now, inside the timeouts, not in the first cell
    return {**describe(), "heartbeat_port": heartbeat_port}


def start_heartbeat() -> int:
    """Echoes the kernel's pings on a loopback port (returned) from a thread of its own.

    The echo is zmq's proxy of a socket to itself, which runs in C without Python's GIL, so
    a cell that holds the GIL does not stop it: it stops when the process does (SIGSTOP, a
    debugger, a frozen process), as JAX's own heartbeat does. The kernel names the engine
    whose echo stops first (:mod:`.health`).
    """
    import zmq

    # a context of its own: the engine's shared one is terminated at its shutdown, which
    # would wait forever for this socket
    context = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    socket.linger = 0
    port = socket.bind_to_random_port("tcp://127.0.0.1")

    def echo() -> None:
        with contextlib.suppress(zmq.ZMQError):  # runs until the process ends
            zmq.proxy(socket, socket)

    threading.Thread(target=echo, name="shardlab-heartbeat", daemon=True).start()
    return port


def describe() -> dict[str, Any]:
    """This process: its id, pid, devices and memory (``%cluster status``)."""
    import jax

    from shardlab.engine.resources import live_memory as memory

    per_device = memory.live_bytes_per_device()
    local = jax.local_devices()
    return {
        "process_id": jax.process_index(),
        "process_count": jax.process_count(),
        "pid": os.getpid(),
        "platform": local[0].platform if local else "none",
        "local_devices": [d.id for d in local],
        "global_devices": len(jax.devices()),
        "live_bytes": sum(per_device.get(str(d), 0) for d in local),
        "rss": memory.process_rss(),
    }
