"""Known-harmless native stderr lines are dropped; everything else a library prints stays."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_only_the_known_harmless_lines_are_dropped_from_fd_2():
    # a child process writes to fd 2 directly, as C++ logging does, inside the block
    script = textwrap.dedent(
        """
        import os
        from shardlab._core.native_log import quiet_native_stderr
        with quiet_native_stderr():
            os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\\n")
            os.write(2, b"I0000 00:00:1 1 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.\\n")
            os.write(2, b"E0000 real trouble: out of host memory\\n")
            os.write(2, b"=== Source Location Trace: ===\\n")
            os.write(2, b"learning/45eac/tfrc/runtime/libtpu_init_utils.cc:327\\n")
        os.write(2, b"after the block\\n")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stderr == "E0000 real trouble: out of host memory\nafter the block\n"
