"""When JAX's compilation caches are worth dropping: by the memory they hold, not their count.

A compiled program on XLA:CPU costs about 1.4 MiB of the process's resident memory (measured:
616 small eager programs, 868 MiB), and only ``jax.clear_caches()`` gives it back: JAX keeps
each executable in several caches (per primitive, per jitted function, per lowering), so
clearing one of them frees nothing and there is no least-recently-used eviction to call.
The choice is therefore *when* to wipe. Counting programs wiped far too often: an eager cell
with a new shape compiles ~26 programs, so a limit of 256 was crossed every ~27 cells of a
mixed session, and every wipe made the cells after it compile again (3x the wall time).

The rule here acts on memory: the caches hold at most what the process grew by since they
were last empty (``floor``, the lowest resident size seen since then). When that growth
passes the budget, a wipe is due. What the wipe freed is measured, and the share of the
growth it freed (``share``) scales the next estimate: when a wipe freed little because the
user's data grew, not the caches, the next one waits for proportionally more growth (at
most ``1 / MIN_SHARE`` times the budget), so a growing dataset does not wipe useful caches
every budget's worth of growth.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.engine.resources.devices import host_memory

__all__ = ["MIN_SHARE", "CacheBudget", "default_budget"]

MIN_SHARE = 0.5  # caches may grow to twice the budget when the last wipe freed little
_MIN_DEFAULT = 2**30  # 1 GiB
_UNKNOWN_HOST_DEFAULT = 2 * 2**30


def default_budget(host: int | None = None) -> int:
    """Bytes of resident memory the compilation caches may hold by default: an eighth of the
    host's memory (cgroup limit included), at least 1 GiB; 2 GiB where it cannot be read."""
    host = host_memory() if host is None else host
    if not host:
        return _UNKNOWN_HOST_DEFAULT
    return max(_MIN_DEFAULT, host // 8)


@dataclass
class CacheBudget:
    """The memory held by compilation caches, estimated from resident-size readings.

    Call :meth:`observe` after each cell that compiled (the process's resident bytes and
    JAX's count of cached programs), :meth:`over` to ask whether a wipe is due, and
    :meth:`wiped` with the resident size before and after a wipe.
    """

    floor: int | None = None  # resident bytes when the caches were last empty (or lowest since)
    share: float = 1.0  # of the growth above the floor, the part the last wipe freed
    programs: int = 0  # cached programs at the last observation
    rss: int = 0  # resident bytes at the last observation

    def observe(self, rss: int, programs: int) -> None:
        """Records a reading after a cell that compiled."""
        if self.floor is None or programs < self.programs:
            # The first reading, or the caches were emptied elsewhere (%release, %devices,
            # jax.clear_caches()): what is held now is the new floor.
            self.floor = rss
        else:
            self.floor = min(self.floor, rss)  # the user freed memory: caches grew from less
        self.programs = programs
        self.rss = rss

    def held(self) -> int:
        """Estimated bytes the caches hold: the growth above the floor, scaled by what the
        last wipe showed to be theirs."""
        if self.floor is None:
            return 0
        return int(max(0, self.rss - self.floor) * self.share)

    def over(self, budget: int) -> bool:
        """Whether the caches are estimated to hold more than ``budget`` bytes."""
        return self.held() > budget

    def wiped(self, rss_before: int, rss_after: int) -> int:
        """Records a wipe: its measured yield sets ``share``; the caches are empty now, so
        ``rss_after`` is the new floor. Returns the bytes it freed."""
        freed = max(0, rss_before - rss_after)
        growth = rss_before - (self.floor if self.floor is not None else rss_before)
        if growth > 0:
            self.share = min(1.0, max(MIN_SHARE, freed / growth))
        self.floor = rss_after
        self.rss = rss_after
        self.programs = 0
        return freed
