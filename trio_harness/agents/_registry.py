"""The agent registry (``harness.agents``), the factory slot, and AgentHandle.

Create and resume share one atomic publication pipeline (docs/lifecycle.rst,
"Create and resume: one atomic pipeline"):

1. prepare the session (fresh, or loaded and recovered) — nobody can see it;
   preparing a fresh one claims its id in the store, so a same-id create (in
   any process sharing the store) is refused here, before setup;
2. prepare the agent: its own scope (a child of the factory's scope), inbox
   and driver, with the teardown chain registered first so it unwinds last;
3. ``await setup(agent)`` while both registries still return nothing;
4. run setup's synchronous ``commit()`` (the last failable step);
5. enter the session registry, then the agent registry (same-id arbitration);
6. announce ``session/created``, ``agent/created``, ``agent/session-start``;
7. return the :class:`AgentHandle`.

Any failure or cancellation before step 5 completes closes the agent scope
and discards the session: nothing is published, the id is free again.  The
owner scope (or the factory's scope) starting to close cancels steps 1-3 at
once; its teardown waits until that rollback is done.  The owner defaults to
the scope the caller runs in (:func:`~trio_harness._scope.current_scope`).

Teardown is the agent scope closing, whoever starts it (the handle, the
caller's scope, the factory's scope): the close hook cancels the driver with
cause ``disposed`` and waits for quiescence; child scopes and scoped resources
unwind (tools, owned tasks); then the agent leaves the registry
(``agent/disposed``) and finally the session is flushed and detached
(``session/disposed``).  Scope close is memoized and shielded.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Literal, Protocol

import attrs
import trio

from .._construct import NoPublicConstructor
from .._errors import (
    AgentError,
    AgentExistsError,
    FactoryError,
    InvalidSessionIdError,
    SessionExistsError,
    SessionStoreError,
)
from .._scope import Scope, current_scope
from ..session._events import InboxMessage
from ..session._session import validate_session_id
from ._agent import Agent
from ._options import AgentOptions
from ._remote_control import apply_control

if TYPE_CHECKING:
    from .._bus import EventBus
    from ..session._control import Control
    from ..session._registry import SessionEntry, SessionRegistry
    from ..session._session import Session


Setup = Callable[["Agent"], Awaitable["Callable[[], None] | None"]]
"""``async def setup(agent) -> commit | None``: compose the agent's world (never drive it)."""


class LoopAgent(Agent, Protocol):
    """What a factory builds: an :class:`Agent` plus the close hook that quiesces it.

    The registry adds ``dispose_hook`` as a close hook of the agent's scope:
    it runs first when any owner (the handle, the caller's scope, the
    factory's scope) starts the teardown, before the scope's children and
    exit callbacks unwind.
    """

    def dispose_hook(self) -> Awaitable[None] | None:
        """Cancel the driver with cause ``disposed``; the awaitable (if any) waits for quiescence."""
        ...


class AgentFactory(Protocol):
    """Builds agents for the registry (the loop implementation fills this slot).

    The public seam for a loop of your own: ``open_harness(builtin_loop=False)``
    leaves the slot empty and :meth:`AgentRegistry.register_factory` fills it;
    consumers (``harness.agents``, the ACP bridge, the ``subagent`` tool) do
    not change.  A factory is given the services its agents use when it is made (the
    default :class:`~trio_harness.agents.ReactLoopFactory` takes the bus, the
    shared tool set, the registry and the default model); ``build`` receives
    only what differs per agent.
    """

    async def build(
        self,
        *,
        session: Session,
        options: AgentOptions,
        scope: Scope,
        parent_id: str | None,
    ) -> LoopAgent:
        """Construct (but do not start) an agent around ``session`` in ``scope``.

        Resources the agent alone uses (e.g. a model built from a spec) are
        entered into ``scope``, which closes them with the agent.
        """
        ...


@attrs.define(eq=False)
class _AgentEntry:
    agent: Agent
    owner: Agent | None
    announced: bool = False
    detached: bool = False

    # The session registry's routes to the live agent, as bound methods of this entry: 64 B each
    # per idle agent where a functools.partial costs ~190 B (bench/bench_agents.py, memory figure).
    def deliver(self, message: InboxMessage) -> None:
        _deliver(self.agent, message)

    def control(self, control: Control, applied: Callable[[], None]) -> None:
        apply_control(self.agent, control, applied)


def _deliver(agent: Agent, message: InboxMessage) -> None:
    """Splice a message posted to the agent's session into its inbox (``SessionRegistry.post``).

    An agent with ``deliver_posted`` (the built-in loop) acts on it only once
    its splice is stored; another loop gets it through ``send`` and acts at once.
    """
    deliver_posted = getattr(agent, "deliver_posted", None)
    if deliver_posted is not None:
        deliver_posted(message)
    else:
        agent.send(message, mode=message.mode)


def _text_path(cwd: object) -> str:
    """``cwd`` as the str a session header records, or a TypeError naming it."""
    path = os.fspath(cwd) if isinstance(cwd, os.PathLike) else cwd
    if not isinstance(path, str):
        raise TypeError(f"cwd must be a str (a directory path), got {type(cwd).__name__} {cwd!r:.80}")
    return str.__str__(path)


@attrs.define(eq=False)
class _Abort:
    """Cancels one create / resume pipeline when a scope it depends on starts closing.

    A close hook on each watched scope (the owner, the factory's scope) cancels
    the pipeline's awaits (loading, setup) and makes that scope's teardown wait
    until the pipeline has rolled back, so the id is free when the close returns
    (docs/guarantees.rst, "Publication").
    """

    factory_scope: Scope
    # Scopes whose closing cancels the calling task anyway.
    enclosing: tuple[Scope, ...] = ()
    # The scope whose closing cancelled the pipeline, if any.
    closed_by: Scope | None = None
    _scopes: list[trio.CancelScope] = attrs.field(factory=list)
    _removers: list[Callable[[], None]] = attrs.field(factory=list)
    _done: trio.Event = attrs.field(factory=trio.Event)

    def watch(self, scope: Scope) -> None:
        def hook() -> Awaitable[None] | None:
            if self._done.is_set() or any(outer.closing for outer in self.enclosing):
                return None  # over, or the caller is about to be cancelled by its own scope
            if self.closed_by is None:
                self.closed_by = scope
            for cancel_scope in self._scopes:
                cancel_scope.cancel()
            return self._done.wait()

        self._removers.append(scope.add_close_hook(hook))

    def guard(self) -> trio.CancelScope:
        """A cancel scope for one await of the pipeline (already cancelled once aborted)."""
        cancel_scope = trio.CancelScope()
        if self.closed_by is not None:
            cancel_scope.cancel()
        self._scopes.append(cancel_scope)
        return cancel_scope

    def finish(self) -> None:
        """The pipeline published or rolled back: release the watched scopes."""
        for remove in self._removers:
            remove()
        self._removers.clear()
        self._scopes.clear()
        self._done.set()


@attrs.define(eq=False, repr=False)
class AgentHandle(metaclass=NoPublicConstructor, public_way="harness.agents.create() or resume()"):
    """The teardown capability for one agent, held by whoever created or resumed it.

    Returned by :meth:`~trio_harness.agents.AgentRegistry.create` and
    :meth:`~trio_harness.agents.AgentRegistry.resume` (the class has no public
    constructor).  ``dispose()`` is idempotent and memoized: every owner awaits the same
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
    """Live agents of a harness and the create / resume pipeline.

    It uses two services: the session registry (sessions are prepared, entered
    and detached there) and the bus (``agent/*`` notices).  Agents are built
    by the factory registered with :meth:`register_factory`.
    """

    _sessions: SessionRegistry = attrs.field(alias="sessions")
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
        cwd: str | os.PathLike[str] | None = None,
    ) -> AgentHandle:
        """Create a fresh agent around a new session and publish it atomically.

        Args:
            session_id: the id (default: a random one); must not be live or stored.
            options: model route and limits.
            setup: composes the agent's world before publication (see :data:`Setup`).
            owner: a scope whose closing disposes the agent; closing it during
                creation cancels the creation.  Default: the parent's scope when
                ``parent`` is given, else the scope the caller runs in (a
                plugin's ``apply``, a task of a scope), else none.
            parent: the agent creating this one (runtime ownership).
            cwd: the working directory recorded in the session header (a str
                or an ``os.PathLike`` of str).

        Raises:
            InvalidSessionIdError: the id is not a usable session id.
            TypeError: ``cwd``, ``options``, ``owner`` or ``setup`` has the wrong type.
            AgentExistsError: the id is live, being created (in this process or
                another one sharing the store), or stored (resume it instead);
                raised before setup and before any model request.
            AgentError: the owner scope is closing, or closed during creation.
            FactoryError: no factory is registered.
            SessionStoreError: the store cannot be written (checked before setup).
        """
        if session_id is not None:
            validate_session_id(session_id)
        if cwd is not None:
            cwd = _text_path(cwd)
        owner = self._check_request(session_id, options, setup, owner, parent)
        self._require_factory()
        if session_id is not None and session_id in self._entries:
            raise AgentExistsError(f"agent {session_id!r} already exists")
        await self._sessions.check()  # a store that cannot be written fails before any model call
        try:
            session = await self._sessions.prepare_new(
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

        ``owner`` and ``parent`` work as for :meth:`create`; closing the owner
        while the log loads or setup runs cancels the resume.

        Raises:
            InvalidSessionIdError: the id is not a usable session id.
            AgentExistsError: the session's agent is live in this process, or
                in another one (its log is locked: the cause is a
                :exc:`SessionLockedError`).
            AgentError: the owner scope is closing, or closed during the resume.
            SessionNotFoundError: nothing is stored under this id.
            SessionStoreError: the store cannot be written, or the stored
                log is not a regular file in a real directory of the store.
            SessionCorruptError: the stored log is damaged.
        """
        validate_session_id(session_id)
        owner = self._check_request(session_id, options, setup, owner, parent)
        _, factory_scope = self._require_factory()
        if session_id in self._entries or self._sessions.get(session_id) is not None:
            raise AgentExistsError(f"agent {session_id!r} is live; dispose it before resuming its session")
        await self._sessions.check()
        abort = self._watch(owner, factory_scope)
        session: Session | None = None
        try:
            with abort.guard():
                session = await self._sessions.prepare_resume(session_id)
            if abort.closed_by is not None or session is None:
                raise self._closed_error(abort, session_id, "while its log was loading")
        except SessionExistsError as exc:
            abort.finish()
            raise AgentExistsError(str(exc)) from exc
        except BaseException:
            if session is not None:
                await self._sessions.discard(session)
            abort.finish()
            raise
        return await self._publish(session, "resume", options, setup, owner, parent, abort)

    @asynccontextmanager
    async def open(
        self,
        *,
        session_id: str | None = None,
        options: AgentOptions | None = None,
        setup: Setup | None = None,
        resume: bool = False,
        cwd: str | os.PathLike[str] | None = None,
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

    def _check_request(
        self,
        session_id: str | None,
        options: AgentOptions | None,
        setup: Setup | None,
        owner: Scope | None,
        parent: Agent | None,
    ) -> Scope | None:
        """Check the arguments of a create / resume; return the owner scope to use."""
        if options is not None and not isinstance(options, AgentOptions):
            raise TypeError(f"options must be an AgentOptions, got {type(options).__name__}")
        if setup is not None and not callable(setup):
            raise TypeError(f"setup must be an async function of the agent, got {type(setup).__name__}")
        if owner is not None and not isinstance(owner, Scope):
            raise TypeError(f"owner must be a Scope, got {type(owner).__name__}")
        implicit = owner is None and parent is None
        if owner is None:
            owner = parent.scope if parent is not None else current_scope()
        if owner is not None and owner.closing:
            which = "the scope this code runs in" if implicit else "its owner scope"
            name = repr(session_id) if session_id is not None else "(new)"
            raise AgentError(
                f"cannot create or resume agent {name}: {which} {owner.name!r} is closing"
                + ("; pass owner= to choose a scope that stays open" if implicit else "")
            )
        return owner

    def _watch(self, owner: Scope | None, factory_scope: Scope) -> _Abort:
        # Scopes whose nursery runs the caller cancel the caller themselves when
        # they close (after their close hooks and children): such a closing must
        # not be turned into an error, nor wait for a caller not cancelled yet.
        task = trio.lowlevel.current_task()
        enclosing: list[Scope] = []
        scope = current_scope()
        while scope is not None:
            if scope.encloses(task):
                enclosing.append(scope)
            scope = scope.parent
        abort = _Abort(factory_scope=factory_scope, enclosing=tuple(enclosing))
        if owner is not None and owner is not factory_scope and not owner.encloses(task):
            abort.watch(owner)
        if not factory_scope.encloses(task):
            abort.watch(factory_scope)
        return abort

    @staticmethod
    def _closed_error(abort: _Abort, session_id: str, when: str) -> AgentError:
        closed = abort.closed_by
        if closed is None or closed is abort.factory_scope:
            return FactoryError(f"the agent factory was unloaded {when} (agent {session_id!r}); nothing was published")
        return AgentError(
            f"agent {session_id!r} was not created: its owner scope {closed.name!r} closed {when}; "
            "nothing was published and the id is free"
        )

    async def _publish(
        self,
        session: Session,
        source: Literal["startup", "resume"],
        options: AgentOptions | None,
        setup: Setup | None,
        owner: Scope | None,
        parent: Agent | None,
        abort: _Abort | None = None,
    ) -> AgentHandle:
        sessions = self._sessions
        try:
            factory, factory_scope = self._require_factory()
            if owner is None and parent is not None:
                owner = parent.scope
            if abort is None and setup is not None:  # without setup nothing here waits long
                abort = self._watch(owner, factory_scope)
            agent_scope = await factory_scope.open_child(f"agent:{session.id}")
        except BaseException:
            await sessions.discard(session)
            if abort is not None:
                abort.finish()
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
            agent = await factory.build(
                session=session,
                options=options if options is not None else AgentOptions(),
                scope=agent_scope,
                parent_id=parent.id if parent is not None else None,
            )
            agent_scope.add_close_hook(agent.dispose_hook)
            commit: Callable[[], None] | None = None
            if setup is not None:
                assert abort is not None
                # The owner or the factory closing cancels setup (docs/guarantees.rst, "Publication").
                with abort.guard():
                    commit = await setup(agent)
            if abort is not None and abort.closed_by is not None:
                raise self._closed_error(abort, session.id, "during setup")
            if owner is not None and owner.closing:
                raise AgentError(
                    f"agent {session.id!r} was not created: its owner scope {owner.name!r} closed during setup; "
                    "nothing was published and the id is free"
                )
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
            sessions.receive(session_entry, agent_entry.deliver, agent_entry.control)
        except BaseException:
            try:
                with trio.CancelScope(shield=True):
                    await agent_scope.close()
                await sessions.discard(session)
            finally:
                if abort is not None:
                    abort.finish()
            raise
        if abort is not None:
            abort.finish()
        if owner is not None:
            remove = owner.add_exit_callback(agent_scope.close)
            agent_scope.add_exit_callback(remove)
        sessions.announce(session_entry)
        self._announce(agent_entry)
        if not agent_entry.detached:
            self._bus.emit("agent/session-start", agent, source=source)
        if source == "resume":
            await sessions.deliver_waiting(session_entry)  # a decision posted meanwhile answers the paused call
            _resume_pending(agent)
        entry_for_handle = session_entry
        return AgentHandle._create(
            agent=agent, scope=agent_scope, take_failure=lambda: sessions.take_failure(entry_for_handle)
        )

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

    @staticmethod
    def _check_id(agent_id: object) -> None:
        if not isinstance(agent_id, str):
            raise InvalidSessionIdError(f"an agent id is a session id, a string; got {type(agent_id).__name__}")

    def get(self, agent_id: str) -> Agent | None:
        """The live agent with this id, or None.

        Raises:
            InvalidSessionIdError: ``agent_id`` is not a string.
        """
        self._check_id(agent_id)
        entry = self._entries.get(agent_id)
        return entry.agent if entry is not None else None

    def list(self) -> list[Agent]:
        """The live agents, in publication order."""
        return [entry.agent for entry in self._entries.values()]

    def __len__(self) -> int:
        return len(self._entries)

    def owner_of(self, agent_id: str) -> str | None:
        """The id of the live agent that owns ``agent_id`` at runtime, or None."""
        self._check_id(agent_id)
        entry = self._entries.get(agent_id)
        if entry is None or entry.owner is None:
            return None
        return entry.owner.id

    def owned_by(self, agent_id: str) -> builtins.list[Agent]:
        """The live agents owned at runtime by agent ``agent_id``."""
        self._check_id(agent_id)
        return [e.agent for e in self._entries.values() if e.owner is not None and e.owner.id == agent_id]


def _resume_pending(agent: Agent) -> None:
    """A resumed agent starts the work its log left pending now: a paused turn, a followup (docs/inbox.rst)."""
    start = getattr(agent, "resume_pending", None)
    if callable(start):
        start()
