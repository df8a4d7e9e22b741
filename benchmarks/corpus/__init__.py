"""The corpus benchmark (``section.py``): the strategy search and every baseline on the model
zoo of "other people's models" (``examples.zoo``: flax linen, flax nnx, equinox, optax).
Run: ``make bench`` or ``python -m benchmarks --only corpus``."""
