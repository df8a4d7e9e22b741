"""``%target``: plan for another machine — new meshes are laid over its abstract devices.

``%target h100 hosts=8`` (or ``tpu-v5p topology=4x4x8 slices=2``) makes
``shardlab.mesh(...)`` without ``devices=`` use that target, so every analysis, search and view
of the notebook is compiled by XLA:GPU or XLA:TPU; ``%target off`` goes back to the kernel's own
devices; ``%target`` says which is in effect. The status bar and panel show it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from shardlab.parallel.targets.catalog import KINDS, TargetError
from shardlab.parallel.targets.target import default_target, target, use_target

if TYPE_CHECKING:
    from shardlab.kernel.session import ShardlabSession

_INT_KEYS = ("hosts", "gpus_per_host", "slices")
_KEYS = (*_INT_KEYS, "topology")
USAGE = (
    "%target KIND [hosts=N] [gpus_per_host=N] [topology=AxB[xC]] [slices=N] | %target off; "
    f"kinds: {', '.join(KINDS)} (e.g. %target h100 hosts=8, %target tpu-v5p topology=4x4x8)"
)


def parse_target_line(line: str) -> tuple[str, dict[str, Any]] | None:
    """``(kind, keyword arguments)`` of ``%target``'s line; None for ``off``.

    Raises:
        UsageError: no kind, an argument not written ``key=value``, an unknown key, or a
            count that is not a whole number.
    """
    words = line.split()
    if not words:
        raise UsageError(f"%target needs a kind: {USAGE}")
    if words[0].lower() in ("off", "none"):
        if len(words) > 1:
            raise UsageError(f"%target off takes nothing more, got {' '.join(words[1:])!r}")
        return None
    kind, kwargs = words[0], {}
    for word in words[1:]:
        key, eq, value = word.partition("=")
        key = key.replace("-", "_")
        if not eq or not value:
            raise UsageError(f"%target: {word!r} is not key=value; {USAGE}")
        if key not in _KEYS:
            raise UsageError(f"%target: unknown argument {key!r}; use {', '.join(_KEYS)}")
        if key in kwargs:
            raise UsageError(f"%target: {key} given twice")
        if key in _INT_KEYS:
            if not value.isdigit() or len(value) > 6:
                raise UsageError(f"%target: {key}={value!r} must be a whole number, e.g. {key}=8")
            kwargs[key] = int(value)
        else:
            kwargs[key] = value
    return kind, kwargs


@magics_class
class TargetMagics(Magics):
    """``%target``, bound to one :class:`ShardlabSession` (whose status record, sent after
    the cell, carries the target)."""

    def __init__(self, shell: Any, *, session: ShardlabSession) -> None:
        super().__init__(shell)
        self.session = session

    @line_magic("target")
    def target_magic(self, line: str) -> None:
        """Plan for another machine: ``%target h100 hosts=8``, ``%target tpu-v5e
        topology=16x16``, ``%target off``; ``%target`` alone says which is in effect.

        While a target is set, ``shardlab.mesh(...)`` without ``devices=`` lays its axes over
        the target's abstract devices (the last axes inside a host or slice), and what is
        compiled on such a mesh is compiled by the target's compiler, deviceless. Nothing
        runs on a target; meshes made before keep their devices.
        """
        if not line.strip():
            current = default_target()
            print(
                f"target: {current.description}"
                if current is not None
                else "no target: new meshes use this kernel's devices "
                "(%target h100 hosts=8 plans for 64 H100s)"
            )
            return
        parsed = parse_target_line(line)
        if parsed is None:
            use_target(None)
            print("target off: new meshes use this kernel's devices")
            return
        kind, kwargs = parsed
        try:
            made = target(kind, **kwargs)
        except TargetError as error:
            raise UsageError(f"%target: {error}") from None
        use_target(made)
        print(
            f"target: {made.description}\nnew meshes are laid over it: "
            "shardlab.mesh(data=..., model=...) (compiled deviceless; nothing runs on it)"
        )
