"""Errors a person can act on, for cells that cannot be staged as one program.

JAX's tracer errors are precise but speak of tracers and abstract values. When a graph cell
fails while tracing, we find the line of the cell at fault (and the innermost line of user
code, when that is in a function the cell called), say in one sentence why staging cannot
work there, and name the fix.
"""

from __future__ import annotations

import ast
import traceback
from typing import TYPE_CHECKING

import jax

if TYPE_CHECKING:
    from shardlab.engine.cells.source import CellSource


class GraphStagingError(Exception):
    """A graph cell could not be staged into one compiled program.

    Attributes:
        lineno: the line of the cell at fault (as the user sees the cell), or None.
        line: the source text of that line.
        reason: one sentence saying why it cannot be staged.
        fix: what to do instead.
        where: the innermost user frame (``file:line``) when it is outside the cell.
    """

    def __init__(
        self,
        *,
        lineno: int | None,
        line: str,
        reason: str,
        fix: str,
        where: str | None = None,
    ) -> None:
        self.lineno = lineno
        self.line = line
        self.reason = reason
        self.fix = fix
        self.where = where
        super().__init__(self._message())

    def _render_traceback_(self) -> list[str]:
        """What IPython shows instead of a traceback through kernel internals."""
        return [f"\x1b[31m{type(self).__name__}\x1b[0m: {self}"]

    def _message(self) -> str:
        at = f"cell line {self.lineno}" if self.lineno is not None else "this cell"
        text = f"{at}: `{self.line}`" if self.line else at
        if self.where:
            text += f" (in {self.where})"
        return f"{text}\n  why: {self.reason}\n  fix: {self.fix}"


_FIXES = {
    "branch": (
        "branches on a traced value: Python `if`, `while`, `and`/`or` and `bool()` need a "
        "concrete True/False, which an array inside a staged program does not have yet.",
        "in a function the cell calls, decorate it with `@shardlab.to_static` (its "
        "`if`/`while`/`for` then convert to lax control flow, as a graph cell's own do); or "
        "use `jnp.where(cond, a, b)` or `jax.lax.cond`/`jax.lax.while_loop`, or run the "
        "cell with %%jit or %%eager.",
    ),
    "scalar": (
        "converts a traced value to a Python number (`float()`, `int()`, `.item()`, "
        "indexing a list with an array); inside a staged program the value does not exist "
        "until the program runs.",
        "keep it an array (use jnp operations), hoist the conversion into a later cell, or "
        "run the cell with %%jit or %%eager.",
    ),
    "numpy": (
        "converts a traced value to a NumPy array (`np.asarray`, a NumPy function, or "
        "`np.array(x)`); NumPy runs in Python, outside the staged program.",
        "use `jax.numpy` instead of `numpy` for this expression, hoist it into a later cell, "
        "or run the cell with %%jit or %%eager.",
    ),
    "shape": (
        "makes an array whose shape depends on the values in it (`jnp.nonzero`, `jnp.unique`, "
        "`jnp.argwhere` without `size=`); a staged program's shapes are fixed before it runs.",
        "pass `size=` (and `fill_value=`) so that the shape is known: "
        "`jnp.nonzero(mask, size=n)`; or run the cell with %%eager.",
    ),
    "leak": (
        "a traced value escaped the staged program (stored in a global, a closure or an "
        "object that outlives the cell).",
        "bind results to names in the cell instead of storing them elsewhere, or run the cell "
        "with %%jit or %%eager.",
    ),
}


def _kind(error: BaseException) -> str:
    if isinstance(error, jax.errors.NonConcreteBooleanIndexError):
        return "mask"
    if isinstance(error, jax.errors.ConcretizationTypeError) and "size argument" in str(error):
        return "shape"
    if isinstance(error, jax.errors.TracerBoolConversionError):
        return "branch"
    if isinstance(error, jax.errors.TracerArrayConversionError):
        return "numpy"
    if isinstance(error, jax.errors.UnexpectedTracerError):
        return "leak"
    if isinstance(error, jax.errors.ConcretizationTypeError) and "bool" in str(error).lower():
        return "branch"
    return "scalar"


def translate_trace_error(error: BaseException, cell: CellSource) -> GraphStagingError:
    """Turns a JAX tracer error raised while staging ``cell`` into a GraphStagingError."""
    frames = traceback.extract_tb(error.__traceback__)
    in_cell = [f for f in frames if f.filename == cell.filename]
    lineno = in_cell[-1].lineno if in_cell else None
    line = (in_cell[-1].line or "").strip() if in_cell else ""
    where = None
    frames_after_user: list[traceback.FrameSummary] = []
    if in_cell:
        after = frames[frames.index(in_cell[-1]) + 1 :]
        user = frames_after_user = [
            f
            for f in after
            if "/jax/" not in f.filename
            and "/jaxlib/" not in f.filename
            and "/shardlab/" not in f.filename
            and "/numpy/" not in f.filename
        ]
        if user:
            where = f"{user[-1].filename}:{user[-1].lineno} `{(user[-1].line or '').strip()}`"
    kind = _kind(error)
    if kind == "mask":  # the line with the indexing: the cell's, or the called function's
        text = (frames_after_user[-1].line or "").strip() if frames_after_user else line
        reason, fix = _mask_fix(text)
    else:
        reason, fix = _FIXES[kind]
    left = [s for s in cell.sites if not s.converted and s.lineno == lineno]
    if left:  # a statement the conversion left as Python, and why
        reason = f"{reason} This `{left[0].kind}` was not converted: {left[0].reason}."
    staging = GraphStagingError(lineno=lineno, line=line, reason=reason, fix=fix, where=where)
    staging.__cause__ = None
    return staging


def _mask_fix(line: str) -> tuple[str, str]:
    """Why ``x[x < 0]`` cannot be staged, and the fix written with the line's own mask."""
    mask, value = "mask", "x"
    tree = None
    for text in (line, line + "\n    pass"):  # a statement, or a block's first line
        try:
            tree = ast.parse(text)
            break
        except SyntaxError:
            continue
    subscripts = [] if tree is None else [n for n in ast.walk(tree) if isinstance(n, ast.Subscript)]
    masked = [
        n for n in subscripts if not isinstance(n.slice, (ast.Constant, ast.Slice, ast.Tuple))
    ]
    if masked:
        chosen = next(
            (n for n in masked if isinstance(n.slice, (ast.Compare, ast.BoolOp, ast.UnaryOp))),
            masked[0],
        )
        mask, value = ast.unparse(chosen.slice), ast.unparse(chosen.value)
    reason = (
        f"indexes with a boolean mask (`{value}[{mask}]`): the result has as many elements "
        "as the mask has True values, a shape that depends on the values, and a staged "
        "program's shapes are fixed before it runs."
    )
    fix = (
        f"keep the shape and zero the other elements: `jnp.where({mask}, {value}, 0)` (a sum "
        f"or mean of the selected elements: `jnp.sum({value}, where={mask})`); or give the "
        f"number of elements: `{value}[jnp.nonzero({mask}, size=n)]`; or run the cell with "
        "%%eager."
    )
    return reason, fix


class CellSyntaxError(Exception):
    """A syntax error in a graph cell, at the user's line, shown as Python shows one: the
    line and a caret, without frames of the machinery that staged the cell. (IPython shows
    every frame of a real ``SyntaxError`` raised while a cell runs; this one it renders with
    ``_render_traceback_``.) ``error`` is the ``SyntaxError`` itself, at the user's line."""

    def __init__(self, error: SyntaxError) -> None:
        super().__init__(error.msg)
        self.error = error

    def _render_traceback_(self) -> list[str]:
        return [line.rstrip("\n") for line in traceback.format_exception_only(self.error)]

    @classmethod
    def at(cls, error: SyntaxError, *, filename: str, line_offset: int) -> CellSyntaxError:
        """``error`` moved ``line_offset`` lines down (the lines above the cell body)."""
        lineno = None if error.lineno is None else error.lineno + line_offset
        end = getattr(error, "end_lineno", None)
        details = (
            filename,
            lineno,
            error.offset,
            error.text,
            None if end is None else end + line_offset,
            getattr(error, "end_offset", None),
        )
        return cls(SyntaxError(error.msg, details))


CellSyntaxError.__name__ = "SyntaxError"  # the name the user reads (ename), as for any cell
