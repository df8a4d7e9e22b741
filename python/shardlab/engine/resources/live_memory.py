"""Memory accounting and release for long sessions.

``device.memory_stats()`` is None on CPU, so per-device bytes are summed over the addressable
shards of ``jax.live_arrays()``. Release drops what nothing the user can reach still holds:
compilation caches, the last traceback's frames, arrays that no reachable object refers to;
then returns freed heap to the OS with glibc's ``malloc_trim``.
"""

from __future__ import annotations

import collections
import ctypes
import gc
import sys
import types
from collections.abc import Collection, Iterable, Mapping, MutableMapping
from dataclasses import asdict, dataclass
from typing import Any

import jax

from shardlab._core.units import human_bytes

_GPU_NOTE = (
    "On GPU, XLA's allocator keeps freed memory for reuse (by default it preallocates 75% of "
    "the device); the bytes above are what arrays hold. To hand memory back to the driver, "
    "start the kernel with XLA_PYTHON_CLIENT_ALLOCATOR=platform (slower allocation) or "
    "XLA_PYTHON_CLIENT_PREALLOCATE=false."
)


def process_rss() -> int:
    """Resident set size of this process in bytes (0 where it cannot be read)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        import resource

        return pages * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        try:
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        except Exception:
            return 0


def shard_nbytes(array: jax.Array) -> int:
    """Bytes one device holds of ``array``, from its sharding."""
    shape = array.sharding.shard_shape(array.shape)
    count = 1
    for size in shape:
        count *= int(size)
    return count * array.dtype.itemsize


def _shard_arrays(array: jax.Array) -> list[jax.Array]:
    """The single-device arrays of ``array``'s addressable shards.

    JAX creates these lazily and caches them on the array; they share its buffers and show
    up in ``jax.live_arrays()`` as arrays of their own ("views").
    """
    arrays = getattr(array, "_arrays", None)
    if arrays is None:
        arrays = [shard.data for shard in array.addressable_shards]
    return list(arrays)


def buffers(prefer: Collection[int] = ()) -> tuple[dict[int, tuple[str, int]], set[int]]:
    """Every live device buffer once: ``{address: (device, bytes)}``, and the ids of live
    arrays that are views of another array's buffer (counted with it).

    JAX makes such views itself: an array's per-shard arrays (created lazily, then cached on
    it), and on CPU the array a zero-copy read to host (``np.asarray``, printing) wraps the
    buffer in. Of single-device arrays sharing a buffer, one whose id is in ``prefer`` (a
    named one, say) is the buffer's owner; the others are its views.
    """
    by_pointer: dict[int, tuple[str, int]] = {}
    views: set[int] = set()
    # Reading a buffer pointer makes JAX create an array's shard views: make them all
    # first, so that every view is listed below, not only in later jax.live_arrays() calls.
    for array in jax.live_arrays():
        parts = _safe_shards(array) if _devices(array) > 1 else [array]
        for part in parts:
            _pointer(part)
    live = jax.live_arrays()
    multi = [a for a in live if _devices(a) > 1]
    for array in multi:
        for shard in _safe_shards(array):
            pointer = _pointer(shard)
            if pointer is not None:
                by_pointer[pointer] = (str(next(iter(shard.devices()))), int(shard.nbytes))
                views.add(id(shard))
    singles = [a for a in live if id(a) not in views and _devices(a) == 1]
    preferred = set(prefer)
    singles.sort(key=lambda a: id(a) not in preferred)  # stable: live order otherwise
    for array in singles:
        pointer = _pointer(array)
        if pointer is None:
            continue
        if pointer in by_pointer:
            views.add(id(array))
        else:
            by_pointer[pointer] = (str(next(iter(array.devices()))), int(array.nbytes))
    return by_pointer, views


def _devices(array: jax.Array) -> int:
    try:
        return 0 if array.is_deleted() else len(array.sharding.device_set)
    except Exception:
        return 0


def _safe_shards(array: jax.Array) -> list[jax.Array]:
    try:
        return _shard_arrays(array)
    except Exception:
        return []


def _pointer(array: jax.Array) -> int | None:
    try:
        return int(array.unsafe_buffer_pointer())
    except Exception:  # deleted, donated, or not a single-device array
        return None


def live_bytes_per_device() -> dict[str, int]:
    """Bytes held by live JAX arrays on each device, keyed by ``str(device)``; a buffer
    shared by an array and its shard views counts once."""
    totals: dict[str, int] = {str(d): 0 for d in jax.devices()}
    by_pointer, _ = buffers()
    for device, nbytes in by_pointer.values():
        totals[device] = totals.get(device, 0) + nbytes
    return totals


_HISTORY_NAMES = frozenset({"Out", "In"})  # IPython's output and input history


def array_names(
    namespace: Mapping[str, Any] | None, *, max_leaves: int = 100_000
) -> dict[int, str]:
    """``{id(array): name}`` for the JAX arrays that the namespace's names hold.

    A name is the namespace path (``params['w']``); names starting with ``_`` are skipped,
    and the user's names come before ``Out``/``In`` (an array the output history also holds
    is named by the user's name). A typed PRNG key's base array gets the key's name. The
    walk stops after ``max_leaves`` pytree leaves.
    """
    names: dict[int, str] = {}
    items = [(n, v) for n, v in (namespace or {}).items() if not n.startswith("_")]
    items.sort(key=lambda item: item[0] in _HISTORY_NAMES)
    seen = 0
    for name, value in items:
        if seen >= max_leaves:
            break
        try:
            leaves = jax.tree_util.tree_flatten_with_path(value)[0]
        except Exception:
            continue
        seen += len(leaves)
        for path, leaf in leaves:
            if isinstance(leaf, jax.Array) and id(leaf) not in names:
                names[id(leaf)] = name + jax.tree_util.keystr(path)
                base = getattr(leaf, "_base_array", None)  # a typed PRNG key's data
                if base is not None:
                    names.setdefault(id(base), names[id(leaf)])
    return names


def _buffer_pointers(arrays: Iterable[jax.Array]) -> set[int]:
    """Device buffer addresses of ``arrays`` (their shards' for multi-device arrays)."""
    pointers: set[int] = set()
    for array in arrays:
        parts = _safe_shards(array) if _devices(array) > 1 else [array]
        pointers.update(p for p in map(_pointer, parts) if p is not None)
    return pointers


def cache_stats() -> dict[str, int]:
    """Sizes of JAX's in-memory compilation caches (entries, not bytes)."""
    from jax._src import pjit
    from jax._src.interpreters import pxla

    stats: dict[str, int] = {}
    for name, cache in (
        ("executables", getattr(pxla, "_cached_compilation", None)),
        ("lowerings", getattr(pxla, "_cached_lowering_to_hlo", None)),
        ("jaxprs", getattr(pjit, "_infer_params_cached", None)),
    ):
        info = getattr(cache, "cache_info", None)
        if info is not None:
            stats[name] = int(info().currsize)
    return stats


def malloc_trim() -> bool:
    """Returns freed heap to the OS on glibc; False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):
        return False


def _reachable_arrays(
    roots: Iterable[object], *, max_objects: int = 300_000, exclude: frozenset[int] = frozenset()
) -> tuple[set[int], bool]:
    """ids of JAX arrays reachable from ``roots`` through containers and object attributes.

    Returns the ids and whether the walk finished (it stops after ``max_objects`` objects,
    and then nothing may be called unreachable).
    """
    found: set[int] = set()
    seen: set[int] = set(exclude)
    queue = collections.deque(roots)
    while queue and len(seen) < max_objects:
        obj = queue.popleft()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, jax.Array):
            found.add(id(obj))
            # A typed PRNG key array wraps a uint32 array: the buffer jax.live_arrays() lists.
            base = getattr(obj, "_base_array", None)
            if base is not None:
                found.add(id(base))
            continue
        if isinstance(obj, (str, bytes, int, float, complex, bool, type(None), types.ModuleType)):
            continue
        if isinstance(obj, Mapping):
            queue.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
            queue.extend(obj)
        elif isinstance(obj, types.FunctionType):
            queue.extend(c.cell_contents for c in (obj.__closure__ or ()) if _cell_ok(c))
            queue.extend(obj.__defaults__ or ())
        else:
            attrs = getattr(obj, "__dict__", None)
            if isinstance(attrs, dict):
                queue.extend(attrs.values())
            for slot in getattr(type(obj), "__slots__", ()) or ():
                if isinstance(slot, str) and hasattr(obj, slot):
                    queue.append(getattr(obj, slot))
            try:
                leaves = jax.tree_util.tree_leaves(obj)
            except Exception:
                leaves = []
            # by identity: ``leaves != [obj]`` compared an array leaf with ``obj`` by value
            # (an elementwise ``!=``, whose truth is ambiguous)
            if leaves and not (len(leaves) == 1 and leaves[0] is obj):
                queue.extend(leaves)
    return found, not queue


def reachable_array_ids(roots: Iterable[object], *, max_objects: int = 300_000) -> set[int]:
    """ids of the JAX arrays reachable from ``roots`` (containers, attributes, closures);
    the walk stops after ``max_objects`` objects."""
    return _reachable_arrays(roots, max_objects=max_objects)[0]


def _cell_ok(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises ValueError
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class ReleaseReport:
    """Before/after figures of a memory release."""

    bytes_before: dict[str, int]
    bytes_after: dict[str, int]
    rss_before: int
    rss_after: int
    arrays_deleted: int
    named_arrays_deleted: tuple[str, ...]
    caches_cleared: dict[str, int]
    trimmed: bool
    platform: str
    names_unbound: tuple[str, ...] = ()  # of named_arrays_deleted: names removed
    named_arrays_kept: tuple[str, ...] = ()  # delete_named, but a module holds the arrays

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def freed_device_bytes(self) -> int:
        return sum(self.bytes_before.values()) - sum(self.bytes_after.values())

    def text(self) -> str:
        """A short human-readable summary."""
        lines = [
            f"device bytes: {human_bytes(sum(self.bytes_before.values()))} → "
            f"{human_bytes(sum(self.bytes_after.values()))} "
            f"(freed {human_bytes(self.freed_device_bytes)}; {self.arrays_deleted} unreachable "
            f"array(s) deleted)",
            f"process RSS:  {human_bytes(self.rss_before)} → {human_bytes(self.rss_after)}",
        ]
        if self.named_arrays_deleted:
            names = ", ".join(self.named_arrays_deleted)
            unbound = set(self.names_unbound)
            if unbound == set(self.named_arrays_deleted):
                fate = "these names are unbound now (re-create them to use them)"
            else:
                left = [n for n in self.named_arrays_deleted if n not in unbound]
                fate = "still bound to deleted arrays: " + ", ".join(left)
            lines.append(f"deleted named arrays: {names}; {fate}")
        if self.named_arrays_kept:
            lines.append(
                "kept named arrays that a module also holds (still usable): "
                + ", ".join(self.named_arrays_kept)
            )
        per_device = [
            f"{d}: {human_bytes(self.bytes_before.get(d, 0))} → {human_bytes(b)}"
            for d, b in self.bytes_after.items()
        ]
        lines.append("per device: " + "; ".join(per_device))
        if self.platform == "gpu":
            lines.append(_GPU_NOTE)
        return "\n".join(lines)


def release(
    user_namespace: Mapping[str, Any] | None = None,
    *,
    delete_named: bool = False,
    delete_unreachable: bool = True,
    skip_names: Collection[str] = (),
    stop_at: Collection[object] = (),
) -> ReleaseReport:
    """Frees device and host memory nothing the user can reach still uses.

    Args:
        user_namespace: the user's names (a notebook's namespace); arrays reachable from it
            are kept unless ``delete_named``. ``None`` deletes no arrays at all.
        delete_named: also delete arrays bound to names in ``user_namespace``; the names
            that held them are unbound (removed from a mutable ``user_namespace``: using one
            is then a ``NameError``, not "Array has been deleted") and reported, and so are
            names whose arrays a module also holds (kept).
        delete_unreachable: delete arrays that neither the namespace nor any imported
            module reaches (typically held by stale tracebacks or hidden caches).
        skip_names: names in the namespace that are not the user's (IPython's ``In``,
            ``Out``, ``exit``...): they neither keep arrays alive nor get reported.
        stop_at: objects the walk from the namespace does not enter (the shell, the
            kernel: everything is reachable through them).

    Arrays reachable from the namespace are never deleted (unless ``delete_named``): when
    the walk over the namespace cannot finish, nothing is deleted as unreachable.
    """
    bytes_before = live_bytes_per_device()
    rss_before = process_rss()
    for attr in ("last_traceback", "last_value", "last_type", "last_exc"):
        if hasattr(sys, attr):
            setattr(sys, attr, None)
    caches = cache_stats()
    jax.clear_caches()
    gc.collect()
    deleted = 0
    named: list[str] = []
    named_kept: list[str] = []
    unbound: list[str] = []
    if user_namespace is not None:
        user_items = [
            (k, v)
            for k, v in user_namespace.items()
            if k not in skip_names and (not k.startswith("_") or k == "_")
        ]
        barrier = frozenset({id(user_namespace), *(id(o) for o in stop_at)})
        user_ids, user_complete = _reachable_arrays((v for _, v in user_items), exclude=barrier)
        per_name: dict[str, set[int]] = {}
        if delete_named:
            for k, v in user_items:
                if k != "_":
                    per_name[k] = _reachable_arrays([v], exclude=barrier)[0]
        module_roots = [
            vars(m) for name, m in list(sys.modules.items()) if m is not None and name != "__main__"
        ]
        # The user namespace is reachable from modules too (through the shell object); it
        # is judged by the rules above, not as a module's own data.
        module_ids, complete = _reachable_arrays(module_roots, exclude=barrier)
        # A walk cut short proves nothing unreachable: then delete only named arrays.
        delete_unreachable = delete_unreachable and complete and user_complete
        live = jax.live_arrays()
        kept = [a for a in live if id(a) in module_ids or (id(a) in user_ids and not delete_named)]
        # Never delete a buffer a kept array uses: a shard view (``shard.data``) is a separate
        # array object sharing its parent's buffer, and deleting it would delete the parent's.
        protected = _buffer_pointers(kept)
        kept_ids = {id(a) for a in kept}
        live_ids = {id(a) for a in live if not a.is_deleted()}
        deleted_ids: set[int] = set()
        for array in live:
            if id(array) in kept_ids:
                continue
            if id(array) not in user_ids and not delete_unreachable:
                continue
            if _buffer_pointers([array]) & protected:
                continue
            try:
                array.delete()
            except Exception:
                continue
            deleted_ids.add(id(array))
            deleted += id(array) not in user_ids
        for k, ids in per_name.items():
            if ids & deleted_ids:
                named.append(k)
            elif ids & live_ids:
                named_kept.append(k)
        if isinstance(user_namespace, MutableMapping):
            for k in named:  # a name bound to deleted arrays only fails later: unbind it
                user_namespace.pop(k, None)
                unbound.append(k)
        del live, kept
    gc.collect()
    trimmed = malloc_trim()
    platform = jax.devices()[0].platform if jax.devices() else "cpu"
    return ReleaseReport(
        bytes_before=bytes_before,
        bytes_after=live_bytes_per_device(),
        rss_before=rss_before,
        rss_after=process_rss(),
        arrays_deleted=deleted,
        named_arrays_deleted=tuple(named),
        caches_cleared=caches,
        trimmed=trimmed,
        platform="gpu" if platform in ("gpu", "cuda", "rocm") else platform,
        names_unbound=tuple(unbound),
        named_arrays_kept=tuple(named_kept),
    )
