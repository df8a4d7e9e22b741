"""Converted expressions at run time: ``and``/``or``/``not``, chained comparisons and
``assert``, as AutoGraph's operators do them.

Each keeps Python's meaning on concrete values (short-circuit, operand values, the first
false comparison, ``AssertionError`` now) and stages on traced ones:

- ``a or b`` / ``a and b`` on a traced ``a``: ``jnp.logical_or``/``logical_and`` for booleans,
  otherwise the operand Python would return, chosen elementwise (``jnp.where(a, a, b)``);
- ``a < b < c``: ``(a < b) and (b < c)`` with ``b`` evaluated once;
- ``assert test, message`` on a traced ``test``: a check at run time
  (``jax.debug.callback``); when it fails the call raises ``AssertionError(message)``.
"""

from __future__ import annotations

import functools
import logging
import operator
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

__all__ = ["ExprOps", "TracedAssertionError", "raising_failed_asserts"]


def _is_traced(value: object) -> bool:
    return isinstance(value, Tracer)


_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "is": operator.is_,
    "is not": operator.is_not,
    "in": lambda a, b: a in b,
    "not in": lambda a, b: a not in b,
}


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_)) or (
        hasattr(value, "dtype") and jnp.dtype(value.dtype) == jnp.bool_
    )


def _select(chosen_if_true: Any, chosen_if_false: Any, test: Any) -> Any:
    truth = test if _is_bool(test) else jnp.asarray(test) != 0
    return jnp.where(truth, chosen_if_true, chosen_if_false)


class TracedAssertionError(AssertionError):
    """An ``assert`` on a traced value that failed when the program ran."""


# Failed run-time asserts of this thread, newest last, with where they are: the callback
# raises inside the runtime, which reports a JaxRuntimeError; the caller (to_static, a graph
# cell) turns it back into the user's AssertionError, raised at the assert's line.
_FAILED = threading.local()


@dataclass(frozen=True)
class _Failure:
    text: str
    filename: str | None
    lineno: int | None


def _failed() -> list[_Failure]:
    if not hasattr(_FAILED, "messages"):
        _FAILED.messages = []
    return _FAILED.messages


class _QuietAssertions(logging.Filter):
    """jax logs every exception a debug callback raises, with a traceback through its
    runtime; a failed ``assert`` is reported once, as the user's AssertionError."""

    def filter(self, record: logging.LogRecord) -> bool:
        info = record.exc_info
        return not (info and isinstance(info[1], TracedAssertionError))


logging.getLogger("jax._src.debugging").addFilter(_QuietAssertions())


class raising_failed_asserts:  # a context manager used like a function: its name says how
    """Around a call of a compiled program: a run-time ``assert`` that failed inside it
    raises ``AssertionError`` with the user's message (not the runtime's wrapper), from
    the assert's own line, so a traceback shows the line as for Python's ``assert``."""

    def __enter__(self) -> None:
        self.before = len(_failed())

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> bool:
        __tracebackhide__ = True
        if not isinstance(error, jax.errors.JaxRuntimeError):
            return False
        failures = _failed()[self.before :]
        del _failed()[self.before :]
        if not failures or "AssertionError" not in str(error):
            return False
        first = failures[0]
        failed = AssertionError(first.text) if first.text else AssertionError()
        if first.filename is None or not first.lineno:
            raise failed from None
        # A frame at the user's line: compiled under their filename, padded to the line.
        code = compile("\n" * (first.lineno - 1) + "raise failed from None", first.filename, "exec")
        exec(code, {"failed": failed})
        return False  # not reached


class ExprOps:
    """``__sl__``'s expression operators (the statements are in ``CondOps`` and
    ``Runtime``)."""

    staged: Any  # a Counter, from CondOps
    python: Any
    sites: dict[int, Any]  # CondOps': the converted statements by index
    filename: str
    _predicate: Callable[[int, Any], Any]  # CondOps': one truth value, or an error

    @staticmethod
    def and_(first: Any, *rest: Callable[[], Any]) -> Any:
        value = first
        for thunk in rest:
            if _is_traced(value):
                other = thunk()
                if _is_bool(value) and _is_bool(other):
                    value = jnp.logical_and(value, other)
                else:
                    value = _select(other, value, value)
            elif not value:
                return value
            else:
                value = thunk()
        return value

    @staticmethod
    def or_(first: Any, *rest: Callable[[], Any]) -> Any:
        value = first
        for thunk in rest:
            if _is_traced(value):
                other = thunk()
                if _is_bool(value) and _is_bool(other):
                    value = jnp.logical_or(value, other)
                else:
                    value = _select(value, other, value)
            elif value:
                return value
            else:
                value = thunk()
        return value

    @staticmethod
    def not_(value: Any) -> Any:
        return jnp.logical_not(value) if _is_traced(value) else not value

    @staticmethod
    def compare(left: Any, *parts: Any) -> Any:
        """``left op1 b op2 c ...``: ``parts`` alternates an operator's text and a thunk of
        its right operand (evaluated once, and only when Python would)."""
        result: Any = None
        for op, thunk in zip(parts[::2], parts[1::2], strict=True):
            right = thunk()
            step = _COMPARE[op](left, right)
            if result is None or not (_is_traced(result) or _is_traced(step)):
                result = step
            else:
                result = jnp.logical_and(result, step)
            if not _is_traced(result) and not result:
                return result
            left = right
        return result

    def assert_stmt(self, k: int, test: Any, message: Callable[[], Any] | None = None) -> None:
        """``assert test, message``: Python's on a concrete test, a run-time check on a
        traced one (the message is made while tracing, from values known then)."""
        __tracebackhide__ = True
        if not _is_traced(test):
            self.python["assert"] += 1
            if not test:
                raise AssertionError(message()) if message is not None else AssertionError
            return
        predicate = self._predicate(k, test)
        text = "" if message is None else str(message())
        site = self.sites.get(k)
        failure = _Failure(text, self.filename, site.lineno if site is not None else None)
        jax.debug.callback(functools.partial(_check, failure=failure), predicate)
        self.staged["assert"] += 1


def _check(ok: Any, *, failure: _Failure) -> None:
    if not bool(np.asarray(ok)):
        _failed().append(failure)
        raise TracedAssertionError(failure.text)
