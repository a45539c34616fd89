"""Lifecycle scopes: the nursery-owned tree every agent, service and plugin lives in.

A :class:`Scope` is a node in a tree.  It owns a Trio nursery (tasks spawned
into the scope) and a LIFO stack of exit callbacks.  Closing a scope:

1. closes its child scopes, newest first, each awaited;
2. cancels its nursery and awaits every task in it;
3. runs its exit callbacks, newest first.

So a child scope is completely closed before its parent's callbacks unwind, the
same order an ``AsyncExitStack`` wrapped around a nursery gives.  Teardown runs
in the scope's own runner task under a shield, bounded by ``teardown_timeout``
per callback, so a cancelled closer cannot leave it half done, and an error in a
callback is logged and contained: the remaining callbacks still run.

Scopes are obtained from :func:`open_scope` (a root, bound to an ``async with``
block) or :meth:`Scope.open_child`; they have no public constructor.

Code knows which scope it runs in: :func:`current_scope` returns the scope
whose task, plugin ``apply``, close hook or exit callback is running (a
:class:`contextvars.ContextVar` set by the scope itself), or None outside every
scope.  The agent registry uses it as the default teardown owner of an agent
(docs/lifecycle.rst, "Three owners, one teardown").
"""

from __future__ import annotations

import contextvars
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol, TypeVar

import attrs
import trio

from ._errors import PluginError, ScopeClosedError
from ._util import is_positive_number

__all__ = ["ExitCallback", "LoadedPlugin", "Plugin", "Scope", "current_scope", "open_scope"]

log = logging.getLogger("trio_harness.scope")

T = TypeVar("T")

ExitCallback = Callable[[], Awaitable[None] | None]
"""A callback run when a scope closes: sync, or async (awaited, shielded, bounded)."""

DEFAULT_TEARDOWN_TIMEOUT = 30.0

# The scope the running code belongs to.  Trio copies the spawner's context into
# a new task, so a scope sets this around every spawn into its nursery (the task
# then belongs to the scope, whoever spawned it), in its runner task (close
# hooks, exit callbacks) and around a plugin's ``apply``.
_current_scope: contextvars.ContextVar[Scope | None] = contextvars.ContextVar(
    "trio_harness_current_scope", default=None
)


def current_scope() -> Scope | None:
    """The scope whose task, plugin ``apply``, close hook or exit callback is running.

    None outside every scope (for example in the body of ``async with
    open_harness() as harness:``, which belongs to the caller, not to the
    harness's root scope).
    """
    return _current_scope.get()


class Plugin(Protocol):
    """Something that can be loaded into a scope.

    ``apply`` installs the plugin's contributions (tools, listeners, tasks) into
    the plugin's own child scope; everything registered there unwinds when the
    plugin is unloaded.
    """

    @property
    def name(self) -> str:
        """A unique name among the plugins of one scope."""
        ...

    async def apply(self, scope: Scope) -> None:
        """Install the plugin into ``scope``."""
        ...


@attrs.define(eq=False)
class LoadedPlugin:
    """A plugin loaded into a scope, with the child scope it lives in."""

    plugin: Plugin
    scope: Scope


async def _unwind(callbacks: list[ExitCallback | None], *, lifo: bool, where: str, bound: float) -> None:
    """Run (and consume) ``callbacks``; each awaitable one shielded and bounded by ``bound`` seconds.

    Errors are logged and contained; a callback still running after ``bound``
    is abandoned with a warning and the rest still run.  Synchronous callbacks
    cost no cancel scope and no checkpoint.
    """
    while callbacks:
        current = callbacks.pop() if lifo else callbacks.pop(0)
        if current is None:
            continue
        try:
            result = current()
        except Exception:
            log.exception("exit callback %r of scope %s failed", current, where)
            continue
        if not inspect.isawaitable(result):
            continue
        with trio.CancelScope(shield=True, deadline=trio.current_time() + bound) as shield:
            try:
                await result
            except Exception:
                log.exception("exit callback %r of scope %s failed", current, where)
        if shield.cancel_called:
            log.warning("exit callback %r of %s did not finish in %ss", current, where, bound)


@attrs.define(eq=False, repr=False)
class Scope:
    """A node of the lifecycle tree, owning a nursery and LIFO exit callbacks.

    Obtain one from :func:`open_scope` or :meth:`open_child`.
    """

    # Dotted path from the root, for messages and logs.
    name: str
    parent: Scope | None
    teardown_timeout: float
    # Set once by the runner before the scope is handed out; never replaced.
    _nursery: trio.Nursery = attrs.field(init=False, alias="_nursery")
    # Exit callbacks, run newest first; removed entries are set to None.
    _callbacks: list[ExitCallback | None] = attrs.field(factory=list, init=False)
    # Close hooks, run first (oldest first) when teardown starts, before children close.
    # Removed entries are set to None (and trailing ones dropped).
    _close_hooks: list[ExitCallback | None] = attrs.field(factory=list, init=False)
    # Open children in creation order; a child removes itself when closed.
    _children: dict[Scope, None] = attrs.field(factory=dict, init=False)
    # Loaded plugins by name.
    _plugins: dict[str, LoadedPlugin] = attrs.field(factory=dict, init=False)
    # Set to end a child scope's hold and start teardown (an Event, not a cancel
    # scope: cheaper to wait on and to release, and a child is opened per agent).
    _release: trio.Event = attrs.field(factory=trio.Event, init=False)
    # Set when close() was requested or teardown started: no new work accepted.
    _closing: bool = attrs.field(default=False, init=False)
    _closed: trio.Event = attrs.field(factory=trio.Event, init=False)

    def __repr__(self) -> str:
        state = "closed" if self._closed.is_set() else "closing" if self._closing else "open"
        return f"<Scope {self.name} {state}>"

    # ------------------------------------------------------------ state

    @property
    def closing(self) -> bool:
        """True once teardown was requested; new work is refused from then on."""
        return self._closing

    @property
    def closed(self) -> bool:
        """True once teardown has finished."""
        return self._closed.is_set()

    @property
    def children(self) -> tuple[Scope, ...]:
        """The open child scopes, oldest first."""
        return tuple(self._children)

    def encloses(self, task: trio.lowlevel.Task) -> bool:
        """Whether ``task`` runs in this scope's nursery, directly or nested.

        Closing the scope cancels such a task (after the close hooks and the
        child scopes).
        """
        nursery = task.parent_nursery
        while nursery is not None:
            if nursery is self._nursery:
                return True
            nursery = nursery.parent_task.parent_nursery
        return False

    def _check_open(self, what: str) -> None:
        if self._closing:
            raise ScopeClosedError(f"scope {self.name!r} is closing; cannot {what}")

    # ------------------------------------------------------------ work

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object, name: str | None = None) -> None:
        """Run ``fn(*args)`` as a task of this scope; it is cancelled when the scope closes."""
        self._check_open("spawn a task")
        token = _current_scope.set(self)  # the new task copies this context
        try:
            self._nursery.start_soon(fn, *args, name=name)
        finally:
            _current_scope.reset(token)

    async def start(self, fn: Callable[..., Awaitable[object]], *args: object, name: str | None = None) -> Any:
        """Like :meth:`trio.Nursery.start`: run ``fn`` in this scope and wait for it to start."""
        self._check_open("start a task")
        token = _current_scope.set(self)  # the new task copies this context
        try:
            return await self._nursery.start(fn, *args, name=name)
        finally:
            _current_scope.reset(token)

    def add_exit_callback(self, callback: ExitCallback) -> Callable[[], None]:
        """Register ``callback`` to run when the scope closes (LIFO).

        Returns:
            A function that removes the callback again (idempotent), for
            resources released before the scope closes.
        """
        self._check_open("add an exit callback")
        index = len(self._callbacks)
        self._callbacks.append(callback)

        def remove() -> None:
            if index < len(self._callbacks) and self._callbacks[index] is callback:
                self._callbacks[index] = None

        return remove

    def add_close_hook(self, hook: ExitCallback) -> Callable[[], None]:
        """Register ``hook`` to run first when the scope starts closing.

        Close hooks run oldest first, before child scopes close and before the
        nursery is cancelled: the place to stop a driver gracefully (an agent
        cancels its turn with cause ``disposed`` and waits for quiescence here).

        Returns:
            A function that removes the hook again (idempotent), for work that
            ends before the scope closes (an agent creation watching its owner).
        """
        self._check_open("add a close hook")
        hooks = self._close_hooks
        index = len(hooks)
        hooks.append(hook)
        removed = False

        def remove() -> None:
            nonlocal removed
            if removed:
                return
            removed = True
            if index < len(hooks) and hooks[index] is hook:
                hooks[index] = None
                while hooks and hooks[-1] is None:  # keep a long-lived scope's list short
                    hooks.pop()

        return remove

    async def enter_async_context(self, cm: AbstractAsyncContextManager[T]) -> T:
        """Enter ``cm`` in a task of this scope and keep it entered until the scope closes.

        The context manager is entered and exited by the same task (as Trio
        requires), and exits when the scope's nursery is cancelled.
        """

        async def hold(task_status: trio.TaskStatus[T]) -> None:
            async with cm as value:
                task_status.started(value)
                await trio.sleep_forever()

        result: T = await self.start(hold)
        return result

    # ------------------------------------------------------------ children

    async def open_child(self, name: str, *, teardown_timeout: float | None = None) -> Scope:
        """Open a child scope; it closes no later than this scope does."""
        self._check_open(f"open child scope {name!r}")
        child = Scope(
            name=f"{self.name}/{name}",
            parent=self,
            teardown_timeout=self.teardown_timeout if teardown_timeout is None else teardown_timeout,
        )
        # start_soon + an Event rather than nursery.start: start() opens a
        # temporary nursery per call, which made it the largest cost of
        # creating an agent.  The runner sets ``ready`` in its first step.
        ready = trio.Event()
        token = _current_scope.set(child)  # the runner (hooks, callbacks) belongs to the child
        try:
            self._nursery.start_soon(child._run_child, ready, name=f"scope {child.name}")
        finally:
            _current_scope.reset(token)
        try:
            await ready.wait()
        except BaseException:
            # The opener was cancelled: nobody will own this child, so close it.
            with trio.CancelScope(shield=True):
                await ready.wait()
                await child.close()
            raise
        return child

    async def _run_child(self, ready: trio.Event) -> None:
        assert self.parent is not None
        self.parent._children[self] = None
        try:
            async with self._lifetime():
                ready.set()
                await self._release.wait()
        finally:
            self.parent._children.pop(self, None)
            ready.set()  # never leave an opener waiting

    @asynccontextmanager
    async def _lifetime(self) -> AsyncIterator[None]:
        """The nursery and teardown shared by root and child scopes."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    yield
                finally:
                    self._closing = True
                    if self._close_hooks:
                        hooks: list[ExitCallback | None] = list(self._close_hooks)
                        self._close_hooks.clear()
                        await _unwind(hooks, lifo=False, where=self.name, bound=self.teardown_timeout)
                    if self._children:
                        with trio.CancelScope(shield=True):
                            for child in reversed(tuple(self._children)):
                                await child.close()
                    nursery.cancel_scope.cancel()
        finally:
            self._closing = True
            await _unwind(self._callbacks, lifo=True, where=self.name, bound=self.teardown_timeout)
            self._plugins.clear()
            self._closed.set()

    async def close(self) -> None:
        """Close the scope and wait until its teardown finished (idempotent).

        Teardown itself runs shielded in the scope's runner; cancelling the
        caller only stops the caller's wait.  Closing a root scope from inside
        its own block is not possible: leave the ``async with`` block instead.
        """
        if self._closed.is_set():
            return
        if self.parent is None:
            raise ScopeClosedError(f"root scope {self.name!r} closes when its async with block exits")
        self._closing = True
        self._release.set()
        await self._closed.wait()

    # ------------------------------------------------------------ plugins

    @property
    def plugins(self) -> dict[str, LoadedPlugin]:
        """The plugins loaded into this scope, by name (a copy)."""
        return dict(self._plugins)

    async def load(self, plugin: Plugin) -> LoadedPlugin:
        """Load ``plugin`` into a new child scope.

        If ``apply`` raises, the child scope is closed (everything it registered
        unwinds) and a :class:`PluginError` naming the plugin is raised.
        """
        if plugin.name in self._plugins:
            raise PluginError(f"a plugin named {plugin.name!r} is already loaded in {self.name!r}")
        child = await self.open_child(f"plugin:{plugin.name}")
        token = _current_scope.set(child)  # what apply creates belongs to the plugin
        try:
            await plugin.apply(child)
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                await child.close()
            if isinstance(exc, Exception):
                raise PluginError(f"plugin {plugin.name!r} failed to load: {exc!r}") from exc
            raise
        finally:
            _current_scope.reset(token)
        loaded = LoadedPlugin(plugin=plugin, scope=child)
        if plugin.name in self._plugins:  # a concurrent load won the name
            with trio.CancelScope(shield=True):
                await child.close()
            raise PluginError(f"a plugin named {plugin.name!r} is already loaded in {self.name!r}")
        self._plugins[plugin.name] = loaded
        return loaded

    async def unload(self, name: str) -> None:
        """Unload the plugin ``name``: close its scope and await its teardown."""
        loaded = self._plugins.pop(name, None)
        if loaded is None:
            raise PluginError(f"no plugin named {name!r} is loaded in {self.name!r}")
        await loaded.scope.close()

    async def reload(self, plugin: Plugin) -> LoadedPlugin:
        """Unload the plugin of the same name (if loaded), then load ``plugin``."""
        if plugin.name in self._plugins:
            await self.unload(plugin.name)
        return await self.load(plugin)


@asynccontextmanager
async def open_scope(name: str = "root", *, teardown_timeout: float = DEFAULT_TEARDOWN_TIMEOUT) -> AsyncIterator[Scope]:
    """Open a root scope bound to the ``async with`` block.

    Leaving the block closes the scope: children newest first, then the
    nursery's tasks, then the exit callbacks newest first.
    """
    if not is_positive_number(teardown_timeout):
        raise ValueError(f"teardown_timeout must be positive, got {teardown_timeout!r}")
    scope = Scope(name=name, parent=None, teardown_timeout=teardown_timeout)
    body_error: BaseException | None = None
    unwrapped: BaseException | None = None
    token: contextvars.Token[Scope | None] | None = None
    try:
        async with scope._lifetime():
            try:
                yield scope
            except BaseException as exc:
                body_error = exc
                raise
            finally:
                # The block belongs to the caller; the teardown (close hooks,
                # exit callbacks) that follows runs in the root scope.
                token = _current_scope.set(scope)
    except BaseExceptionGroup as group:
        # The block's own exception comes back wrapped by the nursery; give the
        # caller the exception they raised when nothing else failed.
        # It is raised below, outside this handler, so that its own
        # ``__cause__`` and ``__context__`` stay what the block gave them.
        if not (body_error is not None and len(group.exceptions) == 1 and group.exceptions[0] is body_error):
            raise
        unwrapped = body_error
    finally:
        if token is not None:
            _current_scope.reset(token)
    if unwrapped is not None:
        try:
            raise unwrapped
        finally:
            unwrapped = body_error = None  # no reference cycle through this frame
