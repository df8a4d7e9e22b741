"""Python control flow converted for staging: ``shardlab.to_static`` and ``converted``.

``to_static(fn)`` compiles ``fn`` with ``jax.jit`` after rewriting its ``if``/``while``/
``for``, ``and``/``or``/``not`` and ``a if c else b`` so that each decides at run time: on a
concrete Python value it runs as Python (exactly as unconverted), on a traced value it becomes
``lax.cond``, ``lax.while_loop`` or ``lax.scan`` (``break``, ``continue`` and early ``return``
included). Graph cells get the same conversion (``cellsource.analyse_cell``). The pass is
``convert_pass``; the run-time operators are ``convert_ops`` and ``convert_loops``;
docs/guide/control-flow.md says what converts, what stays Python and why this is our own pass
rather than diastatic-malt.

The converted code is compiled under the function's own filename with its original line
numbers, so tracebacks and error messages point at the user's lines.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import traceback
import types
from collections.abc import Callable
from typing import Any

import jax

from shardlab._core.source import line_label as source_line_label
from shardlab.engine.convert.exprs import raising_failed_asserts
from shardlab.engine.convert.loops import Runtime
from shardlab.engine.convert.lower import function_def
from shardlab.engine.convert.ops import ControlFlowError, ConversionNote, reverse_ad
from shardlab.engine.convert.rewrite import RUNTIME, PassResult, convert_block
from shardlab.engine.convert.undefined import UnboundRead, Undefined

__all__ = ["ControlFlowError", "ConversionNote", "Runtime", "converted", "to_static"]


def line_label(filename: str) -> Callable[[int], str]:
    """How a person names a line of ``filename`` (``_core/source.py``: ``In [3], line 2``
    for a notebook cell, ``path:2`` for a file)."""
    return lambda line: source_line_label(filename, line)


class _Unconvertible(Exception):
    """``fn`` cannot be converted (no source, a lambda, a generator...): run it as it is."""


def _function_node(fn: types.FunctionType) -> tuple[ast.FunctionDef, str]:
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError) as error:
        raise _Unconvertible(f"its source is not available ({error})") from None
    indent = len(source) - len(source.lstrip(" \t"))
    tree = ast.parse(textwrap.dedent(source))
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn.__name__]
    if not nodes:
        raise _Unconvertible("it is not a plain `def` (a lambda, or made by another function)")
    node = nodes[0]
    first = fn.__code__.co_firstlineno
    ast.increment_lineno(
        node,
        first - node.lineno if not node.decorator_list else first - node.decorator_list[0].lineno,
    )
    for child in ast.walk(node):  # columns as in the file, for carets under the right text
        if "col_offset" in child._attributes and hasattr(child, "col_offset"):
            setattr(child, "col_offset", getattr(child, "col_offset") + indent)  # noqa: B009,B010
            end = getattr(child, "end_col_offset", None)
            if end is not None:
                setattr(child, "end_col_offset", end + indent)  # noqa: B010
    node.decorator_list = []
    return node, source


def _declared(node: ast.FunctionDef) -> dict[str, str]:
    found: dict[str, str] = {}
    for child in ast.walk(node):
        if isinstance(child, ast.Global):
            found.update(dict.fromkeys(child.names, "global"))
        elif isinstance(child, ast.Nonlocal):
            found.update(dict.fromkeys(child.names, "nonlocal"))
    return found


def _convert_node(fn: types.FunctionType, *, strict: bool) -> tuple[ast.FunctionDef, PassResult]:
    if inspect.isgeneratorfunction(fn) or inspect.iscoroutinefunction(fn):
        raise _Unconvertible("it is a generator or coroutine")
    node, _ = _function_node(fn)
    result = convert_block(node.body, function=True, live_out=set(), declared=_declared(node))
    if strict:
        left = [s for s in result.sites if not s.converted]
        if left:
            label = line_label(fn.__code__.co_filename)
            site = left[0]
            raise ControlFlowError(
                label=label(site.lineno),
                lineno=site.lineno,
                line="",
                reason=f"this `{site.kind}` cannot be converted: {site.reason}.",
                fix="rewrite it as the reason says, or convert without strict=True to run it as Python.",
            )
    node.body = result.body
    return node, result


def _instantiate(
    fn: types.FunctionType, node: ast.FunctionDef, runtime: Runtime
) -> types.FunctionType:
    """The converted ``def``, compiled under ``fn``'s filename, with ``fn``'s globals,
    closure, defaults and metadata, and ``__sl__`` bound to ``runtime``."""
    free = fn.__code__.co_freevars
    params = [ast.arg(arg=n) for n in (RUNTIME, *free)]
    factory = function_def(
        "__sl_factory",
        ast.arguments(posonlyargs=[], args=params, kwonlyargs=[], kw_defaults=[], defaults=[]),
        [node, ast.Return(value=ast.Name(id=node.name, ctx=ast.Load()))],
    )
    module = ast.Module(body=[factory], type_ignores=[])
    ast.copy_location(factory, node)
    ast.fix_missing_locations(module)
    code = compile(module, fn.__code__.co_filename, "exec", dont_inherit=True)
    factory_code = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    inner = next(
        c
        for c in factory_code.co_consts
        if isinstance(c, types.CodeType) and c.co_name == node.name
    )
    cells = dict(zip(free, fn.__closure__ or (), strict=True))
    cells[RUNTIME] = types.CellType(runtime)
    closure = tuple(cells[n] for n in inner.co_freevars)
    new = types.FunctionType(inner, fn.__globals__, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    functools.update_wrapper(new, fn)
    del new.__wrapped__
    return new


def _converted_pair(
    fn: Callable[..., Any], *, strict: bool
) -> tuple[Callable[..., Any], Runtime | None, str]:
    """(callable to trace, its runtime or None when unconverted, the note when unconverted)."""
    target = fn
    if not isinstance(target, types.FunctionType):
        return fn, None, "it is not a Python function"
    try:
        node, result = _convert_node(target, strict=strict)
    except _Unconvertible as why:
        if strict:
            raise ControlFlowError(
                label=None,
                lineno=None,
                line="",
                reason=f"`{fn.__name__}` cannot be converted: {why}.",
                fix="define it with `def` in a file or notebook cell, or convert without strict=True.",
            ) from None
        return fn, None, str(why)
    filename = target.__code__.co_filename
    runtime = Runtime(result.sites, filename=filename, label=line_label(filename), strict=strict)
    runtime.warn = True
    return _instantiate(target, node, runtime), runtime, ""


def _left_as_python(error: BaseException, runtime: Runtime | None) -> ControlFlowError | None:
    """A tracer error at a statement the pass left as Python: the error names that line and
    why it was not converted (JAX's own message cannot know)."""
    if runtime is None:
        return None
    frames = [
        f for f in traceback.extract_tb(error.__traceback__) if f.filename == runtime.filename
    ]
    sites = {s.lineno: s for s in runtime.sites.values() if not s.converted}
    for frame in reversed(frames):
        site = sites.get(frame.lineno or 0)
        if site is None:
            continue
        return ControlFlowError(
            label=runtime.label(site.lineno) if runtime.label else None,
            lineno=site.lineno,
            line=(frame.line or "").strip(),
            reason=f"this `{site.kind}` was left as Python, because {site.reason}, and its "
            f"condition is a traced value ({type(error).__name__}).",
            fix="rewrite it as the reason says, or make the condition a concrete Python value.",
        )
    return None


def converted(fn: Callable[..., Any]) -> str:
    """The converted source of ``fn`` (what :func:`to_static` compiles), as Python text.

    Raises:
        TypeError: ``fn`` is not a function defined with ``def`` whose source is available.
    """
    target = getattr(fn, "__shardlab_original__", fn)
    try:
        node, _ = _convert_node(target, strict=False)
    except _Unconvertible as why:
        raise TypeError(f"cannot show converted source of {fn!r}: {why}") from None
    return ast.unparse(node)


def _reverse_ad(args: Any) -> bool:
    from jax._src.interpreters import ad

    kinds = tuple(
        k for k in (getattr(ad, "LinearizeTracer", None), getattr(ad, "JVPTracer", None)) if k
    )
    return any(
        isinstance(leaf, kinds) and _in_reverse(leaf) for leaf in jax.tree_util.tree_leaves(args)
    )


def _in_reverse(leaf: Any) -> bool:
    """A LinearizeTracer (jax.grad, vjp, linearize) or a JVPTracer under a partial-eval
    (the older grad path); a plain jvp's JVPTracer is forward mode."""
    return type(leaf).__name__ == "LinearizeTracer"


def to_static(
    fn: Callable[..., Any] | None = None, /, *, strict: bool = False, **jit_options: Any
) -> Any:
    """Converts ``fn``'s Python control flow and compiles it with ``jax.jit``.

    ``if``/``elif``/``else`` on a traced value becomes ``lax.cond``; ``while`` on a traced
    condition ``lax.while_loop``; ``for i in range(n)`` with a traced ``n`` a counted
    ``lax.while_loop``; ``for row in xs`` over a traced array ``lax.scan``; ``break``,
    ``continue`` and early ``return`` work inside them; ``and``/``or``/``not`` on traced
    values become logical ops. On concrete Python values all of these stay Python.

    Args:
        fn: a function defined with ``def`` (its source must be available).
        strict: raise instead of running a statement as Python when it cannot be converted.
        **jit_options: passed to ``jax.jit`` (``static_argnums``, ``donate_argnums``, ...).

    Returns:
        The jitted, converted function; ``shardlab.converted(f)`` shows its source. Used as
        ``@shardlab.to_static`` or ``@shardlab.to_static(strict=True)``.

    Example:
        >>> @shardlab.to_static
        ... def relu_sum(x):
        ...     if x.sum() > 0:
        ...         return x.sum()
        ...     return 0.0
    """
    if fn is None:
        return functools.partial(to_static, strict=strict, **jit_options)
    inner, runtime, why = _converted_pair(fn, strict=strict)
    if runtime is None:
        import warnings

        warnings.warn(
            f"shardlab.to_static: `{getattr(fn, '__name__', fn)}` runs unconverted: {why}",
            ConversionNote,
            stacklevel=2,
        )

    def traced(*args: Any, __sl_reverse: bool = False, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        with reverse_ad(__sl_reverse):
            try:
                out = inner(*args, **kwargs)
            except jax.errors.ConcretizationTypeError as error:
                left = _left_as_python(error, runtime)
                if left is None:
                    raise
                raise left from None
        for leaf in jax.tree_util.tree_leaves(out, is_leaf=lambda v: isinstance(v, Undefined)):
            if isinstance(leaf, Undefined):  # `return y` with `y` bound on no path here
                raise UnboundRead(leaf.name)
        return out

    traced.__name__ = getattr(fn, "__name__", "traced")  # jit(layer), not jit(traced)
    traced.__qualname__ = getattr(fn, "__qualname__", traced.__name__)
    # JAX names the function it traces in its errors ("while tracing the function f at
    # file:line"): the user's, not this wrapper (its own signature keeps the flag's name).
    traced.__signature__ = inspect.signature(traced)  # type: ignore[attr-defined]
    traced.__wrapped__ = fn  # type: ignore[attr-defined]
    static = tuple(jit_options.pop("static_argnames", ()) or ())
    if isinstance(static, str):
        static = (static,)
    jitted = jax.jit(traced, static_argnames=("__sl_reverse", *static), **jit_options)

    @functools.wraps(fn)
    def staged(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        with raising_failed_asserts():
            return jitted(*args, __sl_reverse=_reverse_ad((args, kwargs)), **kwargs)

    staged.__shardlab_original__ = fn  # type: ignore[attr-defined]
    staged.__shardlab_runtime__ = runtime  # type: ignore[attr-defined]
    staged.lower = jitted.lower  # type: ignore[attr-defined]
    return staged
