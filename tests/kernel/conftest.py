"""The real kernel the tests in this folder talk to, through jupyter_client.

One kernel per test module, shared by its tests as the cells of one notebook share a kernel;
the module's ``KERNEL_SETUP`` (imports, a mesh) runs first. A module that needs a fresh
kernel per test defines its own ``kernel`` fixture (``test_hooks.py``: memory accounting).
"""

from __future__ import annotations

import pytest

from kernelclient import Kernel


@pytest.fixture(scope="module")
def kernel(request):
    k = Kernel()
    setup = getattr(request.module, "KERNEL_SETUP", "")
    if setup:
        k.ok(setup)
    yield k
    k.shutdown()
