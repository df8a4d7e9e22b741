"""Test configuration: 8 simulated CPU devices, set before JAX starts.

Multi-device tests run on ``jax_num_cpu_devices=8`` (see ``shared/JAX_NOTES.md``). The
environment variables must be set before the first ``import jax`` anywhere in the test
process, which is why this happens at import time of the conftest.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAX_NUM_CPU_DEVICES"] = "8"
# A sharding rule that raises is a bug: surface it (users get a replicated fallback).
os.environ["SHARDLAB_STRICT_RULES"] = "1"

import jax

jax.config.update("jax_num_cpu_devices", 8)
