"""The graph suite's items: tutorial-style cells (:class:`Item`), all of them (``ITEMS``),
the representative subset the default test run takes (``SUBSET``), and :func:`items` to pick
some by name. ``harness.py`` runs them; ``report.py`` writes the section.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from dataclasses import dataclass


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
