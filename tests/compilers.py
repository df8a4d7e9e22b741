"""The target compilers a test needs (the ``targets`` extra): skipped where they are not
installed, a failure in CI (``CI`` set), where a skip would hide that they were never tried."""

from __future__ import annotations

import os

import pytest

from shardlab.parallel.targets.devices import compiler_missing


def needs(*platforms: str) -> None:
    """Skip (or, in CI, fail) unless the compilers of ``platforms`` ("cuda", "tpu") load."""
    for platform in platforms:
        missing = compiler_missing(platform)
        if missing is None:
            continue
        if os.environ.get("CI"):
            pytest.fail(f"CI must install the targets extra: {missing}")
        pytest.skip(missing)
