"""Benchmarks behind ``make bench`` (``python -m benchmarks``, run from the repository root);
each module's ``run()`` returns a markdown section.

Not part of the shardlab package (not in the wheel): it imports shardlab, never the other
way round, and the corpus section runs on the model zoo in ``examples.zoo``.
"""
