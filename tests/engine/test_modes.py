"""Mode names, the mode magic line and the precedence magic > metadata > default."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from shardlab.engine.modes import (
    ModeError,
    mode_context,
    mode_from_metadata,
    parse_mode,
    parse_mode_magic,
    resolve_mode,
)


def test_parse_mode_accepts_the_three_modes_case_insensitively():
    assert [parse_mode(m) for m in ("eager", "JIT", " graph ")] == ["eager", "jit", "graph"]


@pytest.mark.parametrize("bad", ["fast", "", "grpah", 3, None])
def test_parse_mode_error_names_value_and_valid_modes(bad):
    with pytest.raises(ModeError) as info:
        parse_mode(bad, origin="%mode")
    message = str(info.value)
    assert repr(bad) in message and "'eager', 'jit' and 'graph'" in message


def test_parse_mode_suggests_close_match():
    with pytest.raises(ModeError, match="Did you mean 'graph'"):
        parse_mode("grahp")


def test_mode_magic_line_is_split_off():
    assert parse_mode_magic("%%graph\nx = 1\n") == ("graph", "x = 1\n")
    assert parse_mode_magic("\n%%eager\nx = 1") == ("eager", "x = 1")
    assert parse_mode_magic("%%time\nx = 1") == (None, "%%time\nx = 1")
    assert parse_mode_magic("x = 1  # %%graph") == (None, "x = 1  # %%graph")


def test_precedence_magic_over_metadata_over_default():
    meta = {"shardlab": {"mode": "eager"}}
    assert resolve_mode("%%graph\nx", meta, "jit") == ("graph", "magic")
    assert resolve_mode("x", meta, "jit") == ("eager", "metadata")
    assert resolve_mode("x", {}, "graph") == ("graph", "default")
    assert resolve_mode("x", {"other": 1}, "jit") == ("jit", "default")
    assert resolve_mode("x", {"shardlab": {}}, "jit") == ("jit", "default")


@pytest.mark.parametrize(
    "meta, fragment",
    [
        ({"shardlab": "graph"}, "expected an object"),
        ({"shardlab": {"mode": "fast"}}, "unknown mode 'fast'"),
        ({"shardlab": {"mode": 1}}, "unknown mode 1"),
    ],
)
def test_malformed_metadata_is_a_clear_error(meta, fragment):
    with pytest.raises(ModeError, match=fragment):
        mode_from_metadata(meta)


def test_eager_context_runs_jitted_functions_op_by_op():
    seen = []

    @jax.jit
    def f(x):
        seen.append(type(x).__name__)
        return x * 2

    with mode_context("eager"):
        f(jnp.ones(3))
    with mode_context("jit"):
        f(jnp.ones(3))
    assert "Tracer" not in seen[0] and "Tracer" in seen[1]


def test_mode_cell_magic_with_a_name():
    assert parse_mode_magic("%%mode graph\nx = 1") == ("graph", "x = 1")
    assert resolve_mode("%%mode eager\nx", {"shardlab": {"mode": "jit"}}, "jit") == (
        "eager",
        "magic",
    )
    with pytest.raises(ModeError, match="%%mode: unknown mode 'fast'"):
        parse_mode_magic("%%mode fast\nx = 1")
    with pytest.raises(ModeError, match="unknown mode ''"):
        parse_mode_magic("%%mode\nx = 1")
