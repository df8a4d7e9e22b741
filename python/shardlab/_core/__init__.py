"""The floor under ``engine/`` and ``parallel/``: ideas both build on (jax and numpy only)."""
