"""shardlab.mesh and spec validation: errors name path, dimension, sizes and a valid spec."""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import shardlab as sp


def test_mesh_forms_agree_and_use_auto_axes():
    a = sp.mesh(data=2, model=4)
    b = sp.mesh({"data": 2, "model": 4})
    c = sp.mesh(shape=(2, 4), names=("data", "model"))
    for m in (a, b, c):
        assert dict(m.shape) == {"data": 2, "model": 4}
        assert all(t == jax.sharding.AxisType.Auto for t in m.axis_types)
    assert list(a.devices.flat) == jax.devices()
    sub = sp.mesh(x=4, devices=jax.devices()[:4])
    assert sub.devices.size == 4


def test_mesh_size_mismatch_lists_devices():
    with pytest.raises(ValueError, match=r"needs 12 devices, but 8 are available") as e:
        sp.mesh(data=3, model=4)
    assert "mesh(data=2, model=4)" in str(e.value)
    assert str(jax.devices()[0]) in str(e.value)
    with pytest.raises(ValueError, match="one way"):
        sp.mesh({"a": 8}, b=1)


@pytest.fixture
def no_compile(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("compiled despite a bad spec")

    analyze_module = importlib.import_module("shardlab.parallel.compiled.analyze")
    monkeypatch.setattr(analyze_module.jax, "jit", boom)


ARGS = ({"w": jnp.ones((16, 32)), "b": jnp.ones((32,))}, jnp.ones((6, 16)))


def f(p, x):
    return x @ p["w"] + p["b"]


@pytest.mark.parametrize(
    ("specs", "fragments"),
    [
        (
            ({"w": P(None, "modle"), "b": P()}, P()),
            ["in_shardings[0]['w']", "'modle'", "did you mean 'model'", "P(None, 'model')"],
        ),
        (
            ({"w": P("model", "model"), "b": P()}, P()),
            ["in_shardings[0]['w']", "used twice", "Nearest valid spec: P('model',)"],
        ),
        (
            ({"w": P(), "b": P()}, P("model")),
            ["in_shardings[1]", "dimension 0 has size 6", "model=4", "Nearest valid spec: P()"],
        ),
        (
            ({"w": P(), "b": P()}, P(("data", "model"), None)),
            ["dimension 0 has size 6", "8 = data=2 × model=4", "P('data',)"],
        ),
        (
            ({"w": P()}, P()),
            ["in_shardings[0]", "does not match", "dict keys ['w']", "['b', 'w']"],
        ),
        ((P(), P(), P()), ["in_shardings", "length 3", "length 2"]),
        (
            ({"w": P(None, None, "data"), "b": P()}, P()),
            ["in_shardings[0]['w']", "3 entries", "2 dimensions"],
        ),
    ],
)
def test_bad_specs_are_named_before_compiling(no_compile, specs, fragments):
    m = sp.mesh(data=2, model=4)
    with pytest.raises(sp.ShardingSpecError) as e:
        sp.analyze(f, *ARGS, mesh=m, in_shardings=specs)
    for fragment in fragments:
        assert fragment in str(e.value), (fragment, str(e.value))
    with pytest.raises(sp.ShardingSpecError):
        sp.predict(f, *ARGS, mesh=m, in_shardings=specs)
    assert isinstance(e.value, ValueError)


def test_prefix_specs_and_out_shardings_validated(no_compile):
    m = sp.mesh(data=2, model=4)
    with pytest.raises(sp.ShardingSpecError, match=r"out_shardings.*size 6.*model=4"):
        sp.analyze(f, *ARGS, mesh=m, in_shardings=(P(), P()), out_shardings=P("model"))
    # a prefix spec for the whole dict is fine (it fails only at the patched compile)
    with pytest.raises(AssertionError, match="compiled"):
        sp.analyze(f, *ARGS, mesh=m, in_shardings=(P(), P()))
