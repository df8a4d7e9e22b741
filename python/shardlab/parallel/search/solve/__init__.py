"""The solvers over the space: recursive, ILP, elimination, the budget and bounds."""
