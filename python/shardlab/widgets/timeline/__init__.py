"""Timelines: the SVG view, its lanes, the bokeh plot and the pipeline schedule."""
