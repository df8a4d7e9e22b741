"""Kernel hooks in a real kernel: memory release, device switch, mode-switch resets."""

from __future__ import annotations

import json
import re

import pytest

from kernelclient import Kernel

pytestmark = pytest.mark.kernel


@pytest.fixture()
def kernel():
    k = Kernel()
    k.ok("import jax, jax.numpy as jnp, numpy as np, json")
    yield k
    k.shutdown()


def live_bytes(kernel: Kernel) -> int:
    code = "sum(s.data.nbytes for a in jax.live_arrays() for s in a.addressable_shards)"
    return int(kernel.ok(code).text)


def test_release_frees_history_and_unreachable_arrays_keeps_named(kernel):
    baseline = live_bytes(kernel)
    kernel.ok("keep = jnp.ones((256, 1024))")  # 1 MiB, bound to a name
    kernel.ok("jnp.ones((2048, 1024)) * 2")  # 8 MiB, only in Out/_ history
    kernel.ok("hidden = [jnp.ones((1024, 1024))]\nhold = hidden[0]\ndel hidden")
    before = live_bytes(kernel)
    assert before - baseline >= (1 + 8 + 4) * 2**20
    release = kernel.ok("%release")
    assert "device bytes:" in release.stdout and "process RSS:" in release.stdout
    after = live_bytes(kernel)
    assert before - after >= 8 * 2**20  # the history-only array is gone
    assert kernel.ok("float(keep.sum()), float(hold.sum())").text == "(262144.0, 1048576.0)"
    kernel.ok("jnp.ones((1024, 1024)) * 3")  # 4 MiB, history only again
    freed = kernel.ok("import shardlab\nr = shardlab.release()\nr.freed_device_bytes")
    assert int(freed.text) >= 4 * 2**20


def test_release_all_deletes_named_arrays_after_listing_them(kernel):
    kernel.ok("a_named = jnp.ones((512, 1024))\nnot_array = [1, 2]")
    out = kernel.ok("%release --all").stdout
    assert "deleted named arrays: a_named" in out
    assert "not_array" not in out.split("deleted named arrays:")[1].splitlines()[0]
    assert live_bytes(kernel) < 2**20
    assert kernel.ok("not_array").text == "[1, 2]"
    bad = kernel.execute("%release --everything")
    assert bad.status == "error" and "--everything" in bad.reply["content"]["evalue"]


def test_device_switch_keeps_every_array_and_reports(kernel):
    kernel.ok(
        "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n"
        "mesh = Mesh(np.array(jax.devices()), ('d',))\n"
        "a = jnp.arange(8.)\n"
        "tree = {'w': [jnp.ones((2, 3)), (jnp.zeros(2, jnp.int32), 5)], 'name': 'x'}\n"
        "s = jax.device_put(jnp.arange(16.), NamedSharding(mesh, P('d')))\n"
        "f = jax.jit(lambda v: v + 1)\n"
        "_ = f(a)\n"
        "expected = json.dumps({'a': a.tolist(), 'w0': tree['w'][0].tolist(), "
        "'w1': tree['w'][1][0].tolist(), 's': s.tolist()})"
    )
    out = kernel.ok("%devices cpu:4").stdout
    assert "switched cpu:8 → cpu:4" in out
    for name in ("a", "tree['w'][0]", "tree['w'][1][0]", "s"):
        assert name in out
    assert "now on one device" in out and "s" in out.split("now on one device")[1]
    assert "will recompile on next call: f" in out
    assert "meshes of the old devices" in out and "mesh" in out
    assert kernel.ok("len(jax.devices())").text == "4"
    same = kernel.ok(
        "json.dumps({'a': a.tolist(), 'w0': tree['w'][0].tolist(), "
        "'w1': tree['w'][1][0].tolist(), 's': s.tolist()}) == expected"
    )
    assert same.text == "True"
    assert kernel.ok("tree['w'][1][1], tree['name'], tree['w'][1][0].dtype").text == (
        "(5, 'x', dtype('int32'))"
    )
    assert kernel.ok("float((f(a) + s[:8]).sum())").text == "64.0"  # new devices compute
    assert "pinned:   cpu:4" in kernel.ok("%devices").stdout


@pytest.mark.parametrize(
    "arg, fragment",
    [
        ("cpu:0", "at least 1"),
        ("gpu:99", "kernelspec"),
        ("tpu:3", "cpu:N"),
        ("cpu:x", "cpu:N"),
    ],
)
def test_bad_device_sets_are_clear_and_change_nothing(kernel, arg, fragment):
    kernel.ok("v = jnp.arange(3.)")
    bad = kernel.execute(f"%devices {arg}")
    assert bad.status == "error"
    assert fragment in bad.reply["content"]["evalue"] and arg in bad.reply["content"]["evalue"]
    assert kernel.ok("len(jax.devices()), v.tolist()").text == "(8, [0.0, 1.0, 2.0])"


def test_mode_switches_release_caches_beyond_the_limit_and_keep_memory_bounded(kernel):
    # the old rule, kept as an option (the default acts on memory: test_cache_reset.py)
    kernel.ok('%config ShardlabSession.cache_reset = "programs"')
    kernel.ok("%config ShardlabSession.max_cached_programs = 30")
    kernel.ok(
        "x = jnp.ones((64, 64))\nfrom shardlab.engine.resources.live_memory import cache_stats"
    )
    define = "@jax.jit\ndef step(v):\n    return jnp.tanh(v @ v.T) + {k}\ny = step(x)"
    modes = ["eager", "jit", "graph"]
    samples = []
    announced = 0
    for k in range(200):
        mode = modes[k % 3]
        code = "y = step(x) + 1" if mode == "graph" else define.format(k=k)
        execution = kernel.ok(code, metadata={"shardlab": {"mode": mode}})
        announced += "[shardlab] mode" in execution.stdout
        if k in (20, 199):
            stats = json.loads(kernel.ok("import json\njson.dumps(cache_stats())").text.strip("'"))
            samples.append((live_bytes(kernel), stats["executables"]))
    assert 3 <= announced < 100  # released when over the limit, not on every switch
    (bytes_early, _), (bytes_late, exec_late) = samples
    assert bytes_late <= bytes_early * 1.05 + 65536
    assert exec_late <= 30 + 8


def test_reset_can_be_turned_off_by_config(kernel):
    kernel.ok("%config ShardlabSession.reset_on_mode_switch = False")
    kernel.ok("%config ShardlabSession.max_cached_programs = 0")
    kernel.ok("a = jnp.ones(3) * 2")
    out = kernel.ok("%%eager\nz = jnp.ones(5) + 1").stdout
    assert "[shardlab] mode" not in out


def test_mode_announcement_is_one_line(kernel):
    kernel.ok('%config ShardlabSession.cache_reset = "programs"')
    kernel.ok("%config ShardlabSession.max_cached_programs = 0")
    kernel.ok("a = jnp.ones(3) * 2")
    out = kernel.ok("%%graph\nq = jnp.ones(2) * 2").stdout
    lines = [line for line in out.splitlines() if line.startswith("[shardlab]")]
    assert len(lines) == 1 and re.match(r"\[shardlab\] mode jit → graph with \d+", lines[0])
    assert "cleared 1 graph cell(s)" in lines[0]
