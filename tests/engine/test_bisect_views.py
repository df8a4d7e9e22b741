"""bisect's HTML says what its text says (issue 36 item 4): when no equation diverges but the
Python differs from its trace, both forms carry the explanation, from one source, and the
HTML's title and colour do not read as "all fine"."""

from __future__ import annotations

import html
import re

import jax
import jax.numpy as jnp
import numpy as np

import shardlab
from shardlab.engine.compare.bisect import PYTHON_DIFFERS


def _visible_text(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", markup))


def _squash(text: str) -> str:
    return " ".join(text.split())


def test_python_that_differs_is_explained_in_html_as_in_text():
    def noisy(x):
        return x * 2 + np.random.default_rng().normal()

    report = shardlab.bisect(noisy, jnp.ones(4))
    assert not report.found and report.python_differs and not report.fine
    text, markup = report.text(), report._repr_html_()
    assert markup is not None
    shown = _squash(_visible_text(markup))
    for finding in report.findings():
        assert _squash(finding) in _squash(text)
        assert _squash(finding) in shown  # was: only the green summary
    assert PYTHON_DIFFERS in report.findings()
    assert "first diverging equation" not in markup  # was the title whatever was found
    assert report.title in shown
    from shardlab.widgets.compare import _BAD, _OK

    assert f"color:{_BAD}" in markup and f"color:{_OK}" not in markup  # was green
    assert _squash(report.summary()) in shown


def test_agreement_reads_fine_in_both_forms():
    def agree(x, key):
        return x * 2 + jax.random.normal(key, x.shape)

    report = shardlab.bisect(agree, jnp.arange(8.0), jax.random.key(1))
    assert report.fine and report.findings() == ()
    assert "1 compile)" in report.summary() and "(s)" not in report.summary()
    markup = report._repr_html_()
    assert markup is not None and "no diverging equation" in markup
    assert "first diverging equation" not in markup
