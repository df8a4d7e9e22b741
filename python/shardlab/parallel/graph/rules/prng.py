"""PRNG primitives over (typed) key arrays.

A key array ``key<impl>[S]`` is stored as ``uint32[S, *key_shape]``: its dims ``S`` behave
like elementwise dims (a vmapped batch of keys), the trailing key-data dims of
``random_wrap``'s operand and ``random_unwrap``'s result stay whole. ``random_bits`` and
``random_split`` append generated dims: like ``iota``'s, they get fresh factors that appear
in no operand (generating a slice needs nothing from other devices: JAX's threefry is
partitionable, ``jax_threefry_partitionable``; for other impls XLA generates the whole and
slices locally, no communication either way). ``threefry2x32`` is elementwise over its four
operands and two results.
"""

from __future__ import annotations

from shardlab.parallel.graph.opgraph import Node, OpGraph
from shardlab.parallel.graph.rules.base import (
    Dim,
    Factors,
    OpRule,
    RuleFn,
    elementwise,
    shape_of,
    size_of,
)


def _extend(node: Node, g: OpGraph, flops_per_element: float) -> OpRule:
    """Key dims pass through to the result's leading dims; generated trailing dims are free
    (fresh factors)."""
    keys, out = shape_of(g, node.inputs[0]), shape_of(g, node.outputs[0])
    f = Factors()
    dims = tuple(f.new(s) for s in out)
    key_dims = dims[: len(keys)]
    return OpRule(
        (key_dims,),
        (dims,),
        tuple(f.sizes),
        flops=flops_per_element * size_of(out),
    )


def _random_bits(node: Node, g: OpGraph) -> OpRule:
    return _extend(node, g, 10.0)  # a threefry hash per element (order of magnitude)


def _random_split(node: Node, g: OpGraph) -> OpRule:
    return _extend(node, g, 10.0)


def _random_wrap(node: Node, g: OpGraph) -> OpRule:
    """``uint32[S, *key_shape] -> key[S]``: ``S`` passes through, the key data stays whole."""
    data, keys = shape_of(g, node.inputs[0]), shape_of(g, node.outputs[0])
    f = Factors()
    dims = tuple(f.new(s) for s in keys)
    trailing: tuple[Dim, ...] = tuple(() for _ in data[len(keys) :])
    return OpRule(((*dims, *trailing),), (dims,), tuple(f.sizes))


def _random_unwrap(node: Node, g: OpGraph) -> OpRule:
    """``key[S] -> uint32[S, *key_shape]``."""
    keys, data = shape_of(g, node.inputs[0]), shape_of(g, node.outputs[0])
    f = Factors()
    dims = tuple(f.new(s) for s in keys)
    trailing: tuple[Dim, ...] = tuple(() for _ in data[len(keys) :])
    return OpRule((dims,), ((*dims, *trailing),), tuple(f.sizes))


def _free(node: Node, g: OpGraph) -> OpRule:
    return elementwise(node, g, 0.0)


def _keyed(node: Node, g: OpGraph) -> OpRule:
    return elementwise(node, g, 10.0)


def _rng_bit_generator(node: Node, g: OpGraph) -> OpRule:
    """``rng_bit_generator(key) -> (new key, bits)``: the key stays whole, the bits are
    generated (XLA makes them whole and slices locally)."""
    key, bits = shape_of(g, node.inputs[0]), shape_of(g, node.outputs[1])
    f = Factors()
    dims = tuple(f.new(s) for s in bits)
    whole = tuple(() for _ in key)
    new_key = tuple(() for _ in shape_of(g, node.outputs[0]))
    return OpRule((whole,), (new_key, dims), tuple(f.sizes), flops=10.0 * size_of(bits))


RULES: dict[str, RuleFn] = {
    "random_bits": _random_bits,
    "random_split": _random_split,
    "random_wrap": _random_wrap,
    "random_unwrap": _random_unwrap,
    "random_seed": _keyed,
    "random_fold_in": _keyed,
    "random_clone": _free,
    "threefry2x32": _keyed,
    "rng_bit_generator": _rng_bit_generator,
}
