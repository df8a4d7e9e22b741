"""Where records find their views, without the cores importing a view library.

``engine/`` and ``parallel/`` hold records (a ``Plan``, a ``Report``, a ``CompareReport``);
``widgets/`` draws them and sits above both. A record asks :func:`view_for` for its view by
kind; the view module registers itself with :func:`register_view` when it is imported, and
:data:`PROVIDERS` names, as a string, the module to import the first time a kind is asked
for. So ``import shardlab; shardlab.search(...)`` loads no view library, and the first
``plan.show()`` or notebook display loads just the view it needs.

Kinds: ``plan`` (``Plan.show()``), ``html:<record>`` (a record's ``_repr_html_``),
``compare`` and ``bisect`` (their reports' HTML), ``progress`` (the default bar of long calls),
and one action the other way round: ``release``, which the kernel registers when it loads
(``%release``'s ``shardlab.release``) and the memory panel's Release button calls, so that
no view imports the kernel.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["PROVIDERS", "register_view", "view_for"]

# kind -> the module that registers it on import (named, not imported: it lives above).
PROVIDERS: dict[str, str] = {
    "plan": "shardlab.widgets.commgraph",
    "html:plan": "shardlab.widgets.records_html",
    "html:report": "shardlab.widgets.records_html",
    "html:cost": "shardlab.widgets.records_html",
    "compare": "shardlab.widgets.compare",
    "bisect": "shardlab.widgets.compare",
    "progress": "shardlab.widgets._base.long_work",
}
_VIEWS: dict[str, Callable[..., Any]] = {}


def register_view(kind: str, view: Callable[..., Any]) -> None:
    """Makes ``view`` the one drawing records of ``kind`` (the last registration wins)."""
    _VIEWS[kind] = view


def view_for(kind: str) -> Callable[..., Any] | None:
    """The view of ``kind``, importing its provider on first use; None when there is none
    (the views' libraries are not installed: the record shows its text)."""
    view = _VIEWS.get(kind)
    if view is None and kind in PROVIDERS:
        try:
            importlib.import_module(PROVIDERS[kind])
        except ImportError:
            return None
        view = _VIEWS.get(kind)
    return view
