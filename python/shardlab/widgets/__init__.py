"""Views of shardlab records: layouts, communication, memory, live watches.

Views render records (``TileMap``, ``Report``, ``CostBreakdown``...), never reach into
kernel state except through the public API, and always carry a self-contained ``text/html``
and ``text/plain`` form (no CDN, no lab extension needed: VS Code and saved notebooks show
them). Live parts are stock ipywidgets controls plus outputs updated in place by display id.
"""

from __future__ import annotations

from .bokeh_explorer import Explorer, explore
from .commgraph import CommGraphView, commgraph
from .compare import bisect_html, compare_html  # registers the compare/bisect views
from .editor import StrategyEditor, editor
from .layout import LayoutView, show
from .long_work import default_bar  # registers the progress bar of search and verify()
from .memory import MemoryPanel, memory
from .pipeline_view import PipelineTimeline, pipeline_timeline
from .records_html import cost_html, plan_html, report_html  # registers the records' HTML
from .timeline import TimelineView, timeline
from .watch import Watch, watch

__all__ = [
    "CommGraphView",
    "Explorer",
    "LayoutView",
    "MemoryPanel",
    "PipelineTimeline",
    "StrategyEditor",
    "TimelineView",
    "Watch",
    "bisect_html",
    "commgraph",
    "compare_html",
    "cost_html",
    "default_bar",
    "editor",
    "explore",
    "memory",
    "pipeline_timeline",
    "plan_html",
    "report_html",
    "show",
    "timeline",
    "watch",
]
