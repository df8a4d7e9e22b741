"""Which names may be read later: the liveness the control-flow pass decides state with.

A converted ``if`` or loop passes through the names it binds that are *live* after it (read
before being bound again on some path), as AutoGraph's pass does: a name bound on one path
only is an error only when it is live, and a name only a loop's body uses (bound before it
is read, in every iteration) is not carried. The analysis runs on the lowered code (flags
and guards from ``lower.py``), backwards, with a fixed point for loops.

Reads by nested functions and lambdas happen when they are called, which the analysis
cannot see: the names they read are live everywhere (``captured``), and a function that
calls ``locals()``, ``vars()``, ``eval`` or ``exec`` keeps every name live.
"""

from __future__ import annotations

import ast
from typing import Any

from shardlab.engine.convert.lower import _SCOPES, walk_scope

__all__ = ["annotate_liveness", "captured", "loads"]

_INTROSPECTION = frozenset({"locals", "vars", "eval", "exec"})


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


def captured(body: list[ast.stmt]) -> tuple[set[str], bool]:
    """(names nested functions and lambdas in ``body`` read, whether ``body`` introspects
    its scope) — both keep names live whatever the statements after say."""
    names: set[str] = set()
    introspects = False
    for stmt in body:
        for node in walk_scope(stmt):
            if (isinstance(node, _SCOPES) and node is not stmt) or isinstance(stmt, _SCOPES):
                names |= loads(node)
            elif isinstance(node, ast.Name) and node.id in _INTROSPECTION:
                introspects = True
    return names, introspects


def _bound(target: ast.AST) -> set[str]:
    """Names an assignment target binds for sure (not ``a[i]`` or ``a.b``, which read)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_bound(t) for t in target.elts)) if target.elts else set()
    if isinstance(target, ast.Starred):
        return _bound(target.value)
    return set()


def _kills(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, ast.Assign):
        return set().union(*(_bound(t) for t in stmt.targets))
    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        return _bound(stmt.target)
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names if a.name != "*"}
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    return set()


def annotate_liveness(
    block: list[ast.stmt],
    live_out: set[str],
    always: set[str] = frozenset(),  # type: ignore[assignment]
) -> set[str]:
    """Sets ``_sl_live`` on every statement of ``block`` (nested blocks included): the names
    that may be read after it; on loops also ``_sl_live_head``, the names live at the start
    of an iteration (what the loop carries). Returns the names live before ``block``."""
    live = set(live_out) | always
    for stmt in reversed(block):
        live = _statement(stmt, live, always)
    return live


def _statement(stmt: ast.stmt, out: set[str], always: set[str]) -> set[str]:
    stmt._sl_live = set(out)  # type: ignore[attr-defined]
    if isinstance(stmt, ast.If):
        return (
            loads(stmt.test)
            | annotate_liveness(stmt.body, out, always)
            | annotate_liveness(stmt.orelse, out, always)
        )
    if isinstance(stmt, ast.While):
        after_else = annotate_liveness(stmt.orelse, out, always)
        entry = loads(stmt.test) | out | after_else
        return _loop(stmt, entry, set(), always)
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        after_else = annotate_liveness(stmt.orelse, out, always)
        head = _loop(stmt, out | after_else, _bound(stmt.target), always)
        return loads(stmt.iter) | head
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        inside = annotate_liveness(stmt.body, out, always)
        bound: set[str] = set()
        for item in stmt.items:
            if item.optional_vars is not None:
                bound |= _bound(item.optional_vars)
        return (inside - bound) | set().union(*(loads(i.context_expr) for i in stmt.items))
    if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
        # An exception may leave the body anywhere: everything the statement reads is live
        # throughout, and nothing it binds is known to be bound after it.
        attempt: Any = stmt
        inside = out | loads(stmt)
        for part in (attempt.body, attempt.orelse, attempt.finalbody):
            annotate_liveness(part, inside, always)
        for handler in attempt.handlers:
            annotate_liveness(handler.body, inside, always)
        return inside
    return (out - _kills(stmt)) | loads(stmt) | always


def _loop(
    stmt: ast.For | ast.AsyncFor | ast.While, entry: set[str], targets: set[str], always: set[str]
) -> set[str]:
    """Live at a loop's head: what the test (or the next item) and after the loop read, and
    what the body reads before binding, to a fixed point over iterations."""
    stops = set(getattr(stmt, "_sl_stops", []))
    head = entry | stops
    while True:
        body_in = annotate_liveness(stmt.body, head, always)
        new = entry | stops | (body_in - targets)
        if new == head:
            break
        head = new
    stmt._sl_live_head = head  # type: ignore[attr-defined]
    return head
