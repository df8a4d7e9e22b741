"""The layering in DESIGN.md, checked: parallel/ and engine/ never import UI libraries, and
the package never imports the repository root's ``benchmarks`` or ``examples``."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import shardlab

ROOT = pathlib.Path(__file__).resolve().parents[2]
FORBIDDEN = ("IPython", "ipywidgets", "bokeh", "ipykernel", "jupyter_bokeh")


@pytest.mark.parametrize(
    "module",
    [
        "shardlab",
        "shardlab._core.equivalence",
        "shardlab._core.source",
        "shardlab._core.views",
        "shardlab.engine",
        "shardlab.parallel",
        "shardlab.cluster.manager",
        "shardlab.data",
    ],
)
def test_core_layers_import_no_ui_libraries(module):
    code = (
        f"import sys, json\nimport {module}\n"
        f"print(json.dumps([m for m in {list(FORBIDDEN)!r} if m in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_version_has_one_source_of_truth():
    version = (ROOT / "python" / "shardlab" / "_version.py").read_text()
    assert f'"{shardlab.__version__}"' in version
    package_json = ROOT / "package.json"
    if package_json.exists():  # the lab extension, once it exists, shares the version
        assert json.loads(package_json.read_text())["version"] == shardlab.__version__


def test_public_api_is_explicit():
    assert set(shardlab.__all__) <= set(dir(shardlab))
    assert "load_ipython_extension" in shardlab.__all__
    for name in shardlab.__all__:  # every listed name resolves
        assert getattr(shardlab, name) is not None, name


def test_the_public_face_is_one_table():
    """``__all__`` is ``_PUBLIC``'s names (and the three defined in the file); the
    ``TYPE_CHECKING`` imports, for type checkers, name the same objects from the same
    modules."""
    import ast

    table = shardlab._PUBLIC
    assert set(shardlab.__all__) == {
        *table,
        "__version__",
        "load_ipython_extension",
        "unload_ipython_extension",
    }
    tree = ast.parse((SRC / "__init__.py").read_text())
    block = next(
        n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
    )
    typed = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and not node.level and node.module
        for alias in node.names:
            if node.module == "shardlab":  # a module: ``from shardlab import data as data``
                target = f"shardlab.{alias.name}"
            else:
                target = f"{node.module}:{alias.name}"
            typed[alias.asname or alias.name] = target
    assert typed == table


# The parallel core's layers, bottom first (docs/design/architecture.md): a module imports only from
# its own layer or the ones below it.
PARALLEL_LAYERS = ("base", "graph", "cost", "compiled", "plan", "search")
PACKAGE_LAYERS = {  # shardlab's own packages: these never import the ones named after them
    "parallel": ("engine", "kernel", "widgets", "examples"),
    "engine": ("parallel", "kernel", "widgets", "examples"),
    "widgets": ("kernel",),
    "examples": ("engine", "kernel", "widgets"),
    # the cluster's management (docs/guide/cluster.md): below the kernel's magics, beside engine
    "cluster": ("kernel", "widgets", "examples"),
    # the floor under both cores: it imports none of shardlab's packages
    "_core": ("parallel", "engine", "kernel", "widgets", "examples", "cluster"),
}
# The repository root's packages, which are not installed: the benchmarks (``make bench``) and
# the model zoo on dev-only libraries (``examples.zoo``). They import shardlab, never the
# other way round (``shardlab.examples`` is the package's own, and is another thing).
ROOT_PACKAGES = ("benchmarks", "examples")
SRC = ROOT / "python" / "shardlab"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path) -> set[str]:
    """Every shardlab module ``path`` imports, at any depth of the file (lazy imports too)."""
    import ast

    tree = ast.parse(path.read_text())
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join([*base, *([node.module] if node.module else [])])
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)  # `from pkg import module`
    modules = {_module_name(p) for p in SRC.rglob("*.py")}
    return {m for m in found if m in modules and m != me}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["shardlab", "parallel"]:
        return None
    if len(parts) == 2 or parts[2] not in PARALLEL_LAYERS:
        return "base"
    return parts[2]


def test_parallel_layers_import_only_downwards():
    wrong = []
    for path in (SRC / "parallel").rglob("*.py"):
        me = _module_name(path)
        mine = PARALLEL_LAYERS.index(_layer(me) or "base")
        for other in _imports(path):
            layer = _layer(other)
            if other == "shardlab.parallel":
                wrong.append(f"{me} imports the package face shardlab.parallel")
            elif layer is not None and PARALLEL_LAYERS.index(layer) > mine:
                wrong.append(f"{me} ({PARALLEL_LAYERS[mine]}) imports {other} ({layer})")
    assert wrong == []


def test_packages_import_in_one_direction():
    wrong = []
    for path in SRC.rglob("*.py"):
        me = _module_name(path)
        package = me.split(".")[1] if "." in me else ""
        for other in _imports(path):
            target = other.split(".")[1] if "." in other else ""
            if target in PACKAGE_LAYERS.get(package, ()):
                wrong.append(f"{me} imports {other}")
    assert wrong == []


def _absolute_imports(path: pathlib.Path) -> set[str]:
    """The top-level names of the modules ``path`` imports absolutely, at any depth of the
    file, ``importlib.import_module("name")`` and ``__import__("name")`` included."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and node.args:
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            first = node.args[0]
            if name in ("import_module", "__import__") and isinstance(first, ast.Constant):
                found.add(str(first.value).split(".")[0])
    return found


def test_the_package_never_imports_the_roots_benchmarks_or_examples():
    """The wheel ships ``python/shardlab`` alone: no module of it may import the root's
    ``benchmarks`` or ``examples`` (which it would find only in a checkout)."""
    wrong = [
        f"{_module_name(path)} imports {name}"
        for path in sorted(SRC.rglob("*.py"))
        for name in sorted(_absolute_imports(path) & set(ROOT_PACKAGES))
    ]
    assert wrong == []
    # and at run time, from the root, where both are importable: the package's faces load
    # neither
    code = (
        "import sys, json\n"
        "import shardlab, shardlab.parallel, shardlab.engine, shardlab.examples, shardlab.data\n"
        f"print(json.dumps([m for m in {list(ROOT_PACKAGES)!r} if m in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_no_import_cycles_between_modules():
    graph = {_module_name(p): _imports(p) for p in SRC.rglob("*.py")}
    # A package's __init__ re-exporting its modules is not a cycle of the modules.
    graph = {m: {o for o in deps if not m.startswith(o + ".")} for m, deps in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:  # Tarjan's strongly connected components
        index[m] = low[m] = len(index)
        stack.append(m)
        for o in graph.get(m, ()):
            if o not in index:
                visit(o)
                low[m] = min(low[m], low[o])
            elif o in stack:
                low[m] = min(low[m], index[o])
        if low[m] == index[m]:
            component = []
            while True:
                o = stack.pop()
                component.append(o)
                if o == m:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    assert cycles == []
