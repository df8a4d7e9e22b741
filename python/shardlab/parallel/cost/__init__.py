"""Layer 2, the cost model: the compilers' rules (``compilers.py``), device profiles (``profiles.py``), layouts and resharding
(``layouts.py``), the memory model (``memory/``), propagation of a given strategy
(``propagate.py``), XLA's all-reduce combining (``combine.py``), ``predict`` and the
schedule over time (``schedule.py``). Nothing here compiles."""
