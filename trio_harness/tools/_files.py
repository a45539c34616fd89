"""The file tools: ``read_file``, ``write_file`` and ``edit_file``, with diffs and read-before-edit guards.

:class:`FileToolsPlugin` registers the three tools into a tool set (the
harness loads it as the built-in ``files`` plugin).  Reads never ask; writes
(``write_file``, ``edit_file``) require approval like ``bash`` and the
approver can show the change first (:func:`file_change`).  Every successful
call's result carries a ``detail`` (logged with ``tool/result``, never sent to
the model): the resolved path and the file's fingerprint (size and SHA-256,
plus the modification time on the local disk), and for a write the old and new
text, from which front ends draw the diff (ACP: ``kind: "edit"`` tool calls
with ``diff`` content).

Guards, per agent: an overwrite or edit of an existing file the agent has not
read (or written) in this session, or whose content changed since, is refused
with an error telling the model to read it first; creating a file needs no
read.  The fingerprints come from the results' ``detail`` in the session's
log, so a resumed agent knows what its earlier run read (built at its first
file call in this process).

Paths are relative to the session's working directory, resolved through
symlinks before any check; with a bash sandbox the sandbox's rules apply
(:class:`~trio_harness.tools._files_fs.PathRules`): what it hides from
commands (its private ``/tmp`` and ``/dev`` included) is not read, and the
session store never is, sandbox or not.  Where the bytes come
from is a :class:`~trio_harness.tools._files_fs.FileSystem`: the local disk,
or the editor's (bound per agent by the ACP bridge, :meth:`FileToolsPlugin.bind`).
"""

from __future__ import annotations

import difflib
import hashlib
import os
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from ..agents._tools import Tool, ToolContext, ToolOutput, ToolSet
from ..session import _events as ev
from ..tasks._render import bound_text, utf8_len
from ._files_fs import FileContent, FileSystem, FileToolError, LocalFileSystem, PathRules, resolve_path

if TYPE_CHECKING:
    from .._scope import Scope
    from ..agents._agent import Agent
    from ..agents._approval import ApprovalRequest
    from ..bash._executor import BashExecutor

FILE_TOOLS = ("read_file", "write_file", "edit_file")
"""The model-facing names of the file tools."""

DIFF_DETAIL_LIMIT = 256 * 1024
"""Above this many bytes of old plus new text, an edit's ``detail`` keeps only the replaced fragments."""


@attrs.frozen
class FileToolOptions:
    """Settings of the file tools (:class:`FileToolsPlugin`; :func:`~trio_harness.open_harness`
    takes them as ``file_tool_options=``).

    Attributes:
        requires_approval: ask the approver before each ``write_file`` and
            ``edit_file`` (default on, as for ``bash``); reads never ask.
        output_limit_bytes: the byte cap on every result the model reads
            (a read stops at a line boundary within it and says how to go on).
        max_file_bytes: the largest file the tools read or edit.
        default_read_lines: how many lines ``read_file`` returns when the
            model gives no ``limit``.
        max_line_chars: a longer line is cut in ``read_file``'s output.
    """

    requires_approval: bool = True
    output_limit_bytes: int = attrs.field(default=64 * 1024, validator=attrs.validators.gt(256))
    max_file_bytes: int = attrs.field(default=32 * 1024 * 1024, validator=attrs.validators.gt(0))
    default_read_lines: int = attrs.field(default=2000, validator=attrs.validators.gt(0))
    max_line_chars: int = attrs.field(default=2000, validator=attrs.validators.gt(0))


@attrs.frozen
class FileChange:
    """A change a write or an edit makes (or would make: :func:`file_change`).

    Attributes:
        path: the file, absolute (symlinks resolved).
        old_text: its text before, or None when the call creates it.
        new_text: its text after.
    """

    path: str
    old_text: str | None
    new_text: str

    @property
    def unified_diff(self) -> str:
        """The change as a unified diff (``--- path`` / ``+++ path``)."""
        old = (self.old_text or "").splitlines(keepends=True)
        new = self.new_text.splitlines(keepends=True)
        lines = difflib.unified_diff(
            old, new, "/dev/null" if self.old_text is None else self.path, self.path, lineterm="\n"
        )
        return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def _fingerprint(content: FileContent) -> dict[str, Any]:
    data = content.text.encode("utf-8")
    found: dict[str, Any] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    if content.mtime_ns is not None:
        found["mtime_ns"] = content.mtime_ns
    return found


def _same(known: Mapping[str, Any], now: Mapping[str, Any]) -> bool:
    # The content decides: a file touched (mtime) but not changed is not stale.
    return bool(known.get("size") == now["size"] and known.get("sha256") == now["sha256"])


def known_files(events: Any) -> dict[str, dict[str, Any]]:
    """The fingerprints the file tools' successful results in a log record, by resolved path (the last wins)."""
    known: dict[str, dict[str, Any]] = {}
    for event in events:
        if type(event) is ev.ToolResult and event.name in FILE_TOOLS and not event.is_error and event.detail:
            path, print_ = event.detail.get("path"), event.detail.get("fingerprint")
            if isinstance(path, str) and isinstance(print_, dict):
                known[path] = print_
    return known


_DESCRIPTIONS = {
    "read_file": (
        "Read a text file. Returns its lines numbered (line number, a tab, the line). Use offset "
        "(1-based first line) and limit (number of lines) to read a part of a long file; the result "
        "says which lines it shows and how to go on. Read a file before you edit or overwrite it."
    ),
    "write_file": (
        "Write a text file: create it, or replace its whole content. An existing file must have been "
        "read first (read_file) in this session and not changed since. Prefer edit_file for changes "
        "to part of a file."
    ),
    "edit_file": (
        "Edit a text file: replace old_text, which must match exactly (whitespace included) and once "
        "in the file, by new_text; with replace_all=true, replace every match. Read the file first "
        "(read_file) in this session; copy old_text from what you read, without the line-number prefix."
    ),
}

_PARAMETERS: dict[str, dict[str, Any]] = {
    "read_file": {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "The file (relative to the working directory, or absolute)."},
            "offset": {"type": "integer", "minimum": 1, "description": "The first line to show (1-based)."},
            "limit": {"type": "integer", "minimum": 1, "description": "How many lines to show."},
        },
        "required": ["path"],
    },
    "write_file": {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "The file (relative to the working directory, or absolute)."},
            "content": {"type": "string", "description": "The whole new content of the file."},
        },
        "required": ["path", "content"],
    },
    "edit_file": {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "The file (relative to the working directory, or absolute)."},
            "old_text": {"type": "string", "description": "The exact text to replace (must match once)."},
            "new_text": {"type": "string", "description": "The text to put in its place."},
            "replace_all": {"type": "boolean", "description": "Replace every match (default false)."},
        },
        "required": ["path", "old_text", "new_text"],
    },
}


@attrs.frozen(eq=False)
class _FileTool(Tool):
    """A file tool: a :class:`Tool` that knows its plugin (for :func:`file_change`)."""

    plugin: FileToolsPlugin | None = attrs.field(default=None, kw_only=True)


def _absolute(path: str | os.PathLike[str] | None) -> str | None:
    return None if path is None else os.path.abspath(os.fspath(path))


_APPLIED: weakref.WeakSet[FileToolsPlugin] = weakref.WeakSet()


@attrs.define(eq=False)
class FileToolsPlugin:
    """Registers ``read_file``, ``write_file`` and ``edit_file`` into a tool set (normally the harness-wide one).

    Attributes:
        tools: the tool set to register into.
        bash: the bash executor whose sandbox rules the tools follow (its
            writable and hidden paths), or None for no rules.
        options: the tools' settings (:class:`FileToolOptions`).
        store_root: the directory of the session store in use (a JSONL store's
            root; :func:`~trio_harness.open_harness` passes it), which the
            tools never write, sandbox or not, whatever the approval: a model
            that could write its own log could forge its history (approvals
            it was never given).  Nor do they read it (other sessions'
            transcripts), unless a sandbox shows it (``hide_sessions=False``).
            None: no store on disk.
    """

    name: ClassVar[str] = "files"
    tools: ToolSet
    bash: BashExecutor | None = None
    options: FileToolOptions = attrs.field(
        factory=FileToolOptions, validator=attrs.validators.instance_of(FileToolOptions)
    )
    store_root: str | None = attrs.field(default=None, kw_only=True, converter=_absolute)
    # Per agent (by identity): what it has read or written, and the file system bound to it.
    _known: dict[int, tuple[Agent, dict[str, dict[str, Any]]]] = attrs.field(factory=dict, init=False)
    _systems: dict[int, tuple[Agent, FileSystem]] = attrs.field(factory=dict, init=False)
    _local: LocalFileSystem = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._local = LocalFileSystem(self.options.max_file_bytes)

    # ------------------------------------------------------------ loading

    def tool_list(self) -> list[Tool]:
        """The three tool definitions."""
        note = self._sandbox_note()
        handlers = {"read_file": self._read, "write_file": self._write, "edit_file": self._edit}
        return [
            _FileTool(
                name=name,
                description=_DESCRIPTIONS[name] + (note if name != "read_file" else ""),
                parameters=_PARAMETERS[name],
                handler=handlers[name],
                parallel_safe=name == "read_file",
                requires_approval=name != "read_file" and self.options.requires_approval,
                plugin=self,
            )
            for name in FILE_TOOLS
        ]

    async def apply(self, scope: Scope) -> None:
        """Register the tools, bound to ``scope``."""
        for tool in self.tool_list():
            self.tools.add(tool, scope=scope)
        _APPLIED.add(self)
        scope.add_exit_callback(lambda: _APPLIED.discard(self))

    def bind(self, agent: Agent, system: FileSystem) -> Callable[[], None]:
        """Make ``agent``'s file tools read and write through ``system``.

        Until the returned remover is called, or the agent's scope closes.
        """
        key = id(agent)
        self._systems[key] = (agent, system)

        def remove() -> None:
            entry = self._systems.get(key)
            if entry is not None and entry[0] is agent:
                del self._systems[key]

        agent.scope.add_exit_callback(remove)
        return remove

    def _sandbox_note(self) -> str:
        if self.bash is None or self.bash.sandbox is None:
            return ""
        return (
            " The sandbox applies: only the working directory and the sandbox's writable paths can be "
            "written, and hidden paths cannot be read."
        )

    def _rules(self, reader: str | None = None) -> PathRules:
        """The path rules; ``reader``: the id of the agent reading, whose background commands' spill files
        (in the host's ``/tmp``, which a sandbox otherwise keeps unread) it may read."""
        checked = self.bash.checked_sandbox if self.bash is not None else None
        protected = (self.store_root,) if self.store_root is not None else ()
        if checked is None:
            return PathRules(protected=protected, unread=protected)
        assert self.bash is not None
        spills = frozenset(
            os.path.realpath(path)
            for process in self.bash.list()
            if reader is not None and process.owner == reader
            for path in (process.stdout_path, process.stderr_path)
        )
        return PathRules(
            writable=checked.writable,
            hidden=checked.hidden,
            protect_git=checked.policy.protect_git,
            protected=protected,
            unread=protected if checked.policy.hide_sessions else (),
            spill_files=spills,
        )

    def _system(self, agent: Agent) -> FileSystem:
        entry = self._systems.get(id(agent))
        return entry[1] if entry is not None and entry[0] is agent else self._local

    def _known_of(self, agent: Agent) -> dict[str, dict[str, Any]]:
        entry = self._known.get(id(agent))
        if entry is not None and entry[0] is agent:
            return entry[1]
        known = known_files(agent.session.events)  # a resumed agent: what its earlier run read
        key = id(agent)
        self._known[key] = (agent, known)

        def forget() -> None:
            self._known.pop(key, None)

        agent.scope.add_exit_callback(forget)
        return known

    # ------------------------------------------------------------ calls

    def _error(self, message: str) -> ToolOutput:
        return ToolOutput(bound_text(f"error: {message}", self.options.output_limit_bytes), is_error=True)

    def _paths(self, agent: Agent, path: object) -> tuple[str, str, str]:
        cwd = agent.session.header.cwd or os.getcwd()
        full, real = resolve_path(cwd, str(path))
        return cwd, full, real

    async def _read(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutput:
        try:
            cwd, full, real = self._paths(ctx.agent, args["path"])
            self._rules(ctx.agent.id).check_read(full, real, cwd)
            content = await self._system(ctx.agent).read_text(real)
        except FileToolError as exc:
            return self._error(str(exc))
        if content is None:
            return self._error(f"{full} does not exist")
        fingerprint = _fingerprint(content)
        self._known_of(ctx.agent)[real] = fingerprint
        text = self._numbered(content.text, args.get("offset", 1), args.get("limit"), full)
        if isinstance(text, ToolOutput):
            return text
        line = int(args.get("offset", 1))
        return ToolOutput(text, detail={"path": real, "line": line, "fingerprint": fingerprint})

    def _numbered(self, text: str, offset: int, limit: int | None, shown: str) -> str | ToolOutput:
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # the newline ending the last line
        total = len(lines)
        if total == 0:
            return f"({shown} is empty)"
        if offset > total:
            return self._error(f"offset {offset} is past the end of {shown}, which has {total} lines")
        count = limit if limit is not None else self.options.default_read_lines
        budget = self.options.output_limit_bytes - 200  # room for the footer
        out: list[str] = []
        used = 0
        last = offset - 1
        cut_lines = 0
        for number in range(offset, min(offset - 1 + count, total) + 1):
            line = lines[number - 1].removesuffix("\r")
            if len(line) > self.options.max_line_chars:
                line = line[: self.options.max_line_chars] + " […line cut]"
                cut_lines += 1
            rendered = f"{number:>6}\t{line}\n"
            size = utf8_len(rendered)
            if used + size > budget and out:
                break
            if used + size > budget:  # one line longer than the whole budget
                rendered = bound_text(rendered, budget)
                size = budget
            out.append(rendered)
            used += size
            last = number
        body = "".join(out)
        if offset == 1 and last == total:
            return (
                body
                if not cut_lines
                else body + f"[{cut_lines} long lines were cut at {self.options.max_line_chars} characters]\n"
            )
        footer = f"[lines {offset}-{last} of {total}"
        if last < total:
            footer += f"; to read on, call read_file with offset={last + 1}"
        return body + footer + "]\n"

    async def _check_fresh(self, agent: Agent, full: str, real: str, current: FileContent | None) -> str | None:
        """None when the agent may change the file; else the refusal."""
        if current is None:
            return None  # a new file: nothing to have read
        known = self._known_of(agent).get(real)
        if known is None:
            return (
                f"{full} exists and has not been read in this session; read it first with read_file "
                "(then write or edit it)"
            )
        if not _same(known, _fingerprint(current)):
            return (
                f"{full} has changed since it was last read (by someone or something else); read it "
                "again with read_file before you change it"
            )
        return None

    async def _write_change(
        self, ctx: ToolContext, change: FileChange, fragment: tuple[str, str] | None
    ) -> str | ToolOutput:
        system = self._system(ctx.agent)
        try:
            mtime = await system.write_text(change.path, change.new_text)
        except FileToolError as exc:
            return self._error(str(exc))
        fingerprint = _fingerprint(FileContent(change.new_text, mtime))
        self._known_of(ctx.agent)[change.path] = fingerprint
        detail: dict[str, Any] = {"path": change.path, "fingerprint": fingerprint}
        old, new = change.old_text, change.new_text
        if utf8_len(old or "") + utf8_len(new) <= DIFF_DETAIL_LIMIT:
            detail.update(old_text=old, new_text=new)
        elif fragment is not None:  # a large file: the replaced fragments only
            detail.update(old_text=fragment[0], new_text=fragment[1], partial=True)
        else:
            detail.update(old_text=None, new_text=new, partial=old is not None)
        verb = "created" if old is None else "updated"
        lines = new.count("\n") + (0 if new.endswith("\n") or not new else 1)
        head = f"{verb} {change.path} ({lines} lines, {utf8_len(new)} bytes)"
        diff = change.unified_diff if old is not None else ""
        text = bound_text(head + ("\n" + diff if diff else "\n"), self.options.output_limit_bytes)
        return ToolOutput(text, detail=detail)

    async def _plan(
        self, agent: Agent, name: str, args: Mapping[str, Any]
    ) -> tuple[FileChange, tuple[str, str] | None, str]:
        """The change a write or edit call makes, checked; raises :exc:`FileToolError` with the refusal."""
        cwd, full, real = self._paths(agent, args["path"])
        self._rules().check_write(full, real, cwd)
        current = await self._system(agent).read_text(real)
        refusal = await self._check_fresh(agent, full, real, current)
        if refusal is not None:
            raise FileToolError(refusal)
        old = current.text if current is not None else None
        if name == "write_file":
            content = str(args["content"])
            self._check_size(full, utf8_len(content))
            return FileChange(real, old, content), None, full
        old_text, new_text = str(args["old_text"]), str(args["new_text"])
        if old is None:
            raise FileToolError(f"{full} does not exist; create it with write_file")
        if not old_text:
            raise FileToolError(
                "old_text is empty; give the text to replace (to replace the whole file, use write_file)"
            )
        if old_text == new_text:
            raise FileToolError("old_text and new_text are the same; nothing would change")
        count = old.count(old_text)
        if count == 0 and "\r\n" in old and "\r" not in old_text:
            # A CRLF file edited with the LF lines read_file showed: match and write CRLF.
            old_text, new_text = old_text.replace("\n", "\r\n"), new_text.replace("\n", "\r\n")
            count = old.count(old_text)
        if count == 0:
            raise FileToolError(
                f"old_text was not found in {full}; copy it exactly from read_file's output "
                "(whitespace and indentation included, without the line-number prefix)"
            )
        if count > 1 and not args.get("replace_all", False):
            raise FileToolError(
                f"old_text matches {count} times in {full}; add surrounding lines to make it unique, "
                "or pass replace_all=true to replace every match"
            )
        # The result's size before it is built: replace_all of a short, common old_text by a long
        # new_text would otherwise build a text many times the file limit (gigabytes) in memory.
        self._check_size(full, utf8_len(old) + count * (utf8_len(new_text) - utf8_len(old_text)))
        return FileChange(real, old, old.replace(old_text, new_text)), (old_text, new_text), full

    def _check_size(self, full: str, size: int) -> None:
        """Refuse a write whose text would be larger than the file tools read back (``max_file_bytes``)."""
        limit = self.options.max_file_bytes
        if size > limit:
            raise FileToolError(
                f"the new text of {full} would be {size} bytes, more than the {limit}-byte limit of the "
                "file tools; nothing was written (write smaller files, or use bash)"
            )

    async def _write(self, ctx: ToolContext, args: dict[str, Any]) -> str | ToolOutput:
        try:
            change, fragment, _ = await self._plan(ctx.agent, "write_file", args)
        except FileToolError as exc:
            return self._error(str(exc))
        return await self._write_change(ctx, change, fragment)

    async def _edit(self, ctx: ToolContext, args: dict[str, Any]) -> str | ToolOutput:
        try:
            change, fragment, _ = await self._plan(ctx.agent, "edit_file", args)
        except FileToolError as exc:
            return self._error(str(exc))
        output = await self._write_change(ctx, change, fragment)
        if isinstance(output, ToolOutput) and not output.is_error:
            count = change.old_text.count(fragment[0]) if change.old_text is not None and fragment else 1
            head = f"edited {change.path}: replaced {count} match{'es' if count != 1 else ''}\n"
            body = output.content.split("\n", 1)[1] if "\n" in output.content else ""
            return attrs.evolve(output, content=bound_text(head + body, self.options.output_limit_bytes))
        return output

    async def preview(self, request: ApprovalRequest) -> FileChange | None:
        """The change a ``write_file`` / ``edit_file`` call asked about would make, or None (it would fail)."""
        if request.tool not in ("write_file", "edit_file"):
            return None
        try:
            return (await self._plan(request.agent, request.tool, request.arguments))[0]
        except (FileToolError, KeyError):
            return None


def file_tools_in(tools: ToolSet | None, name: str = "write_file") -> FileToolsPlugin | None:
    """The plugin whose file tool ``name`` is registered in ``tools``, if any."""
    tool = tools.get(name) if tools is not None else None
    return tool.plugin if isinstance(tool, _FileTool) else None


async def file_change(request: ApprovalRequest, tools: ToolSet | None = None) -> FileChange | None:
    """The change a ``write_file`` or ``edit_file`` call an approver is asked about would make.

    For an approver that shows the diff before deciding (the CLI's and the
    ACP bridge's do): ``(await file_change(request)).unified_diff``.  None
    for another tool's call, or a call that would be refused anyway (not read
    first, stale, outside the sandbox, no match).

    Args:
        request: the approval request.
        tools: the tool set the file tools are registered in (the harness's,
            ``harness.tools``); by default the calling agent's own, then any
            file tools plugin loaded in this process.
    """
    plugin = file_tools_in(request.agent.tools, request.tool) or file_tools_in(tools, request.tool)
    if plugin is None:
        plugin = next((p for p in list(_APPLIED) if file_tools_in(p.tools, request.tool) is p), None)
    return await plugin.preview(request) if plugin is not None else None
