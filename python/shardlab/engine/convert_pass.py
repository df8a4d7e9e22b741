"""The source pass behind converted control flow: Python ``if``/``while``/``for`` rewritten
into calls that decide at run time whether to stay Python or become ``lax`` control flow.

The pass works on parsed AST only (user text never reaches generated code except as parsed
nodes) and keeps every node's original line and column, so the converted code, compiled
under the user's own filename, makes tracebacks point at the user's lines. It runs in two
steps, as AutoGraph's does:

1. *Lowering jumps*: ``break``, ``continue`` and a ``return`` nested in a branch or loop
   become boolean flags (``__sl_break_3 = True``), and the statements after a jump are
   guarded by ``if not flag:``; a loop with a ``break`` tests ``not flag`` before each step.
   On concrete values this is plain Python, and on traced flags the guards become conds.
2. *Functional form*: each ``if``/``while``/``for`` becomes nested functions over the names
   it binds (its state), and one call, ``__sl__.if_stmt(...)`` and the like (``convert_ops``),
   that runs them as Python or stages them. ``and``/``or``/``not`` and ``a if c else b``
   become calls too.

What the pass leaves alone, it reports as a :class:`Site` with ``converted=False`` and a
reason, which the caller shows as one line naming the user's line.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field

RUNTIME = "__sl__"
PREFIX = "__sl_"
RETURN_FLAG = "__sl_returned"
RETURN_VALUE = "__sl_retval"
_MUTATORS = frozenset(
    {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "add"}
)


@dataclass(frozen=True)
class Site:
    """One control-flow statement the pass looked at."""

    index: int
    kind: str  # "if", "while", "for", "ifexp"
    lineno: int  # as compiled (the user's line)
    converted: bool
    reason: str = ""  # why it was left as Python


@dataclass
class PassResult:
    body: list[ast.stmt]
    sites: list[Site] = field(default_factory=list)

    @property
    def converted(self) -> int:
        return sum(s.converted for s in self.sites)


def _name(id_: str, ctx: ast.expr_context | None = None) -> ast.Name:
    return ast.Name(id=id_, ctx=ctx or ast.Load())


def _assign(name: str, value: ast.expr, like: ast.AST) -> ast.stmt:
    return ast.copy_location(ast.Assign(targets=[_name(name, ast.Store())], value=value), like)


def _located(node: ast.AST, like: ast.AST) -> ast.AST:
    """``node`` and all its children at ``like``'s position (generated code, user's line)."""
    for child in ast.walk(node):
        if "lineno" in child._attributes:
            ast.copy_location(child, like)
    return node


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


def loads(node: ast.AST) -> set[str]:
    """Every name read anywhere in ``node``, nested scopes included (conservative)."""
    names = {
        n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }
    names |= {
        n.target.id
        for n in ast.walk(node)
        if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)
    }
    return names


def annotate_liveness(block: list[ast.stmt], live_out: set[str]) -> None:
    """Sets ``_sl_live`` on every compound statement: the names that may be read after it."""
    after = set(live_out)
    for stmt in reversed(block):
        stmt._sl_live = set(after)  # type: ignore[attr-defined]
        if isinstance(stmt, ast.If):
            annotate_liveness(stmt.body, after)
            annotate_liveness(stmt.orelse, after)
        elif isinstance(stmt, (ast.For, ast.While)):
            inside = after | loads(stmt) | set(getattr(stmt, "_sl_stops", []))
            annotate_liveness(stmt.body, inside)
            annotate_liveness(stmt.orelse, after)
        elif isinstance(stmt, (ast.With, ast.Try)) or type(stmt).__name__ == "TryStar":
            for name in ("body", "orelse", "finalbody"):
                annotate_liveness(getattr(stmt, name, []), after | loads(stmt))
            for handler in getattr(stmt, "handlers", []):
                annotate_liveness(handler.body, after | loads(stmt))
        if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
            after -= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
        after |= loads(stmt)


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
                    out.append(
                        ast.copy_location(
                            ast.If(test=_not_all(sorted(may), stmt), body=rest, orelse=[]),
                            body[i + 1],
                        )
                    )
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
        return [stmt], set()

    @staticmethod
    def _may(stmt: ast.stmt, flags: dict[str, str]) -> set[str]:
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
        if any(isinstance(n, ast.Try) for n in walk_scope(loop) if n is not loop) and (
            _direct_jump(ast.Module(body=loop.body, type_ignores=[]), (ast.Break, ast.Continue))
        ):
            loop._sl_reason = "a `break`/`continue` inside `try` is not converted"  # type: ignore[attr-defined]
            return [loop], set()
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


def _call(attr: str, args: list[ast.expr], like: ast.AST) -> ast.expr:
    func = ast.Attribute(value=_name(RUNTIME), attr=attr, ctx=ast.Load())
    return _located(ast.Call(func=func, args=args, keywords=[]), like)  # type: ignore[return-value]


def _lambda(body: ast.expr) -> ast.expr:
    empty = ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])
    return ast.copy_location(ast.Lambda(args=empty, body=body), body)


def _strings(names: list[str], like: ast.AST) -> ast.expr:
    return _located(ast.Tuple(elts=[ast.Constant(n) for n in names], ctx=ast.Load()), like)  # type: ignore[return-value]


class _Logic(ast.NodeTransformer):
    """``and``/``or``/``not`` and ``a if c else b`` into runtime calls (Python semantics on
    concrete values, logical ops or a cond on traced ones). Nested scopes are left alone."""

    def __init__(self, owner: _Functional) -> None:
        self.owner = owner

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        return node

    def _skip(self, node: ast.AST) -> ast.AST:
        return node

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _skip

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        self.generic_visit(node)
        if any(isinstance(n, ast.NamedExpr) for n in ast.walk(node)):
            return node
        attr = "and_" if isinstance(node.op, ast.And) else "or_"
        first, *rest = node.values
        return _call(attr, [first, *(_lambda(v) for v in rest)], node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            return _call("not_", [node.operand], node)
        return node

    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        self.generic_visit(node)
        if any(isinstance(n, ast.NamedExpr) for n in ast.walk(node)):
            return node
        k = self.owner.site("ifexp", node, True)
        return _call(
            "ifexp", [ast.Constant(k), node.test, _lambda(node.body), _lambda(node.orelse)], node
        )


class _Functional:
    """Step 2: each ``if``/``while``/``for`` into nested functions over its state and one
    runtime call."""

    def __init__(self, *, declared: dict[str, str], first_site: int = 0) -> None:
        self.declared = declared  # name -> "global" / "nonlocal" (the function's declarations)
        self.sites: list[Site] = []
        self.first_site = first_site
        self.logic = _Logic(self)

    def site(self, kind: str, node: ast.AST, converted: bool, reason: str = "") -> int:
        index = self.first_site + len(self.sites)
        self.sites.append(Site(index, kind, getattr(node, "lineno", 0), converted, reason))
        return index

    def expr(self, node: ast.expr) -> ast.expr:
        return self.logic.visit(node)

    def block(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for stmt in body:
            out.extend(self.statement(stmt))
        return out

    def statement(self, stmt: ast.stmt) -> list[ast.stmt]:
        if isinstance(stmt, (*_SCOPES,)):
            return [stmt]  # type: ignore[list-item]
        if isinstance(stmt, ast.If):
            return self.if_(stmt)
        if isinstance(stmt, (ast.While, ast.For)):
            return self.loop(stmt)
        for field_name in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, field_name, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                setattr(stmt, field_name, self.block(inner))
        for handler in getattr(stmt, "handlers", []):
            handler.body = self.block(handler.body)
        for field_name, value in ast.iter_fields(stmt):
            if isinstance(value, ast.expr):
                setattr(stmt, field_name, self.expr(value))
            elif isinstance(value, list) and value and isinstance(value[0], ast.expr):
                setattr(stmt, field_name, [self.expr(v) for v in value])
        return [stmt]

    # -- what stays Python ------------------------------------------------------------------
    def _reason(self, stmt: ast.stmt, blocks: list[list[ast.stmt]], state: list[str]) -> str:
        given = getattr(stmt, "_sl_reason", "")
        if given:
            return given
        for block in blocks:
            for top in block:
                for node in walk_scope(top):
                    if isinstance(node, (ast.Yield, ast.YieldFrom, ast.Await)):
                        return "it contains `yield` or `await`"
                    if isinstance(node, ast.Delete):
                        return "it deletes a name (`del`)"
                    if isinstance(node, (ast.Return, ast.Break, ast.Continue)):
                        word = type(node).__name__.lower()
                        return (
                            f"a `{word}` here cannot be lowered (it is outside a function or loop)"
                        )
                    mutated = _mutated_outer(node, state)
                    if mutated:
                        return (
                            f"its body changes `{mutated}` in place, and a staged branch or loop "
                            "runs its Python once while tracing; build a new value instead "
                            f"(`{mutated} = [*{mutated}, item]`, `.at[i].set(v)`)"
                        )
        return ""

    def _function(
        self,
        name: str,
        params: list[str],
        body: list[ast.stmt],
        returns: ast.expr | None,
        like: ast.AST,
    ) -> ast.FunctionDef:
        declared = sorted({n for n in stores(body) if n in self.declared})
        head: list[ast.stmt] = []
        for kind in ("global", "nonlocal"):
            names = [n for n in declared if self.declared[n] == kind]
            if names:
                node = ast.Global(names=names) if kind == "global" else ast.Nonlocal(names=names)
                head.append(ast.copy_location(node, like))
        tail = [ast.copy_location(ast.Return(value=returns), like)] if returns is not None else []
        args = ast.arguments(
            posonlyargs=[],
            args=[ast.arg(arg=p) for p in params],
            kwonlyargs=[],
            kw_defaults=[],
            defaults=[],
        )
        fn = ast.FunctionDef(
            name=name,
            args=args,
            body=[*head, *body, *tail] or [ast.Pass()],
            decorator_list=[],
            returns=None,
            type_params=[],
        )
        return _located_shallow(fn, like)

    def _state_call(self, names: list[str], like: ast.AST) -> ast.expr:
        locals_call = ast.Call(func=_name("locals"), args=[], keywords=[])
        return _call("state", [locals_call, *(ast.Constant(n) for n in names)], like)

    def _bind(self, names: list[str], call: ast.expr, like: ast.stmt) -> ast.stmt:
        if not names:
            return ast.copy_location(ast.Expr(value=call), like)
        target = ast.Tuple(elts=[_name(n, ast.Store()) for n in names], ctx=ast.Store())
        return ast.copy_location(ast.Assign(targets=[_located(target, like)], value=call), like)  # type: ignore[list-item]

    def _tuple(self, names: list[str], like: ast.AST) -> ast.expr:
        return _located(ast.Tuple(elts=[_name(n) for n in names], ctx=ast.Load()), like)  # type: ignore[return-value]

    # -- if ----------------------------------------------------------------------------------
    def if_(self, stmt: ast.If) -> list[ast.stmt]:
        live = getattr(stmt, "_sl_live", set())
        stmt.test = self.expr(stmt.test)
        body, orelse = self.block(stmt.body), self.block(stmt.orelse)
        names = [n for n in stores(body + orelse) if n not in self.declared]
        reason = self._reason(stmt, [body, orelse], names)
        if reason:
            self.site("if", stmt, False, reason)
            stmt.body, stmt.orelse = body, orelse
            return [stmt]
        k = self.site("if", stmt, True)
        true_fn = self._function(
            f"{PREFIX}fn_if_true_{k}", names, body, self._tuple(names, stmt), stmt
        )
        false_fn = self._function(
            f"{PREFIX}fn_if_false_{k}", names, orelse, self._tuple(names, stmt), stmt
        )
        call = _call(
            "if_stmt",
            [
                ast.Constant(k),
                stmt.test,
                _name(true_fn.name),
                _name(false_fn.name),
                self._state_call(names, stmt),
                _strings(names, stmt),
                _strings([n for n in names if n in live], stmt),
            ],
            stmt,
        )
        return [true_fn, false_fn, self._bind(names, call, stmt)]

    # -- loops -------------------------------------------------------------------------------
    def loop(self, stmt: ast.While | ast.For) -> list[ast.stmt]:
        kind = "while" if isinstance(stmt, ast.While) else "for"
        live = getattr(stmt, "_sl_live", set())
        stops: list[str] = getattr(stmt, "_sl_stops", [])
        body = self.block(stmt.body)
        targets = (
            stores([ast.Assign(targets=[stmt.target], value=ast.Constant(0))])
            if isinstance(stmt, ast.For)
            else []
        )
        rebound = set(stores(body))
        # a loop target nothing reads after the loop is the body's own (bound from the item)
        targets = [t for t in targets if t in live or t in rebound]
        names = [n for n in dict.fromkeys([*targets, *stores(body)]) if n not in self.declared]
        reason = self._reason(stmt, [body, stmt.orelse], names)
        if not reason and stmt.orelse:
            reason = "its `else:` clause could not be lowered"
        if reason:
            self.site(kind, stmt, False, reason)
            stmt.body = body
            if isinstance(stmt, ast.While):
                stmt.test = self.expr(stmt.test)
            else:
                stmt.iter = self.expr(stmt.iter)
            return [stmt]
        k = self.site(kind, stmt, True)
        out: list[ast.stmt] = []
        state = self._state_call(names, stmt)
        live_names = _strings([n for n in names if n in live], stmt)
        if isinstance(stmt, ast.While):
            test = stmt.test
            if stops:
                test = ast.BoolOp(op=ast.And(), values=[_not_all(stops, stmt), test])
                _located(test, stmt)
                ast.copy_location(test, stmt)
            test_fn = self._function(f"{PREFIX}fn_while_test_{k}", names, [], self.expr(test), stmt)
            body_fn = self._function(
                f"{PREFIX}fn_while_body_{k}", names, body, self._tuple(names, stmt), stmt
            )
            out += [test_fn, body_fn]
            call = _call(
                "while_stmt",
                [
                    ast.Constant(k),
                    _name(test_fn.name),
                    _name(body_fn.name),
                    state,
                    _strings(names, stmt),
                    live_names,
                ],
                stmt,
            )
        else:
            item = f"{PREFIX}item"
            take = ast.copy_location(ast.Assign(targets=[stmt.target], value=_name(item)), stmt)
            _located(take, stmt)
            body_fn = self._function(
                f"{PREFIX}fn_for_body_{k}",
                [item, *names],
                [take, *body],
                self._tuple(names, stmt),
                stmt,
            )
            extra: ast.expr = ast.Constant(None)
            if stops:
                test_fn = self._function(
                    f"{PREFIX}fn_for_test_{k}", names, [], self.expr(_not_all(stops, stmt)), stmt
                )
                out.append(test_fn)
                extra = _name(test_fn.name)
            out.append(body_fn)
            iterable = self.expr(stmt.iter)
            if (
                isinstance(iterable, ast.Call)
                and isinstance(iterable.func, ast.Name)
                and iterable.func.id == "range"
                and not iterable.keywords
                and 1 <= len(iterable.args) <= 3
                and not any(isinstance(a, ast.Starred) for a in iterable.args)
            ):
                iterable = _call("range_", [iterable.func, *iterable.args], iterable)
            call = _call(
                "for_stmt",
                [
                    ast.Constant(k),
                    iterable,
                    extra,
                    _name(body_fn.name),
                    state,
                    _strings(names, stmt),
                    live_names,
                ],
                stmt,
            )
        out.append(self._bind(names, _located_keep(call), stmt))
        return out


def _located_shallow(node: ast.AST, like: ast.AST) -> ast.FunctionDef:
    ast.copy_location(node, like)
    for child in ast.walk(node):
        if "lineno" in child._attributes and not hasattr(child, "lineno"):
            ast.copy_location(child, like)
    return node  # type: ignore[return-value]


def _located_keep(node: ast.expr) -> ast.expr:
    return node


def _mutated_outer(node: ast.AST, state: list[str]) -> str:
    """The name a statement changes in place (``out.append(x)``, ``d[k] = v``, ``o.a = v``)
    when that name is not rebound in the construct: a staged construct would do it once."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _MUTATORS
    ):
        base = node.func.value
        if isinstance(base, ast.Name) and base.id not in state:
            return base.id
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, (ast.Subscript, ast.Attribute)) and isinstance(
                    part.ctx, ast.Store
                ):
                    base = part.value
                    while isinstance(base, (ast.Subscript, ast.Attribute)):
                        base = base.value
                    if isinstance(base, ast.Name) and base.id not in state:
                        return base.id
    return ""


def convert_block(
    body: list[ast.stmt],
    *,
    function: bool,
    live_out: set[str],
    declared: dict[str, str] | None = None,
) -> PassResult:
    """Both steps on a function body (``function=True``) or a cell body."""
    body = copy.deepcopy(body)
    lowered = lower_function(body) if function else lower_cell(body)
    annotate_liveness(lowered, live_out)
    functional = _Functional(declared=declared or {})
    converted = functional.block(lowered)
    module = ast.Module(body=converted, type_ignores=[])
    ast.fix_missing_locations(module)
    return PassResult(converted, functional.sites)
