"""The graph suite's harness: two real shardlab kernels driven through ``jupyter_client``
(:class:`SuiteKernel`), the probe each kernel runs to send its names back, the names a cell
binds or reads, the comparisons of values and printed output, and :func:`run_suite`.
"""

from __future__ import annotations

import ast
import math
import os
import pickle
import queue
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.manager import KernelManager

from benchmarks.graph_suite.items import PRELUDE, Item, items

RTOL = 1e-5
ATOL = 1e-6
TIMEOUT = 300
RSS_CELLS = 300
RSS_WARMUP = 60
RSS_TARGET = 1.10
GRAPH_METADATA = {"shardlab": {"mode": "graph"}}
JIT_METADATA = {"shardlab": {"mode": "jit"}}


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
