"""The file tools: read_file / write_file / edit_file, their guards, the sandbox's path rules, approval, resume
(docs/tools.rst, "File tools")."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest
import trio
from _util import NEEDS_BUBBLEWRAP

from trio_harness import ApprovalDecision, ApprovalRequest, BashRuntimeOptions, ScriptedModel, allow_all
from trio_harness.bash import SandboxPolicy
from trio_harness.session import _events as ev
from trio_harness.testing import open_test_harness
from trio_harness.tools import FileChange, FileToolOptions, file_change
from trio_harness.tools._files_fs import FileToolError, PathRules, _read_local, _write_local, resolve_path

WAIT = 10


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def results(events: Any) -> list[ev.ToolResult]:
    return [e for e in events if isinstance(e, ev.ToolResult)]


async def run_calls(
    tmp_path: Path, *steps: list[dict[str, Any]], approver: Any = allow_all, store: Any = ":memory:", **options: Any
) -> list[ev.ToolResult]:
    model = ScriptedModel([*({"tool_calls": s} for s in steps), {"text": "done"}])
    async with open_test_harness(model, builtin_tools=["files"], approver=approver, store=store, **options) as h:
        async with h.agents.open(cwd=str(tmp_path)) as agent:
            agent.followup("go")
            with trio.fail_after(WAIT):
                await agent.when_idle()
            return results(agent.session.events)


async def test_read_numbers_lines_and_pages(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    read, part, past = await run_calls(
        tmp_path,
        [call("read_file", path="a.txt"), call("read_file", path="a.txt", offset=4, limit=2)],
        [call("read_file", path="a.txt", offset=50)],
    )
    assert not read.is_error
    assert read.content.startswith("     1\tline 1\n     2\tline 2\n") and read.content.endswith("    10\tline 10\n")
    assert (
        part.content == "     4\tline 4\n     5\tline 5\n[lines 4-5 of 10; to read on, call read_file with offset=6]\n"
    )
    assert read.detail is not None and read.detail["path"] == str(tmp_path / "a.txt")
    assert set(read.detail["fingerprint"]) == {"size", "sha256", "mtime_ns"}
    assert past.is_error and "offset 50 is past the end" in past.content and "10 lines" in past.content


async def test_clear_errors_for_missing_directory_and_binary(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "b.bin").write_bytes(b"\x89PNG\r\n\x00\x00data")
    (tmp_path / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    missing, directory, binary, latin = await run_calls(
        tmp_path,
        [
            call("read_file", path="nope.txt"),
            call("read_file", path="d"),
            call("read_file", path="b.bin"),
            call("read_file", path="latin.txt"),
        ],
    )
    assert missing.is_error and missing.content == f"error: {tmp_path / 'nope.txt'} does not exist"
    assert directory.is_error and "is a directory" in directory.content
    assert binary.is_error and "is a binary file" in binary.content
    assert latin.is_error and "not UTF-8 text" in latin.content


async def test_ten_megabyte_file_is_read_within_the_byte_limit(tmp_path: Path) -> None:
    line = "x" * 99 + "\n"
    (tmp_path / "big.txt").write_text(line * 100_000)  # 10 MB
    (result,) = await run_calls(tmp_path, [call("read_file", path="big.txt")])
    assert not result.is_error
    assert len(result.content.encode()) <= FileToolOptions().output_limit_bytes
    last = result.content.rstrip("\n").split("\n")[-1]
    assert last.startswith("[lines 1-") and "of 100000; to read on, call read_file with offset=" in last
    # Over the configured file size: refused, saying how to look at it.
    (result,) = await run_calls(
        tmp_path, [call("read_file", path="big.txt")], file_tool_options=FileToolOptions(max_file_bytes=1_000_000)
    )
    assert result.is_error and "more than the 1000000-byte limit" in result.content


async def test_edit_needs_a_read_first_and_a_new_file_does_not(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    refused, created, overwrite = await run_calls(
        tmp_path,
        [
            call("edit_file", path="a.py", old_text="x = 1", new_text="x = 2"),
            call("write_file", path="new/b.py", content="y = 1\n"),
            call("write_file", path="a.py", content="z\n"),
        ],
    )
    assert refused.is_error and "has not been read in this session; read it first with read_file" in refused.content
    assert overwrite.is_error and "read it first" in overwrite.content
    assert (tmp_path / "a.py").read_text() == "x = 1\n"
    assert not created.is_error and (tmp_path / "new" / "b.py").read_text() == "y = 1\n"
    assert created.detail is not None and created.detail["old_text"] is None


async def test_edit_after_read_replaces_once_and_counts_matches(tmp_path: Path) -> None:
    target = tmp_path / "a.py"
    target.write_text("a = 1\nb = 1\n")
    os.chmod(target, 0o750)
    _, twice, missing, edited, again, everywhere = await run_calls(
        tmp_path,
        [call("read_file", path="a.py")],
        [
            call("edit_file", path="a.py", old_text="= 1", new_text="= 2"),
            call("edit_file", path="a.py", old_text="c = 1", new_text="c = 2"),
            call("edit_file", path="a.py", old_text="a = 1", new_text="a = 3"),
        ],
        # The agent's own write counts as a read: a second edit needs no new read.
        [call("edit_file", path="a.py", old_text="b = 1", new_text="b = 4")],
        [call("edit_file", path="a.py", old_text=" = ", new_text="=", replace_all=True)],
    )
    assert twice.is_error and "matches 2 times" in twice.content and "replace_all=true" in twice.content
    assert missing.is_error and "was not found" in missing.content
    assert not edited.is_error and edited.content.startswith(f"edited {target}: replaced 1 match\n")
    assert "-a = 1\n+a = 3\n" in edited.content  # the unified diff, for the model
    assert edited.detail is not None
    assert edited.detail["old_text"] == "a = 1\nb = 1\n" and edited.detail["new_text"] == "a = 3\nb = 1\n"
    assert not again.is_error
    assert not everywhere.is_error and "replaced 2 matches" in everywhere.content
    assert target.read_text() == "a=3\nb=4\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o750  # the mode is kept across the atomic rename
    assert [p.name for p in tmp_path.iterdir()] == ["a.py"]  # no temporary file left


async def test_a_file_changed_between_read_and_edit_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "a.py"
    target.write_text("v = 1\n")

    async def changing_approver(request: ApprovalRequest) -> ApprovalDecision:
        if request.arguments.get("new_text") == "v = 2":
            target.write_text("v = 1  # someone else\n")  # between the read and the edit
        return ApprovalDecision.allow_once()

    _, stale, reread, edited = await run_calls(
        tmp_path,
        [call("read_file", path="a.py")],
        [call("edit_file", path="a.py", old_text="v = 1", new_text="v = 2")],
        [call("read_file", path="a.py")],
        [call("edit_file", path="a.py", old_text="v = 1", new_text="v = 3")],
        approver=changing_approver,
    )
    assert stale.is_error and "has changed since it was last read" in stale.content and "read it again" in stale.content
    assert not reread.is_error and not edited.is_error
    assert target.read_text() == "v = 3  # someone else\n"


async def test_a_touch_without_a_change_is_not_stale(tmp_path: Path) -> None:
    target = tmp_path / "a.py"
    target.write_text("v = 1\n")

    async def touching(request: ApprovalRequest) -> ApprovalDecision:
        os.utime(target, ns=(1, 1))
        return ApprovalDecision.allow_once()

    _, edited = await run_calls(
        tmp_path,
        [call("read_file", path="a.py")],
        [call("edit_file", path="a.py", old_text="v = 1", new_text="v = 2")],
        approver=touching,
    )
    assert not edited.is_error


async def test_writes_ask_with_the_diff_and_a_denial_keeps_the_file(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    target.write_text("old\n")
    changes: list[FileChange | None] = []
    asked: list[str] = []

    async def approver(request: ApprovalRequest) -> ApprovalDecision:
        asked.append(request.tool)
        changes.append(await file_change(request))
        return ApprovalDecision.deny("no")

    _, denied = await run_calls(
        tmp_path,
        [call("read_file", path="a.txt")],
        [call("write_file", path="a.txt", content="new\n")],
        approver=approver,
    )
    assert asked == ["write_file"]  # reads never ask
    assert denied.is_error and "was not approved" in denied.content
    (change,) = changes
    assert change is not None and change.old_text == "old\n" and change.new_text == "new\n"
    assert change.unified_diff == f"--- {target}\n+++ {target}\n@@ -1 +1 @@\n-old\n+new\n"
    assert target.read_text() == "old\n"
    # Without an approver, writes are denied like bash commands.
    (denied,) = await run_calls(tmp_path, [call("write_file", path="b.txt", content="x")], approver=None)
    assert denied.is_error and "requires approval and no approver is configured" in denied.content
    assert not (tmp_path / "b.txt").exists()


async def test_writes_are_side_effects_tool_started_is_logged_first(tmp_path: Path) -> None:
    model = ScriptedModel([{"tool_calls": [call("write_file", path="a.txt", content="x")]}, {"text": "done"}])
    async with open_test_harness(model, builtin_tools=["files"], approver=allow_all) as h:
        async with h.agents.open(cwd=str(tmp_path)) as agent:
            agent.followup("go")
            with trio.fail_after(WAIT):
                await agent.when_idle()
            kinds = [type(e).__name__ for e in agent.session.events if isinstance(e, ev.ToolStarted | ev.ToolResult)]
    assert kinds == ["ToolStarted", "ToolResult"]


async def test_guards_are_rebuilt_on_resume_from_the_log(tmp_path: Path) -> None:
    store = tmp_path / "store"
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("one\n")
    model = ScriptedModel([{"tool_calls": [call("read_file", path="a.txt")]}, {"text": "read"}])
    async with open_test_harness(model, builtin_tools=["files"], approver=allow_all, store=str(store)) as h:
        async with h.agents.open(cwd=str(work)) as agent:
            agent.followup("go")
            with trio.fail_after(WAIT):
                await agent.when_idle()
            session_id = agent.id
    edit = call("edit_file", path="a.txt", old_text="one", new_text="two")
    model = ScriptedModel([{"tool_calls": [edit]}, {"text": "ok"}, {"tool_calls": [edit]}, {"text": "ok"}])
    async with open_test_harness(model, builtin_tools=["files"], approver=allow_all, store=str(store)) as h:
        async with h.agents.open(session_id=session_id, resume=True) as agent:
            agent.followup("edit")
            with trio.fail_after(WAIT):
                await agent.when_idle()
            edited = results(agent.session.events)[-1]
            assert not edited.is_error, edited.content  # the read of the earlier process counts
            (work / "a.txt").write_text("three\n")  # changed on disk after the resumed agent wrote it
            agent.followup("again")
            with trio.fail_after(WAIT):
                await agent.when_idle()
            stale = results(agent.session.events)[-1]
    assert stale.is_error and "has changed since it was last read" in stale.content


# ---------------------------------------------------------------- path rules (the sandbox's)


def test_path_rules_refuse_escapes_hidden_paths_and_git_hooks(tmp_path: Path) -> None:
    cwd = tmp_path / "proj"
    (cwd / ".git" / "hooks").mkdir(parents=True)
    secret = tmp_path / "secret"
    secret.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (cwd / "link").symlink_to(outside)  # a symlink planted to escape
    rules = PathRules(writable=(), hidden=(str(secret),), protect_git=True)

    def write(path: str) -> None:
        full, real = resolve_path(str(cwd), path)
        rules.check_write(full, real, str(cwd))

    write("ok.txt")
    write("sub/dir/ok.txt")
    with pytest.raises(FileToolError, match="outside the sandbox's writable paths"):
        write("../outside/x.txt")
    with pytest.raises(FileToolError, match=r"resolves to .*outside/x.txt\) is outside the sandbox"):
        write("link/x.txt")
    with pytest.raises(FileToolError, match="hidden by the sandbox"):
        write(str(secret / "k"))
    with pytest.raises(FileToolError, match="read-only in the sandbox"):
        write(".git/hooks/pre-commit")
    # Read from a session in tmp_path: the secret is in its directory (not in the host's /tmp outside it).
    full, real = resolve_path(str(cwd), str(secret / "k"))
    with pytest.raises(FileToolError, match=rf"hidden by the sandbox \({re.escape(str(secret))}\).*cannot be read"):
        rules.check_read(full, real, str(tmp_path))
    (cwd / "to_secret").symlink_to(secret)
    full, real = resolve_path(str(cwd), "to_secret/k")
    with pytest.raises(FileToolError, match=rf"hidden by the sandbox \({re.escape(str(secret))}\)"):
        rules.check_read(full, real, str(tmp_path))


@NEEDS_BUBBLEWRAP
async def test_under_the_real_sandbox_escapes_hidden_paths_and_planted_symlinks_are_refused(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target.txt").write_text("keep\n")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("s3cret\n")
    (work / "escape").symlink_to(outside)  # a symlink planted to escape the working directory
    (work / "peek").symlink_to(secret / "key")
    policy = SandboxPolicy(hidden=(str(secret),))
    escaped, through_link, hidden, peek, inside = await run_calls(
        work,
        [
            call("write_file", path="../outside/x.txt", content="x"),
            call("write_file", path="escape/target.txt", content="x"),
            call("read_file", path=str(secret / "key")),
            call("read_file", path="peek"),
            call("write_file", path="ok.txt", content="fine\n"),
        ],
        bash_options=BashRuntimeOptions(sandbox=policy),
    )
    assert escaped.is_error and "outside the sandbox's writable paths" in escaped.content
    assert through_link.is_error and f"resolves to {outside / 'target.txt'}" in through_link.content
    assert hidden.is_error and "hidden by the sandbox" in hidden.content and "s3cret" not in hidden.content
    assert peek.is_error and "hidden by the sandbox" in peek.content
    assert not inside.is_error and (work / "ok.txt").read_text() == "fine\n"
    assert (outside / "target.txt").read_text() == "keep\n" and not (outside / "x.txt").exists()


async def test_the_guard_is_per_agent(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one\n")
    edit = call("edit_file", path="a.txt", old_text="one", new_text="two")
    model = ScriptedModel(
        [{"tool_calls": [call("read_file", path="a.txt")]}, {"text": "read"}, {"tool_calls": [edit]}, {"text": "no"}]
    )
    async with open_test_harness(model, builtin_tools=["files"], approver=allow_all) as h:
        async with h.agents.open(cwd=str(tmp_path)) as reader, h.agents.open(cwd=str(tmp_path)) as other:
            reader.followup("read")
            with trio.fail_after(WAIT):
                await reader.when_idle()
            other.followup("edit")
            with trio.fail_after(WAIT):
                await other.when_idle()
            (refused,) = results(other.session.events)
    assert refused.is_error and "has not been read in this session" in refused.content
    assert (tmp_path / "a.txt").read_text() == "one\n"


async def test_the_file_tools_are_built_in_by_default() -> None:
    async with open_test_harness(builtin_tools=True) as h:
        assert {"read_file", "write_file", "edit_file"} <= {tool.name for tool in h.tools.tools()}
        assert not h.tools.get("read_file").requires_approval  # type: ignore[union-attr]
        assert h.tools.get("edit_file").requires_approval is True  # type: ignore[union-attr]
    unasked = FileToolOptions(requires_approval=False)
    async with open_test_harness(builtin_tools=["files"], file_tool_options=unasked) as h:
        assert h.tools.get("write_file").requires_approval is False  # type: ignore[union-attr]
    with pytest.raises(TypeError, match="file_tool_options must be a FileToolOptions"):
        async with open_test_harness(file_tool_options={"requires_approval": False}):
            pass


def test_a_symlink_planted_after_the_check_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("s3cret\n")
    (tmp_path / "resolved.txt").symlink_to(tmp_path / "secret")  # swapped in after resolve_path ran
    with pytest.raises(FileToolError, match="changed into a symbolic link"):
        _read_local(str(tmp_path / "resolved.txt"), 1000)


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "a.txt"
    target.write_text("old\n")
    with pytest.raises(FileToolError, match="not valid Unicode text"):
        _write_local(str(target), "\udcff")  # a lone surrogate, which a JSON escape can carry

    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(FileToolError, match=r"cannot write .*: No space left on device"):
        _write_local(str(target), "new\n")  # fails after the temporary file was made
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_the_policys_writable_paths_are_writable(tmp_path: Path) -> None:
    cwd = tmp_path / "proj"
    cwd.mkdir()
    extra = tmp_path / "cache"
    extra.mkdir()
    rules = PathRules(writable=(str(extra),))
    full, real = resolve_path(str(cwd), str(extra / "x"))
    rules.check_write(full, real, str(cwd))
    full, real = resolve_path(str(cwd), str(tmp_path / "elsewhere"))
    with pytest.raises(FileToolError, match="outside the sandbox's writable paths"):
        rules.check_write(full, real, str(cwd))
    PathRules().check_write(full, real, str(cwd))  # no sandbox: no rule


async def test_a_crlf_file_is_edited_with_the_lf_lines_read_file_shows(tmp_path: Path) -> None:
    target = tmp_path / "win.txt"
    target.write_bytes(b"one\r\ntwo\r\nthree\r\n")
    read, edited = await run_calls(
        tmp_path,
        [call("read_file", path="win.txt")],
        [call("edit_file", path="win.txt", old_text="one\ntwo", new_text="one\n2")],
    )
    assert read.content == "     1\tone\n     2\ttwo\n     3\tthree\n"
    assert not edited.is_error, edited.content
    assert target.read_bytes() == b"one\r\n2\r\nthree\r\n"
