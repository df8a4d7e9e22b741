"""The parallel core, in layers that import only downwards: ``graph`` (tracing, op graph,
sharding rules), ``cost`` (the cost model and ``predict``), ``compiled`` (what the compiler
did: ``analyze``), ``plan`` (``Plan`` records) and ``search`` (the strategy search), over the
base modules ``errors``, ``records``, ``mesh`` and ``specs``. The package has no face of
its own: ``shardlab`` (the public API) names each entry point's defining module, so using
one loads only what it needs.

Imports jax, numpy and scipy only (never IPython or widget libraries).
"""
