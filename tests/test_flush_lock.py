"""The pooled writer's lock (session/_flush_lock.py): trio.Lock's behaviour without its bookkeeping."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trio_harness.session._flush_lock import FlushLock


async def test_held_by_one_task_at_a_time_and_refused_without_waiting_while_held() -> None:
    lock = FlushLock()
    lock.acquire_nowait()
    assert lock.locked()
    with pytest.raises(trio.WouldBlock):
        lock.acquire_nowait()
    lock.release()
    assert not lock.locked()
    lock.acquire_nowait()
    lock.release()


async def test_releasing_a_lock_not_held_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="not held"):
        FlushLock().release()


async def test_waiters_take_it_in_order_and_a_release_hands_it_over_so_no_newcomer_takes_it_between() -> None:
    lock = FlushLock()
    order: list[int] = []

    async def waiter(number: int) -> None:
        async with lock:
            order.append(number)
            await trio.sleep(0)

    lock.acquire_nowait()
    async with trio.open_nursery() as nursery:
        for number in range(3):
            nursery.start_soon(waiter, number)
            await trio.testing.wait_all_tasks_blocked()
        assert lock.statistics().tasks_waiting == 3
        lock.release()
        # Handed to the first waiter (not yet running): still held, so a newcomer is refused.
        assert lock.locked()
        with pytest.raises(trio.WouldBlock):
            lock.acquire_nowait()
    assert order == [0, 1, 2]
    assert not lock.locked()


async def test_a_waiter_cancelled_leaves_the_queue_without_the_lock() -> None:
    lock = FlushLock()
    lock.acquire_nowait()
    got: list[str] = []

    async def waiter(name: str, scope: trio.CancelScope) -> None:
        with scope:
            await lock.acquire()
            got.append(name)
            lock.release()

    first, second = trio.CancelScope(), trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter, "first", first)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(waiter, "second", second)
        await trio.testing.wait_all_tasks_blocked()
        first.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert lock.statistics().tasks_waiting == 1
        lock.release()
    assert got == ["second"]
    assert not lock.locked()


async def test_acquire_is_a_checkpoint_even_when_free() -> None:
    lock = FlushLock()
    with trio.CancelScope() as scope:
        scope.cancel()
        await lock.acquire()  # cancelled at its checkpoint: not taken
    assert scope.cancelled_caught
    assert not lock.locked()
    with trio.testing.assert_checkpoints():
        await lock.acquire()
    lock.release()
