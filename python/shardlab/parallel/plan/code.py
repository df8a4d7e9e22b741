"""``Plan.to_code()``'s snippet: pytrees of shardings written as Python that runs pasted.

An argument tree is written as a literal when every node of it can be: ``dict``, ``list``,
``tuple``, ``None`` and named tuples whose class is importable (optax's ``TraceState``,
``EmptyState``, ``ScaleByAdamState`` are written ``optax.TraceState(trace=...)``, with
``import optax``). A tree holding any other node (an equinox module, a flax ``nnx.State``, a
registered dataclass) cannot be rebuilt from text: its class may live in the notebook and its
static fields are in the tree's structure. The snippet then lists one spec per array leaf and
takes the structure from the arguments themselves (``_shardings(args, in_specs)``); when
the arguments hold static leaves (an ``eqx.nn.MLP``'s activation) it jits with
``eqx.filter_jit`` and places with ``eqx.filter_shard``, equinox's own idiom.

Nothing is copied in unescaped (``io.py``): dict keys are ``str``/``int`` literals, class
paths and field names are checked identifiers, specs come from ``spec_code``.
"""

from __future__ import annotations

import importlib
import inspect
import keyword
import sys
from collections.abc import Sequence
from typing import Any

import jax

# Names the snippet binds before calling the function (``step = jax.jit(step, ...)`` is
# fine: the function is read before ``step`` is rebound).
TEMPLATE_NAMES = frozenset(
    {"jax", "shardlab", "NamedSharding", "P", "mesh", "_named", "in_shardings"}
    | {"out_shardings", "args", "in_specs", "out_specs", "_shardings", "_is_array", "eqx"}
    | {"_sharded"}
)
_WIDTH = 88


class Spec(str):
    """A leaf of a tree written as code: its text is its source (``P('data')``)."""

    def __repr__(self) -> str:
        return str(self)


class PlanCode(str):
    """``Plan.to_code()``'s snippet: a ``str`` (``exec``, write to a file, ``print``) that a
    notebook shows as a highlighted code block and a terminal as the code itself, not as one
    quoted line of ``\\n``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str.__str__(self)

    def _repr_markdown_(self) -> str:
        return "```python\n" + str.__str__(self) + "```\n"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str.__str__(self).rstrip("\n"))


def _is_identifier(name: Any) -> bool:
    return (
        isinstance(name, str)
        and name.isascii()
        and name.isidentifier()
        and not keyword.iskeyword(name)
    )


def class_path(cls: type) -> tuple[str, str] | None:
    """``(module to import, dotted name)`` that reaches ``cls`` from a fresh interpreter:
    the package's own alias when it exports the class (``optax.TraceState``), else its
    module's path; ``None`` for a class of the notebook or a local one."""
    module, qualname = getattr(cls, "__module__", ""), getattr(cls, "__qualname__", "")
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    parts = module.split(".")
    if module in ("__main__", "builtins") or not all(_is_identifier(p) for p in parts):
        return None
    if not all(_is_identifier(p) for p in qualname.split(".")):  # "<locals>"
        return None
    top = parts[0]
    try:
        package = importlib.import_module(top)
    except Exception:  # a module that does not import again: no path
        return None
    if "." not in qualname and getattr(package, qualname, None) is cls:
        return top, f"{top}.{qualname}"
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return (module, f"{module}.{qualname}") if found is cls else None


def _is_namedtuple(tree: Any) -> bool:
    return isinstance(tree, tuple) and isinstance(getattr(type(tree), "_fields", None), tuple)


def literal(tree: Any, imports: set[str], indent: int = 0) -> str | None:
    """Source of a pytree of ``Spec`` leaves, black-style (on one line when it fits, else one
    element per line), or ``None`` when a node cannot be written (see the module's
    docstring). ``imports`` gets the modules its named tuples need."""
    flat = _flat(tree, imports)
    if flat is None:
        return None
    if indent + len(flat) <= _WIDTH - 16 or isinstance(tree, Spec) or tree is None:
        return flat
    pad = " " * (indent + 4)
    items = []
    if type(tree) is dict:
        for k, v in tree.items():
            items.append(f"{pad}{_key(k)}: {literal(v, imports, indent + 4)},")
        open_, close = "{", "}"
    elif _is_namedtuple(tree):
        path = class_path(type(tree))
        assert path is not None  # _flat wrote it
        for name, v in zip(type(tree)._fields, tree, strict=True):
            items.append(f"{pad}{name}={literal(v, imports, indent + 4)},")
        open_, close = path[1] + "(", ")"
    else:
        items = [f"{pad}{literal(v, imports, indent + 4)}," for v in tree]
        open_, close = ("[", "]") if type(tree) is list else ("(", ")")
    return open_ + "\n" + "\n".join(items) + "\n" + " " * indent + close


def _key(k: Any) -> str:
    if type(k) is str:
        return str.__repr__(k)
    return int.__repr__(k)


def _flat(tree: Any, imports: set[str]) -> str | None:
    if isinstance(tree, Spec):
        return str.__str__(tree)
    if tree is None:
        return "None"
    if type(tree) is dict:
        if not all(type(k) is str or (type(k) is int and k.bit_length() <= 64) for k in tree):
            return None
        items = [(_key(k), _flat(v, imports)) for k, v in tree.items()]
        if any(v is None for _, v in items):
            return None
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if type(tree) in (list, tuple):
        parts = [_flat(v, imports) for v in tree]
        if any(p is None for p in parts):
            return None
        body = ", ".join(p for p in parts if p is not None)
        if type(tree) is list:
            return f"[{body}]"
        return f"({body}{',' if len(parts) == 1 else ''})"
    if _is_namedtuple(tree):
        path = class_path(type(tree))
        fields = type(tree)._fields
        if path is None or not all(_is_identifier(f) for f in fields):
            return None
        parts = [_flat(v, imports) for v in tree]
        if any(p is None for p in parts):
            return None
        imports.add(path[0])
        args = ", ".join(f"{f}={p}" for f, p in zip(fields, parts, strict=True))
        return f"{path[1]}({args})"
    return None


def argument_names(fn: Any, count: int) -> list[str] | None:
    """The names of ``fn``'s first ``count`` positional parameters, when each is one the
    snippet can bind (an identifier, none of the snippet's own names); else ``None``."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(names) < count:
        return None
    names = names[:count]
    if any(not _is_identifier(n) or n in TEMPLATE_NAMES for n in names):
        return None
    return names


def spec_list(specs: Sequence[Spec], indent: int = 0) -> str:
    """``[P(), P('data'), ...]``: on one line when it fits, else one spec per line."""
    flat = "[" + ", ".join(specs) + "]"
    if indent + len(flat) <= _WIDTH - 16:
        return flat
    pad = " " * (indent + 4)
    return "[\n" + "\n".join(f"{pad}{s}," for s in specs) + "\n" + " " * indent + "]"


def structural_lines(
    fn_name: str,
    names: list[str] | None,
    in_specs: Sequence[Spec],
    out_specs: Sequence[Spec],
    *,
    statics: bool,
) -> list[str]:
    """The snippet's tail for arguments that cannot be written as literals: one spec per
    array leaf, the tree's structure read from the arguments (``args``) themselves."""
    bind = (
        f"args = ({', '.join(names)}{',' if len(names) == 1 else ''})"
        if names
        else "args = ...  # bind: the tuple of arguments you call the function with"
    )
    lines = [
        "# The arguments hold objects (modules, states) that are rebuilt from your own values:",
        f"# bind the names below to the arguments you call {fn_name} with.",
        bind,
        "# one spec per array of args (and of the outputs), in jax.tree.leaves order",
        f"in_specs = {spec_list(in_specs)}",
        f"out_specs = {spec_list(out_specs)}",
        "",
        "",
        "def _is_array(x):",
        "    return hasattr(x, 'shape') or type(x) in (int, float, complex)",
        "",
        "",
        "def _shardings(tree, specs):",
        '    """NamedShardings shaped like tree: the i-th array on specs[i], None elsewhere."""',
        "    specs = iter(specs)",
        "    return jax.tree.map(",
        "        lambda x: NamedSharding(mesh, next(specs)) if _is_array(x) else None, tree",
        "    )",
        "",
        "",
        "in_shardings = _shardings(args, in_specs)",
    ]
    if not statics:
        return [
            *lines,
            f"out_shardings = _shardings(jax.eval_shape({fn_name}, *args), out_specs)",
            f"step = jax.jit({fn_name}, in_shardings=in_shardings, out_shardings=out_shardings)",
        ]
    return [
        *lines,
        "# static leaves (functions, flags) in the arguments: equinox's filtered jit and shard",
        f"out_shardings = _shardings(eqx.filter_eval_shape({fn_name}, *args), out_specs)",
        "",
        "",
        "def _sharded(fn):",
        '    """fn jitted, its arguments and outputs placed on the plan shardings."""',
        "",
        "    def run(*args):",
        "        args = eqx.filter_shard(args, in_shardings)",
        "        return eqx.filter_shard(fn(*args), out_shardings)",
        "",
        "    return eqx.filter_jit(run)",
        "",
        "",
        f"step = _sharded({fn_name})",
    ]


def tree_of(treedef: Any, leaves: Sequence[Spec]) -> Any:
    return jax.tree_util.tree_unflatten(treedef, list(leaves))
