"""The source pass behind converted control flow: Python ``if``/``while``/``for`` rewritten
into calls that decide at run time whether to stay Python or become ``lax`` control flow.

The pass works on parsed AST only (user text never reaches generated code except as parsed
nodes) and keeps every node's original line and column, so the converted code, compiled
under the user's own filename, makes tracebacks point at the user's lines. It runs in two
steps, as AutoGraph's does:

1. *Lowering jumps* (``convert_lower``): ``break``, ``continue`` and a ``return`` nested in a branch or loop
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
import sys
from dataclasses import dataclass, field

from shardlab.engine.convert.liveness import annotate_liveness, captured
from shardlab.engine.convert.lower import (
    _SCOPES,
    PREFIX,
    RETURN_FLAG,
    RETURN_VALUE,
    RUNTIME,
    _located,
    _name,
    _not_all,
    function_def,
    lower_cell,
    lower_function,
    stores,
    walk_scope,
)

__all__ = [
    "PREFIX",
    "RETURN_FLAG",
    "RETURN_VALUE",
    "RUNTIME",
    "PassResult",
    "Site",
    "convert_block",
    "walk_scope",
]

_MUTATORS = frozenset(
    {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "add"}
)


@dataclass(frozen=True)
class Site:
    """One control-flow statement the pass looked at."""

    index: int
    kind: str  # "if", "while", "for", "ifexp", "assert"
    lineno: int  # as compiled (the user's line)
    converted: bool
    reason: str = ""  # why it was left as Python
    # The guard the pass put after a jump ("return", or "loop" for break/continue): its
    # false side is the path that jumped.
    jump: str = ""
    in_try: bool = False  # inside the body of a ``try`` that handles exceptions


@dataclass
class PassResult:
    body: list[ast.stmt]
    sites: list[Site] = field(default_factory=list)

    @property
    def converted(self) -> int:
        return sum(s.converted for s in self.sites)


def _call(attr: str, args: list[ast.expr], like: ast.AST) -> ast.expr:
    func = ast.Attribute(value=_name(RUNTIME), attr=attr, ctx=ast.Load())
    return _located(ast.Call(func=func, args=args, keywords=[]), like)  # type: ignore[return-value]


def _lambda(body: ast.expr) -> ast.expr:
    empty = ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])
    return ast.copy_location(ast.Lambda(args=empty, body=body), body)


def _strings(names: list[str], like: ast.AST) -> ast.expr:
    return _located(ast.Tuple(elts=[ast.Constant(n) for n in names], ctx=ast.Load()), like)  # type: ignore[return-value]


_COMPARE_TEXT: dict[type, str] = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
}


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

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        """``a < b < c`` into ``__sl__.compare(a, "<", lambda: b, "<", lambda: c)``: Python's
        chain on concrete values, a logical and of the comparisons on traced ones."""
        self.generic_visit(node)
        if len(node.ops) < 2 or any(isinstance(n, ast.NamedExpr) for n in ast.walk(node)):
            return node
        parts: list[ast.expr] = []
        for op, right in zip(node.ops, node.comparators, strict=True):
            parts += [_located(ast.Constant(_COMPARE_TEXT[type(op)]), node), _lambda(right)]
        return _call("compare", [node.left, *parts], node)

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

    def __init__(
        self,
        *,
        declared: dict[str, str],
        first_site: int = 0,
        print_order: bool = False,
        shared: set[str] | None = None,
    ) -> None:
        self.declared = declared  # name -> "global" / "nonlocal" (the function's declarations)
        # Names nested functions read (a closure defined before a loop, called inside it):
        # the generated functions write them through to the function's own variable
        # (``nonlocal``), so such a closure sees this iteration's value, as in Python.
        self.shared = shared or set()
        self.in_try = 0  # depth of ``try`` bodies (with handlers) around the statement
        # A graph cell prints in program order after the run; a print inside lax.scan can
        # only be a runtime callback, which prints before those: loops that print unroll.
        self.print_order = print_order
        self.sites: list[Site] = []
        self.first_site = first_site
        self.logic = _Logic(self)

    def site(self, kind: str, node: ast.AST, converted: bool, reason: str = "") -> int:
        index = self.first_site + len(self.sites)
        jump = getattr(node, "_sl_jump", "")
        line = getattr(node, "lineno", 0)
        self.sites.append(Site(index, kind, line, converted, reason, jump, self.in_try > 0))
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
        if isinstance(stmt, ast.Assert) and not sys.flags.optimize:
            return [self.assert_stmt(stmt)]
        handles = bool(getattr(stmt, "handlers", None))
        for field_name in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, field_name, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                guarded = handles and field_name == "body"
                self.in_try += guarded
                setattr(stmt, field_name, self.block(inner))
                self.in_try -= guarded
        for handler in getattr(stmt, "handlers", []):
            handler.body = self.block(handler.body)
        for field_name, value in ast.iter_fields(stmt):
            if isinstance(value, ast.expr):
                setattr(stmt, field_name, self.expr(value))
            elif isinstance(value, list) and value and isinstance(value[0], ast.expr):
                setattr(stmt, field_name, [self.expr(v) for v in value])
        return [stmt]

    def assert_stmt(self, stmt: ast.Assert) -> ast.stmt:
        """``assert test, msg`` into ``__sl__.assert_stmt(k, test, lambda: msg)``: checked at run
        time when ``test`` is traced (Python's assert otherwise)."""
        k = self.site("assert", stmt, True)
        args = [ast.Constant(k), self.expr(stmt.test)]
        if stmt.msg is not None:
            args.append(_lambda(self.expr(stmt.msg)))
        return _located(ast.Expr(value=_call("assert_stmt", args, stmt)), stmt)

    # -- what stays Python ------------------------------------------------------------------
    def _reason(self, stmt: ast.stmt, blocks: list[list[ast.stmt]], state: list[str]) -> str:
        given = getattr(stmt, "_sl_reason", "")
        if given:
            return given
        for block in blocks:
            for top in block:
                for node in walk_scope(top):
                    if getattr(node, "_sl_reason", ""):  # a `try` the lowering left alone
                        return node._sl_reason  # type: ignore[attr-defined]
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
        shared = [p for p in params if p in self.shared]
        if shared:  # `nonlocal i; i = __sl_arg_i`: closures read the enclosing variable
            head.append(ast.copy_location(ast.Nonlocal(names=shared), like))
            head += [_assign_name(p, _name(f"{PREFIX}arg_{p}"), like) for p in shared]
            params = [f"{PREFIX}arg_{p}" if p in self.shared else p for p in params]
        tail = [ast.copy_location(ast.Return(value=returns), like)] if returns is not None else []
        args = ast.arguments(
            posonlyargs=[],
            args=[ast.arg(arg=p) for p in params],
            kwonlyargs=[],
            kw_defaults=[],
            defaults=[],
        )
        fn = function_def(name, args, [*head, *body, *tail] or [ast.Pass()])
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
        bound = dict.fromkeys([*stores(body + orelse), *item_stores(body + orelse)])
        names = [n for n in bound if n not in self.declared]
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
        # The loop carries what it binds and reads again: in a later iteration or after it
        # (a name the body binds before each read is the body's own, as for AutoGraph).
        head = getattr(stmt, "_sl_live_head", None)
        changed = [*targets, *stores(body), *item_stores(body)]
        names = [
            n
            for n in dict.fromkeys(changed)
            if n not in self.declared and (head is None or n in head or n in live)
        ]
        reason = self._reason(stmt, [body, stmt.orelse], [*changed])
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
                    ast.Constant(self.print_order and _prints(body)),
                ],
                stmt,
            )
        out.append(self._bind(names, _located_keep(call), stmt))
        return out


def _assign_name(name: str, value: ast.expr, like: ast.AST) -> ast.stmt:
    target = _name(name, ast.Store())
    return _located(ast.Assign(targets=[target], value=value), like)


def item_stores(body: list[ast.stmt]) -> list[str]:
    """Names whose items or attributes-of-items the statements assign (``d["b"] = 1``,
    ``y[0] += 1``, ``x["a"]["b"] = v``): AutoGraph counts the container as changed, so a
    staged branch or loop passes it through (its staged copy is a fresh pytree)."""
    found: list[str] = []
    for stmt in body:
        for node in walk_scope(stmt):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            else:
                continue
            for target in targets:
                for part in ast.walk(target):
                    if not (isinstance(part, ast.Subscript) and isinstance(part.ctx, ast.Store)):
                        continue
                    base = part.value
                    while isinstance(base, ast.Subscript):
                        base = base.value
                    if isinstance(base, ast.Name) and base.id not in found:
                        found.append(base.id)
    return found


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


def _prints(body: list[ast.stmt]) -> bool:
    """``print(...)`` or ``jax.debug.print(...)`` in ``body``."""
    for stmt in body:
        for node in walk_scope(stmt):
            if isinstance(node, ast.Call):
                func = node.func
                if (isinstance(func, ast.Name) and func.id == "print") or (
                    isinstance(func, ast.Attribute) and func.attr == "print"
                ):
                    return True
    return False


def convert_block(
    body: list[ast.stmt],
    *,
    function: bool,
    live_out: set[str],
    declared: dict[str, str] | None = None,
) -> PassResult:
    """Both steps on a function body (``function=True``) or a cell body (whose loops that
    print stay unrolled over traced arrays, keeping the cell's print order)."""
    body = copy.deepcopy(body)
    read_later, introspects = captured(body)
    lowered = lower_function(body) if function else lower_cell(body)
    always = set(read_later)
    if introspects:  # locals(), eval(...): any name may be read
        always |= {n for stmt in lowered for n in stores([stmt])}
    annotate_liveness(lowered, live_out, always)
    functional = _Functional(
        declared=declared or {},
        print_order=not function,
        shared=read_later if function else set(),
    )
    converted = functional.block(lowered)
    module = ast.Module(body=converted, type_ignores=[])
    ast.fix_missing_locations(module)
    return PassResult(converted, functional.sites)
