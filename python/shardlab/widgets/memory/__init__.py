"""Memory: the panel and its history plot."""
