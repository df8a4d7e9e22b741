"""Layer 5, the strategy search: the space of choices (``space.py`` records, ``candidates.py``,
``edges.py``, assembled by ``build.py``), the solvers on it (``pairs.py``, ``recursive.py``,
``ilp.py``, ``repeats.py``, ``scan_ties.py``, run by ``methods.py``; ``budget.py`` for memory
budgets), a choice's plan (``choice.py``), the baselines (``baselines.py``), annotations and
the driver, ``shardlab.search`` (``driver.py``)."""
