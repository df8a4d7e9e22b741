"""Every call of the targets workflow works on every size issue 33 lists (GPU hosts 1–32,
an A100 cluster, v5e slices up to 16x16, v5p up to 8x8x8), on abstract arguments and on
arrays alike: ``benchmarks/target_calls.py`` runs them and says which failed and why."""

from __future__ import annotations

import pytest

from benchmarks.target_calls import TARGETS, calls
from compilers import needs
from shardlab.parallel.targets.catalog import KINDS


@pytest.mark.parametrize(
    ("kind", "kwargs", "model"),
    TARGETS,
    ids=[f"{k}-{'-'.join(str(v) for v in kw.values())}" for k, kw, _ in TARGETS],
)
def test_every_call_works_on_the_target(kind, kwargs, model):
    needs(KINDS[kind].platform)
    done, _ = calls(kind, kwargs, model)
    assert len(done) == 12
    failed = [f"{name}: {problem}" for name, problem in done if problem]
    assert not failed, failed
