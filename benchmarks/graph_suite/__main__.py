"""``python -m benchmarks.graph_suite [ITEM ...]``: the named items (or all, with the
RSS check), their section printed."""

from __future__ import annotations

import sys

from benchmarks.graph_suite.report import main

if __name__ == "__main__":
    sys.exit(main())
