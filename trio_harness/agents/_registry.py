"""The agent registry (``harness.agents``), the factory slot, and AgentHandle.

Create and resume share one atomic publication pipeline (seed 002 §5):

1. prepare the session (fresh, or loaded and recovered) — nobody can see it;
2. prepare the agent: its own scope (a child of the factory's scope), inbox
   and driver, with the teardown chain registered first so it unwinds last;
3. ``await setup(agent)`` while both registries still return nothing;
4. run setup's synchronous ``commit()`` (the last failable step);
5. enter the session store, then the agent registry (same-id arbitration);
6. announce ``session/created``, ``agent/created``, ``agent/session-start``;
7. return the :class:`AgentHandle`.

Any failure or cancellation before step 5 completes closes the agent scope
and discards the session: nothing is published, the id is free again.

Teardown is the agent scope closing, whoever starts it (the handle, the
caller's scope, the factory's scope): the close hook cancels the driver with
cause ``disposed`` and waits for quiescence; child scopes and scoped resources
unwind (tools, owned tasks); then the agent leaves the registry
(``agent/disposed``) and finally the session is flushed and detached
(``session/disposed``).  Scope close is memoized and shielded.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Literal, Protocol

import attrs
import trio

from .._errors import AgentError, AgentExistsError, FactoryError, SessionExistsError, SessionStoreError
from ._options import AgentOptions

if TYPE_CHECKING:
    from .._bus import EventBus
    from .._harness import Harness
    from .._scope import Scope
    from ..session._session import Session
    from ..session._store import SessionEntry, SessionStore
    from ._agent import Agent

__all__ = ["AgentFactory", "AgentHandle", "AgentRegistry", "LoopAgent", "Setup"]

Setup = Callable[["Agent"], Awaitable["Callable[[], None] | None"]]
"""``async def setup(agent) -> commit | None``: compose the agent's world (never drive it)."""


class LoopAgent(Protocol):
    """What a factory builds: an Agent plus the close hook that quiesces it."""

    @property
    def id(self) -> str: ...

    @property
    def session(self) -> Session: ...

    def dispose_hook(self) -> Awaitable[None] | None:
        """Cancel the driver with cause ``disposed``; the awaitable (if any) waits for quiescence."""
        ...


class AgentFactory(Protocol):
    """Builds agents for the registry (the loop implementation fills this slot)."""

    def build(
        self,
        *,
        session: Session,
        options: AgentOptions,
        scope: Scope,
        harness: Harness,
        parent_id: str | None,
    ) -> LoopAgent:
        """Construct (but do not start) an agent around ``session`` in ``scope``."""
        ...


@attrs.define(eq=False)
class _AgentEntry:
    agent: Agent
    owner: Agent | None
    announced: bool = False
    detached: bool = False


@attrs.define(eq=False, repr=False)
class AgentHandle:
    """The teardown capability for one agent, held by whoever created or resumed it.

    ``dispose()`` is idempotent and memoized: every owner awaits the same
    teardown.  ``async with handle as agent:`` disposes at the end of the block.
    """

    agent: Agent
    _scope: Scope = attrs.field(alias="scope")
    # Takes the session's detach failure from the store (so the harness exit
    # does not report it a second time); None when there is nothing to take.
    _take_failure: Callable[[], SessionStoreError | None] | None = attrs.field(default=None, alias="take_failure")
    # The failure dispose() reports, on every call.
    _failure: SessionStoreError | None = attrs.field(default=None, init=False)

    def __repr__(self) -> str:
        return f"<AgentHandle {self.agent.id!r}{' disposed' if self.disposed else ''}>"

    @property
    def disposed(self) -> bool:
        """Whether teardown has finished."""
        return self._scope.closed

    async def dispose(self) -> None:
        """Dispose the agent and wait until teardown has finished.

        Raises:
            SessionStoreError: the session's last events could not be stored
                (teardown itself still completed: nothing is left running).
                Every call raises it.
        """
        await self._scope.close()
        if self._take_failure is not None:
            failure = self._take_failure()
            if failure is not None:
                self._failure = failure
        if self._failure is not None:
            raise self._failure

    async def __aenter__(self) -> Agent:
        return self.agent

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with trio.CancelScope(shield=True):
            await self.dispose()


@attrs.define(eq=False)
class AgentRegistry:
    """Live agents of a harness and the create / resume pipeline."""

    _harness: Harness = attrs.field(alias="harness")
    _sessions: SessionStore = attrs.field(alias="sessions")
    _bus: EventBus = attrs.field(alias="bus")
    _entries: dict[str, _AgentEntry] = attrs.field(factory=dict, init=False)
    _factory: tuple[AgentFactory, Scope] | None = attrs.field(default=None, init=False)

    # ------------------------------------------------------------ factory slot

    def register_factory(self, factory: AgentFactory, scope: Scope) -> Callable[[], None]:
        """Fill the factory slot; it empties when ``scope`` closes.

        Agents are built in child scopes of ``scope``, so closing it disposes
        every agent the factory built.

        Raises:
            FactoryError: the slot is already filled.
        """
        if self._factory is not None:
            raise FactoryError("an agent factory is already registered; unload it first")
        slot = (factory, scope)
        self._factory = slot

        def release() -> None:
            if self._factory is slot:
                self._factory = None

        scope.add_exit_callback(release)
        return release

    def _require_factory(self) -> tuple[AgentFactory, Scope]:
        if self._factory is None or self._factory[1].closing:
            raise FactoryError("no agent factory is registered (is the harness open?)")
        return self._factory

    # ------------------------------------------------------------ create / resume

    async def create(
        self,
        *,
        session_id: str | None = None,
        options: AgentOptions | None = None,
        setup: Setup | None = None,
        owner: Scope | None = None,
        parent: Agent | None = None,
        cwd: str | None = None,
    ) -> AgentHandle:
        """Create a fresh agent around a new session and publish it atomically.

        Args:
            session_id: the id (default: a random one); must not be live or stored.
            options: model route and limits.
            setup: composes the agent's world before publication (see :data:`Setup`).
            owner: a scope whose closing disposes the agent (default: the
                parent's scope when ``parent`` is given).
            parent: the agent creating this one (runtime ownership).
            cwd: the working directory recorded in the session header.

        Raises:
            AgentExistsError: the id is live (or stored: resume it instead).
            FactoryError: no factory is registered.
            SessionStoreError: the store cannot be written (checked before setup).
        """
        self._require_factory()
        if session_id is not None and session_id in self._entries:
            raise AgentExistsError(f"agent {session_id!r} already exists")
        await self._sessions.check()  # a store that cannot be written fails before any model call
        try:
            session = self._sessions.prepare_new(
                session_id, cwd=cwd, parent_session=parent.id if parent is not None else None
            )
        except SessionExistsError as exc:
            raise AgentExistsError(str(exc)) from exc
        return await self._publish(session, "startup", options, setup, owner, parent)

    async def resume(
        self,
        session_id: str,
        *,
        options: AgentOptions | None = None,
        setup: Setup | None = None,
        owner: Scope | None = None,
        parent: Agent | None = None,
    ) -> AgentHandle:
        """Resume a stored session as a fresh live agent.

        Raises:
            AgentExistsError: the session's agent is live in this process, or
                in another one (its log is locked: the cause is a
                :exc:`SessionLockedError`).
            SessionNotFoundError: nothing is stored under this id.
            SessionStoreError: the store cannot be written, or the stored
                log is not a regular file in a real directory of the store.
            SessionCorruptError: the stored log is damaged.
        """
        self._require_factory()
        if session_id in self._entries or self._sessions.get(session_id) is not None:
            raise AgentExistsError(f"agent {session_id!r} is live; dispose it before resuming its session")
        await self._sessions.check()
        try:
            session = await self._sessions.prepare_resume(session_id)
        except SessionExistsError as exc:
            raise AgentExistsError(str(exc)) from exc
        return await self._publish(session, "resume", options, setup, owner, parent)

    @asynccontextmanager
    async def open(
        self,
        *,
        session_id: str | None = None,
        options: AgentOptions | None = None,
        setup: Setup | None = None,
        resume: bool = False,
        cwd: str | None = None,
    ) -> AsyncIterator[Agent]:
        """Create (or with ``resume=True`` resume) an agent bound to the block."""
        if resume:
            if session_id is None:
                raise ValueError("resume=True needs a session_id")
            handle = await self.resume(session_id, options=options, setup=setup)
        else:
            handle = await self.create(session_id=session_id, options=options, setup=setup, cwd=cwd)
        async with handle as agent:
            yield agent

    async def _publish(
        self,
        session: Session,
        source: Literal["startup", "resume"],
        options: AgentOptions | None,
        setup: Setup | None,
        owner: Scope | None,
        parent: Agent | None,
    ) -> AgentHandle:
        sessions = self._sessions
        try:
            factory, factory_scope = self._require_factory()
            if owner is None and parent is not None:
                owner = parent.scope
            agent_scope = await factory_scope.open_child(f"agent:{session.id}")
        except BaseException:
            sessions.discard(session)
            raise
        session_entry: SessionEntry | None = None
        agent_entry: _AgentEntry | None = None

        # Registered first, so they unwind last: agent detach, then session detach.
        async def detach_session() -> None:
            if session_entry is not None:
                try:
                    await sessions.detach(session_entry)
                except SessionStoreError:
                    pass  # kept by the store: dispose() or the harness exit raises it

        def detach_agent() -> None:
            if agent_entry is not None:
                self._detach(agent_entry)

        agent_scope.add_exit_callback(detach_session)
        agent_scope.add_exit_callback(detach_agent)
        try:
            built = factory.build(
                session=session,
                options=options if options is not None else AgentOptions(),
                scope=agent_scope,
                harness=self._harness,
                parent_id=parent.id if parent is not None else None,
            )
            agent: Agent = built  # type: ignore[assignment]
            agent_scope.add_close_hook(built.dispose_hook)
            commit = await setup(agent) if setup is not None else None
            if owner is not None and owner.closing:
                raise AgentError(f"the owner scope of agent {session.id!r} closed during setup")
            if factory_scope.closing:
                raise FactoryError(f"the agent factory was unloaded while agent {session.id!r} was being set up")
            if commit is not None:
                commit()
            # Publication edge: no await from here to the return.
            if agent.id != session.id:
                raise AgentError(f"agent id {agent.id!r} differs from its session id {session.id!r}")
            if session.id in self._entries:
                raise AgentExistsError(f"agent {session.id!r} already exists")
            try:
                session_entry = sessions.enter(session)
            except SessionExistsError as exc:
                raise AgentExistsError(f"agent {session.id!r} already exists: {exc}") from exc
            agent_entry = _AgentEntry(agent=agent, owner=parent)
            self._entries[agent.id] = agent_entry
        except BaseException:
            with trio.CancelScope(shield=True):
                await agent_scope.close()
            sessions.discard(session)
            raise
        if owner is not None:
            remove = owner.add_exit_callback(agent_scope.close)
            agent_scope.add_exit_callback(remove)
        sessions.announce(session_entry)
        self._announce(agent_entry)
        if not agent_entry.detached:
            self._bus.emit("agent/session-start", agent, source=source)
        entry_for_handle = session_entry
        return AgentHandle(agent=agent, scope=agent_scope, take_failure=lambda: sessions.take_failure(entry_for_handle))

    def _announce(self, entry: _AgentEntry) -> None:
        if entry.announced or entry.detached or self._entries.get(entry.agent.id) is not entry:
            return
        entry.announced = True
        self._bus.emit("agent/created", entry.agent)

    def _detach(self, entry: _AgentEntry) -> None:
        if entry.detached:
            return
        entry.detached = True
        if self._entries.get(entry.agent.id) is entry:
            del self._entries[entry.agent.id]
        if entry.announced:
            self._bus.emit("agent/disposed", entry.agent)

    # ------------------------------------------------------------ queries

    def get(self, agent_id: str) -> Agent | None:
        """The live agent with this id, or None."""
        entry = self._entries.get(agent_id)
        return entry.agent if entry is not None else None

    def list(self) -> list[Agent]:
        """The live agents, in publication order."""
        return [entry.agent for entry in self._entries.values()]

    def __len__(self) -> int:
        return len(self._entries)

    def owner_of(self, agent_id: str) -> str | None:
        """The id of the live agent that owns ``agent_id`` at runtime, or None."""
        entry = self._entries.get(agent_id)
        if entry is None or entry.owner is None:
            return None
        return entry.owner.id

    def owned_by(self, agent_id: str) -> builtins.list[Agent]:
        """The live agents owned at runtime by agent ``agent_id``."""
        return [e.agent for e in self._entries.values() if e.owner is not None and e.owner.id == agent_id]
