"""Step 1 of the control-flow pass (``convert_pass``), and the scope analysis both steps use.

``break``, ``continue`` and a ``return`` nested in a branch or loop become boolean flags
(``__sl_break_3 = True``), and the statements after a jump are guarded by ``if not flag:``; a
loop with a ``break`` tests ``not flag`` before each step. On concrete values this is plain
Python, and on traced flags the guards become conds. Liveness (which names may be read after
a statement) decides when a name bound on one path of a traced ``if`` is an error.
"""

from __future__ import annotations

import ast
import sys
from typing import Any, TypeVar

RUNTIME = "__sl__"
PREFIX = "__sl_"
RETURN_FLAG = "__sl_returned"
RETURN_VALUE = "__sl_retval"


def function_def(name: str, args: ast.arguments, body: list[ast.stmt]) -> ast.FunctionDef:
    """A ``def`` node (``type_params`` only where Python has them, 3.12 on)."""
    extra: dict[str, Any] = {"type_params": []} if sys.version_info >= (3, 12) else {}
    return ast.FunctionDef(
        name=name, args=args, body=body, decorator_list=[], returns=None, **extra
    )


def _name(id_: str, ctx: ast.expr_context | None = None) -> ast.Name:
    return ast.Name(id=id_, ctx=ctx or ast.Load())


def _assign(name: str, value: ast.expr, like: ast.AST) -> ast.stmt:
    return ast.copy_location(ast.Assign(targets=[_name(name, ast.Store())], value=value), like)


_Node = TypeVar("_Node", bound=ast.AST)


def _located(node: _Node, like: ast.AST) -> _Node:
    """``node`` and all its children at ``like``'s position (generated code, user's line)."""
    for child in ast.walk(node):
        if "lineno" in child._attributes:
            ast.copy_location(child, like)
    return node


def _guard(flags: set[str], rest: list[ast.stmt], like: ast.AST) -> ast.If:
    """``if not flag: rest`` after a statement that may jump; marked so the run time knows
    what its false side means (``_sl_jump``: "return", or "loop" for break/continue)."""
    guard = ast.copy_location(
        ast.If(test=_not_all(sorted(flags), like), body=rest, orelse=[]), like
    )
    guard._sl_jump = "return" if flags == {RETURN_FLAG} else "loop"  # type: ignore[attr-defined]
    return guard


def _not_all(flags: list[str], like: ast.AST) -> ast.expr:
    parts: list[ast.expr] = [ast.UnaryOp(op=ast.Not(), operand=_name(f)) for f in flags]
    test = parts[0] if len(parts) == 1 else ast.BoolOp(op=ast.And(), values=parts)
    return _located(test, like)  # type: ignore[return-value]


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def walk_scope(node: ast.AST):
    """``node`` and its descendants; nested functions, classes and lambdas are yielded but
    not entered (their names are their own)."""
    yield node
    if isinstance(node, _SCOPES):
        return
    for child in ast.iter_child_nodes(node):
        if isinstance(child, _SCOPES):
            yield child
            continue
        yield from walk_scope(child)


def _direct_jump(node: ast.AST, kinds: tuple[type, ...]) -> bool:
    """A ``break``/``continue`` in ``node`` that belongs to the enclosing loop."""
    if isinstance(node, kinds):
        return True
    if isinstance(node, (*_SCOPES, ast.For, ast.While, ast.AsyncFor)):
        return False
    return any(_direct_jump(c, kinds) for c in ast.iter_child_nodes(node))


def stores(nodes: list[ast.stmt]) -> list[str]:
    """Names the statements bind in their own scope, in order of first binding."""
    found: list[str] = []

    def add(name: str) -> None:
        if name not in found:
            found.append(name)

    for node in nodes:
        for child in walk_scope(node):
            if isinstance(child, ast.Name) and isinstance(child.ctx, (ast.Store, ast.Del)):
                add(child.id)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                add(child.name)
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                for alias in child.names:
                    if alias.name != "*":
                        add((alias.asname or alias.name).split(".")[0])
            elif isinstance(child, ast.ExceptHandler) and child.name:
                add(child.name)
    return [n for n in found if not n.startswith(PREFIX + "fn_")]


class _Lowering:
    """Step 1: ``break``/``continue``/nested ``return`` into flags and guards."""

    def __init__(self) -> None:
        self.counter = 0

    def block(self, body: list[ast.stmt], flags: dict[str, str]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for i, stmt in enumerate(body):
            new, may = self.statement(stmt, flags)
            out.extend(new)
            if may:
                rest = self.block(body[i + 1 :], flags)
                if rest:
                    out.append(_guard(may, rest, body[i + 1]))
                return out
        return out

    def statement(self, stmt: ast.stmt, flags: dict[str, str]) -> tuple[list[ast.stmt], set[str]]:
        if isinstance(stmt, ast.Break) and "break" in flags:
            return [_assign(flags["break"], ast.Constant(True), stmt)], {flags["break"]}
        if isinstance(stmt, ast.Continue) and "continue" in flags:
            return [_assign(flags["continue"], ast.Constant(True), stmt)], {flags["continue"]}
        if isinstance(stmt, ast.Return) and "return" in flags:
            value = stmt.value if stmt.value is not None else ast.Constant(None)
            return [
                _assign(RETURN_VALUE, value, stmt),
                _assign(RETURN_FLAG, ast.Constant(True), stmt),
            ], {RETURN_FLAG}
        if isinstance(stmt, ast.If):
            stmt.body = self.block(stmt.body, flags) or [ast.copy_location(ast.Pass(), stmt)]
            stmt.orelse = self.block(stmt.orelse, flags)
            return [stmt], self._may(stmt, flags)
        if isinstance(stmt, (ast.For, ast.While)):
            return self.loop(stmt, flags)
        if isinstance(stmt, ast.With):
            stmt.body = self.block(stmt.body, flags)
            return [stmt], self._may(stmt, flags)
        if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            return self.try_(stmt, flags)
        return [stmt], set()

    def try_(self, stmt: Any, flags: dict[str, str]) -> tuple[list[ast.stmt], set[str]]:
        """A jump inside ``try`` sets its flag like anywhere else: the rest of the ``try``
        body is guarded, ``finally`` still runs (as it does when Python jumps), and ``else``
        runs only when the body did not jump. A jump inside ``finally`` (which would cancel
        an exception) stays Python."""
        jumps = (ast.Return, ast.Break, ast.Continue)
        if any(isinstance(n, jumps) for part in stmt.finalbody for n in walk_scope(part)):
            stmt._sl_reason = "a `return`/`break`/`continue` inside `finally` is not converted"
            return [stmt], set()
        stmt.body = self.block(stmt.body, flags) or [ast.copy_location(ast.Pass(), stmt)]
        body_may = self._may(ast.Module(body=stmt.body, type_ignores=[]), flags)
        for handler in stmt.handlers:
            handler.body = self.block(handler.body, flags) or [
                ast.copy_location(ast.Pass(), handler)
            ]
        orelse = self.block(stmt.orelse, flags)
        if orelse and body_may:
            orelse = [_guard(body_may, orelse, orelse[0])]
        stmt.orelse = orelse
        return [stmt], self._may(stmt, flags)

    @staticmethod
    def _may(stmt: ast.AST, flags: dict[str, str]) -> set[str]:
        """The flags ``stmt`` (already lowered) may set."""
        targets = {v for v in flags.values()}
        found = set()
        for child in walk_scope(stmt):
            if isinstance(child, ast.Assign) and isinstance(child.value, ast.Constant):
                for t in child.targets:
                    if isinstance(t, ast.Name) and t.id in targets and child.value.value is True:
                        found.add(t.id)
        return found

    def loop(
        self, loop: ast.For | ast.While, flags: dict[str, str]
    ) -> tuple[list[ast.stmt], set[str]]:
        self.counter += 1
        k = self.counter
        inner: dict[str, str] = {}
        if "return" in flags:
            inner["return"] = flags["return"]
        body_module = ast.Module(body=loop.body, type_ignores=[])
        has_break = _direct_jump(body_module, (ast.Break,))
        has_continue = _direct_jump(body_module, (ast.Continue,))
        if has_break:
            inner["break"] = f"{PREFIX}break_{k}"
        if has_continue:
            inner["continue"] = f"{PREFIX}continue_{k}"
        body = self.block(loop.body, inner)
        if has_continue:
            body = [_assign(inner["continue"], ast.Constant(False), loop), *body]
        loop.body = body or [ast.copy_location(ast.Pass(), loop)]
        stops = [inner["break"]] if has_break else []
        returns = "return" in inner and self._may(loop, {"return": RETURN_FLAG})
        if returns:
            stops.append(RETURN_FLAG)
        loop._sl_stops = stops  # type: ignore[attr-defined]
        out: list[ast.stmt] = []
        if has_break:
            out.append(_assign(inner["break"], ast.Constant(False), loop))
        out.append(loop)
        if loop.orelse:
            orelse = self.block(loop.orelse, flags)
            loop.orelse = []
            if stops:
                out.append(
                    ast.copy_location(
                        ast.If(test=_not_all(stops, loop), body=orelse, orelse=[]), loop
                    )
                )
            else:
                out.extend(orelse)
        return out, ({RETURN_FLAG} if returns else set())


def lower_function(body: list[ast.stmt]) -> list[ast.stmt]:
    """Step 1 for a function body: nested returns (if any) and loop jumps into flags."""
    nested_return = any(
        isinstance(n, ast.Return) for stmt in body for n in walk_scope(stmt) if n is not stmt
    ) or any(isinstance(s, ast.Return) for s in body[:-1])
    lowering = _Lowering()
    if not nested_return:
        return lowering.block(body, {})
    if not body or not isinstance(body[-1], ast.Return):
        body = [*body, ast.copy_location(ast.Return(value=ast.Constant(None)), body[-1])]
    last = body[-1]
    prologue = [
        _assign(RETURN_FLAG, ast.Constant(False), body[0]),
        _assign(
            RETURN_VALUE,
            _located(
                ast.Attribute(value=_name(RUNTIME), attr="UNDEFINED_RETURN", ctx=ast.Load()),
                body[0],
            ),
            body[0],
        ),  # type: ignore[arg-type]
    ]
    lowered = lowering.block(body, {"return": RETURN_FLAG})
    call = ast.Call(
        func=ast.Attribute(value=_name(RUNTIME), attr="retval", ctx=ast.Load()),
        args=[_name(RETURN_VALUE)],
        keywords=[],
    )
    epilogue = ast.copy_location(ast.Return(value=_located(call, last)), last)  # type: ignore[arg-type]
    return [*prologue, *lowered, epilogue]


def lower_cell(body: list[ast.stmt]) -> list[ast.stmt]:
    """Step 1 for a cell (module level: no ``return``)."""
    return _Lowering().block(body, {})
