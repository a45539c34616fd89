"""Foreground ``bash`` in the client's terminal: ``terminal/create``, ``output``, ``wait_for_exit``, ``kill``...

When the client's ``initialize`` advertises ``clientCapabilities.terminal``,
every session of the connection gets a :class:`TerminalRunner` as its
agents' ``bash_runner`` (``AgentOptions.bash_runner``): a foreground command
runs as ``[shell, "-c", command]`` in a terminal the client creates, in the
command's working directory, with ``outputByteLimit`` the executor's tail.
The terminal is embedded in the call's ``tool_call_update``
(``{"type": "terminal", "terminalId"}``) as soon as it exists, so the user
watches it live; the call's final update shows the terminal and the text the
model got.

The model-facing result has the executor's shape (:class:`~trio_harness.bash.BashResult`,
rendered by the ``bash`` tool): the terminal's output (it merges standard
output and error), ``[exit code: N]`` or ``[killed by signal ...]``, and a
timeout after the spec's ``timeout`` (the terminal is killed, then its output
read).  A cancelled call (``session/cancel``, the session closed, the
connection gone) kills the terminal and releases it; every terminal is
released once its call ends, whatever happened, so none is left behind:
while the client's answers are read, each cleanup request waits for its
answer (bounded by :data:`CLEANUP_TIMEOUT`); once they are not (end of input,
the server shutting down), kill and release are sent without waiting; once
the client stopped reading, nothing is sent.  A ``terminal/create`` answered
after its call gave up (cancelled, or past its bound) is killed and released
when that answer arrives (``on_late`` of
:meth:`~trio_harness.acp._jsonrpc.OutgoingRequests.call`).  A client that
sends more output than ``outputByteLimit`` is cut to that tail.

Background commands and sessions under a bash sandbox stay with the local
executor: a background command must outlive a request, and the client's
terminal is not sandboxed (docs/acp.rst, "Terminals").
"""

from __future__ import annotations

import functools
import logging
import signal as _signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from .._errors import BashError
from ..bash._records import BashResult
from . import _jsonrpc as rpc
from ._updates import shorten, tool_call_id

if TYPE_CHECKING:
    from ..agents._agent import Agent
    from ..agents._tools import ToolContext
    from ..bash._records import BashSpec

log = logging.getLogger("trio_harness.acp")

CLEANUP_TIMEOUT: Final = 5.0
"""How long a cancelled call waits for the client to answer ``terminal/kill`` and ``terminal/release``."""

_TRUNCATED: Final = "[output truncated: earlier output not shown]\n"


def _signal_number(name: object) -> int | None:
    if not isinstance(name, str) or not name:
        return None
    try:
        return int(_signal.Signals[name if name.startswith("SIG") else f"SIG{name}"])
    except KeyError:  # a signal this platform does not name
        return None


@attrs.define(eq=False)
class TerminalRunner:
    """Runs foreground ``bash`` commands of a connection's sessions in the client's terminals.

    Attributes:
        requests: the connection's requests to the client (their answers routed by its reader).
        post: queues one outgoing message.
        session_of: the session serving an agent (None: not this connection's).
        update: sends a ``session/update`` for a session.
        connected: whether the connection still writes (False once the client stopped reading).
        answers: whether the client's answers are still read (False once the reader stopped:
            end of input, or the server shutting down); without, cleanup requests are sent
            without waiting for answers that cannot arrive.
        shell: the shell the command line is given to (``[shell, "-c", command]``).
        output_limit: the ``outputByteLimit`` of each terminal.
    """

    requests: rpc.OutgoingRequests
    post: Callable[[dict[str, Any]], None]
    session_of: Callable[[Agent], str | None]
    update: Callable[[str, dict[str, Any]], None]
    connected: Callable[[], bool]
    answers: Callable[[], bool]
    shell: str
    output_limit: int
    # The terminal of each call, by (session, toolCallId), until its final update shows it (``decorate``).
    terminals: dict[tuple[str, str], str] = attrs.field(factory=dict)
    # Terminals created and not yet released (a test and a leak check read it).
    live: set[str] = attrs.field(factory=set)
    # The cleanup requests waiting for their answers (``answers_stopped`` ends them).
    _cleanup_waits: set[trio.CancelScope] = attrs.field(factory=set, init=False)

    async def _request(
        self, method: str, params: dict[str, Any], on_late: Callable[[rpc.Response], None] | None = None
    ) -> dict[str, Any]:
        response = await self.requests.call(self.post, method, params, on_late=on_late)
        if response.error is not None:
            detail = response.error.get("message") if isinstance(response.error, dict) else None
            raise BashError(f"the client's {method} failed: {shorten(str(detail or response.error), 300)}")
        result = response.result
        return result if isinstance(result, dict) else {}

    async def __call__(self, ctx: ToolContext, spec: BashSpec) -> BashResult:
        """Run ``spec`` in a terminal of the client; the result the executor would give."""
        session_id = self.session_of(ctx.agent)
        if session_id is None:
            raise BashError("no ACP session of this connection serves this agent, so no terminal can run the command")
        call_id = tool_call_id(ctx.turn, ctx.call_id)
        if ctx.agent.id != session_id:
            call_id = f"{ctx.agent.id}/{call_id}"
        created: dict[str, Any] | None = None
        params: dict[str, Any] = {
            "sessionId": session_id,
            "command": self.shell,
            "args": ["-c", spec.command],
            "cwd": spec.workdir,
            "outputByteLimit": self.output_limit,
        }
        if spec.env:
            params["env"] = [{"name": name, "value": value} for name, value in spec.env.items()]
        # A cancel or the bound ends the wait at once; a terminal the client creates anyway
        # (its answer comes late) is killed and released when that answer arrives.
        bound = max(spec.timeout, CLEANUP_TIMEOUT)
        with trio.move_on_after(bound):
            created = await self._request(
                "terminal/create", params, on_late=functools.partial(self._created_late, session_id)
            )
        if created is None:
            raise BashError(
                f"the client did not answer terminal/create within {bound:g}s; the command did not run "
                "(a terminal the client creates later is killed and released)"
            )
        terminal_id = created.get("terminalId")
        if not isinstance(terminal_id, str) or not terminal_id:
            raise BashError(f"the client's terminal/create answered no terminalId: {shorten(repr(created), 200)}")
        self.live.add(terminal_id)
        key = (session_id, call_id)
        self.terminals[key] = terminal_id
        ids = {"sessionId": session_id, "terminalId": terminal_id}
        exited = False
        try:
            await trio.lowlevel.checkpoint_if_cancelled()  # cancelled while creating: kill and release
            self.update(
                session_id,
                {
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": call_id,
                    "content": [{"type": "terminal", "terminalId": terminal_id}],
                },
            )
            timed_out = False
            status: dict[str, Any] | None = None
            with trio.move_on_after(spec.timeout):
                status = await self._request("terminal/wait_for_exit", ids)
            if status is None:
                timed_out = True
                # Bounded: a client that never answers after the kill must not hold the call past its timeout.
                with trio.move_on_after(CLEANUP_TIMEOUT):
                    await self._request("terminal/kill", ids)
                    status = await self._request("terminal/wait_for_exit", ids)
                if status is None:
                    raise BashError(
                        f"the command timed out and the client did not answer terminal/kill and "
                        f"terminal/wait_for_exit within {CLEANUP_TIMEOUT:g}s"
                    )
            exited = True
            output = None
            with trio.move_on_after(CLEANUP_TIMEOUT):
                output = await self._request("terminal/output", ids)
            if output is None:
                raise BashError(f"the client did not answer terminal/output within {CLEANUP_TIMEOUT:g}s")
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._release(ids, kill=not exited)
            raise
        with trio.CancelScope(shield=True):
            await self._release(ids, kill=False)
        text = output.get("output")
        text = text if isinstance(text, str) else ""
        # A client that ignores outputByteLimit: the model still gets the tail the executor would keep.
        data = text.encode("utf-8", "surrogatepass")
        dropped = max(0, len(data) - self.output_limit)
        if dropped:
            text = data[dropped:].decode("utf-8", "ignore")
        elif output.get("truncated") is True:
            text = _TRUNCATED + text
        exit_code = status.get("exitCode")
        return BashResult(
            stdout=text,
            stderr="",
            exit_code=exit_code if type(exit_code) is int else None,
            signal=_signal_number(status.get("signal")),
            timed_out=timed_out,
            stdout_dropped=dropped,
            stderr_dropped=0,
            timeout=spec.timeout,
        )

    def decorate(self, session_id: str, update: dict[str, Any]) -> dict[str, Any]:
        """A call's final ``tool_call_update`` showing its terminal before the text (the terminal stays visible)."""
        if update.get("sessionUpdate") != "tool_call_update" or update.get("status") not in ("completed", "failed"):
            return update
        terminal_id = self.terminals.pop((session_id, str(update.get("toolCallId"))), None)
        if terminal_id is None:
            return update
        content = [{"type": "terminal", "terminalId": terminal_id}, *update.get("content", ())]
        return {**update, "content": content}

    def _created_late(self, session_id: str, response: rpc.Response) -> None:
        """A ``terminal/create`` answered after its call gave up: kill and release that terminal."""
        result = response.result
        terminal_id = result.get("terminalId") if isinstance(result, dict) and response.error is None else None
        if not isinstance(terminal_id, str) or not terminal_id:
            return  # no terminal came of it (an error, e.g. the client honoured the $/cancel_request)
        log.info("acp: terminal %r was created after its call ended; killing and releasing it", terminal_id)
        self._send_cleanup({"sessionId": session_id, "terminalId": terminal_id}, kill=True)

    def _send_cleanup(self, ids: dict[str, Any], *, kill: bool) -> None:
        """Send kill (when still running) and release without waiting for their answers (bounded: no wait)."""
        self.live.discard(ids["terminalId"])
        if not self.connected():
            return
        for method in ("terminal/kill", "terminal/release") if kill else ("terminal/release",):
            self.requests.send_only(self.post, method, ids)

    async def _release(self, ids: dict[str, Any], *, kill: bool) -> None:
        """Kill (when still running) and release a terminal; bounded, and nothing to send once disconnected."""
        terminal_id = ids["terminalId"]
        self.live.discard(terminal_id)
        if not self.connected():
            return
        if not self.answers():
            # Shutting down, or the client closed its side: nobody reads its answers any more,
            # but it may still read ours, so its terminal is released all the same.
            self._send_cleanup(ids, kill=kill)
            return
        for method in ("terminal/kill", "terminal/release") if kill else ("terminal/release",):
            if not self.answers():  # the reader stopped meanwhile (answers_stopped)
                self.requests.send_only(self.post, method, ids)
                continue
            # Each bounded on its own: a kill the client never answers must not cost the release.
            with trio.move_on_after(CLEANUP_TIMEOUT) as waiting:
                self._cleanup_waits.add(waiting)
                try:
                    await self._request(method, ids)
                except (BashError, rpc.PeerGoneError) as exc:
                    log.info("acp: %s of terminal %r: %s", method, terminal_id, exc)
                    if isinstance(exc, rpc.PeerGoneError):
                        return
                finally:
                    self._cleanup_waits.discard(waiting)

    def answers_stopped(self) -> None:
        """The client's answers are no longer read: the cleanup waits end now, the rest is sent without waiting."""
        for waiting in list(self._cleanup_waits):
            waiting.cancel()
