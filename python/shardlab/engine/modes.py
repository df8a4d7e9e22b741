"""The three execution modes and how a cell's mode is chosen.

A cell's mode comes from, in order of precedence: a first line ``%%eager``, ``%%jit`` or
``%%graph``; the cell's metadata ``{"shardlab": {"mode": ...}}``; the session default.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import jax

Mode = Literal["eager", "jit", "graph"]
MODES: tuple[Mode, ...] = ("eager", "jit", "graph")
ModeSource = Literal["magic", "metadata", "default"]


class ModeError(ValueError):
    """An unknown mode name or malformed mode metadata."""

    def _render_traceback_(self) -> list[str]:
        """What IPython shows: the message, no traceback through kernel internals."""
        return [f"\x1b[31mModeError\x1b[0m: {self}"]


def parse_mode(value: object, *, origin: str = "mode") -> Mode:
    """Validates a mode name, with an error that names the value and the valid modes."""
    if isinstance(value, str) and value.strip().lower() in MODES:
        return value.strip().lower()  # type: ignore[return-value]
    hint = ""
    if isinstance(value, str):
        close = difflib.get_close_matches(value.strip().lower(), MODES, n=1)
        if close:
            hint = f" Did you mean {close[0]!r}?"
    raise ModeError(
        f"{origin}: unknown mode {value!r}; valid modes are 'eager', 'jit' and 'graph'.{hint}"
    )


def parse_mode_magic(cell: str) -> tuple[Mode | None, str]:
    """Splits a leading ``%%eager``/``%%jit``/``%%graph`` (or ``%%mode NAME``) line off a cell.

    Returns the mode (``None`` when the cell does not start with a mode magic) and the cell
    body without that line. Blank lines before the magic are allowed, as IPython allows them.

    Raises:
        ModeError: the cell starts with ``%%mode`` and an unknown (or no) mode name.
    """
    stripped = cell.lstrip("\n")
    first, _, rest = stripped.partition("\n")
    head = first.strip()
    if head.startswith("%%"):
        words = head[2:].split()
        name = words[0] if words else ""
        if name in MODES:
            return name, rest  # type: ignore[return-value]
        if name == "mode":
            value = words[1] if len(words) > 1 else ""
            return parse_mode(value, origin="%%mode"), rest
    return None, cell


def mode_from_metadata(cell_meta: Mapping[str, Any] | None) -> Mode | None:
    """Reads ``{"shardlab": {"mode": ...}}`` from a cell's metadata.

    Raises:
        ModeError: the ``shardlab`` entry is present but malformed; the message names the
            value found and the expected shape.
    """
    if not cell_meta or "shardlab" not in cell_meta:
        return None
    entry = cell_meta["shardlab"]
    if not isinstance(entry, Mapping):
        raise ModeError(
            f"cell metadata 'shardlab' is {entry!r}; expected an object such as "
            '{"shardlab": {"mode": "graph"}}'
        )
    if "mode" not in entry or entry["mode"] is None:
        return None
    return parse_mode(entry["mode"], origin="cell metadata shardlab.mode")


def resolve_mode(
    cell: str, cell_meta: Mapping[str, Any] | None, default: Mode
) -> tuple[Mode, ModeSource]:
    """The effective mode of a cell and where it came from (magic > metadata > default)."""
    magic, _ = parse_mode_magic(cell)
    if magic is not None:
        return magic, "magic"
    from_meta = mode_from_metadata(cell_meta)
    if from_meta is not None:
        return from_meta, "metadata"
    return default, "default"


@contextlib.contextmanager
def mode_context(mode: Mode) -> Iterator[None]:
    """The JAX context a mode runs under: ``eager`` disables jit, the others change nothing.

    ``graph`` cells are staged by :func:`shardlab.engine.cells.staging.run_graph_cell`; inside the
    staged program JAX runs as under ``jit``.
    """
    if mode == "eager":
        with jax.disable_jit():
            yield
    else:
        yield
