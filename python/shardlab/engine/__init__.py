"""Execution engine: per-cell modes, graph-cell staging, memory and device switching.

Imports jax and the standard library only — never IPython or widget libraries, so that the
same engine serves the kernel, a stock IPython session and plain scripts.
"""

from __future__ import annotations

from shardlab.engine.cells.staging import GraphCache, GraphStagingError, run_graph_cell
from shardlab.engine.modes import MODES, Mode, ModeError, mode_context, parse_mode, parse_mode_magic
from shardlab.engine.resources.live_memory import (
    ReleaseReport,
    cache_stats,
    live_bytes_per_device,
    process_rss,
)

__all__ = [
    "MODES",
    "GraphCache",
    "GraphStagingError",
    "Mode",
    "ModeError",
    "ReleaseReport",
    "cache_stats",
    "live_bytes_per_device",
    "mode_context",
    "parse_mode",
    "parse_mode_magic",
    "process_rss",
    "run_graph_cell",
]
