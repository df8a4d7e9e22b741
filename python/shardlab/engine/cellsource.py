"""Static analysis of a graph cell's source: what it reads, binds, mutates and prints.

Graph mode stages a whole cell as one function. To do that we need to know, before tracing,
which names the cell reads (candidate inputs), which names it binds (outputs written back),
and which statements cannot be staged faithfully (defining functions that would capture
tracers, mutating a Python container that lives outside the cell). The checks here are
syntactic; whether a read name holds arrays is decided at run time from the namespace.
"""

from __future__ import annotations

import ast
import types
from dataclasses import dataclass, field

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
            if isinstance(func.value, ast.Name):
                self.mutations.append(
                    Mutation(func.value.id, node.lineno, f"method .{func.attr}()")
                )

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
        if isinstance(node.func, ast.Name) and node.func.id == "print":
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


_UNCONDITIONAL_BINDERS = (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Import, ast.ImportFrom)


def _free_reads(body: list[ast.stmt]) -> list[str]:
    """Names read before the cell surely binds them: the candidate inputs.

    A name bound by an unconditional top-level statement (``y = ...``, an import) before its
    first read is the cell's own, not an input. Binds inside ``if``/``for``/``with`` are not
    sure, so a later read of such a name still counts as a read.
    """
    reads: list[str] = []
    bound: set[str] = set()
    for statement in body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                name = node.id
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                name = node.target.id
            else:
                continue
            if name not in bound and name not in reads:
                reads.append(name)
        if isinstance(statement, _UNCONDITIONAL_BINDERS):
            binder = _Binder()
            binder.visit(statement)
            bound.update(binder.binds)
    return reads


def analyse_cell(source: str, *, filename: str, line_offset: int = 0) -> CellSource:
    """Parses and compiles a graph cell.

    Args:
        source: the cell body (without a ``%%graph`` line).
        filename: the name tracebacks show for this cell; it should be in ``linecache``.
        line_offset: lines above ``source`` in the cell as the user sees it (1 when a
            ``%%graph`` line was removed), so reported line numbers match the cell.

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
    code = compile(tree, filename, "exec")
    binds = tuple(binder.binds)
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
    )


@dataclass(frozen=True)
class Segment:
    """A run of a graph cell's top-level statements: staged, or run as Python around it.

    ``source`` keeps the cell's line numbers (it is padded with blank lines), so errors
    and tracebacks in either kind point at the user's line.
    """

    staged: bool
    source: str
    first_line: int  # 1-based, in the cell body


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
    kinds: list[tuple[bool, int, int]] = []  # (staged, first line, last line)
    for statement in tree.body:
        calls = [n for n in ast.walk(statement) if _is_shell_call(n)]
        if not calls:
            staged = True
        elif isinstance(statement, (ast.Expr, ast.Assign, ast.AnnAssign)):
            staged = False
        else:
            raise ShellLineInBlock(getattr(calls[0], "lineno", statement.lineno))
        end = statement.end_lineno or statement.lineno
        if kinds and kinds[-1][0] == staged:
            kinds[-1] = (staged, kinds[-1][1], end)
        else:
            kinds.append((staged, statement.lineno, end))
    if all(staged for staged, _, _ in kinds):
        return [Segment(True, source, 1)]
    segments = []
    for staged, first, last in kinds:
        text = "\n" * (first - 1) + "".join(lines[first - 1 : last])
        segments.append(Segment(staged, text, first))
    return segments
