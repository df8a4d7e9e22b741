"""Graph mode vs ``%%jit``: tutorial-style cells run in two real kernels, compared run by run.

Each :class:`Item` is a notebook cell written the way JAX tutorials write them (training
loops, RNG keys, flax nnx and equinox modules, optax, dataclass state, closures over config,
magics, lax control flow, sharded arrays). The harness starts two shardlab kernels, runs the
item's setup once in each, then runs the cell body the same number of times in both: as
``%%graph`` (or with the cell metadata ``{"shardlab": {"mode": "graph"}}``) in one, as
``%%jit`` in the other. After every run it pulls back, from both kernels, every name the
cell binds or reads (a read name may be changed in place: an nnx module, a config dict), as
plain NumPy data through a pickle file, and compares them (rtol 1e-5, atol 1e-6; integers,
booleans, strings and RNG key data exactly), with the printed output (stdout, ``x?`` pages
and the cell's result, timings of ``%time`` ignored). In the graph kernel it also counts
tracers reachable from the user namespace and the graph cache's traces.

Finally :func:`alternating_rss` runs 300 small cells alternating eager / jit / graph in a
fresh kernel and samples the process RSS after a warm-up and at the end.

Run: ``python -m shardlab.bench --only graph`` (the section of docs/benchmarks.md) or
``python -m shardlab.bench.graph_suite [ITEM ...]``.
"""

from __future__ import annotations

import ast
import math
import os
import pickle
import queue
import re
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.manager import KernelManager

RTOL = 1e-5
ATOL = 1e-6
TIMEOUT = 300
RSS_CELLS = 300
RSS_WARMUP = 60
RSS_TARGET = 1.10
GRAPH_METADATA = {"shardlab": {"mode": "graph"}}
JIT_METADATA = {"shardlab": {"mode": "jit"}}


@dataclass(frozen=True)
class Item:
    """One tutorial-style cell.

    ``setup`` runs once (plain cell, the kernel's default mode ``jit``); ``between`` runs
    before every run after the first (an in-place config change, say); ``body`` runs
    ``runs`` times. ``traces`` is how many times graph mode should trace the body over all
    its runs (1: it never retraces; ``runs``: each run changes static state), or None.
    ``via`` is how the graph kernel gets graph mode: the ``%%graph`` line or cell metadata.
    """

    name: str
    summary: str
    setup: str
    body: str
    runs: int = 3
    between: str = ""
    traces: int | None = 1
    via: str = "magic"
    group: str = ""


PRELUDE = """\
import dataclasses, functools
from typing import Any, Callable, NamedTuple
import numpy as np
import jax, jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import optax
import equinox as eqx
import flax
from flax import nnx
"""


def _item(
    name: str,
    summary: str,
    setup: str,
    body: str,
    *,
    runs: int = 3,
    between: str = "",
    traces: int | None = 1,
    via: str = "magic",
    group: str = "",
) -> Item:
    return Item(
        name=name,
        summary=summary,
        setup=textwrap.dedent(setup).strip("\n"),
        body=textwrap.dedent(body).strip("\n"),
        runs=runs,
        between=textwrap.dedent(between).strip("\n"),
        traces=traces,
        via=via,
        group=group,
    )


# fmt: off
ITEMS: tuple[Item, ...] = (
    # -- training loops ------------------------------------------------------------------
    _item("linreg_sgd", "linear regression, params dict, value_and_grad + tree.map SGD", """
        X = jax.random.normal(jax.random.key(0), (64, 3))
        true_w = jnp.array([1.5, -2.0, 0.5])
        Y = X @ true_w + 0.3
        params = {"w": jnp.zeros(3), "b": jnp.zeros(())}
        lr = 0.1
        def mse(params, x, y):
            pred = x @ params["w"] + params["b"]
            return jnp.mean((pred - y) ** 2)
        """, """
        loss, grads = jax.value_and_grad(mse)(params, X, Y)
        params = jax.tree.map(lambda p, g: p - lr * g, params, grads)
        print(f"loss {loss:.5f}")
        """, runs=4, via="metadata", group="training"),
    _item("mlp_inner_loop", "MLP as a list of layer dicts, 3 SGD steps in a Python loop", """
        def init_mlp(key, sizes):
            layers = []
            keys = jax.random.split(key, len(sizes) - 1)
            for k, m, n in zip(keys, sizes[:-1], sizes[1:]):
                wk, bk = jax.random.split(k)
                layers.append({"W": jax.random.normal(wk, (m, n)) / jnp.sqrt(m),
                               "b": 0.1 * jax.random.normal(bk, (n,))})
            return layers
        def mlp(layers, x):
            for layer in layers[:-1]:
                x = jax.nn.relu(x @ layer["W"] + layer["b"])
            return x @ layers[-1]["W"] + layers[-1]["b"]
        def mlp_loss(layers, x, y):
            return jnp.mean((mlp(layers, x) - y) ** 2)
        mlp_params = init_mlp(jax.random.key(1), [4, 16, 16, 1])
        xs = jax.random.normal(jax.random.key(2), (32, 4))
        ys = jnp.sin(xs.sum(axis=1, keepdims=True))
        """, """
        for i in range(3):
            g = jax.grad(mlp_loss)(mlp_params, xs, ys)
            mlp_params = jax.tree.map(lambda p, d: p - 0.05 * d, mlp_params, g)
        train_loss = mlp_loss(mlp_params, xs, ys)
        print("train loss", train_loss)
        """, runs=4, group="training"),
    _item("optax_adam", "optax.adam: tx.update + optax.apply_updates, opt_state carried", """
        tx = optax.adam(1e-2)
        p_adam = {"w": jnp.ones((3, 2)) * 0.1, "b": jnp.zeros(2)}
        opt_state = tx.init(p_adam)
        xa = jnp.linspace(-1, 1, 24).reshape(8, 3)
        ya = jnp.stack([xa.sum(1), xa[:, 0] - xa[:, 2]], axis=1)
        def adam_loss(p, x, y):
            return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)
        """, """
        loss_a, grads_a = jax.value_and_grad(adam_loss)(p_adam, xa, ya)
        updates, opt_state = tx.update(grads_a, opt_state, p_adam)
        p_adam = optax.apply_updates(p_adam, updates)
        """, runs=4, group="training"),
    _item("optax_chain_schedule", "optax.chain(clip, adamw(warmup-cosine schedule))", """
        schedule = optax.warmup_cosine_decay_schedule(0.0, 0.1, warmup_steps=2, decay_steps=10)
        tx_chain = optax.chain(optax.clip_by_global_norm(1.0),
                               optax.adamw(schedule, weight_decay=1e-4))
        p_chain = {"dense": {"kernel": jax.random.normal(jax.random.key(3), (5, 3)),
                             "bias": jnp.zeros(3)}}
        chain_state = tx_chain.init(p_chain)
        xc = jax.random.normal(jax.random.key(4), (16, 5))
        yc = jax.random.normal(jax.random.key(5), (16, 3))
        def chain_loss(p):
            out = xc @ p["dense"]["kernel"] + p["dense"]["bias"]
            return optax.l2_loss(out, yc).mean()
        """, """
        grads_c = jax.grad(chain_loss)(p_chain)
        upd_c, chain_state = tx_chain.update(grads_c, chain_state, p_chain)
        p_chain = optax.apply_updates(p_chain, upd_c)
        print(f"loss={chain_loss(p_chain):.4f}")
        """, runs=4, group="training"),
    _item("aux_metrics", "value_and_grad(has_aux=True), softmax classifier, metrics dict", """
        def loss_with_metrics(params, x, y):
            logits = x @ params["w"] + params["b"]
            loss = optax.softmax_cross_entropy(logits, jax.nn.one_hot(y, 3)).mean()
            acc = jnp.mean(jnp.argmax(logits, -1) == y)
            return loss, {"loss": loss, "accuracy": acc}
        clf = {"w": jnp.zeros((4, 3)), "b": jnp.zeros(3)}
        xcl = jax.random.normal(jax.random.key(6), (40, 4))
        ycl = jnp.argmax(xcl[:, :3], axis=1)
        """, """
        (loss_m, metrics), grads_m = jax.value_and_grad(loss_with_metrics, has_aux=True)(
            clf, xcl, ycl)
        clf = jax.tree.map(lambda p, g: p - 0.5 * g, clf, grads_m)
        print(f"loss {metrics['loss']:.4f} acc {metrics['accuracy']:.3f}")
        """, runs=4, group="training"),
    _item("jit_step_counter", "@jax.jit train step called from the cell, Python step counter", """
        def mse1(params, x, y):
            return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)
        @jax.jit
        def sgd_step(params, x, y):
            loss, g = jax.value_and_grad(mse1)(params, x, y)
            return jax.tree.map(lambda p, d: p - 0.1 * d, params, g), loss
        p_jit = {"w": jnp.zeros(3), "b": jnp.zeros(())}
        jx = jnp.arange(30.0).reshape(10, 3) / 30
        jy = jx @ jnp.array([2.0, -1.0, 0.5])
        step = 0
        """, """
        p_jit, loss_j = sgd_step(p_jit, jx, jy)
        step += 1
        print(f"step {step}: loss {loss_j:.4f}")
        """, runs=4, traces=4, group="training"),
    _item("loss_history_list", "loss history kept as `history = [*history, loss]`", """
        w_h = jnp.array([3.0, -2.0])
        def bowl(w):
            return jnp.sum(w ** 2) + 0.5 * w[0] * w[1]
        history = []
        """, """
        loss_h, g_h = jax.value_and_grad(bowl)(w_h)
        w_h = w_h - 0.1 * g_h
        history = [*history, loss_h]
        """, runs=3, traces=3, group="training"),
    _item("minibatch_epoch", "an epoch of minibatches by slicing, dict comprehension update", """
        data_x = jax.random.normal(jax.random.key(7), (48, 2))
        data_y = data_x @ jnp.array([0.7, -1.3]) + 0.1
        mb_params = {"w": jnp.zeros(2), "b": jnp.zeros(())}
        bs = 16
        epoch = jnp.array(0)
        def mb_loss(p, x, y):
            return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)
        """, """
        for start in range(0, data_x.shape[0], bs):
            xb, yb = data_x[start:start + bs], data_y[start:start + bs]
            gb = jax.grad(mb_loss)(mb_params, xb, yb)
            mb_params = {k: mb_params[k] - 0.1 * gb[k] for k in mb_params}
        epoch = epoch + 1
        print("epoch", epoch, "loss", mb_loss(mb_params, data_x, data_y))
        """, runs=3, group="training"),
    # -- RNG ------------------------------------------------------------------------------
    _item("key_split_per_step", "jax.random.key split every run, random walk", """
        key = jax.random.key(42)
        walk = jnp.zeros(4)
        """, """
        key, subkey = jax.random.split(key)
        walk = walk + 0.1 * jax.random.normal(subkey, walk.shape)
        print("position", walk)
        """, runs=4, via="metadata", group="rng"),
    _item("prngkey_fold_in", "legacy PRNGKey + fold_in(step array), uniform and permutation", """
        rng = jax.random.PRNGKey(7)
        it = jnp.array(0, dtype=jnp.int32)
        """, """
        step_key = jax.random.fold_in(rng, it)
        u = jax.random.uniform(step_key, (3,))
        perm = jax.random.permutation(step_key, 6)
        it = it + 1
        """, runs=3, group="rng"),
    _item("manual_dropout", "dropout by hand: split, bernoulli mask, jnp.where", """
        drop_key = jax.random.key(3)
        acts = jnp.ones((4, 8))
        rate = 0.25
        """, """
        drop_key, mask_key = jax.random.split(drop_key)
        keep = jax.random.bernoulli(mask_key, 1.0 - rate, acts.shape)
        dropped = jnp.where(keep, acts / (1.0 - rate), 0.0)
        print("kept", keep.sum())
        """, runs=3, group="rng"),
    _item("nnx_rngs_streams", "nnx.Rngs(params=, dropout=) streams drawn in the cell", """
        rngs = nnx.Rngs(params=0, dropout=1)
        """, """
        w_init = jax.random.normal(rngs.params(), (2, 3))
        noise = jax.random.uniform(rngs.dropout(), (3,))
        """, runs=3, group="rng"),
    _item("nnx_dropout", "nnx.Dropout(0.5): its RNG state advances every run", """
        drop = nnx.Dropout(0.5, rngs=nnx.Rngs(dropout=0))
        ones = jnp.ones((2, 8))
        """, """
        masked = drop(ones)
        """, runs=3, group="rng"),
    _item("nnx_key_in_jax_random", "nnx.Rngs() key fed to jax.random.normal in a loop", """
        sample_rngs = nnx.Rngs(5)
        total_noise = jnp.zeros(3)
        """, """
        for _ in range(2):
            total_noise = total_noise + jax.random.normal(sample_rngs(), (3,))
        print("noise", total_noise)
        """, runs=3, group="rng"),
    # -- flax nnx -------------------------------------------------------------------------
    _item("nnx_linear", "nnx.Linear forward, last expression shown", """
        lin = nnx.Linear(3, 4, rngs=nnx.Rngs(0))
        xin = jnp.arange(6.0).reshape(2, 3)
        """, """
        out_lin = lin(xin)
        out_lin.sum()
        """, runs=3, group="nnx"),
    _item("nnx_sequential", "nnx.Sequential(Linear, gelu, Linear)", """
        seq = nnx.Sequential(nnx.Linear(4, 8, rngs=nnx.Rngs(1)), nnx.gelu,
                             nnx.Linear(8, 2, rngs=nnx.Rngs(2)))
        xseq = jnp.ones((5, 4))
        """, """
        yseq = seq(xseq)
        print(yseq.shape, yseq.mean())
        """, runs=3, group="nnx"),
    _item("nnx_batchnorm_train", "nnx.BatchNorm in training mode: running stats update", """
        bn = nnx.BatchNorm(3, momentum=0.9, rngs=nnx.Rngs(0))
        bx = jax.random.normal(jax.random.key(9), (16, 3)) * 2 + 1
        """, """
        bn_out = bn(bx)
        print("running mean", bn.mean.value)
        """, runs=4, via="metadata", group="nnx"),
    _item("nnx_dropout_mlp_optimizer", "nnx MLP with Dropout, nnx.Optimizer(sgd), value_and_grad",
        """
        class MLP(nnx.Module):
            def __init__(self, din, dh, dout, *, rngs):
                self.l1 = nnx.Linear(din, dh, rngs=rngs)
                self.drop = nnx.Dropout(0.2, rngs=rngs)
                self.l2 = nnx.Linear(dh, dout, rngs=rngs)
            def __call__(self, x):
                return self.l2(self.drop(nnx.relu(self.l1(x))))
        net = MLP(4, 16, 1, rngs=nnx.Rngs(0))
        net_opt = nnx.Optimizer(net, optax.sgd(0.05), wrt=nnx.Param)
        nx = jax.random.normal(jax.random.key(8), (32, 4))
        ny = nx[:, :1] * 2
        def net_loss(model, x, y):
            return jnp.mean((model(x) - y) ** 2)
        """, """
        loss_n, grads_n = nnx.value_and_grad(net_loss)(net, nx, ny)
        net_opt.update(net, grads_n)
        print(f"loss {loss_n:.4f}")
        """, runs=4, group="nnx"),
    _item("nnx_optimizer_adam", "nnx regressor, nnx.grad of a lambda, nnx.Optimizer(adam)", """
        class Regressor(nnx.Module):
            def __init__(self, rngs):
                self.hidden = nnx.Linear(2, 8, rngs=rngs)
                self.out = nnx.Linear(8, 1, rngs=rngs)
            def __call__(self, x):
                return self.out(jnp.tanh(self.hidden(x)))
        reg = Regressor(nnx.Rngs(3))
        reg_opt = nnx.Optimizer(reg, optax.adam(1e-2), wrt=nnx.Param)
        rx = jnp.linspace(-1, 1, 20).reshape(10, 2)
        ry = rx[:, :1] * rx[:, 1:]
        """, """
        grads_r = nnx.grad(lambda m: jnp.mean((m(rx) - ry) ** 2))(reg)
        reg_opt.update(reg, grads_r)
        reg_loss = jnp.mean((reg(rx) - ry) ** 2)
        """, runs=4, group="nnx"),
    _item("nnx_split_merge", "nnx.split / tree.map on the state / nnx.merge", """
        base = nnx.Linear(3, 3, rngs=nnx.Rngs(4))
        graphdef, lin_state = nnx.split(base)
        eye3 = jnp.eye(3)
        """, """
        lin_state = jax.tree.map(lambda v: v * 0.9, lin_state)
        merged = nnx.merge(graphdef, lin_state)
        y_merged = merged(eye3)
        """, runs=3, group="nnx"),
    _item("nnx_jit_train_step", "@nnx.jit train step (model, optimizer updated in place)", """
        cls_model = nnx.Linear(4, 3, rngs=nnx.Rngs(5))
        cls_opt = nnx.Optimizer(cls_model, optax.sgd(0.1, momentum=0.9), wrt=nnx.Param)
        @nnx.jit
        def nnx_train_step(model, optimizer, x, y):
            def loss_fn(model):
                logits = model(x)
                return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            loss, grads = nnx.value_and_grad(loss_fn)(model)
            optimizer.update(model, grads)
            return loss
        cx = jax.random.normal(jax.random.key(10), (24, 4))
        cy = jnp.argmax(cx[:, :3], 1)
        """, """
        cls_loss = nnx_train_step(cls_model, cls_opt, cx, cy)
        print("loss", cls_loss)
        """, runs=4, group="nnx"),
    # -- equinox --------------------------------------------------------------------------
    _item("eqx_mlp_vmap", "eqx.nn.MLP(activation=tanh) vmapped over a batch", """
        emlp = eqx.nn.MLP(in_size=3, out_size=2, width_size=8, depth=2,
                          activation=jax.nn.tanh, key=jax.random.PRNGKey(11))
        ex = jax.random.normal(jax.random.PRNGKey(12), (6, 3))
        """, """
        ey = jax.vmap(emlp)(ex)
        ex = ex + 0.1 * ey.sum()
        print(ey.mean())
        """, runs=3, group="equinox"),
    _item("eqx_filter_value_and_grad", "@eqx.filter_value_and_grad loss, eqx.apply_updates SGD",
        """
        emodel = eqx.nn.MLP(2, 1, 16, 2, key=jax.random.PRNGKey(13))
        exs = jax.random.uniform(jax.random.PRNGKey(14), (32, 2))
        eys = jnp.sin(3 * exs[:, :1])
        @eqx.filter_value_and_grad
        def eqx_loss(model, x, y):
            return jnp.mean((jax.vmap(model)(x) - y) ** 2)
        """, """
        eloss, egrads = eqx_loss(emodel, exs, eys)
        emodel = eqx.apply_updates(emodel, jax.tree.map(lambda g: -0.1 * g, egrads))
        print(f"eqx loss {eloss:.5f}")
        """, runs=4, via="metadata", group="equinox"),
    _item("eqx_optax", "eqx.nn.Linear + optax.adam on eqx.filter(model, eqx.is_array)", """
        enet = eqx.nn.Linear(3, 2, key=jax.random.PRNGKey(15))
        eopt = optax.adam(0.05)
        eopt_state = eopt.init(eqx.filter(enet, eqx.is_array))
        eqx_in = jnp.ones((5, 3))
        eqx_target = jnp.zeros((5, 2))
        def lin_loss(m):
            return jnp.mean((jax.vmap(m)(eqx_in) - eqx_target) ** 2)
        """, """
        g_lin = eqx.filter_grad(lin_loss)(enet)
        e_updates, eopt_state = eopt.update(g_lin, eopt_state, eqx.filter(enet, eqx.is_array))
        enet = eqx.apply_updates(enet, e_updates)
        """, runs=4, group="equinox"),
    _item("eqx_module_fields", "eqx.Module with a static activation field and a float field", """
        class Block(eqx.Module):
            linear: eqx.nn.Linear
            act: Callable = eqx.field(static=True)
            scale: float = 1.0
            def __call__(self, x):
                return self.scale * self.act(self.linear(x))
        block = Block(eqx.nn.Linear(4, 4, key=jax.random.PRNGKey(16)), jax.nn.softplus, 0.5)
        bin_ = jnp.arange(4.0)
        """, """
        bout = block(bin_)
        block = eqx.tree_at(lambda b: b.scale, block, block.scale * 1.5)
        """, runs=3, traces=3, group="equinox"),
    _item("eqx_filter_jit_step", "@eqx.filter_jit step returning (model, loss)", """
        fmodel = eqx.nn.MLP(3, 1, 8, 1, activation=jax.nn.relu, key=jax.random.PRNGKey(17))
        fx = jnp.linspace(0, 1, 15).reshape(5, 3)
        fy = fx.sum(1, keepdims=True)
        @eqx.filter_jit
        def eqx_step(model, x, y):
            loss, grads = eqx.filter_value_and_grad(
                lambda m: jnp.mean((jax.vmap(m)(x) - y) ** 2))(model)
            return eqx.apply_updates(model, jax.tree.map(lambda g: -0.05 * g, grads)), loss
        """, """
        fmodel, floss = eqx_step(fmodel, fx, fy)
        """, runs=3, group="equinox"),
    # -- dataclass state ------------------------------------------------------------------
    _item("register_dataclass_state", "register_dataclass TrainState (data + meta fields)", """
        @functools.partial(jax.tree_util.register_dataclass,
                           data_fields=["params", "step"], meta_fields=["lr"])
        @dataclasses.dataclass
        class TrainState:
            params: dict
            step: jax.Array
            lr: float
        def quad(p):
            return jnp.sum((p["x"] - 3.0) ** 2)
        ts = TrainState(params={"x": jnp.zeros(2)}, step=jnp.array(0), lr=0.2)
        """, """
        g_ts = jax.grad(quad)(ts.params)
        ts = TrainState(params=jax.tree.map(lambda p, g: p - ts.lr * g, ts.params, g_ts),
                        step=ts.step + 1, lr=ts.lr)
        print("step", ts.step, "x", ts.params["x"])
        """, runs=3, group="dataclass"),
    _item("flax_struct_dataclass", "flax.struct.dataclass metrics, .replace, static field", """
        @flax.struct.dataclass
        class Stats:
            total: jax.Array
            count: jax.Array
            name: str = flax.struct.field(pytree_node=False, default="stats")
        stats = Stats(total=jnp.zeros(()), count=jnp.zeros((), jnp.int32))
        batch_vals = jnp.arange(5.0)
        """, """
        stats = stats.replace(total=stats.total + batch_vals.sum(),
                              count=stats.count + batch_vals.size)
        mean_val = stats.total / stats.count
        """, runs=3, group="dataclass"),
    _item("dataclasses_replace", "@register_dataclass particle, dataclasses.replace", """
        @jax.tree_util.register_dataclass
        @dataclasses.dataclass
        class Particle:
            pos: jax.Array
            vel: jax.Array
        pt = Particle(pos=jnp.zeros(2), vel=jnp.array([1.0, 0.5]))
        dt = 0.1
        """, """
        pt = dataclasses.replace(pt, pos=pt.pos + dt * pt.vel, vel=pt.vel * 0.99)
        speed = jnp.linalg.norm(pt.vel)
        """, runs=3, group="dataclass"),
    _item("namedtuple_state", "NamedTuple optimizer state (momentum, count)", """
        class MomentumState(NamedTuple):
            mu: jax.Array
            t: jax.Array
        ns = MomentumState(jnp.zeros(3), jnp.array(0))
        grad_like = jnp.array([0.1, -0.2, 0.3])
        """, """
        ns = MomentumState(mu=0.9 * ns.mu + 0.1 * grad_like, t=ns.t + 1)
        bias_corrected = ns.mu / (1 - 0.9 ** ns.t)
        """, runs=3, group="dataclass"),
    # -- closures and config --------------------------------------------------------------
    _item("closure_config_dict", "loss closed over a config dict changed in place between runs",
        """
        reg_cfg = {"l2": 0.01, "scale": 2.0}
        def make_loss(cfg):
            def loss(w):
                return jnp.sum((w * cfg["scale"] - 1.0) ** 2) + cfg["l2"] * jnp.sum(w ** 2)
            return loss
        closed_loss = make_loss(reg_cfg)
        wc = jnp.ones(3)
        """, """
        lc, grad_c = jax.value_and_grad(closed_loss)(wc)
        wc = wc - 0.05 * grad_c
        """, runs=3, between='reg_cfg["l2"] = reg_cfg["l2"] * 10', traces=3, group="closures"),
    _item("closure_object_setattr", "function reading a config object; setattr between runs", """
        class Config:
            def __init__(self):
                self.alpha = 0.5
                self.activation = "tanh"
        run_cfg = Config()
        def forward(x):
            h = jnp.tanh(x) if run_cfg.activation == "tanh" else jax.nn.relu(x)
            return run_cfg.alpha * h
        fin = jnp.linspace(-2, 2, 5)
        """, """
        fout = forward(fin)
        """, runs=3, between="""
        setattr(run_cfg, "alpha", run_cfg.alpha + 0.25)
        run_cfg.activation = "relu" if run_cfg.activation == "tanh" else "tanh"
        """, traces=3, group="closures"),
    _item("hp_dict_lr", "hp['lr'] read in the cell, halved between runs (momentum SGD)", """
        hp = {"lr": 0.1, "momentum": 0.9}
        w_hp = jnp.zeros(2)
        vel_hp = jnp.zeros(2)
        """, """
        g_hp = jax.grad(lambda w: jnp.sum((w - 2.0) ** 2))(w_hp)
        vel_hp = hp["momentum"] * vel_hp + g_hp
        w_hp = w_hp - hp["lr"] * vel_hp
        """, runs=4, between='hp["lr"] = hp["lr"] * 0.5', traces=4, group="closures"),
    _item("partial_config", "functools.partial(loss, cfg=cfg_dict); cfg changed between runs",
        """
        def penalised(w, cfg):
            return jnp.sum(w ** 2) * cfg["weight"]
        pen_cfg = {"weight": 1.0}
        pen_loss = functools.partial(penalised, cfg=pen_cfg)
        wp = jnp.arange(3.0)
        """, """
        pen_value = pen_loss(wp)
        """, runs=3, between='pen_cfg["weight"] = pen_cfg["weight"] + 1.0', traces=3,
        group="closures"),
    _item("object_with_weights", "plain Python class holding an array; attribute rebound", """
        class Scaler:
            def __init__(self, w):
                self.w = w
            def __call__(self, x):
                return x * self.w
        scaler = Scaler(jnp.array([1.0, 2.0, 3.0]))
        sv = jnp.ones(3)
        """, """
        scaled_v = scaler(sv)
        sv = scaled_v / 2
        """, runs=3, between="scaler.w = scaler.w + 1.0", traces=3, group="closures"),
    # -- printing -------------------------------------------------------------------------
    _item("step_counter_print", "Python step counter and formatted print", """
        counter = 0
        acc_sum = jnp.zeros(())
        """, """
        counter += 1
        acc_sum = acc_sum + counter * 0.5
        print(f"step {counter}: acc {acc_sum:.3f}")
        """, runs=3, traces=3, group="print"),
    _item("print_pytree", "print() of a params dict and of array attributes", """
        pv = {"w": jnp.array([1.0, 2.0]), "b": jnp.array(0.5)}
        """, """
        pv = jax.tree.map(lambda a: a * 2, pv)
        print("params:", pv)
        print("w is", pv["w"], "dtype", pv["w"].dtype, "shape", pv["w"].shape)
        """, runs=3, group="print"),
    _item("fstring_debug_equals", "f-string debugging specifier f\"{loss=}\"", """
        fl = jnp.array(2.0)
        """, """
        fl = fl * 0.5
        print(f"{fl=}")
        """, runs=3, group="print"),
    _item("dict_output_order", "a metrics dict built in the cell, keys in insertion order", """
        run_w = jnp.array([1.0, -1.0])
        run_x = jnp.array([[1.0, 2.0], [3.0, 4.0]])
        """, """
        logits_o = run_x @ run_w
        summary = {"loss": jnp.mean(logits_o ** 2), "accuracy": jnp.mean(logits_o > 0),
                   "max_logit": logits_o.max()}
        run_w = run_w * 0.9
        """, runs=3, group="print"),
    _item("debug_print_order", "jax.debug.print interleaved with print", """
        dp = jnp.arange(4.0)
        """, """
        dp = dp * 1.5
        jax.debug.print("debug: dp sum = {s}", s=dp.sum())
        print("print: dp max", dp.max())
        jax.debug.print("debug: first {}", dp[0])
        """, runs=3, group="print"),
    _item("fori_debug_print", "jax.debug.print inside a lax.fori_loop body, print after", """
        fl_x = jnp.array(1.0)
        def halve_plus_one(i, x):
            jax.debug.print("iter {i}: {x}", i=i, x=x)
            return x * 0.5 + 1.0
        """, """
        fl_x = lax.fori_loop(0, 3, halve_plus_one, fl_x)
        print("final", fl_x)
        """, runs=3, group="print"),
    # -- magics ---------------------------------------------------------------------------
    _item("time_line_magic", "%time on a jitted train step, print after", """
        mt_params = jnp.ones(4)
        mt_x = jnp.linspace(0, 1, 4)
        @jax.jit
        def mt_step(p, x):
            loss, g = jax.value_and_grad(lambda q: jnp.sum((q * x - 1.0) ** 2))(p)
            return p - 0.1 * g, loss
        """, """
        %time mt_params, mt_loss = mt_step(mt_params, mt_x)
        print("loss after", mt_loss)
        """, runs=3, traces=1, group="magics"),
    _item("time_cell_magic", "%%time cell (mode from cell metadata), two training steps", """
        ct_w = jnp.zeros(3)
        ct_x = jnp.eye(3) + 0.1
        ct_y = jnp.array([1.0, 2.0, 3.0])
        def ct_loss(w):
            return jnp.mean((ct_x @ w - ct_y) ** 2)
        """, """
        %%time
        for _ in range(2):
            ct_w = ct_w - 0.2 * jax.grad(ct_loss)(ct_w)
        ct_value = ct_loss(ct_w)
        print("loss", ct_value)
        """, runs=3, via="metadata", group="magics"),
    _item("time_cell_magic_lines", "%%time under a %%graph / %%jit first line", """
        cl_w = jnp.zeros(3)
        cl_x = jnp.eye(3) + 0.1
        cl_y = jnp.array([1.0, 2.0, 3.0])
        def cl_loss(w):
            return jnp.mean((cl_x @ w - cl_y) ** 2)
        """, """
        %%time
        for _ in range(2):
            cl_w = cl_w - 0.2 * jax.grad(cl_loss)(cl_w)
        cl_value = cl_loss(cl_w)
        print("loss", cl_value)
        """, runs=3, group="magics"),
    _item("devices_shell_help", "%devices, !echo, x? and array work in one cell", """
        dv = jnp.arange(3.0)
        """, """
        %devices
        !echo "epoch start"
        dv = dv * 2 + 1
        dv?
        print("dv sum", dv.sum())
        """, runs=3, traces=2, group="magics"),
    # -- lax control flow -----------------------------------------------------------------
    _item("fori_loop_training", "lax.fori_loop of 10 gradient steps", """
        fl_params = {"a": jnp.array(0.0), "c": jnp.array(0.0)}
        fl_t = jnp.linspace(0, 1, 16)
        fl_target = 3.0 * fl_t - 1.0
        def fl_loss(p):
            return jnp.mean((p["a"] * fl_t + p["c"] - fl_target) ** 2)
        def fl_step(i, p):
            g = jax.grad(fl_loss)(p)
            return jax.tree.map(lambda v, d: v - 0.3 * d, p, g)
        """, """
        fl_params = lax.fori_loop(0, 10, fl_step, fl_params)
        fl_value = fl_loss(fl_params)
        """, runs=3, group="lax"),
    _item("scan_rnn", "lax.scan over a sequence (tanh RNN), carry kept across runs", """
        rk = jax.random.split(jax.random.key(21), 3)
        rnn_p = {"Wx": 0.5 * jax.random.normal(rk[0], (3, 4)),
                 "Wh": 0.5 * jax.random.normal(rk[1], (4, 4)), "b": jnp.zeros(4)}
        seq = jax.random.normal(rk[2], (7, 3))
        h0 = jnp.zeros(4)
        def rnn_cell(h, x):
            h = jnp.tanh(x @ rnn_p["Wx"] + h @ rnn_p["Wh"] + rnn_p["b"])
            return h, h.sum()
        """, """
        h_last, per_step = lax.scan(rnn_cell, h0, seq)
        h0 = h_last * 0.5
        """, runs=3, group="lax"),
    _item("cond_branch", "lax.cond on an array predicate, branches alternate", """
        cv = jnp.array([3.0, -1.0])
        """, """
        norm = jnp.linalg.norm(cv)
        cv = lax.cond(norm > 2.0, lambda v: v / norm, lambda v: v * 1.5, cv)
        branch_val = jnp.where(norm > 2.0, 1, 0)
        """, runs=4, group="lax"),
    _item("while_newton", "lax.while_loop Newton square roots, target moves", """
        target = jnp.array([2.0, 9.0, 10.0])
        guess = jnp.ones(3)
        """, """
        root, iters = lax.while_loop(
            lambda s: (s[1] < 20) & (jnp.max(jnp.abs(s[0] ** 2 - target)) > 1e-5),
            lambda s: ((s[0] + target / s[0]) / 2, s[1] + 1),
            (guess, 0))
        target = target + 1.0
        """, runs=3, group="lax"),
    # -- vmap / grad / jit inside the cell ------------------------------------------------
    _item("vmap_per_example_grads", "vmap(grad) per-example gradients, in_axes=(None, 0, 0)", """
        pe_w = jnp.array([0.5, -0.5])
        pe_x = jnp.linspace(-1, 1, 16).reshape(8, 2)
        pe_y = pe_x @ jnp.array([1.0, 1.0])
        def pe_loss(w, x, y):
            return (x @ w - y) ** 2
        """, """
        per_ex = jax.vmap(jax.grad(pe_loss), in_axes=(None, 0, 0))(pe_w, pe_x, pe_y)
        pe_w = pe_w - 0.1 * per_ex.mean(0)
        norms = jnp.linalg.norm(per_ex, axis=1)
        """, runs=3, group="transforms"),
    _item("jit_inside_cell", "jax.jit(f)(x) and jax.jit(jax.grad(...)) inside the cell", """
        def smooth(x):
            return jnp.convolve(x, jnp.ones(3) / 3, mode="same")
        sig = jnp.sin(jnp.linspace(0, 6.28, 32))
        """, """
        sig = jax.jit(smooth)(sig)
        deriv = jax.jit(jax.grad(lambda s: jnp.sum(smooth(s) ** 2)))(sig)
        """, runs=3, group="transforms"),
    _item("hessian_newton", "jax.hessian + damped Newton step on Rosenbrock", """
        def rosen(p):
            return (1 - p[0]) ** 2 + 100 * (p[1] - p[0] ** 2) ** 2
        pt_r = jnp.array([-1.0, 1.5])
        """, """
        H = jax.hessian(rosen)(pt_r)
        g_r = jax.grad(rosen)(pt_r)
        pt_r = pt_r - jnp.linalg.solve(H + 10 * jnp.eye(2), g_r)
        print(f"f = {rosen(pt_r):.4f}")
        """, runs=3, group="transforms"),
    # -- sharded arrays -------------------------------------------------------------------
    _item("sharded_matmul", "device_put with NamedSharding on a 2x4 Mesh, matmul + reduce", """
        mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
        sx = jax.device_put(jnp.arange(64.0).reshape(8, 8) / 64,
                            NamedSharding(mesh, P("data", None)))
        sw = jax.device_put(jnp.eye(8) * 0.5, NamedSharding(mesh, P(None, "model")))
        """, """
        sy = sx @ sw
        sx = jnp.tanh(sy) + sx
        col_sums = sy.sum(axis=0)
        """, runs=3, via="metadata", group="sharded"),
    _item("data_parallel_sgd", "data-parallel SGD: batch sharded over 8 devices", """
        dp_mesh = jax.make_mesh((8,), ("batch",), axis_types=(jax.sharding.AxisType.Auto,))
        dp_x = jax.device_put(jax.random.normal(jax.random.key(20), (64, 4)),
                              NamedSharding(dp_mesh, P("batch")))
        dp_y = jax.device_put(dp_x @ jnp.array([1.0, 2.0, -1.0, 0.5]),
                              NamedSharding(dp_mesh, P("batch")))
        dp_params = jax.device_put({"w": jnp.zeros(4)}, NamedSharding(dp_mesh, P()))
        def dp_loss(p, x, y):
            return jnp.mean((x @ p["w"] - y) ** 2)
        """, """
        dp_l, dp_g = jax.value_and_grad(dp_loss)(dp_params, dp_x, dp_y)
        dp_params = jax.tree.map(lambda p, g: p - 0.1 * g, dp_params, dp_g)
        print(f"dp loss {dp_l:.4f}")
        """, runs=4, group="sharded"),
    _item("explicit_mesh_set_mesh", "Explicit-axis mesh, `with jax.set_mesh(mesh):` in the cell",
        """
        ex_mesh = jax.make_mesh((2, 4), ("data", "model"))
        ex_x = jax.device_put(jnp.linspace(-1, 1, 64).reshape(16, 4),
                              NamedSharding(ex_mesh, P("data", None)))
        ex_y = jax.device_put(jnp.cos(jnp.linspace(0, 3, 16)), NamedSharding(ex_mesh, P("data")))
        ex_w = jax.device_put(jnp.zeros(4), NamedSharding(ex_mesh, P()))
        def ex_loss(w, x, y):
            return jnp.mean((x @ w - y) ** 2)
        """, """
        with jax.set_mesh(ex_mesh):
            ex_l, ex_g = jax.value_and_grad(ex_loss)(ex_w, ex_x, ex_y)
            ex_w = ex_w - 0.2 * ex_g
        print(f"loss {ex_l:.5f}")
        """, runs=3, group="sharded", traces=2),  # two programs: the mesh block, the print
    _item("sharding_constraint", "with_sharding_constraint inside the cell", """
        mesh2 = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
        sc_x = jax.device_put(jnp.linspace(0, 1, 64).reshape(8, 8),
                              NamedSharding(mesh2, P("data")))
        """, """
        h_sc = jax.lax.with_sharding_constraint(sc_x @ sc_x.T,
                                                NamedSharding(mesh2, P("data", "model")))
        sc_x = sc_x + 0.01 * h_sc
        sc_total = h_sc.sum()
        """, runs=3, group="sharded"),
)
# fmt: on

# A representative subset (one or more per group) for the default test run.
SUBSET = (
    "linreg_sgd",
    "optax_adam",
    "jit_step_counter",
    "loss_history_list",
    "key_split_per_step",
    "prngkey_fold_in",
    "nnx_dropout",
    "nnx_rngs_streams",
    "nnx_batchnorm_train",
    "nnx_dropout_mlp_optimizer",
    "eqx_filter_value_and_grad",
    "eqx_module_fields",
    "register_dataclass_state",
    "flax_struct_dataclass",
    "closure_config_dict",
    "hp_dict_lr",
    "partial_config",
    "print_pytree",
    "fstring_debug_equals",
    "debug_print_order",
    "time_line_magic",
    "devices_shell_help",
    "scan_rnn",
    "cond_branch",
    "sharded_matmul",
)


def items(names: Iterable[str | Item] | None = None) -> tuple[Item, ...]:
    """The suite's items: all, or those named (an :class:`Item` stands for itself)."""
    if names is None:
        return ITEMS
    known = {i.name: i for i in ITEMS}
    chosen = []
    for name in names:
        if isinstance(name, Item):
            chosen.append(name)
        elif name in known:
            chosen.append(known[name])
        else:
            raise KeyError(f"no such suite item: {name!r}")
    return tuple(chosen)


# -- the probe: what the kernels send back ------------------------------------------------

# Defined once in each kernel (silently: no hooks, no history). Names start with `_` so the
# tracer walk and the comparison never see them.
PROBE_CODE = r"""
def _sl_define_probe():
    import dataclasses, functools, os, pickle, sys, types
    import numpy as _np
    import jax as _jax

    _Tracer = _jax.core.Tracer
    _SCALARS = (bool, int, float, complex, str, bytes, type(None))
    _SKIP = {"In", "Out", "exit", "quit", "get_ipython"}

    def _nnx():
        return sys.modules.get("flax.nnx")

    def _attrs(v):
        out = {}
        try:
            d = vars(v)
        except TypeError:
            d = None
        if isinstance(d, dict):
            out.update(d)
        for klass in type(v).__mro__:
            for slot in getattr(klass, "__slots__", ()):
                if isinstance(slot, str) and slot not in ("__dict__", "__weakref__"):
                    if hasattr(v, slot):
                        out[slot] = getattr(v, slot)
        return out if (d is not None or out) else None

    def plain(v, depth=0, seen=()):
        if isinstance(v, _Tracer):
            return ("TRACER", type(v).__name__)
        if isinstance(v, _SCALARS):
            return v
        if isinstance(v, _np.generic):
            return _np.asarray(v)
        if isinstance(v, _jax.Array):
            if _jax.dtypes.issubdtype(v.dtype, _jax.dtypes.prng_key):
                return ("key", str(v.dtype), _np.asarray(_jax.random.key_data(v)))
            return _np.asarray(v)
        if isinstance(v, _np.ndarray):
            if v.dtype == object:
                return ("objarray", v.shape, [plain(x, depth + 1, seen) for x in v.flat])
            return _np.array(v, copy=True)
        if isinstance(v, (types.ModuleType,)):
            return ("module", v.__name__)
        if isinstance(v, type):
            return ("type", v.__qualname__)
        if depth > 14 or id(v) in seen:
            return ("cut", type(v).__name__)
        seen = (*seen, id(v))
        deeper = depth + 1
        if isinstance(v, dict):
            return ("dict", type(v).__name__,
                    {repr(k): plain(x, deeper, seen) for k, x in v.items()})
        if isinstance(v, (list, tuple)):
            return (type(v).__name__, [plain(x, deeper, seen) for x in v])
        if isinstance(v, (set, frozenset)):
            return (type(v).__name__, sorted(repr(x) for x in v))
        nnx = _nnx()
        if nnx is not None and nnx.graph.is_graph_node(v):
            return ("nnx", type(v).__qualname__,
                    plain(nnx.state(v).to_pure_dict(), deeper, seen))
        if isinstance(v, functools.partial):
            return ("partial", plain(v.func, deeper, seen), plain(v.args, deeper, seen),
                    plain(v.keywords, deeper, seen))
        if dataclasses.is_dataclass(v):
            return ("dataclass", type(v).__qualname__,
                    {f.name: plain(getattr(v, f.name, None), deeper, seen)
                     for f in dataclasses.fields(v)})
        leaves, treedef = _jax.tree_util.tree_flatten_with_path(v)
        if not (len(leaves) == 1 and leaves[0][1] is v):
            return ("pytree", type(v).__qualname__,
                    {_jax.tree_util.keystr(p): plain(x, deeper, seen) for p, x in leaves})
        if callable(v):
            name = getattr(v, "__qualname__", None) or type(v).__qualname__
            return ("callable", str(name))
        attrs = _attrs(v)
        if attrs is not None:
            return ("object", type(v).__qualname__,
                    {k: plain(x, deeper, seen) for k, x in sorted(attrs.items())
                     if not k.startswith("__")})
        return ("opaque", type(v).__qualname__)

    def children(v):
        if isinstance(v, dict):
            return list(v.items())
        if isinstance(v, (list, tuple, set, frozenset)):
            return list(enumerate(v))
        out = []
        if isinstance(v, types.FunctionType):
            for name, cell in zip(v.__code__.co_freevars, v.__closure__ or ()):
                try:
                    out.append(("<closure " + name + ">", cell.cell_contents))
                except ValueError:
                    pass
            out.append(("<defaults>", v.__defaults__))
            out.append(("<kwdefaults>", v.__kwdefaults__))
            return out
        if isinstance(v, functools.partial):
            return [("func", v.func), ("args", v.args), ("keywords", v.keywords)]
        try:
            leaves = _jax.tree_util.tree_leaves(v)
        except Exception:
            leaves = [v]
        if not (len(leaves) == 1 and leaves[0] is v):
            out.extend(("<leaf %d>" % i, x) for i, x in enumerate(leaves))
        attrs = _attrs(v)
        if attrs:
            out.extend(attrs.items())
        return out

    def tracers(ns, max_nodes=200000, max_depth=12):
        found, seen, count = [], set(), 0
        stack = [(k, v, 0) for k, v in ns.items()
                 if not k.startswith("_") and k not in _SKIP]
        while stack and count < max_nodes:
            path, v, depth = stack.pop()
            count += 1
            if isinstance(v, _Tracer):
                found.append(path)
                continue
            if isinstance(v, (*_SCALARS, _np.ndarray, _np.generic, _jax.Array,
                              types.ModuleType, type, types.BuiltinFunctionType)):
                continue
            if id(v) in seen or depth >= max_depth:
                continue
            seen.add(id(v))
            for key, child in children(v):
                stack.append((f"{path}/{key}", child, depth + 1))
        return found, count

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def probe(names, path, count_tracers=True):
        ns = get_ipython().user_ns
        out = {"values": {}, "missing": []}
        for name in names:
            if name in ns:
                try:
                    out["values"][name] = plain(ns[name])
                except Exception as error:  # a value the probe cannot read: say so
                    out["values"][name] = ("unreadable", repr(error))
            else:
                out["missing"].append(name)
        if count_tracers:
            out["tracers"], out["walked"] = tracers(ns)
        session = getattr(get_ipython(), "_shardlab_session", None)
        if session is not None:
            out["total_traces"] = session.graph_cache.total_traces
        out["rss"] = rss()
        with open(path, "wb") as f:
            pickle.dump(out, f)

    def traces_of(source):
        cache = get_ipython()._shardlab_session.graph_cache
        return cache.traces_of(get_ipython().transform_cell(source))

    return probe, traces_of, rss

_sl_probe, _sl_traces_of, _sl_rss = _sl_define_probe()
del _sl_define_probe
"""


# -- a kernel driven through jupyter_client --------------------------------------------------


@dataclass
class Reply:
    """What one execute request produced."""

    status: str
    stdout: str = ""
    stderr: str = ""
    result: str = ""
    pages: list[str] = field(default_factory=list)
    error: str = ""


class SuiteKernel:
    """A real shardlab kernel: send a cell, collect its reply and output."""

    def __init__(self, name: str = "shardlab") -> None:
        self.manager = KernelManager(kernel_name=name)
        self.manager.start_kernel()
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=TIMEOUT)
        self.run(PROBE_CODE, silent=True, check=True)

    def send(
        self, code: str, *, metadata: dict[str, Any] | None = None, silent: bool = False
    ) -> str:
        content = {
            "code": code,
            "silent": silent,
            "store_history": not silent,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": False,
        }
        msg = self.client.session.msg("execute_request", content, metadata=metadata or {})
        self.client.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    def wait(self, msg_id: str, *, timeout: float = TIMEOUT) -> Reply:
        deadline = time.monotonic() + timeout
        reply_msg = None
        while reply_msg is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no execute_reply from the kernel")
            candidate = self.client.get_shell_msg(timeout=remaining)
            if candidate["parent_header"].get("msg_id") == msg_id:
                reply_msg = candidate
        content = reply_msg["content"]
        reply = Reply(status=content["status"])
        for payload in content.get("payload", []):
            if payload.get("source") == "page":
                reply.pages.append(payload.get("data", {}).get("text/plain", ""))
        if content["status"] == "error":
            reply.error = f"{content.get('ename')}: {content.get('evalue')}"
        while True:
            remaining = deadline - time.monotonic()
            try:
                message = self.client.get_iopub_msg(timeout=max(remaining, 1))
            except queue.Empty:
                raise TimeoutError("no idle status from the kernel") from None
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind, data = message["msg_type"], message["content"]
            if kind == "stream":
                if data["name"] == "stdout":
                    reply.stdout += data["text"]
                else:
                    reply.stderr += data["text"]
            elif kind == "execute_result":
                reply.result += data["data"].get("text/plain", "")
            elif kind == "error" and not reply.error:
                reply.error = f"{data['ename']}: {data['evalue']}"
            elif kind == "status" and data["execution_state"] == "idle":
                return reply

    def run(
        self,
        code: str,
        *,
        metadata: dict[str, Any] | None = None,
        silent: bool = False,
        check: bool = False,
    ) -> Reply:
        reply = self.wait(self.send(code, metadata=metadata, silent=silent))
        if check and reply.status != "ok":
            raise RuntimeError(f"suite cell failed: {reply.error}\n{code}\n{reply.stderr}")
        return reply

    def probe(self, names: Sequence[str], *, count_tracers: bool = True) -> dict[str, Any]:
        handle, path = tempfile.mkstemp(prefix="shardlab-graph-suite-", suffix=".pkl")
        os.close(handle)
        try:
            self.run(
                f"_sl_probe({list(names)!r}, {path!r}, {count_tracers!r})", silent=True, check=True
            )
            with open(path, "rb") as f:
                return pickle.load(f)
        finally:
            os.unlink(path)

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def _both(
    graph: SuiteKernel,
    jit: SuiteKernel,
    graph_code: str,
    jit_code: str,
    *,
    graph_metadata: dict[str, Any] | None = None,
    jit_metadata: dict[str, Any] | None = None,
) -> tuple[Reply, Reply]:
    """Runs a cell in both kernels at once (each kernel is its own process)."""
    g = graph.send(graph_code, metadata=graph_metadata)
    j = jit.send(jit_code, metadata=jit_metadata)
    return graph.wait(g), jit.wait(j)


# -- which names a cell binds or reads --------------------------------------------------------


def _python_of(body: str) -> str:
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(body)


def _magic_statements(tree: ast.AST) -> list[str]:
    """The Python inside ``%time stmt`` / ``%%time`` calls (``run_line_magic('time', s)``)."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("run_line_magic", "run_cell_magic")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in ("time", "timeit", "prun", "capture")
        ):
            for arg in node.args[1:]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value:
                    found.append(arg.value)
    return found


def names_of(body: str) -> tuple[str, ...]:
    """Every name the cell binds, deletes or reads (a read name may change in place)."""
    names: list[str] = []
    pending = [_python_of(body)]
    while pending:
        source = pending.pop()
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        pending.extend(_python_of(s) for s in _magic_statements(tree))
        lambda_args = {
            a.arg
            for node in ast.walk(tree)
            if isinstance(node, ast.Lambda)
            for a in (*node.args.args, *node.args.kwonlyargs)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id not in lambda_args:
                if node.id != "get_ipython" and node.id not in names:
                    names.append(node.id)
    return tuple(names)


# -- comparing --------------------------------------------------------------------------------

_TIMING = re.compile(r"^\s*(CPU times|Wall time|Compiler|Parser)\s*:")
_LIVE_BYTES = re.compile(r"live\s+[\d,.]+\s*\S*bytes|live\s+[\d,.]+\s*[KMG]i?B")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|nan|inf")


def output_lines(text: str) -> tuple[list[str], list[str]]:
    """A cell's printed lines as compared (timings of %time dropped, %devices live-byte
    counts masked), and shardlab's own notes (``[shardlab] ...``), kept apart."""
    lines, notes = [], []
    for line in _ANSI.sub("", text.replace("\r\n", "\n").replace("\r", "\n")).split("\n"):
        if not line.strip() or _TIMING.match(line):
            continue
        if line.startswith("[shardlab]"):
            notes.append(line)
            continue
        lines.append(_LIVE_BYTES.sub("live <bytes>", line.rstrip()))
    return lines, notes


def _printed_unit(token: str) -> float:
    """One unit in the last digit a printed number shows (0 for integers)."""
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.partition(".")[2]) if "." in mantissa else 0
    if "." not in mantissa and not exponent:
        return 0.0
    return 10.0 ** (-decimals + (int(exponent) if exponent else 0))


def compare_line(expected: str, got: str) -> str | None:
    """None when two printed lines agree: the same text around numbers, and numbers equal
    within the tolerance, or within one unit of the last digit printed (rounding)."""
    # whitespace is not compared: NumPy pads array columns to the widest number printed
    e_parts = ["".join(p.split()) for p in _NUMBER.split(expected)]
    g_parts = ["".join(p.split()) for p in _NUMBER.split(got)]
    e_nums, g_nums = _NUMBER.findall(expected), _NUMBER.findall(got)
    if e_parts != g_parts or len(e_nums) != len(g_nums):
        return f"expected {expected!r}, got {got!r}"
    for a, b in zip(e_nums, g_nums, strict=True):
        if a == b:
            continue
        try:
            fa, fb = float(a), float(b)
        except ValueError:
            return f"expected {expected!r}, got {got!r}"
        unit = max(_printed_unit(a), _printed_unit(b))
        if math.isnan(fa) and math.isnan(fb):
            continue
        if abs(fa - fb) <= ATOL + RTOL * abs(fa) or (unit and abs(fa - fb) <= unit * 1.000001):
            continue
        return f"expected {expected!r}, got {got!r}"
    return None


def compare_output(expected: str, got: str) -> str | None:
    e_lines, _ = output_lines(expected)
    g_lines, _ = output_lines(got)
    for index, (a, b) in enumerate(zip(e_lines, g_lines, strict=False)):
        difference = compare_line(a, b)
        if difference is not None:
            return f"line {index + 1}: {difference}"
    if len(e_lines) != len(g_lines):
        return f"expected {len(e_lines)} lines {e_lines!r}, got {len(g_lines)} {g_lines!r}"
    return None


def compare_values(expected: Any, got: Any, path: str = "") -> str | None:
    """None when two probed values are equal (see the module docstring), else where and how
    they first differ."""
    import numpy as np

    if isinstance(expected, np.ndarray) or isinstance(got, np.ndarray):
        if not (isinstance(expected, np.ndarray) and isinstance(got, np.ndarray)):
            return f"{path}: expected {_short(expected)}, got {_short(got)}"
        if expected.shape != got.shape or expected.dtype != got.dtype:
            return (
                f"{path}: expected {expected.dtype}{list(expected.shape)}, got "
                f"{got.dtype}{list(got.shape)}"
            )
        if expected.dtype.kind in "fc":
            equal = np.allclose(got, expected, rtol=RTOL, atol=ATOL, equal_nan=True)
        else:
            equal = np.array_equal(got, expected)
        if not equal:
            return f"{path}: expected {_short(expected)}, got {_short(got)}"
        return None
    if type(expected) is not type(got):
        return f"{path}: expected {_short(expected)}, got {_short(got)}"
    if isinstance(expected, float):
        if math.isclose(got, expected, rel_tol=RTOL, abs_tol=ATOL) or (
            math.isnan(expected) and math.isnan(got)
        ):
            return None
        return f"{path}: expected {expected!r}, got {got!r}"
    if isinstance(expected, dict):
        if list(expected) != list(got):
            return f"{path}: expected keys {list(expected)}, got {list(got)}"
        for key in expected:
            difference = compare_values(expected[key], got[key], f"{path}[{key}]")
            if difference is not None:
                return difference
        return None
    if isinstance(expected, (list, tuple)):
        if len(expected) != len(got):
            return f"{path}: expected {_short(expected)}, got {_short(got)}"
        tagged = isinstance(expected, tuple) and bool(expected) and isinstance(expected[0], str)
        for index, (a, b) in enumerate(zip(expected, got, strict=True)):
            difference = compare_values(a, b, path if tagged else f"{path}[{index}]")
            if difference is not None:
                return difference
        return None
    if expected != got:
        return f"{path}: expected {_short(expected)}, got {_short(got)}"
    return None


def _short(value: Any, limit: int = 160) -> str:
    import numpy as np

    if isinstance(value, np.ndarray):
        text = f"{value.dtype}{list(value.shape)} " + np.array2string(
            value, precision=6, threshold=12
        ).replace("\n", "")
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- running the suite ------------------------------------------------------------------------


@dataclass
class Mismatch:
    item: str
    run: int
    name: str  # the first differing name, or "<stdout>", "<result>", "<page>", "<status>"
    detail: str


@dataclass
class ItemResult:
    item: Item
    runs: int = 0
    equal_runs: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    traces_per_run: list[int] = field(default_factory=list)
    tracers: list[str] = field(default_factory=list)
    walked: int = 0  # the most values one tracer walk visited
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def equal(self) -> bool:
        return self.runs == self.item.runs and self.equal_runs == self.runs

    @property
    def traces(self) -> int:
        return sum(self.traces_per_run)

    @property
    def traces_as_expected(self) -> bool | None:
        return None if self.item.traces is None else self.traces == self.item.traces


@dataclass
class SuiteResult:
    results: list[ItemResult]
    rss: dict[str, float] | None = None
    seconds: float = 0.0
    stable_traces: int | None = None  # traces_of(source) of a plain re-run cell, 3 runs

    @property
    def mismatches(self) -> list[Mismatch]:
        return [m for r in self.results for m in r.mismatches]

    @property
    def tracers(self) -> int:
        return sum(len(r.tracers) for r in self.results)

    def by_name(self) -> dict[str, ItemResult]:
        return {r.item.name: r for r in self.results}


def _cells(item: Item) -> tuple[tuple[str, dict[str, Any] | None], ...]:
    """The body as the graph kernel and as the %%jit kernel run it: with a ``%%graph`` /
    ``%%jit`` first line, or (``via="metadata"``) with the mode in the cell's metadata."""
    if item.via == "metadata":
        return (item.body, GRAPH_METADATA), (item.body, JIT_METADATA)
    return ("%%graph\n" + item.body, None), ("%%jit\n" + item.body, None)


def _compare_run(
    item: Item, run: int, g: Reply, j: Reply, g_probe: dict[str, Any], j_probe: dict[str, Any]
) -> Mismatch | None:
    def mismatch(name: str, detail: str) -> Mismatch:
        return Mismatch(item.name, run, name, detail)

    if j.status != "ok":
        return mismatch("<status>", f"the %%jit cell failed: {j.error}")
    if g.status != "ok":
        return mismatch("<status>", f"the graph cell failed: {g.error}")
    for name in (*j_probe["values"], *g_probe["values"]):
        if name not in g_probe["values"]:
            return mismatch(name, "bound after %%jit, not after graph")
        if name not in j_probe["values"]:
            return mismatch(name, "bound after graph, not after %%jit")
        difference = compare_values(j_probe["values"][name], g_probe["values"][name], name)
        if difference is not None:
            return mismatch(name, difference)
    difference = compare_output(j.stdout, g.stdout)
    if difference is not None:
        return mismatch("<stdout>", difference)
    difference = compare_output(j.result, g.result)
    if difference is not None:
        return mismatch("<result>", difference)
    difference = compare_output("\n".join(j.pages), "\n".join(g.pages))
    if difference is not None:
        return mismatch("<page>", difference)
    return None


def run_item(graph: SuiteKernel, jit: SuiteKernel, item: Item) -> ItemResult:
    """Runs one item in both kernels and compares after every run."""
    start = time.perf_counter()
    result = ItemResult(item)
    names = names_of(item.body)
    for kernel in (graph, jit):  # each item starts from empty compilation caches
        kernel.run("import jax as _sl_jax\n_sl_jax.clear_caches()", silent=True, check=True)
    g_setup, j_setup = _both(graph, jit, item.setup, item.setup)
    if g_setup.status != "ok" or j_setup.status != "ok":
        result.mismatches.append(
            Mismatch(item.name, 0, "<setup>", f"setup failed: {g_setup.error or j_setup.error}")
        )
        return result
    before = graph.probe([], count_tracers=False)["total_traces"]
    for run in range(1, item.runs + 1):
        if run > 1 and item.between:
            g_b, j_b = _both(graph, jit, item.between, item.between)
            if g_b.status != "ok" or j_b.status != "ok":
                result.mismatches.append(
                    Mismatch(item.name, run, "<between>", g_b.error or j_b.error)
                )
                break
        (g_code, g_meta), (j_code, j_meta) = _cells(item)
        g, j = _both(graph, jit, g_code, j_code, graph_metadata=g_meta, jit_metadata=j_meta)
        g_probe = graph.probe(names)
        j_probe = jit.probe(names, count_tracers=False)
        result.runs += 1
        result.traces_per_run.append(g_probe["total_traces"] - before)
        before = g_probe["total_traces"]
        result.tracers.extend(f"run {run}: {p}" for p in g_probe["tracers"])
        result.walked = max(result.walked, g_probe["walked"])
        result.notes.extend(output_lines(g.stdout)[1])
        found = _compare_run(item, run, g, j, g_probe, j_probe)
        if found is None:
            result.equal_runs += 1
        else:
            result.mismatches.append(found)
    result.seconds = time.perf_counter() - start
    return result


STABLE_SETUP = "stable_in = jnp.linspace(0.0, 1.0, 8)"
STABLE_BODY = "stable_out = jnp.cos(stable_in) * 2 + stable_in.sum()"


def stable_traces(graph: SuiteKernel, runs: int = 3) -> int:
    """traces_of(source) of a cell re-run with unchanged inputs: 1 when it never retraces."""
    graph.run(STABLE_SETUP, check=True)
    for _ in range(runs):
        graph.run("%%graph\n" + STABLE_BODY, check=True)
    reply = graph.run(f"_sl_traces_of({STABLE_BODY!r})", check=True)
    return int(reply.result)


def alternating_rss(cells: int = RSS_CELLS, warmup: int = RSS_WARMUP) -> dict[str, float]:
    """Process RSS of a fresh kernel after ``warmup`` cells and after ``cells`` more cells
    cycling through eager / jit / graph (small array work, a few shapes)."""
    kernel = SuiteKernel()
    try:
        kernel.run(PRELUDE, check=True)
        kernel.run("acc = jnp.zeros(())\nbase = jnp.linspace(0, 1, 32)", check=True)

        def cell(i: int) -> str:
            mode = ("eager", "jit", "graph")[i % 3]
            n = 8 * (1 + i % 4)
            return (
                f"%%{mode}\nv = jnp.tanh(base[:{n}] * {1 + i % 5}) + jnp.ones({n})\n"
                f"acc = acc * 0.5 + jnp.pad(v, (0, {32 - n})).sum()\n"
            )

        for i in range(warmup):
            kernel.run(cell(i), check=True)
        start = kernel.probe([], count_tracers=False)["rss"]
        for i in range(warmup, warmup + cells):
            kernel.run(cell(i), check=True)
        end = kernel.probe([], count_tracers=False)["rss"]
        return {"start": start, "end": end, "ratio": end / start, "cells": cells}
    finally:
        kernel.close()


def run_suite(
    names: Iterable[str | Item] | None = None,
    *,
    rss: bool = True,
    progress: Callable[[str], None] | None = None,
) -> SuiteResult:
    """Runs the items (all, or those named) in a graph and a %%jit kernel, compared."""
    start = time.perf_counter()
    chosen = items(names)
    graph, jit = SuiteKernel(), SuiteKernel()
    results: list[ItemResult] = []
    stable: int | None = None
    try:
        for reply in _both(graph, jit, PRELUDE, PRELUDE):
            if reply.status != "ok":
                raise RuntimeError(f"the suite prelude failed: {reply.error}")
        for item in chosen:
            result = run_item(graph, jit, item)
            results.append(result)
            if progress is not None:
                state = "equal" if result.equal else f"DIFFERS ({result.mismatches[0].name})"
                progress(
                    f"{item.name}: {state}, traces {result.traces_per_run}, {result.seconds:.1f} s"
                )
        stable = stable_traces(graph)
    finally:
        graph.close()
        jit.close()
    memory = alternating_rss() if rss else None
    return SuiteResult(results, memory, time.perf_counter() - start, stable)


# -- the section ----------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def section(suite: SuiteResult, command: str = "python -m shardlab.bench --only graph") -> str:
    results = suite.results
    equal_items = sum(r.equal for r in results)
    total_runs = sum(r.item.runs for r in results)
    equal_runs = sum(r.equal_runs for r in results)
    expected = [r for r in results if r.item.traces is not None]
    as_expected = sum(bool(r.traces_as_expected) for r in expected)
    lines = [
        "## Graph mode vs %%jit",
        "",
        f"Command: `{command}` (section `shardlab.bench.graph_suite`). "
        f"{len(results)} tutorial-style cells (training loops, RNG, flax nnx, equinox, optax, "
        "dataclass state, closures over config, prints, magics, lax control flow, "
        "transformations, sharded arrays on 8 CPU devices), each run the same number of times "
        "in two real kernels, as `%%graph` (or graph cell metadata) and as `%%jit`, state "
        "carried across runs. After every run, every name the cell binds or reads is "
        f"compared (rtol {RTOL:g}, atol {ATOL:g}; integers, strings and RNG key data "
        "exactly), and so is the printed output (numbers within the tolerance or one unit "
        "of the last printed digit; `%time` timings and `%devices` live-byte counts "
        "ignored).",
        "",
        "| figure | value | target |",
        "|---|---|---|",
        f"| items | {len(results)} | ≥ 40 |",
        f"| runs (all items) | {total_runs} | |",
        f"| **items equal on every run** | **{equal_items}/{len(results)}** | all |",
        f"| runs equal | {equal_runs}/{total_runs} | all |",
        f"| **tracers reachable from the namespace** (graph kernel, after every run) | "
        f"**{suite.tracers}** | 0 |",
        f"| items traced as expected (1 trace, or one per run where state changes) | "
        f"{as_expected}/{len(expected)} | all |",
    ]
    if suite.stable_traces is not None:
        lines.append(
            f"| `traces_of` a cell re-run 3× with unchanged inputs | {suite.stable_traces} | 1 |"
        )
    if suite.rss is not None:
        mib = 2**20
        rss = suite.rss
        lines += [
            f"| RSS after a warm-up of {RSS_WARMUP} cells | {rss['start'] / mib:.0f} MiB | |",
            f"| RSS after {int(rss['cells'])} more cells alternating eager / jit / graph | "
            f"{rss['end'] / mib:.0f} MiB | |",
            f"| **RSS end / start** | **{rss['ratio']:.3f}** | ≤ {RSS_TARGET:.2f} |",
        ]
    lines += ["", f"Total time {suite.seconds:.0f} s.", ""]
    differing = [r for r in results if r.mismatches]
    if differing:
        lines += [
            "Items that differ (expected = `%%jit`, got = graph; the first differing name of "
            "the first differing run):",
            "",
            "| item | runs differing | first differing name | difference (that run) |",
            "|---|---|---|---|",
        ]
        for r in differing:
            first = r.mismatches[0]
            lines.append(
                f"| {r.item.name} | {len(r.mismatches)}/{r.item.runs} | `{first.name}` | "
                f"run {first.run}: {_cell(first.detail)} |"
            )
        lines.append("")
    noted = [(r.item.name, n) for r in results for n in dict.fromkeys(r.notes)]
    if noted:
        lines += ["Notes shardlab printed in the graph kernel (not compared):", ""]
        lines += [f"- {name}: {_cell(note)}" for name, note in noted]
        lines.append("")
    walked = max((r.walked for r in results), default=0)
    lines += [
        f"The tracer walk visits the namespace after every run (up to {walked} values in "
        "one walk here): dict/list/tuple items, pytree leaves, object attributes and "
        "closures, 12 levels deep.",
        "",
    ]
    lines += [
        "| item | what it does | runs | equal | traces per run | expected traces |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        expect = "—" if r.item.traces is None else str(r.item.traces)
        mark = "" if r.traces_as_expected in (None, True) else " ✗"
        lines.append(
            f"| {r.item.name} | {_cell(r.item.summary)} | {r.item.runs} | "
            f"{r.equal_runs}/{r.item.runs} | {r.traces_per_run}{mark} | {expect} |"
        )
    lines.append("")
    return "\n".join(lines)


def run() -> str:
    """The graph-suite section of docs/benchmarks.md."""

    def progress(line: str) -> None:
        print(f"[bench] graph: {line}", file=sys.stderr, flush=True)

    return section(run_suite(progress=progress))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    suite = run_suite(
        args or None, rss=not args, progress=lambda line: print(line, file=sys.stderr, flush=True)
    )
    print(section(suite, "python -m shardlab.bench.graph_suite " + " ".join(args)))
    median = statistics.median(r.seconds for r in suite.results) if suite.results else 0.0
    print(f"median seconds per item: {median:.1f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
