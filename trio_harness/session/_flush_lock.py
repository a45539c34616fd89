"""A pooled writer's lock: ``trio.Lock``'s interface and fairness, without its per-acquire bookkeeping.

``trio.Lock`` registers its holder as the breaker of its parking lot on every
acquire (``inspect.getcoroutinestate`` and weak-keyed dictionary entries made
and dropped again): about a tenth of a pooled flush's own Python.  This lock
is held only inside its users' ``try``/``finally`` (session/_pg_pooled.py),
so a holder that exits without releasing it, which that bookkeeping is for,
cannot happen.  Waiters are served first come, first served; a release hands
the lock to the next waiter directly, so no newcomer takes it in between.
"""

from __future__ import annotations

import attrs
import trio


@attrs.define(eq=False)
class FlushLock:
    """Held by one task at a time; :meth:`acquire_nowait`, :meth:`acquire`, :meth:`release`, ``async with``."""

    _held: bool = attrs.field(default=False, init=False)
    _waiting: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot, init=False)

    def locked(self) -> bool:
        return self._held

    def statistics(self) -> trio.lowlevel.ParkingLotStatistics:
        """How many tasks wait for the lock (``tasks_waiting``)."""
        return self._waiting.statistics()

    @trio.lowlevel.enable_ki_protection
    def acquire_nowait(self) -> None:
        """Take the lock now; ``trio.WouldBlock`` when it is held or others wait for it."""
        if self._held or self._waiting:
            raise trio.WouldBlock
        self._held = True

    async def acquire(self) -> None:
        """Take the lock, waiting (cancellably) for its turn; a checkpoint either way."""
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self.acquire_nowait()
        except trio.WouldBlock:
            await self._waiting.park()  # woken holding it (release hands it over)
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()

    @trio.lowlevel.enable_ki_protection
    def release(self) -> None:
        if not self._held:
            raise RuntimeError("this lock is not held")
        if self._waiting:
            self._waiting.unpark()  # the lock passes to the next waiter, still held
        else:
            self._held = False

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()
