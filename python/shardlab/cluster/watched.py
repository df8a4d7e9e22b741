"""``python -m shardlab.cluster.watched MODULE ARGS...``: run ``MODULE`` as ``-m`` would, and
exit (with every process it started) when the process that started it is gone.

The cluster's controller and engines are started this way by the notebook's kernel. A kernel
that is killed (``kill -9``, out of memory) runs no clean-up, and its children would stay:
here each of them notices that it was re-parented (``os.getppid()`` changes the moment the
parent dies, before anyone reaps it) and ends its own descendants and itself.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import threading
import time

POLL_S = 0.5


def exit_with_parent(parent_pid: int, *, poll_s: float = POLL_S) -> threading.Thread:
    """Starts the daemon thread that ends this process when ``parent_pid`` is no longer its
    parent."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        with contextlib.suppress(Exception):
            import psutil

            for child in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.kill()
        os._exit(3)

    thread = threading.Thread(target=watch, name="shardlab-parent-watch", daemon=True)
    thread.start()
    return thread


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m shardlab.cluster.watched MODULE [ARGS...]")
    exit_with_parent(os.getppid())
    module, *args = argv
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
