"""Switching the CPU device count inside a running process without losing the user's arrays.

The switch clears JAX's backends (``jax.extend.backend.clear_backends``) and re-creates them
with a new ``jax_num_cpu_devices``; arrays on the old client are moved to host before and back
after, because a committed old array cannot be mixed with new ones. Every array is copied
once, whatever holds it (a name, a container, IPython's output history), so that no copy on
the old client stays alive. The count is checked first against what the host can hold
(``devices.check_cpu_device_count``).
"""

from __future__ import annotations

import os
from collections.abc import Collection, MutableMapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from shardlab.engine.resources.devices import DeviceSpecError, check_cpu_device_count

__all__ = ["SwitchReport", "switch_cpu_devices"]


@dataclass(frozen=True)
class SwitchReport:
    """What an in-process device switch did."""

    before: str
    after: str
    moved: tuple[str, ...]  # namespace paths of arrays moved (one path per array)
    resharded: tuple[str, ...]  # of those, arrays that were sharded (now on one device)
    recompile: tuple[str, ...]  # names of jitted functions that will recompile
    stale_meshes: tuple[str, ...]  # names bound to meshes of the old devices
    bytes_moved: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    history_arrays: int = 0  # arrays moved that only hidden names hold (Out, _N, ...)
    left_deleted: tuple[str, ...] = ()  # paths of deleted arrays, left as they are
    still_old: tuple[str, ...] = ()  # names holding arrays the switch could not reach

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        lines = [f"switched {self.before} → {self.after}"]
        if self.moved:
            lines.append(
                f"moved {len(self.moved)} array(s) ({self.bytes_moved} bytes) through host "
                f"memory and back: {', '.join(self.moved)}"
            )
        elif not self.history_arrays:
            lines.append("no arrays in the namespace needed moving")
        if self.history_arrays:
            lines.append(
                f"moved {self.history_arrays} more array(s) that only hidden names hold (the "
                "output history Out and _N, names starting with _)"
            )
        if self.resharded:
            lines.append(
                "were sharded, now on one device (re-shard with jax.device_put): "
                + ", ".join(self.resharded)
            )
        if self.recompile:
            lines.append("will recompile on next call: " + ", ".join(self.recompile))
        if self.stale_meshes:
            lines.append(
                "meshes of the old devices (rebuild with shardlab.mesh(...)): "
                + ", ".join(self.stale_meshes)
            )
        if self.left_deleted:
            lines.append("deleted arrays, left as they are: " + ", ".join(self.left_deleted))
        if self.still_old:
            lines.append(
                "still hold arrays on the old devices, inside objects the switch cannot "
                "rebuild (re-create them): " + ", ".join(self.still_old)
            )
        lines.extend(self.notes)
        return "\n".join(lines)


def _is_jitted(value: object) -> bool:
    return callable(value) and hasattr(value, "_cache_size") and hasattr(value, "lower")


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


@dataclass
class _Moved:
    """One array on its way through host memory."""

    host: Any  # numpy array: a view of the old buffer until the new array exists
    weak_type: bool
    key_impl: Any = None  # typed PRNG keys travel as their key data


class _Mover:
    """Moves every JAX array reachable from a namespace through dicts, lists and pytrees.

    Identity is kept: an array (or a container) reached along several paths — two names,
    a name and ``Out``, a dict inside two lists — becomes one new object, and dicts and lists
    are updated in place (IPython's ``Out`` is the history manager's own dict). Other
    pytree nodes (tuples, named tuples, registered classes) are rebuilt.
    """

    def __init__(self) -> None:
        import jax

        self.jax = jax
        self.arrays: dict[int, _Moved] = {}
        self.labels: dict[int, str] = {}  # array id -> first path reaching it
        self.visible: set[int] = set()  # arrays a visible (not hidden) name reaches
        self.sharded: set[int] = set()
        self.deleted: dict[int, str] = {}
        self.nodes: dict[int, tuple[Any, list[Any]]] = {}  # pytree nodes: treedef, leaves
        self.seen: set[int] = set()
        self.keep: list[Any] = []  # holds what was visited, so that no id is reused
        self.memo: dict[int, Any] = {}  # id of a visited object -> its replacement
        self.bytes = 0

    # -- before the switch: copy to host ------------------------------------------------
    def collect(self, value: Any, label: str, visible: bool) -> None:
        jax = self.jax
        stack = [(value, label)]
        while stack:
            obj, path = stack.pop()
            if isinstance(obj, jax.Array):
                self._array(obj, path, visible)
                continue
            if id(obj) in self.seen:
                continue
            if isinstance(obj, dict):
                self.seen.add(id(obj))
                self.keep.append(obj)
                items = list(obj.items())
                stack.extend((v, f"{path}[{k!r}]") for k, v in reversed(items))
            elif isinstance(obj, list):
                self.seen.add(id(obj))
                self.keep.append(obj)
                stack.extend((v, f"{path}[{i}]") for i, v in reversed(list(enumerate(obj))))
            else:
                try:
                    # One level: each child is walked (and rebuilt) on its own, so a node
                    # that two parents share stays one object.
                    leaves, treedef = jax.tree_util.tree_flatten_with_path(
                        obj, is_leaf=lambda x, root=obj: x is not root
                    )
                except Exception:
                    continue
                if len(leaves) == 1 and leaves[0][1] is obj:
                    continue  # a leaf: nothing inside to move
                self.seen.add(id(obj))
                self.keep.append(obj)
                self.nodes[id(obj)] = (treedef, [leaf for _, leaf in leaves])
                stack.extend((leaf, path + jax.tree_util.keystr(p)) for p, leaf in reversed(leaves))

    def _array(self, array: Any, path: str, visible: bool) -> None:
        import numpy as np

        jax = self.jax
        key = id(array)
        if visible:
            self.visible.add(key)
        if key in self.labels:  # reached before: one copy, labelled by the first path
            return
        self.labels[key] = path  # visible names are walked first
        self.keep.append(array)
        if array.is_deleted():
            self.deleted[key] = path
            return
        try:
            if len(array.sharding.device_set) > 1:
                self.sharded.add(key)
            if jax.dtypes.issubdtype(array.dtype, jax.dtypes.prng_key):
                impl = jax.random.key_impl(array)
                host = np.asarray(jax.random.key_data(array))
                moved = _Moved(host, False, impl)
            else:
                host = np.asarray(array)
                moved = _Moved(host, bool(getattr(array, "weak_type", False)))
        except Exception as error:
            raise DeviceSpecError(
                f"could not copy {path} to host memory ({type(error).__name__}: {error}); "
                "nothing was changed"
            ) from None
        self.bytes += int(host.nbytes)
        self.arrays[key] = moved

    # -- after the switch: back on the new devices ----------------------------------------
    def place(self) -> dict[int, Any]:
        """New arrays, by id of the old one: copies (``copy=True``) so that no new array
        aliases an old buffer, which would keep the old array and its client alive."""
        jax = self.jax
        jnp = jax.numpy
        placed: dict[int, Any] = {}
        for key, moved in self.arrays.items():
            if moved.key_impl is not None:
                data = jnp.array(moved.host, copy=True)
                placed[key] = jax.random.wrap_key_data(data, impl=moved.key_impl)
            else:
                new = jnp.array(moved.host, copy=True)
                if moved.weak_type:
                    new = _weak(new)
                placed[key] = new
            moved.host = None  # drop the view of the old buffer
        return placed

    def rebuild(self, value: Any, placed: dict[int, Any]) -> Any:
        """``value`` with every moved array replaced; dicts and lists change in place, and
        a pytree node reached from several names is rebuilt once."""
        return self._rebuild(value, placed, self.memo)

    def _rebuild(self, obj: Any, placed: dict[int, Any], memo: dict[int, Any]) -> Any:
        key = id(obj)
        if key in placed:
            return placed[key]
        if key in memo:
            return memo[key]
        if key not in self.seen:
            return obj
        memo[key] = obj
        if isinstance(obj, dict):
            for k, v in list(obj.items()):
                new = self._rebuild(v, placed, memo)
                if new is not v:
                    obj[k] = new
            return obj
        if isinstance(obj, list):
            for i, v in enumerate(list(obj)):
                new = self._rebuild(v, placed, memo)
                if new is not v:
                    obj[i] = new
            return obj
        node = self.nodes.get(key)
        if node is None:
            return obj
        treedef, leaves = node
        new_leaves = [self._rebuild(leaf, placed, memo) for leaf in leaves]
        if all(a is b for a, b in zip(leaves, new_leaves, strict=True)):
            return obj
        memo[key] = self.jax.tree_util.tree_unflatten(treedef, new_leaves)
        return memo[key]


def _weak(array: Any) -> Any:
    """``array`` weakly typed again (a Python scalar's type promotion), where JAX allows."""
    try:
        from jax._src.lax import lax as lax_internal

        return lax_internal._convert_element_type(array, array.dtype, weak_type=True)
    except Exception:
        return array


def _old_arrays_in(value: Any, known: set[int]) -> bool:
    """Whether ``value`` reaches (through objects, closures...) an array not in ``known``:
    one the switch could not replace, still on the old devices."""
    from shardlab.engine.resources.live_memory import reachable_array_ids

    return bool(reachable_array_ids([value], max_objects=20_000) - known)


def switch_cpu_devices(
    count: int,
    namespace: MutableMapping[str, Any],
    *,
    hidden: Collection[str] = (),
    also: Sequence[MutableMapping[str, Any]] = (),
) -> SwitchReport:
    """Switches this process to ``count`` simulated CPU devices, keeping user arrays.

    Every JAX array bound in ``namespace`` (also inside dicts, lists, tuples and registered
    pytrees, and in IPython's output history) is copied to host memory, the backends are
    cleared and re-created with the new device count, and the arrays are put back (on the
    default device). An array reached along several paths is copied once and stays one
    object; dicts and lists are updated in place. Nothing is changed if copying to host
    fails.

    Args:
        count: the new number of simulated CPU devices.
        namespace: the user's names.
        hidden: names that are not the user's (IPython's ``Out``, ``In``...): their arrays
            are moved too but not listed by path (names starting with ``_`` are hidden too).
        also: other mappings that hold the same values, updated in place and never listed
            (IPython keeps the last outputs in ``user_ns_hidden`` and its display hook too):
            a copy left there would keep the old array, and its client, alive.

    Raises:
        DeviceSpecError: ``count`` < 1 or beyond what the host can hold
            (:func:`check_cpu_device_count`), the current platform is not CPU, or an array
            cannot be copied to host memory.
    """
    import sys

    import jax
    import jax.extend
    from jax.sharding import Mesh

    check_cpu_device_count(count)
    platform = jax.devices()[0].platform
    if platform != "cpu":
        raise DeviceSpecError(
            f"this kernel runs on {platform}; switching to cpu:{count} in-process is not "
            "possible. Install a CPU kernelspec (python -m shardlab install --devices "
            f"cpu:{count} --name shardlab-cpu{count}) and restart with it."
        )
    before = f"cpu:{len(jax.devices())}"
    hidden_names = set(hidden)

    def is_hidden(name: str) -> bool:
        return name in hidden_names or name.startswith("_")

    names = [n for n in namespace if not _is_dunder(n)]
    names.sort(key=is_hidden)  # visible names first: they give arrays their labels
    mover = _Mover()
    for name in names:
        mover.collect(namespace[name], name, not is_hidden(name))
    for mapping in also:
        for key, value in list(mapping.items()):
            mover.collect(value, str(key), False)
    recompile = tuple(
        name
        for name in names
        if not is_hidden(name) and _is_jitted(namespace[name]) and namespace[name]._cache_size() > 0
    )
    stale = tuple(n for n in names if not is_hidden(n) and isinstance(namespace[n], Mesh))
    notes: list[str] = []
    if getattr(sys, "last_traceback", None) is not None:
        # The last error's frames hold arrays (and through them the old client) alive.
        notes.append("dropped the last traceback (its frames held arrays of the old devices)")
    for attr in ("last_traceback", "last_value", "last_type", "last_exc"):
        if hasattr(sys, attr):
            setattr(sys, attr, None)
    jax.clear_caches()
    jax.extend.backend.clear_backends()
    jax.config.update("jax_num_cpu_devices", count)
    os.environ["JAX_NUM_CPU_DEVICES"] = str(count)
    os.environ["SHARDLAB_DEVICES"] = f"cpu:{count}"
    placed = mover.place()
    for mapping, keys in ((namespace, names), *((m, list(m)) for m in also)):
        for name in keys:
            value = mapping[name]
            try:
                new = mover.rebuild(value, placed)
            except Exception as error:  # e.g. a pytree class whose unflatten refuses
                # The old value stays: usable on the old client, listed as still_old below.
                if mapping is namespace and not is_hidden(name):
                    notes.append(f"could not rebuild {name} ({type(error).__name__}: {error})")
                continue
            if new is not value:
                mapping[name] = new
    known = {id(a) for a in placed.values()} | set(mover.deleted)
    for array in placed.values():
        base = getattr(array, "_base_array", None)  # a typed key's data
        if base is not None:
            known.add(id(base))
    still_old = tuple(
        n
        for n in names
        if not is_hidden(n)
        and not isinstance(namespace[n], Mesh)
        and _old_arrays_in(namespace[n], known)
    )
    labels = mover.labels
    moved = tuple(labels[k] for k in mover.arrays if k in mover.visible)
    resharded = tuple(labels[k] for k in mover.arrays if k in mover.visible and k in mover.sharded)
    history = sum(1 for k in mover.arrays if k not in mover.visible)
    left_deleted = tuple(labels[k] for k in mover.deleted if k in mover.visible)
    bytes_moved = mover.bytes
    del mover, placed
    return SwitchReport(
        before=before,
        after=f"cpu:{len(jax.devices())}",
        moved=moved,
        resharded=resharded,
        recompile=recompile,
        stale_meshes=stale,
        bytes_moved=bytes_moved,
        notes=tuple(notes),
        history_arrays=history,
        left_deleted=left_deleted,
        still_old=still_old,
    )
