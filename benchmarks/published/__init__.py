"""Paper replay (``python -m benchmarks --only published``): published training runs —
Megatron-LM 2021 Tables 1 and 2, Korthikanti 2022, NVIDIA's DGX-Cloud recipes, torchtitan,
MaxText on TPU, Alpa — replayed on the cost model at their real shapes and degrees, their
predicted step times against the published ones, and the orderings the papers report.

- ``record.py``: ``Run``, one published step and how to replay it;
- ``megatron_runs.py``, ``framework_runs.py``: the rows, with their sources;
- ``replay.py``: tracing, layouts on a deviceless target, pipeline and remat pricing;
- ``section.py``: the orderings, the markdown, ``run()``.
"""

from __future__ import annotations

from benchmarks.published.section import run

__all__ = ["run"]
