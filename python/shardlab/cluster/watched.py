"""``python -m shardlab.cluster.watched [--owned-folder DIR] MODULE ARGS...``: run ``MODULE``
as ``-m`` would, and exit (with every process it started) when the process that started it
is gone.

The cluster's controller and engines are started this way by the notebook's kernel. A kernel
that is killed (``kill -9``, out of memory) runs no clean-up, and its children would stay:
here each of them notices that it was re-parented (``os.getppid()`` changes the moment the
parent dies, before anyone reaps it) and ends its own descendants and itself. With
``--owned-folder``, it also removes the cluster's folder (its keys and logs) — only a folder
whose owner record names the parent that died (``manager.make_folder``).
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import shutil
import sys
import threading
import time

POLL_S = 0.5


OWNER_FILE = "owner.json"  # as manager.OWNER_FILE (not imported: this starts every engine)


def exit_with_parent(
    parent_pid: int, *, poll_s: float = POLL_S, owned_folder: str | None = None
) -> threading.Thread:
    """Starts the daemon thread that ends this process when ``parent_pid`` is no longer its
    parent (removing ``owned_folder`` if ``parent_pid`` owned it)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        with contextlib.suppress(Exception):
            import psutil

            for child in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.kill()
        if owned_folder is not None:
            remove_if_owned(owned_folder, parent_pid)
        os._exit(3)

    thread = threading.Thread(target=watch, name="shardlab-parent-watch", daemon=True)
    thread.start()
    return thread


def remove_if_owned(folder: str, owner_pid: int) -> bool:
    """Removes ``folder`` if its owner record names ``owner_pid``."""
    try:
        with open(os.path.join(folder, OWNER_FILE)) as record:
            if int(json.load(record)["pid"]) != owner_pid:
                return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    shutil.rmtree(folder, ignore_errors=True)  # the other processes of the cluster race here
    return True


def main(argv: list[str]) -> None:
    owned_folder = None
    if argv[:1] == ["--owned-folder"] and len(argv) > 1:
        owned_folder, argv = argv[1], argv[2:]
    if not argv:
        raise SystemExit(
            "usage: python -m shardlab.cluster.watched [--owned-folder DIR] MODULE [ARGS...]"
        )
    exit_with_parent(os.getppid(), owned_folder=owned_folder)
    module, *args = argv
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
