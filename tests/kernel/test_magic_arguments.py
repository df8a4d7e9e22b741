"""Bad magic arguments in a real kernel (issue 37): each one line naming the value and a
valid form (IPython's ``UsageError``), no shardlab traceback, no name rebound, the kernel
and its session unharmed. Nothing here starts a cluster: every argument is checked first."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.kernel

KERNEL_SETUP = "keep = 41 + 1"

BAD = [
    ("%cluster start -n 2 --gpus '0,1", "no closing quotation"),
    ('%cluster pull "x', "no closing quotation"),
    ("%%spmd --all '\nprint(1)", "no closing quotation"),
    ("%spmd --timeout 5 'print(1)", "no closing quotation"),
    ("%cluster start --heartbeat-timeout -5", "outside 1..3600"),
    ("%cluster start --init-timeout 0", "outside 1..3600"),
    ("%cluster start -n 0", "outside 1..64"),
    ("%cluster start -n " + "9" * 5000, "is not a whole number"),
    ("%cluster start --devices-per-process abc", "is not a whole number"),
    ("%%spmd --timeout -1\nprint(1)", "give 1 to 604800"),
    ("%%spmd --timeout 0\nprint(1)", "give 1 to 604800"),
    ("%%spmd --timeout 1e-9\nprint(1)", "give 1 to 604800"),
    ("%%spmd --timeout nan\nprint(1)", "give 1 to 604800"),
    ("%spmd --timeout inf print(1)", "give 1 to 604800"),
    ("%cluster pull px --as __builtins__", "is not a variable name"),
    ("%cluster pull px --as 'a b'", "is not a variable name"),
    ("%cluster pull px --as 1abc", "is not a variable name"),
    ("%cluster pull px --as a.b", "give one variable name"),
    ("%cluster pull \"__import__('os').getpid()\"", "is not a variable name"),
    ("%cluster pull lambda", "is not a variable name"),
    ("%cluster pull state.params", "e.g. --as params"),
    ("%cluster stop now", "takes no arguments"),
    ("%cluster status everything", "takes no arguments"),
    ("%devices cpu:" + "9" * 5000, "is not valid; use cpu:N"),
    ("%devices cpu:" + "9" * 20, "names no device"),
    ("%%graph --shardlab-line-offset=abc\nx = 1", "the line offset is a whole number"),
    ("%calibrate --save /no/such/folder/p.json", "not in an existing folder"),
    ("%calibrate --save /tmp", "a folder"),
]


@pytest.mark.parametrize(("line", "message"), BAD, ids=[b[0][:40] for b in BAD])
def test_bad_arguments_are_one_line_and_change_nothing(kernel, line, message):
    reply = kernel.execute(line)
    assert reply.status == "error"
    # IPython shows a UsageError as one line on stderr, without a traceback
    shown = reply.stderr + reply.error_text
    assert "UsageError: " in shown, shown[:2000]
    assert message in shown, shown[:2000]
    assert len(shown) < 500  # a value is named, not repeated
    assert "Traceback" not in shown and "shardlab/" not in shown
    assert kernel.ok("keep").text == "42"


def test_gpus_on_a_machine_without_them_is_refused_not_run_on_cpu(kernel):
    if os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("this machine has an NVIDIA driver")
    reply = kernel.execute("%cluster start -n 2 --gpus 0,1")
    assert reply.status == "error" and "UsageError: " in reply.stderr
    assert "no NVIDIA GPU driver" in reply.stderr
    assert "--devices-per-process" in reply.stderr
    assert "cluster: none" in kernel.ok("%cluster status").stdout
