"""The kernel's memory release: ``shardlab.release()`` and ``%release``.

IPython's output history (``Out``, ``_``, ``__``, ``___``) keeps arrays alive that no name
shows, so the kernel clears it first, then the session's staged graph cells, then hands the
namespace to :func:`shardlab.engine.resources.live_memory.release` (caches, unreachable arrays, heap).

Importing this module imports neither IPython nor traitlets: ``shardlab`` re-exports
:func:`release`, and the session module loads only when it is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardlab.engine.resources import live_memory as memory
from shardlab.engine.resources.live_memory import ReleaseReport

if TYPE_CHECKING:
    from shardlab.kernel.session import ShardlabSession


def release(*, all: bool = False) -> ReleaseReport:
    """Frees memory like ``%release``: output history, caches, unreachable arrays, heap.

    In a notebook (shardlab kernel or ``%load_ext shardlab``) arrays bound to names are kept
    unless ``all=True``, which deletes them too and unbinds the names that held them (the
    report lists them, and the names kept because a module also holds their arrays). Where shardlab is not loaded (a script, or IPython without the
    extension) no arrays are deleted, only caches and heap.
    """
    try:
        from shardlab.kernel.session import current_session
    except ImportError:  # IPython not installed
        return memory.release(None)
    session = current_session()
    if session is None:
        return memory.release(None)
    return release_shell(session.shell, session, delete_named=all)


def release_shell(
    shell: Any, session: ShardlabSession, *, delete_named: bool = False
) -> ReleaseReport:
    """The kernel's release: output history first, then :func:`memory.release`."""
    from shardlab.kernel.session import kernel_objects

    if shell is not None:
        try:
            shell.displayhook.flush()  # Out, _, __, ___ and _N
        except Exception:
            pass
        for name in ("_", "__", "___"):
            shell.user_ns.pop(name, None)
    session.graph_cache.clear()
    if shell is None:
        return memory.release(None)
    return memory.release(
        shell.user_ns,
        delete_named=delete_named,
        skip_names=frozenset(getattr(shell, "user_ns_hidden", {})),
        stop_at=kernel_objects(shell),
    )
