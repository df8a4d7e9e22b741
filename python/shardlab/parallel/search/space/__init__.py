"""The search space: candidates per node, edges, pairs, repeated layers, scan ties."""
