"""The errors the parallel core raises; each message names the bad value and a valid one.

``ShardingSpecError``: a sharding spec does not fit its argument or the mesh (nothing was
compiled). ``SearchError``: a function does not trace, or the search, a baseline or a plan
cannot be made from what was given; ``ArgumentError`` (a ``SearchError``): an example
argument's leaf that can be neither traced nor static (``parallel/arguments.py``).
"""

from __future__ import annotations


class ShardingSpecError(ValueError):
    """A sharding spec does not fit its argument or the mesh; nothing was compiled."""


class SearchError(ValueError):
    """The search cannot produce a plan; the message says why and what would be valid."""


class ArgumentError(SearchError):
    """An example argument's leaf can be neither traced (an array) nor static (hashable), or
    a static leaf differs from the value a plan was made for; the message names the leaf."""
