"""Wiring: one session per shell, with its magics, its status channel and IPython's hooks.

The shardlab kernel and ``%load_ext shardlab`` call :func:`register`. This is the one module
that knows every part of ``kernel/``, and imports run one way, from here down: ``register``
imports ``magics`` and ``status``; ``magics`` imports ``release``; each of them imports
``session``, the model, which imports none of them.
"""

from __future__ import annotations

from typing import Any

from shardlab._core.views import register_view
from shardlab.engine.resources import memory_history, shape_guard
from shardlab.kernel.calibrate_magic import CalibrateMagics
from shardlab.kernel.cluster_magic import ClusterMagics
from shardlab.kernel.compare_magic import CompareMagics
from shardlab.kernel.magics import ShardlabMagics
from shardlab.kernel.release import release
from shardlab.kernel.session import ShardlabSession, attach, detach, session_of
from shardlab.kernel.status import StatusChannel
from shardlab.kernel.target_magic import TargetMagics


def register(shell: Any) -> ShardlabSession:
    """Attaches one session to ``shell`` (idempotent) and hooks it in."""
    existing = session_of(shell)
    if existing is not None:
        return existing
    session = ShardlabSession(shell, config=shell.config)
    status = StatusChannel(session)
    session.status = status
    attach(shell, session)
    shell.configurables.append(session)
    session.apply_guard()  # before any cell: no cell may hand XLA an array it aborts on
    shell.input_transformers_cleanup.append(session.transform)
    # Memory over time, hooked before the session so that a cell's last sample and markers
    # are taken before the session sends the status; dormant until a comm or
    # shardlab.memory() wants it.
    memory_history.recorder(shell, activate=False)
    shell.events.register("pre_execute", session.pre_execute)
    shell.events.register("pre_run_cell", session.pre_run_cell)
    shell.events.register("post_execute", session.post_execute)
    shell.events.register("post_run_cell", session.post_run_cell)
    shell.register_magics(ShardlabMagics(shell, session=session))
    shell.register_magics(CompareMagics(shell, session=session))
    shell.register_magics(ClusterMagics(shell, session=session))
    shell.register_magics(TargetMagics(shell, session=session))
    calibrate_magics = CalibrateMagics(shell, session=session, config=shell.config)
    shell.configurables.append(calibrate_magics)  # %config CalibrateMagics.use_by_default
    shell.register_magics(calibrate_magics)
    status.register_target()
    register_view("release", release)  # the memory panel's Release button: %release
    return session


def unregister(shell: Any) -> None:
    """Unhooks the session of ``shell`` (its magics and comm target stay registered)."""
    session = session_of(shell)
    if session is None:
        return
    if session.transform in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.remove(session.transform)
    shell.events.unregister("pre_execute", session.pre_execute)
    shell.events.unregister("pre_run_cell", session.pre_run_cell)
    shell.events.unregister("post_execute", session.post_execute)
    shell.events.unregister("post_run_cell", session.post_run_cell)
    shape_guard.uninstall()
    detach(shell)
