"""Model-facing text for background tasks: reads, lists, kills and completion notices.

Every function here is pure.  With a byte limit, the whole returned text is at
most ``limit`` bytes of UTF-8 and is cut on character boundaries; the parts the
model needs to act (the ``[status: ...]`` suffix of a read, the task id and the
``task_output`` instruction of a notice) are reserved first and only the
variable parts are cut.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ._types import TaskRead, TaskSnapshot

TASKS_GUIDANCE = """\
## Background tasks

Some tools can run work in the background (for example `bash` with \
`run_in_background`, or a background `subagent`). Starting one returns a task id \
such as `bash-3`; keep every task id you are given.

- While a task runs, continue with independent work. Do not busy-poll a task and \
do not start the same work again while it is still running.
- `task_output(task_id)` returns the output produced since your last read (or the \
final result once the task has ended) and always ends with `[status: ...]`. Pass \
`wait: true` only when you have nothing else to do until the task ends; a wait that \
times out reports the task as still running and does not stop it.
- `task_list()` shows your tasks and their status.
- When a task ends you may receive a notice naming it; read its result with \
`task_output`.
- Before your final answer, collect the output of every task relevant to it with \
`task_output`.
- Kill work that no longer matters with `task_kill(task_id)`.
"""
"""System-prompt guidance for the task control tools."""

_MARKER_RE = re.compile(r"\A\[… (\d+) bytes? cut\]\n?")
_ELLIPSIS = "…"


# ---------------------------------------------------------------- UTF-8 cuts


def _encode(text: str) -> bytes:
    """UTF-8 bytes of ``text``; lone surrogates (not encodable) become ``?``."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace")


def _clean(text: str) -> str:
    """``text`` with lone surrogates replaced by ``?`` (so it encodes as UTF-8)."""
    return _encode(text).decode("utf-8")


def utf8_len(text: str) -> int:
    """The number of bytes ``text`` takes in UTF-8 (lone surrogates count as ``?``)."""
    return len(_encode(text))


def cut_utf8(text: str, limit_bytes: int) -> str:
    """Keep the longest prefix of ``text`` whose UTF-8 encoding fits in ``limit_bytes``.

    The cut falls on a character boundary, so the result is always valid UTF-8.
    Lone surrogates (which UTF-8 cannot encode) are replaced by ``?``.

    Args:
        text: the text to cut.
        limit_bytes: the maximum size of the result in UTF-8 bytes (<= 0 gives ``""``).

    Returns:
        ``text`` itself when it fits, else its longest fitting prefix.
    """
    if limit_bytes <= 0:
        return ""
    data = _encode(text)
    if len(data) <= limit_bytes:
        return data.decode("utf-8")
    return data[:limit_bytes].decode("utf-8", "ignore")


def cut_utf8_tail(text: str, limit_bytes: int) -> str:
    """Keep the longest suffix of ``text`` whose UTF-8 encoding fits in ``limit_bytes``.

    Args:
        text: the text to cut.
        limit_bytes: the maximum size of the result in UTF-8 bytes (<= 0 gives ``""``).

    Returns:
        ``text`` itself when it fits, else its longest fitting suffix, cut on a
        character boundary.
    """
    if limit_bytes <= 0:
        return ""
    data = _encode(text)
    if len(data) <= limit_bytes:
        return data.decode("utf-8")
    return data[-limit_bytes:].decode("utf-8", "ignore")


def truncation_marker(cut_bytes: int) -> str:
    """The marker put where output was cut, e.g. ``[… 120 bytes cut]`` plus a newline.

    Producers that cut their own output should put this marker at the start of
    what they return; the renderer then merges its own cut into it instead of
    adding a second marker.
    """
    unit = "byte" if cut_bytes == 1 else "bytes"
    return f"[… {cut_bytes} {unit} cut]\n"


def _one_line(text: str) -> str:
    return " ".join(_clean(text).split())


# ---------------------------------------------------------------- status


def _detail_facts(detail: Mapping[str, object]) -> list[str]:
    """The short, well-known producer facts shown beside a status."""
    facts: list[str] = []
    code = detail.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool) and abs(code) < 1 << 31:
        facts.append(f"exit code {code}")
    signal = detail.get("signal")
    numeric = isinstance(signal, int) and not isinstance(signal, bool) and 0 < signal < 1 << 16
    named = isinstance(signal, str) and 0 < len(signal) <= 16 and signal.isprintable()
    if numeric or named:
        facts.append(f"signal {signal}")
    return facts


def status_line(snapshot: TaskSnapshot) -> str:
    """The status suffix of a read, e.g. ``[status: completed, exit code 0]``.

    Known producer facts (an integer ``exit_code`` and a ``signal`` in the
    snapshot's detail) are added after the status.
    """
    return "[status: " + ", ".join([snapshot.status, *_detail_facts(snapshot.detail)]) + "]"


# ---------------------------------------------------------------- reads


def _body(read: TaskRead) -> str:
    """The variable part of a read: the output, then error and kill reason lines."""
    snapshot = read.snapshot
    lines = [read.output] if read.output else []
    if snapshot.error:
        lines.append(f"error: {snapshot.error}")
    if snapshot.kill_reason and snapshot.status in ("stopping", "killed"):
        lines.append(f"kill reason: {snapshot.kill_reason}")
    text = ""
    for line in lines:
        if text and not text.endswith("\n"):
            text += "\n"
        text += line
    return _clean(text)


def _join(body: str, suffix: str) -> str:
    if not body:
        return suffix
    return body + ("" if body.endswith("\n") else "\n") + suffix


def _cut_tail_with_marker(body: str, budget: int) -> str:
    """Keep the tail of ``body`` within ``budget`` bytes, led by one truncation marker.

    A marker the producer already put at the start of ``body`` is merged into
    ours (its count is added) rather than repeated.
    """
    prior = 0
    match = _MARKER_RE.match(body)
    if match is not None:
        prior = int(match.group(1))
        body = body[match.end() :]
    total = utf8_len(body)
    if prior and total + utf8_len(truncation_marker(prior)) <= budget:
        return truncation_marker(prior) + body
    # Reserve the widest marker this cut can need (its count is at most
    # prior + total), then keep as much of the tail as fits beside it.
    reserve = utf8_len(truncation_marker(prior + total))
    if reserve > budget:
        # Not even the marker fits: the marker itself is what gets cut.
        return cut_utf8_tail(body, budget)
    tail = cut_utf8_tail(body, budget - reserve)
    return truncation_marker(prior + total - utf8_len(tail)) + tail


def render_task_output(read: TaskRead, limit: int | None) -> str:
    """Render a :class:`TaskRead` for the model, always ending with ``[status: ...]``.

    Args:
        read: the output delta (or final result) and the snapshot it came with.
        limit: the maximum size of the whole text in UTF-8 bytes, or None.

    Returns:
        The output, any error or kill reason, and the status suffix.  With a
        limit the suffix is reserved first and the *tail* of the output is
        kept, led by a ``[… N bytes cut]`` marker (merged with a marker the
        producer already put there).  If even the suffix does not fit, the
        suffix itself is cut.
    """
    suffix = status_line(read.snapshot)
    body = _body(read)
    if limit is None:
        return _join(body, suffix)
    if limit <= 0:
        return ""
    suffix_size = utf8_len(suffix)
    if suffix_size > limit:
        return cut_utf8(suffix, limit)
    if not body:
        return suffix
    budget = limit - suffix_size - 1  # one byte for the newline before the suffix
    whole = _join(body, suffix)
    if utf8_len(whole) <= limit:
        return whole
    if budget <= 0:
        return suffix
    kept = _cut_tail_with_marker(body, budget)
    return _join(kept, suffix) if kept else suffix


# ---------------------------------------------------------------- lists and kills


def render_task_list(snapshots: Iterable[TaskSnapshot]) -> str:
    """One line per task, ``<id> [<kind>] <status> — <label>``, or ``(no background tasks)``.

    The line of a task with an ``output_limit_bytes`` is cut to that limit
    (keeping its head, ending with ``…``), as is all model-facing text about it.
    """
    lines = [
        bound_text(f"{s.id} [{s.kind}] {s.status} — {_one_line(s.label)}", s.output_limit_bytes) for s in snapshots
    ]
    return "\n".join(lines) if lines else "(no background tasks)"


def render_kill_result(snapshot: TaskSnapshot, limit: int | None = None) -> str:
    """Render the result of ``task_kill``: what happened, then ``[status: ...]``.

    Args:
        snapshot: the snapshot returned by :meth:`TaskService.kill`.
        limit: the maximum size in UTF-8 bytes, or None.
    """
    if snapshot.status == "stopping":
        head = f"kill requested for task {snapshot.id} [{snapshot.kind}] — {_one_line(snapshot.label)}"
    else:
        head = f"task {snapshot.id} [{snapshot.kind}] had already ended — {_one_line(snapshot.label)}"
    suffix = status_line(snapshot)
    if limit is None:
        return head + "\n" + suffix
    suffix_size = utf8_len(suffix)
    if suffix_size > limit:
        return cut_utf8(suffix, limit)
    budget = limit - suffix_size - 1
    if budget <= 0:
        return suffix
    return _cut_head(head, budget) + "\n" + suffix


def bound_text(text: str, limit: int | None) -> str:
    """Bound free text (a list, an error message) to ``limit`` bytes, keeping its head.

    A cut text ends with ``…`` when the ellipsis fits.
    """
    if limit is None:
        return text
    return _cut_head(text, limit)


def _cut_head(text: str, budget: int) -> str:
    """Keep the head of ``text`` within ``budget`` bytes, ending with ``…`` when cut."""
    if utf8_len(text) <= budget:
        return cut_utf8(text, budget)
    ellipsis = utf8_len(_ELLIPSIS)
    if budget < ellipsis:
        return cut_utf8(text, budget)
    return cut_utf8(text, budget - ellipsis) + _ELLIPSIS


# ---------------------------------------------------------------- notices


LOST_ERROR = "the process that ran it stopped before the task reported; its output and result are gone"
"""The error of a lost task (status ``lost``), shown by ``task_output``."""

_LOST_INSTRUCTION = (
    ". The process that ran it stopped before the task reported: its output and result are gone. "
    "Check what it did before running it again."
)
_STARTED = "started background task "
_STARTED_RE = re.compile(r"started background task ([a-z][a-z0-9_-]{0,31}-[1-9][0-9]{0,17})")
_NOTICE_RE = re.compile(r'\A(?:background task ([^\s.]+)|task_output\("([^"]+)"\)\Z)')


def render_started(task_id: str) -> str:
    """The tool result of a call that started a background task: ``started background task <id>``.

    A resumed session finds the tasks its agent started in this exact text
    (:func:`parse_started`): a producer that returns it gets its unreported
    tasks reported as lost after a restart (docs/tasks.rst, "After a restart").
    """
    return _STARTED + task_id


def parse_started(content: str) -> str | None:
    """The task id of a :func:`render_started` text, or None for any other text."""
    match = _STARTED_RE.fullmatch(content)
    return None if match is None else match.group(1)


def parse_notice(text: str) -> tuple[str, bool] | None:
    """The task id of a completion notice and whether it reports a lost task, or None.

    Reads every form :func:`render_notice` produces, cut ones included; a
    notice cut below its stable parts (only possible with a limit of a few
    bytes) is not recognised.
    """
    match = _NOTICE_RE.match(text)
    if match is None:
        return None
    task_id = match.group(1) or match.group(2)
    return task_id, text.endswith(_LOST_INSTRUCTION)


def _instruction(task_id: str, status: str = "completed") -> str:
    if status == "lost":
        return _LOST_INSTRUCTION
    return f'. Use task_output("{task_id}") to read its result.'


def render_notice(snapshot: TaskSnapshot, limit: int | None) -> str:
    """The completion notice delivered to a task's owner.

    For example ``background task bash-3 [bash] completed (exit code 0) — make
    test. Use task_output("bash-3") to read its result.``  A lost task's notice
    ends instead with ``. The process that ran it stopped before the task
    reported: its output and result are gone. Check what it did before running
    it again.``

    Args:
        snapshot: the terminal snapshot.
        limit: the maximum size in UTF-8 bytes, or None.

    Returns:
        The notice.  With a limit, the stable parts (``background task <id>``
        and the ``task_output`` instruction) are reserved first and only the
        variable part (kind, status, detail, label) is cut.  Below the size of
        the stable parts, the notice degrades to ``task_output("<id>")`` and,
        below that, to a plain cut: the limit is never exceeded.
    """
    prefix = f"background task {snapshot.id}"
    instruction = _instruction(snapshot.id, snapshot.status)
    facts = _detail_facts(snapshot.detail)
    status = snapshot.status + (f" ({', '.join(facts)})" if facts else "")
    variable = f" [{snapshot.kind}] {status} — {_one_line(snapshot.label)}"
    whole = prefix + variable + instruction
    if limit is None:
        return whole
    if utf8_len(whole) <= limit:
        return whole
    stable = utf8_len(prefix) + utf8_len(instruction)
    if stable <= limit:
        return prefix + _cut_head(variable, limit - stable) + instruction
    minimal = f'task_output("{snapshot.id}")'
    if utf8_len(minimal) <= limit:
        return minimal
    return cut_utf8(minimal, limit)
