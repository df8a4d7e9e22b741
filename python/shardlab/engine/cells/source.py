"""Static analysis of a graph cell's source: what it reads, binds, mutates and prints.

Graph mode stages a whole cell as one function. To do that we need to know, before tracing,
which names the cell reads (candidate inputs), which names it binds (outputs written back),
and which statements cannot be staged faithfully (defining functions that would capture
tracers, mutating a Python container that lives outside the cell). The checks here are
syntactic; whether a read name holds arrays is decided at run time from the namespace.
"""

from __future__ import annotations

import ast
import textwrap
import types
from dataclasses import dataclass, field
from typing import Any

from shardlab.engine.convert.rewrite import Site, convert_block
from shardlab.engine.convert.rewrite import walk_scope as walk_scope

RESULT_NAME = "__shardlab_result__"
FORMAT_NAME = "__shardlab_format__"

_MUTATING_METHODS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "pop",
        "remove",
        "clear",
        "update",
        "setdefault",
        "popitem",
        "add",
        "discard",
        "sort",
        "reverse",
        "appendleft",
        "extendleft",
    }
)


@dataclass(frozen=True)
class Mutation:
    """A statement that mutates an object the cell did not create."""

    name: str
    lineno: int
    how: str  # "method .append()", "item assignment", "attribute assignment"
    # For a method call: the object it is called on, as written (``metrics["loss"]``), and
    # its first argument (``loss``), for the fix the error gives.
    target: str = ""
    argument: str | None = None


@dataclass(frozen=True)
class Definition:
    """A function, class or lambda bound by the cell."""

    name: str
    lineno: int
    kind: str


@dataclass(frozen=True)
class CellSource:
    """The analysed, compiled form of a graph cell."""

    source: str
    filename: str
    code: types.CodeType
    reads: tuple[str, ...]
    binds: tuple[str, ...]
    deletes: tuple[str, ...]
    has_result: bool
    mutations: tuple[Mutation, ...]
    definitions: tuple[Definition, ...]
    bind_lines: dict[str, int] = field(default_factory=dict)  # name -> first binding line
    line_offset: int = 0
    # Control flow converted for staging (convert_pass): its sites (each converted
    # statement and each one left as Python, with the reason) and the converted source.
    sites: tuple[Site, ...] = ()
    converted_source: str | None = None

    def line(self, lineno: int, *, offset: int = 0) -> str:
        """The text of a (1-based, cell-relative after ``offset``) source line."""
        lines = self.source.splitlines()
        index = lineno - 1 - offset
        return lines[index].strip() if 0 <= index < len(lines) else ""


def _target_names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in _target_names(elt)]
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    return []


def _base_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


class _Binder(ast.NodeVisitor):
    """Collects names bound at the cell's top level (not inside nested scopes)."""

    def __init__(self) -> None:
        self.binds: list[str] = []
        self.bind_lines: dict[str, int] = {}
        self.lineno = 0
        self.deletes: list[str] = []
        self.definitions: list[Definition] = []
        self.mutations: list[Mutation] = []

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.stmt):
            self.lineno = node.lineno
        super().visit(node)

    def _bind(self, names: list[str]) -> None:
        for name in names:
            if name not in self.binds:
                self.binds.append(name)
                self.bind_lines[name] = self.lineno

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._bind(_target_names(target))
            self._check_store(target, node.lineno)
        if isinstance(node.value, ast.Lambda):
            for target in node.targets:
                for name in _target_names(target):
                    self.definitions.append(Definition(name, node.lineno, "lambda"))
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._bind(_target_names(node.target))
        self._check_store(node.target, node.lineno)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._bind(_target_names(node.target))
        self._check_store(node.target, node.lineno)
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self._bind(_target_names(node.target))
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        self._bind(_target_names(node.target))
        self.generic_visit(node)

    def visit_With(self, node: ast.With) -> None:
        for item in node.items:
            if item.optional_vars is not None:
                self._bind(_target_names(item.optional_vars))
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self._bind([(a.asname or a.name).split(".")[0] for a in node.names])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self._bind([a.asname or a.name for a in node.names if a.name != "*"])

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            if isinstance(target, ast.Name):
                self.deletes.append(target.id)
            else:
                self._check_store(target, node.lineno)

    def _define(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self._bind([node.name])
        kind = "class" if isinstance(node, ast.ClassDef) else "function"
        self.definitions.append(Definition(node.name, node.lineno, kind))
        # Nested scopes bind nothing at top level; do not descend.

    visit_FunctionDef = _define
    visit_AsyncFunctionDef = _define
    visit_ClassDef = _define

    def visit_Lambda(self, node: ast.Lambda) -> None:
        return  # a nested scope

    def _comprehension(self, node: ast.AST) -> None:
        # Comprehension targets are local to the comprehension; only check calls inside.
        for child in ast.walk(node):
            if isinstance(child, ast.Call):
                self._check_call(child)

    visit_ListComp = _comprehension
    visit_SetComp = _comprehension
    visit_DictComp = _comprehension
    visit_GeneratorExp = _comprehension

    def visit_Call(self, node: ast.Call) -> None:
        self._check_call(node)
        self.generic_visit(node)

    def _check_call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _MUTATING_METHODS:
            # ``log.append(v)``, and ``metrics["loss"].append(v)``: a container inside one
            name = _base_name(func.value)
            if name is not None:
                argument = ast.unparse(node.args[0]) if node.args else None
                target = ast.unparse(func.value)
                how = f"method .{func.attr}()"
                self.mutations.append(Mutation(name, node.lineno, how, target, argument))

    def _check_store(self, target: ast.expr, lineno: int) -> None:
        if isinstance(target, ast.Subscript):
            name = _base_name(target)
            if name is not None:
                self.mutations.append(Mutation(name, lineno, "item assignment"))
        elif isinstance(target, ast.Attribute):
            name = _base_name(target)
            if name is not None:
                self.mutations.append(Mutation(name, lineno, "attribute assignment"))
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._check_store(elt, lineno)


class _PrintFormatter(ast.NodeTransformer):
    """Defers f-string formatting inside ``print(...)`` to run time.

    ``print(f"loss {loss:.3f}")`` in a staged cell would format a tracer at trace time. The
    f-string becomes ``__shardlab_format__("loss {0:.3f}", loss)``, a deferred string whose
    values are program outputs, formatted with concrete values after each run.
    """

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if (isinstance(func, ast.Name) and func.id == "print") or (
            isinstance(func, ast.Attribute)  # builtins.print, __builtins__.print
            and func.attr == "print"
            and isinstance(func.value, ast.Name)
            and func.value.id in ("builtins", "__builtins__")
        ):
            node.args = [self._defer(arg) for arg in node.args]
        return node

    @staticmethod
    def _defer(arg: ast.expr) -> ast.expr:
        if not isinstance(arg, ast.JoinedStr):
            return arg
        template: list[str] = []
        values: list[ast.expr] = []
        for part in arg.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                template.append(part.value.replace("{", "{{").replace("}", "}}"))
            elif isinstance(part, ast.FormattedValue):
                spec = ""
                format_spec = part.format_spec
                if isinstance(format_spec, ast.JoinedStr):
                    if not all(isinstance(v, ast.Constant) for v in format_spec.values):
                        return arg  # a nested, computed format spec: leave the f-string alone
                    spec = ":" + "".join(
                        str(v.value) for v in format_spec.values if isinstance(v, ast.Constant)
                    )
                conversion = "" if part.conversion == -1 else "!" + chr(part.conversion)
                template.append("{" + str(len(values)) + conversion + spec + "}")
                values.append(part.value)
            else:
                return arg
        call = ast.Call(
            func=ast.Name(id=FORMAT_NAME, ctx=ast.Load()),
            args=[ast.Constant("".join(template)), *values],
            keywords=[],
        )
        return ast.copy_location(call, arg)


class _Reads:
    """Names a cell reads before it surely binds them: the candidate inputs.

    The cell is walked in execution order. A name bound before its first read is the cell's
    own: by an earlier statement, earlier in the same loop iteration or ``with`` block, in
    both branches of an ``if``, or as a loop target inside its loop. Binds that may not
    happen (one branch, a loop body seen from after the loop, a ``try``) do not count, so a
    later read of such a name is still a read. Lambda arguments and comprehension targets
    are local to their scope and never inputs.
    """

    def __init__(self) -> None:
        self.names: list[str] = []

    def read(self, name: str, bound: set[str]) -> None:
        if name not in bound and name not in self.names:
            self.names.append(name)

    def expr(self, node: ast.AST | None, bound: set[str]) -> None:
        if node is None:
            return
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                self.read(node.id, bound)
            return
        if isinstance(node, ast.Lambda):
            for default in (*node.args.defaults, *node.args.kw_defaults):
                self.expr(default, bound)
            self.expr(node.body, bound | _argument_names(node.args))
            return
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            inner = set(bound)
            for generator in node.generators:
                self.expr(generator.iter, inner)
                inner |= set(_target_names(generator.target))
                for condition in generator.ifs:
                    self.expr(condition, inner)
            parts = (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,)
            for part in parts:
                self.expr(part, inner)
            return
        if isinstance(node, ast.NamedExpr):
            self.expr(node.value, bound)
            bound.add(node.target.id)
            return
        for child in ast.iter_child_nodes(node):
            self.expr(child, bound)

    def store(self, target: ast.expr, bound: set[str]) -> None:
        """Reads in an assignment target (``a[i] = ...`` reads ``a`` and ``i``), then binds."""
        if isinstance(target, (ast.Attribute, ast.Subscript)):
            self.expr(target, bound)
        elif isinstance(target, (ast.Tuple, ast.List, ast.Starred)):
            for child in ast.iter_child_nodes(target):
                if isinstance(child, ast.expr):
                    self.store(child, bound)
        elif isinstance(target, ast.Name):
            bound.add(target.id)

    def block(self, body: list[ast.stmt], bound: set[str]) -> set[str]:
        """Walks ``body`` with ``bound`` (updated in place); returns it."""
        for statement in body:
            self.statement(statement, bound)
        return bound

    def statement(self, node: ast.stmt, bound: set[str]) -> None:
        if isinstance(node, ast.Assign):
            self.expr(node.value, bound)
            for target in node.targets:
                self.store(target, bound)
        elif isinstance(node, ast.AnnAssign):
            self.expr(node.value, bound)
            if node.value is not None:
                self.store(node.target, bound)
        elif isinstance(node, ast.AugAssign):
            self.expr(node.value, bound)
            if isinstance(node.target, ast.Name):
                self.read(node.target.id, bound)
                bound.add(node.target.id)
            else:
                self.expr(node.target, bound)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            self.expr(node.iter, bound)
            inner = set(bound)
            self.store(node.target, inner)
            self.block(node.body, inner)
            self.block(node.orelse, set(bound))
        elif isinstance(node, ast.While):
            self.expr(node.test, bound)
            self.block(node.body, set(bound))
            self.block(node.orelse, set(bound))
        elif isinstance(node, ast.If):
            self.expr(node.test, bound)
            both = self.block(node.body, set(bound)) & self.block(node.orelse, set(bound))
            bound |= both
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                self.expr(item.context_expr, bound)
                if item.optional_vars is not None:
                    self.store(item.optional_vars, bound)
            self.block(node.body, bound)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    bound.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for child in node.decorator_list:
                self.expr(child, bound)
            bound.add(node.name)
        elif isinstance(node, ast.Delete):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    bound.discard(target.id)
                else:
                    self.expr(target, bound)
        elif type(node).__name__ in ("Try", "TryStar"):
            attempt: Any = node
            self.block(attempt.body, set(bound))
            for handler in attempt.handlers:
                self.expr(handler.type, bound)
                self.block(handler.body, set(bound) | ({handler.name} - {None}))
            self.block(attempt.orelse, set(bound))
            self.block(attempt.finalbody, bound)
        else:  # expressions, return, raise, assert, match, ...: read everything inside
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    self.statement(child, set(bound))
                else:
                    self.expr(child, bound)


def _argument_names(args: ast.arguments) -> set[str]:
    every = (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
    return {a.arg for a in every if a is not None}


def _free_reads(body: list[ast.stmt]) -> list[str]:
    """Names read before the cell surely binds them: the candidate inputs (``_Reads``)."""
    reads = _Reads()
    reads.block(body, set())
    return reads.names


_CONVERTIBLE = (ast.If, ast.While, ast.For, ast.BoolOp, ast.IfExp, ast.Assert)


def _has_control_flow(body: list[ast.stmt]) -> bool:
    for node in body:
        for child in walk_scope(node):
            if (
                isinstance(child, _CONVERTIBLE)
                or (isinstance(child, ast.UnaryOp) and isinstance(child.op, ast.Not))
                or (isinstance(child, ast.Compare) and len(child.ops) > 1)  # a < b < c
            ):
                return True
    return False


def analyse_cell(
    source: str, *, filename: str, line_offset: int = 0, convert: bool = True
) -> CellSource:
    """Parses and compiles a graph cell.

    Args:
        source: the cell body (without a ``%%graph`` line).
        filename: the name tracebacks show for this cell; it should be in ``linecache``.
        line_offset: lines above ``source`` in the cell as the user sees it (1 when a
            ``%%graph`` line was removed), so reported line numbers match the cell.
        convert: rewrite the cell's ``if``/``while``/``for`` and ``and``/``or``/``not`` so
            that they stage on traced values (``convert_pass``).

    Raises:
        SyntaxError: the cell does not parse.
    """
    tree = ast.parse(source, filename=filename)
    binder = _Binder()
    for statement in tree.body:
        binder.visit(statement)
    reads = _free_reads(tree.body)
    has_result = bool(tree.body) and isinstance(tree.body[-1], ast.Expr)
    if has_result:
        last = tree.body[-1]
        assert isinstance(last, ast.Expr)
        assign = ast.Assign(targets=[ast.Name(id=RESULT_NAME, ctx=ast.Store())], value=last.value)
        tree.body[-1] = ast.copy_location(assign, last)
    tree = _PrintFormatter().visit(tree)
    ast.fix_missing_locations(tree)
    if line_offset:
        ast.increment_lineno(tree, line_offset)
    binds = tuple(binder.binds)
    sites: tuple[Site, ...] = ()
    converted_source = None
    if convert and _has_control_flow(tree.body):
        result = convert_block(tree.body, function=False, live_out={*binds, RESULT_NAME})
        tree.body = result.body
        sites = tuple(result.sites)
        converted_source = ast.unparse(tree)
    code = compile(tree, filename, "exec")
    return CellSource(
        source=source,
        filename=filename,
        code=code,
        reads=tuple(reads),
        binds=binds,
        deletes=tuple(binder.deletes),
        has_result=has_result,
        mutations=tuple(m for m in binder.mutations if m.name not in binds),
        definitions=tuple(binder.definitions),
        bind_lines=binder.bind_lines,
        line_offset=line_offset,
        sites=sites,
        converted_source=converted_source,
    )


def dropped_blank_lines(body: str, code: str) -> int:
    """How many blank lines at the top of a cell's ``body`` its Python ``code`` lost.

    IPython's ``transform_cell`` drops a cell's leading blank lines, so a cell body that
    starts with one has its line 2 as line 1 of the code, and every error would name the
    line above the right one. ``code`` (the whole code, or a segment padded to its line
    numbers, ``split_shell_lines``) is compared with ``body`` at its first non-blank line:
    the answer is the count of ``body``'s leading blank lines when that is where the line
    is found, 0 when the lines already agree or nothing proves otherwise.
    """
    lines = body.splitlines()
    blank = next((i for i, text in enumerate(lines) if text.strip()), len(lines))
    code_lines = code.splitlines()
    first = next((i for i, text in enumerate(code_lines) if text.strip()), None)
    if blank == 0 or first is None:
        return 0

    def line(index: int) -> str | None:
        return lines[index].strip() if index < len(lines) else None

    text = code_lines[first].strip()
    if line(first) != text and line(first + blank) == text:
        return blank
    return 0


@dataclass(frozen=True)
class Segment:
    """A run of a graph cell's top-level statements: staged, or run as Python around it.

    ``source`` keeps the cell's line numbers (it is padded with blank lines), so errors
    and tracebacks in either kind point at the user's line.
    """

    staged: bool
    source: str
    first_line: int  # 1-based, in the cell body
    # A ``with jax.set_mesh(mesh):`` block: entered in Python around its body's segments
    # (a mesh context cannot be entered inside a staged program).
    context: str | None = None  # the ``with`` statement's items, as source
    targets: tuple[str | None, ...] = ()  # the ``as`` name of each item
    body: tuple[Segment, ...] = ()


def _is_shell_call(node: ast.AST) -> bool:
    """``get_ipython().run_line_magic(...)`` and friends: what IPython makes of ``%magic``,
    ``!cmd``, ``x?`` and ``y = !cmd`` lines."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Call)
        and isinstance(node.func.value.func, ast.Name)
        and node.func.value.func.id == "get_ipython"
    )


class ShellLineInBlock(Exception):
    """A magic, shell escape or help line inside a block of a graph cell."""

    def __init__(self, lineno: int) -> None:
        super().__init__(lineno)
        self.lineno = lineno


def split_shell_lines(source: str) -> list[Segment]:
    """Splits a graph cell (as IPython transformed it) at its magic, shell and help lines.

    Top-level statements that call into IPython run as Python, in order, every run; the
    statements between them are staged. A cell without such lines is one staged segment.

    Raises:
        SyntaxError: the cell does not parse.
        ShellLineInBlock: such a line sits inside a loop, branch or definition, where the
            cell cannot be split around it.
    """
    tree = ast.parse(source)
    lines = source.splitlines(True)
    kinds: list[tuple[bool | Segment, int, int]] = []  # (staged, first line, last line)
    for statement in tree.body:
        calls = [n for n in ast.walk(statement) if _is_shell_call(n)]
        if _is_mesh_context(statement):
            assert isinstance(statement, ast.With)
            kinds.append((_context_segment(statement, lines), statement.lineno, 0))
            continue
        if not calls:
            staged = True
        elif isinstance(statement, (ast.Expr, ast.Assign, ast.AnnAssign)):
            staged = False
        else:
            raise ShellLineInBlock(getattr(calls[0], "lineno", statement.lineno))
        end = statement.end_lineno or statement.lineno
        if kinds and kinds[-1][0] is staged:
            kinds[-1] = (staged, kinds[-1][1], end)
        else:
            kinds.append((staged, statement.lineno, end))
    if all(staged is True for staged, _, _ in kinds):
        return [Segment(True, source, 1)]
    segments = []
    for staged, first, last in kinds:
        if isinstance(staged, Segment):
            segments.append(staged)
            continue
        text = "\n" * (first - 1) + "".join(lines[first - 1 : last])
        segments.append(Segment(staged, text, first))
    return segments


_MESH_CONTEXTS = frozenset({"set_mesh", "use_mesh", "use_abstract_mesh", "sharding_context"})


def _is_mesh_context(statement: ast.stmt) -> bool:
    """``with jax.set_mesh(mesh):`` (or ``use_mesh``): every item enters a mesh."""
    if not isinstance(statement, ast.With):
        return False
    for item in statement.items:
        call = item.context_expr
        if not isinstance(call, ast.Call):
            return False
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name not in _MESH_CONTEXTS:
            return False
    return True


def _context_segment(statement: ast.With, lines: list[str]) -> Segment:
    header = ", ".join(ast.unparse(item.context_expr) for item in statement.items)
    targets = tuple(
        item.optional_vars.id if isinstance(item.optional_vars, ast.Name) else None
        for item in statement.items
    )
    first = statement.body[0].lineno
    last = statement.end_lineno or first
    block = textwrap.dedent("".join(lines[first - 1 : last]))
    body = tuple(split_shell_lines("\n" * (first - 1) + block))
    return Segment(False, "", statement.lineno, context=header, targets=targets, body=body)
