"""Hand-made strategies: the baselines, composites, mixes and pipeline stages."""
