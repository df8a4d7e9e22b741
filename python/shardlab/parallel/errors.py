"""The errors the parallel core raises; each message names the bad value and a valid one.

``ShardingSpecError``: a sharding spec does not fit its argument or the mesh (nothing was
compiled). ``SearchError``: a function does not trace, or the search, a baseline or a plan
cannot be made from what was given.
"""

from __future__ import annotations


class ShardingSpecError(ValueError):
    """A sharding spec does not fit its argument or the mesh; nothing was compiled."""


class SearchError(ValueError):
    """The search cannot produce a plan; the message says why and what would be valid."""
