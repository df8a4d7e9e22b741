"""Layer 3, the truth: what the compiler did. The post-partitioning HLO reader (``hlo.py``),
``analyze`` (compile and read collectives, memory and flops) and tile maps (``tiles.py``)."""
