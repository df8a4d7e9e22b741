"""Kernel hooks at their bounds, on a real kernel: a device count the host cannot hold, a
device switch that leaves one copy of each array (names kept), ``%release --all`` and the
names of deleted arrays, the cell number ``watch`` shows, kernelspec display names and a
``python -m shardlab --help`` that does not import JAX."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from shardlab.engine.resources.devices import (
    DEVICE_HOST_BYTES,
    MAX_CPU_DEVICES,
    DeviceSpecError,
    check_cpu_device_count,
    cpu_device_limit,
    parse_devices,
)

KERNEL_SETUP = "import gc, json, weakref\nimport jax, jax.numpy as jnp, numpy as np, shardlab"


def evalue(execution) -> str:
    assert execution.status == "error"
    return execution.reply["content"]["evalue"]


# -- 8: a device count the host cannot hold ---------------------------------------------------
@pytest.mark.kernel
def test_huge_device_count_is_refused_and_the_kernel_keeps_its_state(kernel):
    kernel.ok("keep = jnp.arange(5.)\nnote = {'run': 3}")
    message = evalue(kernel.execute("%devices cpu:100000"))
    assert "cpu:100000" in message and f"at most {MAX_CPU_DEVICES}" in message
    assert "cpu:8" in message  # a count that fits
    # Beyond what memory allows but under the hard cap: the limit follows available memory.
    kernel.ok("import shardlab.engine.resources.devices as devs\nreal = devs.available_memory")
    kernel.ok("devs.available_memory = lambda: 2**30")  # pretend 1 GiB is available
    limit = 2**30 // 2 // DEVICE_HOST_BYTES
    message = evalue(kernel.execute("%devices cpu:1000"))
    assert "cpu:1000" in message and f"at most {limit}" in message
    assert "1.0 GiB available" in message and f"cpu:{limit} or fewer" in message
    kernel.ok("devs.available_memory = real")
    assert kernel.is_alive()
    state = kernel.ok("len(jax.devices()), keep.tolist(), note").text
    assert state == "(8, [0.0, 1.0, 2.0, 3.0, 4.0], {'run': 3})"


def test_device_limit_follows_memory_and_has_a_hard_cap():
    assert cpu_device_limit(available=10**15).count == MAX_CPU_DEVICES
    assert cpu_device_limit(available=8 * 2**30).count == 8 * 2**30 // 2 // DEVICE_HOST_BYTES
    assert cpu_device_limit(available=0).count == 1
    check_cpu_device_count(8, available=2**30)
    with pytest.raises(DeviceSpecError, match=r"cpu:600: .*at most 409 .*e\.g\. cpu:8"):
        check_cpu_device_count(600, available=2**30)
    with pytest.raises(DeviceSpecError, match=f"cpu:{MAX_CPU_DEVICES + 1}"):
        parse_devices(f"cpu:{MAX_CPU_DEVICES + 1}")
    limit = cpu_device_limit()  # this host, now
    assert 1 <= limit.count <= MAX_CPU_DEVICES and limit.reason


def test_launcher_refuses_a_huge_device_count():
    done = subprocess.run(
        [sys.executable, "-m", "shardlab.kernel", "--devices", "cpu:100000", "-f", "/nonexistent"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "cpu:100000" in done.stderr and f"at most {MAX_CPU_DEVICES}" in done.stderr


_RSS = """\
import os, sys
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["JAX_NUM_CPU_DEVICES"] = sys.argv[1]
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("d",))
x = jax.device_put(jnp.ones(len(jax.devices())), NamedSharding(mesh, P("d")))
jax.jit(lambda v: (v * 2).sum())(x).block_until_ready()
print(int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="RSS from /proc")
def test_per_device_host_cost_is_what_the_bound_assumes():
    """One simulated device's host memory (a program run on every device), measured as the
    RSS of a process with 8 and with 256 devices: the bound's figure is not optimistic."""

    def rss(count: int) -> int:
        done = subprocess.run(
            [sys.executable, "-c", _RSS, str(count)], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return int(done.stdout.split()[-1])

    per_device = (rss(256) - rss(8)) / (256 - 8)
    assert 0 < per_device <= DEVICE_HOST_BYTES * 1.5


# -- 9: a device switch leaves one copy of each array, with its names -------------------------
SETUP = """\
from collections import namedtuple
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
Pair = namedtuple("Pair", "w b")
a = jnp.ones((256, 1024))
alias = a
tree = {"w": [jnp.arange(6.).reshape(2, 3), (jnp.zeros(4, jnp.int32), "tag")],
        "key": jax.random.key(7)}
holder = [tree]
pair = Pair(jnp.full(3, 2.), [jnp.arange(2)])
twin, both = pair, (pair, pair)
s = jax.device_put(jnp.arange(16.), NamedSharding(Mesh(np.array(jax.devices()), ("d",)), P("d")))
lr = jnp.asarray(0.5)
old = [weakref.ref(v) for v in (a, tree["w"][0], pair.w, s, lr)]
def values():
    return json.dumps({"a": float(a.sum()), "w0": tree["w"][0].tolist(),
                       "w1": tree["w"][1][0].tolist(), "key": jax.random.key_data(tree["key"]).tolist(),
                       "pair": [pair.w.tolist(), pair.b[0].tolist()], "s": s.tolist(),
                       "lr": float(lr), "weak": lr.weak_type, "dtypes": str(tree["w"][1][0].dtype)})
"""
# Live arrays, and those that are not a view of another's buffer: JAX creates per-shard views
# lazily (printing an array can) and keeps them, as live arrays sharing the parent's buffer.
COUNT = (
    "from shardlab.engine.resources.live_memory import buffers\ngc.collect()\n"
    "len(jax.live_arrays()), len(jax.live_arrays()) - len(buffers()[1])"
)
NAMED = ("a", "tree['w'][0]", "tree['w'][1][0]", "tree['key']", "pair.w", "pair.b[0]", "s", "lr")


@pytest.mark.kernel
def test_device_switch_leaves_one_copy_of_each_array_with_its_names(kernel):
    kernel.ok(SETUP)
    shown = kernel.ok("jnp.ones(8) * 3")  # an array only the output history holds
    out_index = shown.reply["content"]["execution_count"]
    kernel.ok("a")  # Out, _N (and for a while _) hold `a` too
    kernel.ok("expected = values()")
    _, before = eval(kernel.ok(COUNT).text)
    report = kernel.ok("%devices cpu:4").stdout
    assert "switched cpu:8 → cpu:4" in report
    for name in ("a", "tree['w'][0]", "tree['key']", "pair.b[0]", "s"):
        assert name in report
    assert "Out[" not in report and "1 more array(s) that only hidden names hold" in report
    after, distinct = eval(kernel.ok(COUNT).text)
    assert after == distinct == before  # one copy each, not two
    # The old copies are gone (nothing keeps them, nor their client, alive).
    assert kernel.ok("gc.collect()\n[r() is None for r in old]").text == str([True] * 5)
    # One object per array, whatever holds it: names, containers, IPython's history.
    n = out_index + 1
    same = kernel.ok(
        f"alias is a, holder[0] is tree, Out[{n}] is a, _{n} is a, twin is pair, "
        "both[0] is both[1] is pair"
    ).text
    assert same == "(True, True, True, True, True, True)"
    assert kernel.ok("values() == expected").text == "True"
    assert kernel.ok(f"float(s.sum() + Out[{out_index}].sum())").text == "144.0"  # computes
    panel = kernel.ok("print(shardlab.memory().view().text())").stdout
    assert "(unnamed)" not in panel
    for name in NAMED:
        assert f"  {name} " in panel, name
    assert eval(kernel.ok(COUNT).text)[1] == after  # reading made views, not copies


@pytest.mark.kernel
def test_device_switch_names_what_it_could_not_move(kernel):
    kernel.ok(
        "class Box:\n    pass\n"
        "box = Box()\nbox.inner = jnp.ones(3)\n"
        "gone = jnp.ones(2)\ngone.delete()\n"
        "class Strict:\n    def __init__(self, w):\n        self.w = w\n"
        "def refuse(aux, children):\n    raise ValueError('frozen')\n"
        "jax.tree_util.register_pytree_node(Strict, lambda s: ((s.w,), None), refuse)\n"
        "strict = Strict(jnp.ones(2))"
    )
    report = kernel.ok("%devices cpu:2").stdout
    assert "cpu:2" in report
    assert "deleted arrays, left as they are: gone" in report
    assert "could not rebuild strict (ValueError: frozen)" in report
    stale = report.split("old devices")[1].splitlines()[0]
    assert "box" in stale and "strict" in stale
    assert kernel.ok("len(jax.devices()), values() == expected").text == "(2, True)"


# -- 10: %release --all and the names of deleted arrays ---------------------------------------
@pytest.mark.kernel
def test_release_all_unbinds_the_names_of_deleted_arrays_and_says_so(kernel):
    kernel.ok(
        "import sys, types\n"
        "holder_module = types.ModuleType('holder_module')\n"
        "sys.modules['holder_module'] = holder_module\n"
        "holder_module.W = jnp.ones(2)\nW = holder_module.W\n"
        "gone_w = jnp.ones(4)\ncfg = {'w': gone_w, 'lr': 0.1}\ncount = 3"
    )
    out = kernel.ok("%release --all").stdout
    line = next(x for x in out.splitlines() if x.startswith("deleted named arrays:"))
    for name in ("gone_w", "cfg", "a", "tree"):
        assert name in line
    assert "unbound" in line and "count" not in line
    kept = next(x for x in out.splitlines() if x.startswith("kept named arrays"))
    assert "W" in kept.split(":")[1]
    missing = kernel.execute("gone_w")
    assert missing.status == "error" and missing.reply["content"]["ename"] == "NameError"
    assert kernel.ok("count, float(W.sum()), 'cfg' in dir()").text == "(3, 2.0, False)"


# -- 11: watch names the cell that rebound the name ------------------------------------------
@pytest.mark.kernel
def test_watch_names_the_cell_that_rebound_the_name(kernel):
    shown = kernel.ok("wx = jnp.ones(3)\nw = shardlab.watch('wx')\nw")
    first = shown.reply["content"]["execution_count"]
    assert f"watching (after cell {first})" in shown.displays[0]["data"]["text/plain"]
    kernel.ok("unrelated = 1")
    rebound = kernel.ok("wx = jnp.zeros(3)")
    count = rebound.reply["content"]["execution_count"]
    assert count == first + 2
    assert f"watching (after cell {count})" in rebound.updates[0]["data"]["text/plain"]
    assert f"after cell {count})" in rebound.updates[0]["data"]["text/html"]
    kernel.ok("w.stop()")


# -- 12: kernelspec display names, and a --help that does not import JAX ----------------------
def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shardlab", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_kernelspecs_of_one_device_set_have_distinct_display_names(tmp_path):
    def display(*args: str) -> str:
        done = run_cli("install", "--dry-run", *args)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["display_name"]

    assert display() == "JAX · shardlab (8 CPU devices)"
    a, b = display("--name", "a"), display("--name", "b")
    assert a == "JAX · shardlab · a (8 CPU devices)" and b != a and "b" in b
    assert display("--name", "a", "--display-name", "JAX 64 (mine)") == "JAX 64 (mine)"
    empty = run_cli("install", "--dry-run", "--display-name", " ")
    assert empty.returncode != 0 and "--display-name ' '" in empty.stderr

    env = {"JUPYTER_DATA_DIR": str(tmp_path / "data")}
    one = run_cli("install", "--user", "--name", "one", "--display-name", "Mine", env=env)
    assert one.returncode == 0 and "'Mine'" in one.stdout, one.stderr
    spec = json.loads((tmp_path / "data" / "kernels" / "one" / "kernel.json").read_text())
    assert spec["display_name"] == "Mine"
    two = run_cli("install", "--user", "--name", "two", "--display-name", "Mine", env=env)
    assert two.returncode == 0 and "one" in two.stderr and "--display-name" in two.stderr


_IMPORTS = """\
import json, runpy, sys
sys.argv = ["python -m shardlab", *sys.argv[1:]]
try:
    runpy.run_module("shardlab", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
heavy = ("jax", "jaxlib", "numpy", "scipy", "IPython", "jupyter_client", "ipywidgets")
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy)))
"""


@pytest.mark.parametrize("args", [["--help"], ["install", "--help"], []])
def test_cli_help_imports_no_jax(args):
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS, *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "install" in done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


_FIRST_USE = """\
import json, sys
import shardlab
lazy = "jax" not in sys.modules
getattr(shardlab, sys.argv[1])
loaded = sorted(m for m in sys.modules if m.split(".")[0] in
    ("IPython", "ipywidgets", "bokeh", "ipykernel", "scipy") or m.startswith("shardlab.widgets"))
print(json.dumps([lazy, loaded]))
"""


@pytest.mark.parametrize(
    ("name", "allowed"),
    [("mesh", set()), ("Plan", {"scipy"}), ("search", {"scipy"}), ("to_static", set())],
)
def test_a_public_name_loads_its_module_and_no_view(name, allowed):
    """Each public name loads on first use with the module defining it: ``shardlab.mesh``
    brings no scipy, and nothing short of a view brings a view or a UI library."""
    done = subprocess.run(
        [sys.executable, "-c", _FIRST_USE, name],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert done.returncode == 0, done.stderr
    lazy, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert lazy
    assert {m.split(".")[0] for m in loaded} <= allowed, loaded


def test_a_view_loads_when_first_displayed():
    """``Plan.show()`` and a record's HTML find their views through ``_core/views.py``:
    registered by the view module, imported the first time they are asked for."""
    from shardlab._core import views

    assert views.view_for("plan") is not None and views.view_for("html:report") is not None
    assert views.view_for("no-such-view") is None
    for kind, module in views.PROVIDERS.items():
        assert module.startswith("shardlab.widgets."), (kind, module)
        assert views.view_for(kind) is not None, kind
