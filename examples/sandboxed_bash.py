"""Sandboxed bash: ``BashRuntimeOptions(sandbox=SandboxPolicy())`` confines the model's commands.

What it shows (the model is scripted, the commands are real and run under
bubblewrap, ``bwrap``):

* the ``bash`` tool's description tells the model it runs in a sandbox and what
  it may write;
* a write inside the session's working directory succeeds and lands on disk;
* a write anywhere else fails like any failed command (``Read-only file
  system`` on standard error, a nonzero exit code), so the model reads why;
* ``/tmp`` is private to each command: nothing written there reaches the host;
* there is no network inside the sandbox: a command dials a listener this
  example opens on 127.0.0.1, and the listener is never reached (the sandbox
  has its own loopback), so nothing leaves the machine even if it failed open.

Without a working ``bwrap`` the harness refuses to open (never a silent
fall-back to no sandbox); this example then prints why and exits 0, so that it
runs on any machine.  Install it with ``apt-get install bubblewrap``.
"""

from __future__ import annotations

import os
import socket
import tempfile
from typing import Any

import trio

from trio_harness import BashRuntimeOptions, ScriptedModel, allow_all, open_harness
from trio_harness import events as ev
from trio_harness.agents import EventStream
from trio_harness.bash import SandboxPolicy, SandboxUnavailableError


def bash(command: str) -> dict[str, Any]:
    return {"name": "bash", "arguments": {"command": command}}


async def main() -> None:
    scratch = f"trio-harness-example-{os.getpid()}"
    # A listener on the host's loopback: the sandboxed command must not reach it.
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    model = ScriptedModel(
        [
            {
                "tool_calls": [
                    bash("echo 'build ok' > build.log && cat build.log"),
                    bash("echo oops > /etc/trio-harness-example"),
                    bash(f"echo draft > /tmp/{scratch} && cat /tmp/{scratch}"),
                    bash(f"exec 3<>/dev/tcp/127.0.0.1/{port}"),
                ]
            },
            {"text": "The build log is written; the rest was refused by the sandbox."},
        ]
    )
    options = BashRuntimeOptions(sandbox=SandboxPolicy(network=False))
    with tempfile.TemporaryDirectory(prefix="sandboxed-bash-") as project:
        try:
            # allow_all: the sandbox, not a question, is what confines these commands.
            async with open_harness(model=model, bash_options=options, approver=allow_all) as harness:
                tool = harness.tools.get("bash")
                assert tool is not None
                print("the bash tool tells the model:")
                print("    Commands run in a sandbox" + tool.description.split("Commands run in a sandbox")[1])
                async with harness.agents.open(cwd=project) as agent:

                    async def show(stream: EventStream) -> None:
                        async for event in stream:
                            if isinstance(event, ev.ToolCallRequested):
                                print(f">>> {event.name} {event.arguments}")
                            elif isinstance(event, ev.ToolResult):
                                print(f"    ({'failed' if event.is_error else 'ok'})")
                                print("\n".join(f"    {line}" for line in event.content.splitlines()))
                            elif isinstance(event, ev.AssistantMessage) and event.text:
                                print(f"<<< {event.text}")
                            elif isinstance(event, ev.TurnEnd):
                                return

                    async with agent.events() as stream, trio.open_nursery() as nursery:
                        nursery.start_soon(show, stream)
                        await agent.run("Build the project and look around.")
                    results = [e for e in agent.session.events if isinstance(e, ev.ToolResult)]
        except SandboxUnavailableError as exc:
            print(f"skipping the sandboxed part: {exc}")
            listener.close()
            return
        assert [r.is_error for r in results] == [False, True, False, True]
        log = await trio.Path(project, "build.log").read_text()
        print(f"on the host, {project}/build.log holds: {log.strip()!r}")
    assert "Read-only file system" in results[1].content
    assert not await trio.Path("/etc/trio-harness-example").exists()
    assert not await trio.Path("/tmp", scratch).exists()
    print(f"on the host, /etc/trio-harness-example and /tmp/{scratch} do not exist")
    try:
        listener.accept()
        raise AssertionError("the sandboxed command reached the host's loopback")
    except BlockingIOError:
        print(f"the listener on 127.0.0.1:{port} was never reached")
    finally:
        listener.close()


if __name__ == "__main__":
    trio.run(main)
