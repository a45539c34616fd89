"""The group committer's watch (session/_pg_group.py): its bounds and its compaction, under random schedules.

No server: requests are tracked (``_track``), sent, settled by their group
and timed out (``_expire``) in random orders on a mock clock, and after every
step each request is where the bounds say it must be: an unsent one fails
"not sent" (abandoned, out of the queue) once its bound passes; a sent one is
left to its group once more from when the watch finds it past its bound
(a clock that jumps does not take that away), then settled as unknown; one its
group settled is never touched again; one whose statement was lost on its way
(to be sent again) ends unknown whatever settles it later; the watch's list never holds more than
about twice the most requests ever unsettled at once (the compaction under a
long stuck request is pinned in tests/test_postgres_group.py).
"""

from __future__ import annotations

import types
from unittest import mock

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_harness import SessionStoreError
from trio_harness.session import _pg_group

WRITE_TIMEOUT = 1.0
LIMIT = 2 * WRITE_TIMEOUT + 1

steps = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(0, 0)),
        st.tuples(st.just("submit"), st.integers(0, 0)),
        st.tuples(st.just("submit"), st.integers(0, 0)),
        st.tuples(st.just("send"), st.integers(0, 40)),
        st.tuples(st.just("settle"), st.integers(0, 40)),
        st.tuples(st.just("lose"), st.integers(0, 40)),
        st.tuples(st.just("advance"), st.sampled_from([0.0, 0.125, 0.5, 1.0, LIMIT, LIMIT + 0.25])),
    ),
    max_size=300,
)


@settings(max_examples=200, deadline=None)
@given(steps)
def test_every_request_is_settled_as_the_bounds_say_whatever_the_schedule(
    schedule: list[tuple[str, float]],
) -> None:
    clock = trio.testing.MockClock()

    async def main() -> None:
        store = types.SimpleNamespace(write_timeout=WRITE_TIMEOUT, location="test")
        committer = _pg_group.GroupCommitter(store)  # type: ignore[arg-type]
        committer._compact_at = _pg_group._COMPACT_MIN
        writer = types.SimpleNamespace(header=types.SimpleNamespace(id="s"), _stored=0, _epoch=1)
        requests: list[_pg_group._Request] = []
        submitted: dict[int, float] = {}
        sent_at: dict[int, float] = {}
        by_group: set[int] = set()
        late_at: dict[int, float] = {}
        lost: set[int] = set()
        peak = 0
        for op, arg in schedule:
            now = trio.current_time()
            if op == "submit":
                request = _pg_group._Request(writer, ["{}"], [], True)
                committer._track(request)
                committer._pending.append(request)
                submitted[id(request)] = now
                requests.append(request)
            elif op == "send" and requests:
                request = requests[int(arg) % len(requests)]
                if not request.sent and not request.abandoned and not request.settled:  # as _run_group filters
                    if not request.lost:
                        committer._pending.remove(request)
                        sent_at[id(request)] = now
                    request.sent = True
            elif op == "settle" and requests:
                request = requests[int(arg) % len(requests)]
                if request.sent and not request.settled:
                    request.settle(True)
                    by_group.add(id(request))
            elif op == "lose" and requests:  # its connection dropped, nothing found stored: to be sent again
                request = requests[int(arg) % len(requests)]
                if request.sent and not request.settled:
                    request.sent, request.lost = False, True
                    lost.add(id(request))
            elif op == "advance":
                clock.jump(arg)
                committer._expire(trio.current_time())
            now = trio.current_time()
            for request in requests:
                key, age = id(request), now - submitted[id(request)]
                if key in by_group:
                    assert request.outcome is True and not request.unknown
                elif key in lost:
                    # A lost statement may still commit it: whatever settles it later says its outcome is unknown.
                    if request.settled:
                        assert request.unknown and "unknown" in str(request.outcome)
                elif key in sent_at:
                    # Sent before its bound: waited for once more from when the watch found it past it, then unknown.
                    if age >= LIMIT:
                        late_at.setdefault(key, now)
                    if key in late_at and now >= late_at[key] + LIMIT:
                        assert request.settled and request.unknown and isinstance(request.outcome, SessionStoreError)
                        assert "whether it committed is unknown" in str(request.outcome)
                    else:
                        assert not request.settled
                elif age >= LIMIT:
                    assert request.settled and request.abandoned and not request.unknown
                    assert "was not sent within" in str(request.outcome)
                    assert request not in committer._pending
                else:
                    assert not request.settled
            # The settled requests kept behind an unsettled one: about twice the most ever unsettled at once.
            peak = max(peak, sum(not r.settled for r in requests))
            assert len(committer._waiting) <= max(_pg_group._COMPACT_MIN, 2 * peak) + 1
        # Past every bound, with the watch's expiry run: every request is settled, once, as the rules say.
        for _ in range(2):  # the first bound, then the second one from there
            clock.jump(LIMIT)
            committer._expire(trio.current_time())
        for request in requests:
            assert request.settled
            if id(request) not in by_group and (id(request) in lost or id(request) in sent_at):
                assert request.unknown
            elif id(request) not in by_group:
                assert request.abandoned and not request.unknown

    with mock.patch.object(_pg_group, "_COMPACT_MIN", 8):  # small, so the random schedules reach the compaction
        trio.run(main, clock=clock)
