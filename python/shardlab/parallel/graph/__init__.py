"""Layer 1, the graph: a function traced once (``trace.py``: the ``Traced`` record), its op
graph (``opgraph.py``), the sharding rule of every primitive (``rules/``) and the interpreter
that re-runs the graph with layouts constrained (``interpret.py``)."""
