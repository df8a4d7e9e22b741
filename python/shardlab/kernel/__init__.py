"""The shardlab Jupyter kernel, its launcher, kernelspecs, magics and hooks.

Imports of IPython and ipykernel stay in this package (``parallel/`` and ``engine/`` never
import them).
"""
