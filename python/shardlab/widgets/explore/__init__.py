"""The plan explorer: the candidates and the bokeh plot."""
