"""Views of shardlab records: layouts, communication, memory, live watches.

Views render records (``TileMap``, ``Report``, ``CostBreakdown``...), never reach into
kernel state except through the public API, and always carry a self-contained ``text/html``
and ``text/plain`` form (no CDN, no lab extension needed: VS Code and saved notebooks show
them). Live parts are stock ipywidgets controls plus outputs updated in place by display id.

The package has no face: ``shardlab`` names each view's module, and a record finds its view
through ``_core/views.py`` (importing just that module the first time it is displayed).
"""
