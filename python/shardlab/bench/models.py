"""Benchmark models for the strategy search: small, deterministic, each a ``Case``.

Every train step has the form ``step(params, opt_state, batch) -> (params, opt_state, loss)``
(SGD with momentum), so updated parameters and optimizer state keep their layouts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Case:
    """One benchmark function with example arguments.

    Attributes:
        name: label.
        fn: the function.
        args: example arguments (concrete arrays).
        expect: the baseline the case is designed to favour ("" for none).
    """

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    expect: str = ""


def _normal(key: Any, shape: tuple[int, ...], scale: float = 0.05) -> jax.Array:
    return jax.random.normal(key, shape, jnp.float32) * scale


def train_step(loss: Callable[..., Any], lr: float = 0.01) -> Callable[..., Any]:
    """SGD with momentum around ``loss(params, batch)``."""

    def step(params, momentum, batch):
        value, grads = jax.value_and_grad(loss)(params, batch)
        new_m = jax.tree.map(lambda m, g: 0.9 * m + g, momentum, grads)
        new_p = jax.tree.map(lambda p, m: p - lr * m, params, new_m)
        return new_p, new_m, value

    return step


def _train_case(name: str, loss, params, batch, expect: str = "") -> Case:
    momentum = jax.tree.map(jnp.zeros_like, params)
    return Case(name, train_step(loss), (params, momentum, batch), expect)


def mlp(batch: int, hidden: int, *, train: bool, seed: int = 0) -> Case:
    """A 2-layer MLP; batch ≫ hidden favours data parallel, hidden ≫ batch tensor parallel."""
    k = jax.random.split(jax.random.key(seed), 4)
    params = {"w1": _normal(k[0], (hidden, hidden)), "w2": _normal(k[1], (hidden, hidden))}
    x, y = _normal(k[2], (batch, hidden), 1.0), _normal(k[3], (batch, hidden), 1.0)
    expect = "data_parallel" if batch > hidden else "megatron"

    def forward(p, x):
        return jax.nn.relu(x @ p["w1"]) @ p["w2"]

    name = f"mlp b{batch} h{hidden}"
    if not train:
        return Case(name + " fwd", forward, (params, x), expect)

    def loss(p, xy):
        return jnp.mean((forward(p, xy[0]) - xy[1]) ** 2)

    return _train_case(name + " train", loss, params, (x, y), expect)


def _layernorm(x, g, b):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + 1e-5) * g + b


def _gpt_block_params(keys: Any, d: int) -> dict[str, jax.Array]:
    return {
        "ln1_g": jnp.ones((d,)), "ln1_b": jnp.zeros((d,)),
        "wq": _normal(next(keys), (d, d)), "wk": _normal(next(keys), (d, d)),
        "wv": _normal(next(keys), (d, d)), "wo": _normal(next(keys), (d, d)),
        "ln2_g": jnp.ones((d,)), "ln2_b": jnp.zeros((d,)),
        "w1": _normal(next(keys), (d, 4 * d)), "w2": _normal(next(keys), (4 * d, d)),
    }  # fmt: skip


def _gpt_block(p: Any, x: jax.Array, mask: jax.Array, heads: int) -> jax.Array:
    """LN, causal multi-head attention, LN, GELU MLP, with residuals."""
    batch, seq, d = x.shape
    hd = d // heads
    a = _layernorm(x, p["ln1_g"], p["ln1_b"])
    q, k, v = (jnp.einsum("btd,de->bte", a, p[w]).reshape(batch, seq, heads, hd)
               for w in ("wq", "wk", "wv"))  # fmt: skip
    s = jnp.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(hd)
    w = jax.nn.softmax(jnp.where(mask, s, -1e9), axis=-1)
    o = jnp.einsum("bhqk,bkhe->bqhe", w, v).reshape(batch, seq, d)
    x = x + jnp.einsum("btd,de->bte", o, p["wo"])
    a = _layernorm(x, p["ln2_g"], p["ln2_b"])
    return x + jnp.einsum(
        "btf,fd->btd", jax.nn.gelu(jnp.einsum("btd,df->btf", a, p["w1"])), p["w2"]
    )


def _gpt_loss(stack: Callable[[Any, jax.Array], jax.Array]) -> Callable[..., Any]:
    """Embedding, ``stack(blocks, x)``, head, cross-entropy."""

    def loss(p, batch_):
        toks, tgts = batch_
        x = jnp.take(p["embed"], toks, axis=0)
        x = stack(p["blocks"], x)
        logits = jnp.einsum("btd,dv->btv", x, p["head"])
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, tgts[..., None], axis=-1))

    return loss


def gpt(layers: int, *, batch: int = 8, seq: int = 16, d: int = 64, heads: int = 4,
        vocab: int = 256, seed: int = 0) -> Case:  # fmt: skip
    """A GPT-style decoder train step: embedding, ``layers`` × (LN, attention, LN, MLP)."""
    keys = iter(jax.random.split(jax.random.key(seed), 8 * layers + 4))
    blocks = [_gpt_block_params(keys, d) for _ in range(layers)]
    params = {"embed": _normal(next(keys), (vocab, d)), "blocks": blocks,
              "head": _normal(next(keys), (d, vocab))}  # fmt: skip
    tokens = jax.random.randint(next(keys), (batch, seq), 0, vocab)
    targets = jax.random.randint(next(keys), (batch, seq), 0, vocab)
    mask = jnp.tril(jnp.ones((seq, seq), dtype=bool))

    def unrolled(blocks_, x):
        for bp in blocks_:
            x = _gpt_block(bp, x, mask, heads)
        return x

    return _train_case(f"gpt {layers}L train", _gpt_loss(unrolled), params, (tokens, targets))


def gpt_scan(layers: int, *, batch: int = 8, seq: int = 16, d: int = 64, heads: int = 4,
             vocab: int = 256, seed: int = 0, train: bool = True) -> Case:  # fmt: skip
    """``gpt(layers)`` written as ``jax.lax.scan`` over its blocks' parameters stacked on a
    leading layer axis (the same initial values), as flax ``nn.scan`` models are; with
    ``train=False`` the case is the loss alone (forward)."""
    unrolled = gpt(layers, batch=batch, seq=seq, d=d, heads=heads, vocab=vocab, seed=seed)
    params = dict(unrolled.args[0])
    params["blocks"] = jax.tree.map(lambda *xs: jnp.stack(xs), *params["blocks"])
    mask = jnp.tril(jnp.ones((seq, seq), dtype=bool))

    def scanned(blocks_, x):
        x, _ = jax.lax.scan(lambda h, bp: (_gpt_block(bp, h, mask, heads), None), x, blocks_)
        return x

    loss = _gpt_loss(scanned)
    name = f"gpt_scan {layers}L"
    if not train:
        return Case(name + " fwd", loss, (params, unrolled.args[2]))
    return _train_case(name + " train", loss, params, unrolled.args[2])


def moe(*, tokens: int = 256, d: int = 64, f: int = 128, experts: int = 8, seed: int = 0):
    """A mixture-of-experts layer (soft routing, dense dispatch) train step."""
    k = jax.random.split(jax.random.key(seed), 5)
    params = {"router": _normal(k[0], (d, experts)), "w1": _normal(k[1], (experts, d, f)),
              "w2": _normal(k[2], (experts, f, d))}  # fmt: skip
    x, y = _normal(k[3], (tokens, d), 1.0), _normal(k[4], (tokens, d), 1.0)

    def loss(p, xy):
        x, y = xy
        # Soft routing (every expert, weighted by its gate): the same expert-parallel
        # einsums as top-k routing, without an argmax whose ties could flip between
        # differently-ordered sharded reductions.
        gates = jax.nn.softmax(x @ p["router"], axis=-1)
        routed = jnp.einsum("te,td->etd", gates, x)
        h = jax.nn.relu(jnp.einsum("etd,edf->etf", routed, p["w1"]))
        out = jnp.einsum("etf,efd->td", h, p["w2"])
        return jnp.mean((out - y) ** 2)

    return _train_case("moe train", loss, params, (x, y))


def conv(*, batch: int = 16, hw: int = 8, ch: int = 32, classes: int = 16, seed: int = 0):
    """A wide-ResNet-style block: two 3×3 convolutions with a residual, pool, dense."""
    k = jax.random.split(jax.random.key(seed), 5)
    params = {"k1": _normal(k[0], (3, 3, ch, 2 * ch)), "k2": _normal(k[1], (3, 3, 2 * ch, ch)),
              "dense": _normal(k[2], (ch, classes))}  # fmt: skip
    x, y = _normal(k[3], (batch, hw, hw, ch), 1.0), _normal(k[4], (batch, classes), 1.0)
    dn = ("NHWC", "HWIO", "NHWC")

    def loss(p, xy):
        x, y = xy
        h = jax.nn.relu(jax.lax.conv_general_dilated(x, p["k1"], (1, 1), "SAME",
                                                     dimension_numbers=dn))  # fmt: skip
        h = jax.lax.conv_general_dilated(h, p["k2"], (1, 1), "SAME", dimension_numbers=dn) + x
        logits = jnp.mean(jax.nn.relu(h), axis=(1, 2)) @ p["dense"]
        return jnp.mean((logits - y) ** 2)

    return _train_case("wide-resnet block train", loss, params, (x, y))


def embedding(*, vocab: int = 4096, d: int = 64, batch: int = 64, bag: int = 8, seed: int = 0):
    """An embedding-heavy model: a large table, bag-of-ids lookups, a small MLP head."""
    k = jax.random.split(jax.random.key(seed), 5)
    params = {"table": _normal(k[0], (vocab, d)), "w": _normal(k[1], (d, d)),
              "out": _normal(k[2], (d, 1))}  # fmt: skip
    ids = jax.random.randint(k[3], (batch, bag), 0, vocab)
    y = _normal(k[4], (batch, 1), 1.0)

    def loss(p, batch_):
        ids, y = batch_
        e = jnp.mean(jnp.take(p["table"], ids, axis=0), axis=1)
        return jnp.mean((jnp.tanh(e @ p["w"]) @ p["out"] - y) ** 2)

    return _train_case("embedding train", loss, params, (ids, y))


def pinn(*, points: int = 512, width: int = 64, seed: int = 0) -> Case:
    """A physics-informed network: u(x, t) by an MLP; the loss uses ∂u/∂x and ∂u/∂t."""
    k = jax.random.split(jax.random.key(seed), 4)
    params = {"w1": _normal(k[0], (2, width), 1.0), "w2": _normal(k[1], (width, width), 0.2),
              "w3": _normal(k[2], (width, 1), 0.2)}  # fmt: skip
    xs = jax.random.uniform(k[3], (points, 2))

    def u(p, x):  # one point
        h = jnp.tanh(x @ p["w1"])
        h = jnp.tanh(h @ p["w2"])
        return (h @ p["w3"])[0]

    def loss(p, xs):
        du = jax.vmap(jax.grad(u, argnums=1), in_axes=(None, 0))(p, xs)  # (points, 2)
        values = jax.vmap(u, in_axes=(None, 0))(p, xs)
        residual = du[:, 1] + values * du[:, 0]  # Burgers-like transport
        return jnp.mean(residual**2) + jnp.mean((values - jnp.sin(xs[:, 0])) ** 2)

    return _train_case("pinn train", loss, params, xs)


def cases() -> list[Case]:
    """The benchmark's small cases (verified by compiling)."""
    return [
        mlp(1024, 128, train=False),
        mlp(1024, 128, train=True),
        mlp(128, 1024, train=False),
        mlp(128, 1024, train=True),
        gpt(2),
        moe(),
        conv(),
        embedding(),
        pinn(),
    ]
