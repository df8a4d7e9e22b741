"""Example code that is not part of the shardlab package (it is not in the wheel).

``examples.zoo``: "other people's models", train steps written on flax linen, flax nnx,
equinox and optax (the ``corpus`` dependency group), which the corpus benchmark
(``benchmarks.corpus``) and the tests run shardlab on. Importable from the repository root
(``make bench``, pytest's ``pythonpath``), never installed.

Not to be confused with ``shardlab.examples``: the small models on plain JAX that ship in the
package, for its notebooks, tests and the strategy-search benchmark.
"""
