"""The editor's file system: the file tools of a session through ``fs/read_text_file`` / ``fs/write_text_file``.

A client that advertises ``clientCapabilities.fs.readTextFile`` (or
``writeTextFile``) in ``initialize`` gets, for every session of the
connection, the file tools' reads (writes) as agent-to-client requests, so
the agent sees the editor's unsaved buffers and its edits land in the editor
(docs/editors.rst).  Each capability is used on its own: a client that only
reads gets local writes.  The sandbox's path rules are checked before either
(:mod:`trio_harness.tools._files`).

Each request is bounded by the server's ``fs_timeout`` (:data:`FS_TIMEOUT` by
default): an editor that does not answer in time fails the call with an error
naming the request and the bound (for a write: its outcome is unknown), and
its late answer is dropped.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from ..tools._files import file_tools_in
from ..tools._files_fs import FileContent, FileToolError, LocalFileSystem, check_text, encode_text
from ._jsonrpc import PeerGoneError, discarded

if TYPE_CHECKING:
    from ..agents._agent import Agent
    from ..agents._tools import ToolSet
    from ._jsonrpc import Response

log = logging.getLogger("trio_harness.acp")

Call = Callable[..., Awaitable["Response"]]
"""Sends a request to the client and waits for its response (``OutgoingRequests.call`` bound to the outbox)."""

FS_TIMEOUT: Final = 30.0
"""The default bound (seconds) on the editor's answer to one ``fs/read_text_file`` or ``fs/write_text_file``."""


@attrs.frozen
class ClientFs:
    """Which ``fs`` methods the client offers (``clientCapabilities.fs``)."""

    read: bool = False
    write: bool = False

    @property
    def any(self) -> bool:
        """Whether the client offers either."""
        return self.read or self.write


def client_fs(params: object) -> ClientFs:
    """The ``fs`` capabilities of an ``initialize`` request's raw params (absent or malformed: none)."""
    caps = params.get("clientCapabilities") if isinstance(params, Mapping) else None
    fs = caps.get("fs") if isinstance(caps, Mapping) else None
    if not isinstance(fs, Mapping):
        return ClientFs()
    return ClientFs(read=fs.get("readTextFile") is True, write=fs.get("writeTextFile") is True)


def _message(error: object) -> str:
    message = error.get("message") if isinstance(error, Mapping) else None
    return message if isinstance(message, str) and message else repr(error)[:200]


@attrs.frozen
class ClientFileSystem:
    """A :class:`~trio_harness.tools._files_fs.FileSystem` backed by the ACP client (for the methods it offers)."""

    session_id: str
    call: Call
    caps: ClientFs
    local: LocalFileSystem
    timeout: float = FS_TIMEOUT

    async def _ask(self, method: str, path: str, params: dict[str, Any]) -> Response | None:
        """The editor's answer to ``method`` about ``path``; None when it did not come within the bound."""
        response: Response | None = None
        late = functools.partial(_late_answer, method, path)
        with trio.move_on_after(self.timeout):
            response = await self.call(method, {"sessionId": self.session_id, **params}, on_late=late)
        return response

    async def read_text(self, path: str) -> FileContent | None:
        """The editor's text of ``path`` (its buffer when open, unsaved changes included)."""
        if not self.caps.read:
            return await self.local.read_text(path)
        if await trio.to_thread.run_sync(os.path.isdir, path):
            raise FileToolError(f"{path} is a directory, not a file; list it with bash (ls)")
        try:
            response = await self._ask("fs/read_text_file", path, {"path": path})
        except PeerGoneError:
            raise FileToolError(f"cannot read {path}: the editor disconnected") from None
        if response is None:
            raise FileToolError(
                f"the editor did not answer fs/read_text_file for {path} within {self.timeout:g}s (the fs_timeout)"
            )
        if response.error is not None:
            if not discarded(response.error) and not await trio.to_thread.run_sync(os.path.lexists, path):
                return None  # the editor has no such file, and neither has the disk
            raise FileToolError(f"the editor could not read {path}: {_message(response.error)}")
        result = response.result
        content = result.get("content") if isinstance(result, Mapping) else None
        if not isinstance(content, str):
            raise FileToolError(f"the editor's answer to fs/read_text_file for {path} has no text content")
        data = content.encode("utf-8", "surrogatepass")
        if len(data) > self.local.max_bytes:
            raise FileToolError(
                f"{path} is {len(data)} bytes, more than the {self.local.max_bytes}-byte limit of the file tools"
            )
        return FileContent(check_text(path, data))

    async def write_text(self, path: str, text: str) -> int | None:
        """Have the editor write ``path`` (its buffer and the disk, as the editor does it)."""
        if not self.caps.write:
            return await self.local.write_text(path, text)
        encode_text(path, text)  # a lone surrogate cannot be sent as JSON text either
        try:
            response = await self._ask("fs/write_text_file", path, {"path": path, "content": text})
        except PeerGoneError:
            raise FileToolError(
                f"cannot write {path}: the editor disconnected; whether it wrote the file is unknown"
            ) from None
        if response is None:
            raise FileToolError(
                f"the editor did not answer fs/write_text_file for {path} within {self.timeout:g}s "
                "(the fs_timeout): whether the file was written is unknown; read it before changing it again"
            )
        if response.error is not None:
            raise FileToolError(f"the editor could not write {path}: {_message(response.error)}")
        return None


def _late_answer(method: str, path: str, response: Response) -> None:
    """An answer that came after its call gave up: dropped (the call already failed), and logged."""
    outcome = "an error" if response.error is not None else "success"
    log.warning("acp: the editor answered %s for %s after the fs_timeout (%s); dropped", method, path, outcome)


def bind_client_fs(
    tools: ToolSet, agent: Agent, session_id: str, caps: ClientFs, call: Call, timeout: float = FS_TIMEOUT
) -> None:
    """Route ``agent``'s file tools through the client when it offers ``fs`` (no-op otherwise, or without them)."""
    if not caps.any:
        return
    plugin = file_tools_in(agent.tools) or file_tools_in(tools)
    if plugin is None:
        return
    local = LocalFileSystem(plugin.options.max_file_bytes)
    plugin.bind(agent, ClientFileSystem(session_id, call, caps, local, timeout))
