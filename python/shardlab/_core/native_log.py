"""Known-harmless lines that native libraries print on this machine, kept out of cells.

With the target compilers installed (``shardlab[targets]``), JAX imports the CUDA plugin at
``import jax`` and its CUDA runtime stub prints ``Could not find cuda drivers on your
machine, GPU will not be used``; libtpu, when it first describes a TPU topology on a machine
without TPUs, prints that it cannot determine the accelerator type and worker hostnames.
Neither concerns a deviceless compile, and both go to file descriptor 2 from C++, where
ipykernel forwards them into the cell that happened to trigger them.

:func:`quiet_native_stderr` sends fd 2 to a temporary file for a block and writes back every
line that is not one of those, so anything else a native library says still reaches the user.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

__all__ = ["HARMLESS", "harmless", "quiet_native_stderr"]

HARMLESS = re.compile(
    "|".join(
        [
            r"cudart_stub\.cc.*Could not find cuda drivers",
            r"All log messages before absl::InitializeLog\(\) is called",
            r"Logging before InitGoogle\(\) is written to STDERR",
            r"could not determine TPU (accelerator type|worker hostnames)",
            r"TPU_WORKER_HOSTNAMES",
            r"^=== Source Location Trace: ===\s*$",
            r"libtpu_init_utils\.cc:\d+\s*$",
        ]
    )
)


def harmless(line: str) -> bool:
    """Whether ``line`` is one of the known-harmless native messages."""
    return bool(HARMLESS.search(line))


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """For the block, fd 2 goes to a temporary file; afterwards the lines that are not
    :func:`harmless` are written to fd 2 again, in order."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no fd 2 (embedded interpreters)
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode("utf-8", errors="replace")
            kept = "".join(line for line in text.splitlines(True) if not harmless(line))
            if kept:
                os.write(2, kept.encode())
