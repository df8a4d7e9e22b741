"""The value of a name converted control flow has not bound yet, and the error reading it.

Converted code passes every name a statement may bind through the run-time operators, bound
or not: a name bound only inside a loop, or on one path of an ``if``, enters as
:class:`Undefined`. Python would raise ``UnboundLocalError`` where the program reads such a
name; :class:`Undefined` raises :class:`UnboundRead`, the same kind of error, naming the
variable and what to do, instead of leaking itself into an operator's ``TypeError``.
"""

from __future__ import annotations

from typing import Any, NoReturn

from shardlab.engine.convert.lower import PREFIX, RETURN_VALUE

__all__ = ["UNDEFINED_RETURN", "UnboundRead", "Undefined", "unbound_name"]


class UnboundRead(UnboundLocalError):
    """A name read where converted control flow left it without a value.

    Attributes:
        name: the variable.
    """

    def __init__(self, name: str) -> None:
        super().__init__(
            f"`{name}` is read here but has no value: it is bound only on some paths "
            "(inside a loop, or one branch of an `if`) before this line, as Python's "
            f"UnboundLocalError would say. Bind `{name}` before that statement "
            f"(`{name} = ...` with its initial value), or on every path."
        )
        self.name = name  # after NameError's own __init__, which sets it to None

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name,))


class _UnboundAttribute(AttributeError):
    """``x.attr`` on an unbound ``x`` (an AttributeError, so ``hasattr`` stays False)."""

    def __init__(self, name: str) -> None:
        self.unbound = name
        super().__init__(str(UnboundRead(name)))


def unbound_name(error: BaseException) -> str | None:
    """The variable an error says was read unbound (``UnboundRead`` or attribute access)."""
    if isinstance(error, UnboundRead):
        return error.name
    return getattr(error, "unbound", None)


class Undefined:
    """The value of a name that has none yet (bound only on some paths)."""

    __slots__ = ("name",)
    __array_priority__ = 1_000_000  # NumPy defers to the reflected operator, which raises

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}: unbound>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Undefined) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __getattr__(self, attr: str) -> NoReturn:
        if attr.startswith("__"):  # protocol probes (copy, pickle, __jax_array__): absent
            raise AttributeError(attr)
        raise _UnboundAttribute(self.name)

    def _read(self, *_: Any, **__: Any) -> NoReturn:
        raise UnboundRead(self.name)

    # Every way an expression reads a value: operators, truth, indexing, calls, conversion.
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _read
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _read
    __pow__ = __rpow__ = __matmul__ = __rmatmul__ = __divmod__ = __rdivmod__ = _read
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = _read
    __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = _read
    __lt__ = __le__ = __gt__ = __ge__ = _read
    __neg__ = __pos__ = __abs__ = __invert__ = __bool__ = _read
    __getitem__ = __setitem__ = __iter__ = __len__ = __contains__ = __call__ = _read
    __float__ = __int__ = __index__ = __complex__ = __array__ = _read


UNDEFINED_RETURN = Undefined(RETURN_VALUE)


def is_internal(name: str) -> bool:
    """A name the pass made (flags, the return value, generated functions)."""
    return name.startswith(PREFIX)
