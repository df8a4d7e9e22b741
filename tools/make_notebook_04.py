"""Writes notebooks/04_eager_vs_compiled.ipynb (outputs are left to the reader's kernel)."""

from __future__ import annotations

from nbformat.v4 import new_code_cell, new_markdown_cell
from notebooks import write

cells = []


def md(text: str) -> None:
    cells.append(new_markdown_cell(text.strip()))


def code(text: str) -> None:
    cells.append(new_code_cell(text.strip()))


md("""
# Eager vs compiled: staging a step, and finding why the numbers differ

First a training step staged progressively — **eager** → `shardlab.to_static` on the loss → one
**graph** cell for the whole step. Then the usual reasons eager and compiled runs disagree:
Python side effects in traced code, dtype promotion, random numbers, and fused arithmetic.
Each is shown with `%%compare` (eager, compiled and a float64 referee on the same inputs),
narrowed with `shardlab.bisect` (the first diverging operation and its line), and fixed.
docs/guide/compare.md states the tolerance rule.
""")
code("""
import jax, jax.numpy as jnp
import numpy as np
import shardlab

k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
params = {'w1': jax.random.normal(k1, (16, 32)) * 0.3, 'w2': jax.random.normal(k2, (32, 1)) * 0.3}
x = jax.random.normal(k3, (64, 16))
y = jnp.sin(x.sum(axis=1, keepdims=True))
lr = 0.1
""")
md("""
## 1. Eager
The loss has a Python `if` on a value computed from arrays: eager Python runs it as written.
""")
code("""
def loss(params, x, y):
    pred = jnp.tanh(x @ params['w1']) @ params['w2']
    err = jnp.mean((pred - y) ** 2)
    if err > 1.0:            # a data-dependent branch: fine eagerly
        err = jnp.sqrt(err)
    return err

with jax.disable_jit():
    print('eager loss', loss(params, x, y))
""")
md("""
## 2. `shardlab.to_static` on the loss
Plain `jax.jit(loss)` would stop at the `if` (a traced value has no True/False yet).
`to_static` converts the branch to `lax.cond` and returns a jitted function.
`shardlab.compare` checks that the compiled loss matches eager:
""")
code("""
loss_static = shardlab.to_static(loss)
print(shardlab.converted(loss))
shardlab.compare(loss_static, params, x, y)
""")
md("""
## 3. The whole step as one graph cell
Gradient, update and loss in one compiled program. `%%compare` runs the same cell eager, in
graph mode and in float64 — on copies: `params` is not updated by it.
""")
code("""
%%compare
grads = jax.grad(loss_static)(params, x, y)
params = jax.tree.map(lambda p, g: p - lr * g, params, grads)
step_loss = loss_static(params, x, y)
""")
code("""
%%graph
grads = jax.grad(loss_static)(params, x, y)
params = jax.tree.map(lambda p, g: p - lr * g, params, grads)
print('graph step: loss', loss_static(params, x, y))
""")
md("""
## Cause 1: Python side effects in traced code
Python in a compiled function runs **once, while tracing**. Here the loss reads a number from
NumPy's global generator: eager draws a new one every call, the compiled program keeps the
one drawn at trace time. `%%compare` says the Python itself differs when traced — and bisect
finds no diverging *operation*, because none is at fault:
""")
code("""
def jittery_loss(params, x, y):
    scale = 1.0 + 0.1 * np.random.rand()   # runs at trace time only, once compiled
    return scale * loss_static(params, x, y)

jittery_static = shardlab.to_static(jittery_loss)
""")
code("""
%%compare
l = jittery_static(params, x, y)
""")
code("""
shardlab.bisect(jittery_loss, params, x, y)
""")
md("""
**Fix**: make the value an input (or compute it with `jax.random` from a key passed in).
""")
code("""
def scaled_loss(params, x, y, scale):
    return scale * loss_static(params, x, y)

scale = jnp.float32(1.0 + 0.1 * np.random.rand())
shardlab.compare(shardlab.to_static(scaled_loss), params, x, y, scale)
""")
md("""
## Cause 2: dtype promotion (bfloat16)
A bf16 matmul whose result is converted to float32: eager rounds the product to bf16, then
converts; XLA fuses the convert into the dot and keeps the float32 accumulator. They differ —
and here *compiled* is the one closer to float64.
""")
code("""
def bf16_loss(params, x, y):
    h = (x.astype(jnp.bfloat16) @ params['w1'].astype(jnp.bfloat16)).astype(jnp.float32)
    return jnp.mean((jnp.tanh(h) @ params['w2'] - y) ** 2)

shardlab.compare(bf16_loss, params, x, y)
""")
code("""
shardlab.bisect(bf16_loss, params, x, y)
""")
md("""
**Fix**: say what precision you want the product in — `preferred_element_type=jnp.float32`
accumulates in float32 in both runs, so they agree (and both are closer to float64).
""")
code("""
def bf16_loss_fixed(params, x, y):
    h = jnp.matmul(x.astype(jnp.bfloat16), params['w1'].astype(jnp.bfloat16),
                   preferred_element_type=jnp.float32)
    return jnp.mean((jnp.tanh(h) @ params['w2'] - y) ** 2)

shardlab.compare(bf16_loss_fixed, params, x, y)
""")
md("""
## Cause 3: random numbers
A key kept in a global and split in Python is a side effect too: each run (eager, the trace)
advances it, so they draw different dropout masks.
""")
code("""
dropout_key = jax.random.key(42)

def dropout_loss(params, x, y):
    global dropout_key
    dropout_key, sub = jax.random.split(dropout_key)   # Python state, advanced per run
    keep = jax.random.bernoulli(sub, 0.9, x.shape)
    return loss_static(params, jnp.where(keep, x / 0.9, 0.0), y)

shardlab.compare(dropout_loss, params, x, y)
""")
md("""
**Fix**: pass the key in. The same key gives the same mask eagerly and compiled (and in the
float64 reference, which keeps your random bits: under x64, `jax.random` would draw others).
""")
code("""
def dropout_loss_keyed(params, x, y, key):
    keep = jax.random.bernoulli(key, 0.9, x.shape)
    return loss_static(params, jnp.where(keep, x / 0.9, 0.0), y)

shardlab.compare(shardlab.to_static(dropout_loss_keyed), params, x, y, jax.random.key(42))
""")
md("""
## Cause 4: reduction order and fused arithmetic
Adding and removing a large offset loses the small part of `x` in float32 — eagerly. XLA's
algebraic simplifier folds `(x + c) - c` into `x`, so the compiled step keeps it. Reductions
can be reordered the same way on GPU and TPU (on this CPU, sums and matmuls came out bitwise
equal; the RMSE rule in docs/guide/compare.md is there for them).
""")
code("""
def offset_loss(params, x, y):
    shifted = (x + 1e7) - 1e7        # meant as a no-op
    return loss_static(params, shifted, y)

shardlab.compare(offset_loss, params, x, y)
""")
code("""
shardlab.bisect(offset_loss, params, x, y)
""")
md("""
Bisect stops at the `sub` on the offset line: replayed alone on eager's inputs it agrees, so
the cause is a **rewrite** across operations, not the operation itself. Compiled is not always
the wrong one: here eager lost the digits. **Fix**: don't rely on the cancellation — here, drop
the shift, and both agree:
""")
code("""
def offset_loss_fixed(params, x, y):
    return loss_static(params, x, y)

shardlab.compare(offset_loss_fixed, params, x, y)
""")

write(cells, "notebooks/04_eager_vs_compiled.ipynb")
