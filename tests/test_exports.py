"""The public surface: exactly the pinned names, each with a docstring, documented in ``docs/``.

A public name is anything in a public package's namespace whose name does not
start with ``_`` (what ``from ._x import Name as Name`` re-exports), minus
submodules.  The policy is trio's: no ``__all__`` anywhere in the package; a
package's public names are its ``as`` re-exports, and :data:`PUBLIC_API` pins
them, so an accidental export (an import without ``_``, a helper re-exported
for a test) fails here.  A change of the public surface is a change of
:data:`PUBLIC_API` and of the API pages, made on purpose.

Constants and type aliases have no ``__doc__`` of their own; their
docstring is the string literal written under the assignment in the module
that defines them (the convention Sphinx's autodoc reads), found by following
the re-export chain.  The documentation check needs no Sphinx build: it reads
the ``.. auto*::`` directives of the ``.rst`` sources.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import re
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import trio_harness
import trio_harness.agents

DOCS = Path(__file__).resolve().parent.parent / "docs"

PUBLIC_PACKAGES = (
    "trio_harness",
    "trio_harness.session",
    "trio_harness.agents",
    "trio_harness.model",
    "trio_harness.tasks",
    "trio_harness.bash",
    "trio_harness.tools",
    "trio_harness.testing",
    "trio_harness.acp",
    "trio_harness.events",
)

# Public names that have no docstring yet, in modules this test does not own.
# Each entry is a known gap to fix at its definition; empty this allowlist as
# docstrings are added (a stale entry fails the test, so it cannot linger).
MISSING_DOCSTRINGS_ALLOWLIST: frozenset[str] = frozenset()

_DIRECTIVE = re.compile(
    r"^(?P<indent>[ \t]*)\.\.[ \t]+auto(?P<kind>class|function|data|exception|attribute|method|decorator|module)"
    r"::[ \t]*(?P<target>\S+)[ \t]*$"
)


def _packages() -> Iterator[types.ModuleType]:
    for name in PUBLIC_PACKAGES:
        try:
            yield importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a package still being written
            if exc.name != name:
                raise


def public_names() -> list[tuple[str, str, object]]:
    """``(package, name, object)`` for every public name of every public package."""
    found = []
    for package in _packages():
        for name, obj in vars(package).items():
            if name.startswith("_") or isinstance(obj, types.ModuleType):
                continue
            if type(obj).__module__ == "__future__":
                continue  # `from __future__ import annotations` in an __init__.py is not an export
            found.append((package.__name__, name, obj))
    return found


def attribute_docstring(module_name: str, name: str, depth: int = 0) -> str | None:
    """The string literal under ``name = ...`` in ``module_name``, following re-exports."""
    if depth > 5:
        return None
    module = importlib.import_module(module_name)
    body = ast.parse(inspect.getsource(module)).body
    package = module.__package__ or module_name
    for index, node in enumerate(body):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    source = importlib.util.resolve_name("." * node.level + node.module, package)
                    return attribute_docstring(source, alias.name, depth + 1)
        targets: list[str] = []
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets = [node.target.id]
        if name in targets and index + 1 < len(body):
            following = body[index + 1]
            if (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                return following.value.value
    return None


def docstring_of(package: str, name: str, obj: object) -> str | None:
    """The docstring a reader of ``package.name`` gets, or None."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")  # not inherited
    elif inspect.isroutine(obj) or callable(getattr(obj, "__wrapped__", None)):
        doc = getattr(obj, "__doc__", None)
    else:
        doc = attribute_docstring(package, name)
    return doc if isinstance(doc, str) and doc.strip() else None


@functools.cache
def documented() -> dict[str, list[bool]]:
    """Every ``.. auto*::`` target in ``docs/``, with one ``no_index`` flag per occurrence."""
    targets: dict[str, list[bool]] = {}
    for path in sorted(DOCS.rglob("*.rst")):
        if "_build" in path.parts:
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines):
            match = _DIRECTIVE.match(line)
            if match is None:
                continue
            indent = len(match["indent"])
            no_index = False
            for option in lines[number + 1 :]:
                stripped = option.strip()
                if not stripped.startswith(":") or len(option) - len(option.lstrip()) <= indent:
                    break
                no_index = no_index or stripped in (":no-index:", ":noindex:")
            targets.setdefault(match["target"], []).append(no_index)
    return targets


def resolve(target: str) -> object:
    """Import the object a dotted autodoc target names."""
    parts = target.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attr in parts[split:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(target)


NAMES = public_names()


def test_the_public_packages_export_something() -> None:
    packages = {package for package, _, _ in NAMES}
    assert {"trio_harness", "trio_harness.agents", "trio_harness.session"} <= packages
    assert len(NAMES) > 100


@pytest.mark.parametrize(("package", "name", "obj"), NAMES, ids=[f"{p}.{n}" for p, n, _ in NAMES])
def test_public_name_has_a_docstring(package: str, name: str, obj: object) -> None:
    qualified = f"{package}.{name}"
    doc = docstring_of(package, name, obj)
    if qualified in MISSING_DOCSTRINGS_ALLOWLIST:
        assert doc is None, f"{qualified} has a docstring now: remove it from MISSING_DOCSTRINGS_ALLOWLIST"
        pytest.skip(f"{qualified} has no docstring yet (allowlisted)")
    assert doc is not None, f"{qualified} has no docstring; write one where it is defined"


def test_allowlist_names_exist() -> None:
    exported = {f"{package}.{name}" for package, name, _ in NAMES}
    assert exported >= MISSING_DOCSTRINGS_ALLOWLIST


@pytest.mark.parametrize(("package", "name", "obj"), NAMES, ids=[f"{p}.{n}" for p, n, _ in NAMES])
def test_public_methods_have_docstrings(package: str, name: str, obj: object) -> None:
    if not inspect.isclass(obj):
        return
    missing = []
    for member, value in vars(obj).items():
        if member.startswith("_"):
            continue
        if isinstance(value, property) or inspect.isfunction(value):
            doc = inspect.getdoc(value)
        elif isinstance(value, classmethod | staticmethod):
            doc = inspect.getdoc(value.__func__)
        else:
            continue
        if not doc:
            missing.append(member)
    assert not missing, f"{package}.{name} has public members without a docstring: {missing}"


@pytest.mark.parametrize(("package", "name", "obj"), NAMES, ids=[f"{p}.{n}" for p, n, _ in NAMES])
def test_public_name_is_in_an_autodoc_directive(package: str, name: str, obj: object) -> None:
    qualified = f"{package}.{name}"
    assert qualified in documented(), (
        f"{qualified} is not documented: add `.. autoclass:: {qualified}` (or autofunction, "
        "autodata, autoexception) to the API reference in docs/api/, with `:no-index:` if the "
        "object is documented in full under another name"
    )


def test_each_exported_object_is_indexed_exactly_once() -> None:
    """Re-exports are documented with ``:no-index:``; the defining package's entry is the index."""
    targets = documented()
    by_object: dict[int, list[str]] = {}
    for package, name, obj in NAMES:
        if inspect.isclass(obj) or inspect.isroutine(obj):
            by_object.setdefault(id(obj), []).append(f"{package}.{name}")
    problems = []
    for names in by_object.values():
        indexed = [n for n in names for flag in targets.get(n, []) if not flag]
        if len(indexed) != 1:
            problems.append(f"{names}: indexed as {indexed}")
    assert not problems, "each exported object needs exactly one directive without :no-index:\n" + "\n".join(problems)


def test_every_autodoc_target_exists() -> None:
    targets = documented()
    assert targets, f"no autodoc directives found under {DOCS}"
    for target in targets:
        resolve(target)  # raises if the docs name something that does not exist


# ---------------------------------------------------------------- exceptions: their public module

EXCEPTIONS = sorted(
    {obj for _, _, obj in NAMES if isinstance(obj, type) and issubclass(obj, BaseException)}, key=lambda c: c.__name__
)


def indexed_package(obj: object) -> str:
    """The package of the reference entry that indexes ``obj`` (the directive without ``:no-index:``)."""
    targets = documented()
    (entry,) = [
        f"{package}.{name}"
        for package, name, other in NAMES
        if other is obj and False in targets.get(f"{package}.{name}", [])
    ]
    return entry.rpartition(".")[0]


def test_exceptions_are_collected() -> None:
    names = {cls.__name__ for cls in EXCEPTIONS}
    assert {"HarnessError", "RunError", "BashError", "RpcError", "EventLogMismatch"} <= names


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda c: c.__name__)
def test_a_public_exception_shows_the_package_it_is_imported_from(cls: type[BaseException]) -> None:
    """``trio_harness.RunError`` in tracebacks and reprs, not ``trio_harness._errors.RunError``."""
    package = indexed_package(cls)
    assert cls.__module__ == package, f"{cls.__qualname__} shows module {cls.__module__!r}, not {package!r}"
    assert getattr(importlib.import_module(package), cls.__qualname__) is cls  # pickle finds it there
    assert repr(cls) == f"<class '{package}.{cls.__qualname__}'>"


def test_a_traceback_names_the_public_module() -> None:
    import traceback

    from trio_harness import RunError

    lines = traceback.format_exception(RunError("the turn ended with reason error"))
    assert lines[-1] == "trio_harness.RunError: the turn ended with reason error\n"


def _example(cls: type[BaseException]) -> BaseException:
    """An instance of ``cls`` with every argument its constructor requires (a string, or a tuple of strings)."""
    try:
        signature = inspect.signature(cls)
    except ValueError:  # the constructor of a built-in exception: a message
        return cls("the message")
    args: list[object] = []
    kwargs: dict[str, object] = {}
    for parameter in signature.parameters.values():
        if parameter.default is not inspect.Parameter.empty or parameter.kind in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ):
            continue
        value: object = ("one", "two") if parameter.name.endswith("s") else f"the {parameter.name}"
        if parameter.annotation in ("int", int):
            value = 7
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY:
            kwargs[parameter.name] = value
        else:
            args.append(value)
    if not args and not kwargs:
        return cls("the message")
    return cls(*args, **kwargs)


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda c: c.__name__)
def test_a_public_exception_survives_pickle_and_copy(cls: type[BaseException]) -> None:
    import copy
    import pickle

    error = _example(cls)
    error.__dict__["extra"] = "kept"  # an attribute set after construction comes back too
    for again in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
        assert type(again) is cls
        assert (again.args, str(again), again.__dict__) == (error.args, str(error), error.__dict__)
    assert pickle.loads(pickle.dumps(cls)) is cls


def test_a_run_error_keeps_its_turn_end_through_pickle() -> None:
    import pickle

    from trio_harness import RunError
    from trio_harness.events import TurnEnd

    end = TurnEnd(seq=3, ts=1.0, turn=1, reason="budget")
    again = pickle.loads(pickle.dumps(RunError("stopped", end=end)))
    assert isinstance(again, RunError) and again.end == end and str(again) == "stopped"


# ---------------------------------------------------------------- the exact public set

PUBLIC_API: dict[str, frozenset[str]] = {
    "trio_harness": frozenset(
        {
            "Agent",
            "AgentDisposedError",
            "AgentError",
            "AgentExistsError",
            "AgentHandle",
            "AgentNotFoundError",
            "AgentOptions",
            "allow_all",
            "ApprovalDecision",
            "ApprovalRequest",
            "Approver",
            "BashError",
            "BashRuntimeOptions",
            "BashToolOptions",
            "Budget",
            "CallNotFoundError",
            "CallNotPendingError",
            "CompactionError",
            "connect_mcp",
            "ContextPolicy",
            "current_initiator",
            "current_scope",
            "EventBus",
            "EventDecodeError",
            "FactoryError",
            "ForkBoundaryError",
            "FunctionTool",
            "Harness",
            "HarnessError",
            "Image",
            "Inbox",
            "InboxError",
            "InvalidSessionIdError",
            "JsonlStore",
            "load_mcp_config",
            "LoadedPlugin",
            "McpConfigError",
            "McpError",
            "McpHttpServer",
            "McpStartError",
            "McpStdioServer",
            "MemoryStore",
            "ModelError",
            "ModelProvider",
            "ModelSettings",
            "Notice",
            "NoticeSubject",
            "open_harness",
            "open_model",
            "open_scope",
            "OutputValidationError",
            "Plugin",
            "PluginError",
            "RunError",
            "RunResult",
            "Scope",
            "ScopeClosedError",
            "ScriptedModel",
            "Session",
            "SessionCorruptError",
            "SessionError",
            "SessionExistsError",
            "SessionHeader",
            "SessionLockedError",
            "SessionNotFoundError",
            "SessionStoreError",
            "SubagentOptions",
            "TaskError",
            "TaskNotFoundError",
            "TaskRuntimeOptions",
            "TaskStartError",
            "TaskToolOptions",
            "Tool",
            "tool",
            "ToolContext",
            "ToolError",
            "ToolOutput",
            "UnsupportedFormatError",
            "UsageTotals",
            "with_initiator",
            "without_initiator",
        }
    ),
    "trio_harness.session": frozenset(
        {
            "decode_event",
            "decode_header",
            "encode_event",
            "encode_header",
            "FORMAT_VERSION",
            "JsonlStore",
            "LoadedSession",
            "MailboxWriter",
            "MemoryStore",
            "PooledPostgresStore",
            "PostgresStore",
            "RemoteInbox",
            "BlobReader",
            "SCHEMA_VERSION",
            "ServerSideFork",
            "Session",
            "SessionEntry",
            "SessionFollower",
            "ApprovalDecisionLike",
            "SessionHeader",
            "SessionStore",
            "SessionRegistry",
            "SessionWriter",
            "validate_session_id",
        }
    ),
    "trio_harness.agents": frozenset(
        {
            "Agent",
            "AgentFactory",
            "AgentHandle",
            "AgentOptions",
            "AgentRegistry",
            "AgentStatus",
            "allow_all",
            "ApprovalDecision",
            "ApprovalRequest",
            "Approver",
            "Budget",
            "ContextPolicy",
            "EventStream",
            "FollowedPrompt",
            "Followers",
            "FunctionTool",
            "HistoryProcessor",
            "Inbox",
            "LoopAgent",
            "Prompt",
            "ReactAgent",
            "ReactLoopFactory",
            "RunResult",
            "Setup",
            "StreamGap",
            "StreamItem",
            "Tool",
            "tool",
            "ToolContext",
            "ToolOutput",
            "ToolSet",
            "TurnOutcome",
            "TurnWatcher",
            "Verdict",
        }
    ),
    "trio_harness.model": frozenset(
        {
            "AnthropicProvider",
            "AssistantMessage",
            "Chunk",
            "Emit",
            "Failure",
            "Finish",
            "Image",
            "load_prices",
            "Message",
            "ModelInfo",
            "ModelProvider",
            "ModelRequest",
            "ModelSettings",
            "open_model",
            "OpenAIProvider",
            "OutputFormat",
            "OutputMode",
            "ReasoningBlock",
            "ReasoningDelta",
            "ReplayModel",
            "resolve_model",
            "ResponsesProvider",
            "ResponseInfo",
            "catalog_entry",
            "known_models",
            "Retry",
            "ScriptedModel",
            "TextDelta",
            "ToolCall",
            "ToolCallDelta",
            "ToolMessage",
            "ToolSpec",
            "Usage",
            "usage_cost",
            "UsageTotals",
            "UserMessage",
        }
    ),
    "trio_harness.tasks": frozenset(
        {
            "open_task_service",
            "TaskHooks",
            "TaskListener",
            "TaskRuntimeOptions",
            "TaskOutcome",
            "TaskOwner",
            "TaskRead",
            "TASKS_GUIDANCE",
            "TaskService",
            "TaskSnapshot",
            "TaskSpec",
            "TaskStatus",
            "TerminalStatus",
        }
    ),
    "trio_harness.bash": frozenset(
        {
            "BashError",
            "BashExecutor",
            "BashRuntimeOptions",
            "BashProcess",
            "BashProcessNotFoundError",
            "BashRequest",
            "BashResult",
            "BashSpec",
            "DEFAULT_ENV_DENY",
            "EnvPolicy",
            "ExitFacts",
            "open_bash_executor",
            "SandboxPolicy",
            "SandboxUnavailableError",
        }
    ),
    "trio_harness.tools": frozenset(
        {
            "BashRunner",
            "BashToolOptions",
            "BashToolPlugin",
            "FileChange",
            "file_change",
            "FileToolOptions",
            "FileToolsPlugin",
            "connect_mcp",
            "connect_mcp_servers",
            "load_mcp_config",
            "McpConnection",
            "McpHttpServer",
            "McpServerConfig",
            "McpStdioServer",
            "NoticeTarget",
            "parse_mcp_config",
            "current_plan",
            "plan_of",
            "PlanEntry",
            "PlanToolPlugin",
            "SubagentOptions",
            "SubagentToolPlugin",
            "task_tools",
            "TaskToolOptions",
            "TaskToolsPlugin",
        }
    ),
    "trio_harness.testing": frozenset(
        {
            "assert_balanced",
            "assert_events",
            "event_types",
            "EventLogMismatch",
            "harness",
            "NOISE",
            "open_test_harness",
            "scripted_model",
        }
    ),
    "trio_harness.acp": frozenset(
        {
            "AcpServer",
            "DEFAULT_MAX_LINE_BYTES",
            "PROTOCOL_VERSION",
            "RpcError",
            "serve_stdio",
        }
    ),
    "trio_harness.events": frozenset(
        {
            "ApprovalDecided",
            "ApprovalRequested",
            "AssistantChunk",
            "AssistantMessage",
            "CompactionFailed",
            "ConfigChanged",
            "ContextCompacted",
            "ControlRefused",
            "Event",
            "EVENT_TYPES",
            "ImageMediaType",
            "ImagePart",
            "InboxMessage",
            "MAX_IMAGE_BYTES",
            "MAX_INLINE_IMAGE_BYTES",
            "InboxSpliced",
            "MessageOrigin",
            "RequestHeader",
            "RequestRetry",
            "StepEnd",
            "StepStart",
            "ToolCallRequested",
            "ToolResult",
            "ToolStarted",
            "TurnEnd",
            "TurnStart",
            "UserMessage",
        }
    ),
}
"""Every public name of every public package; a name added or removed on purpose is added or removed here."""

# Public names that are modules: the public subpackages and ``trio_harness.events``.
PUBLIC_MODULES = frozenset(PUBLIC_PACKAGES)

# Modules that still define ``__all__`` while another change of issue 23 splits
# them; a stale entry fails, so the list empties as they are merged.
ALL_ALLOWLIST: frozenset[str] = frozenset()


def test_every_public_package_is_pinned() -> None:
    assert set(PUBLIC_API) == set(PUBLIC_PACKAGES)


@pytest.mark.parametrize("package", PUBLIC_PACKAGES)
def test_the_public_names_are_exactly_the_pinned_ones(package: str) -> None:
    found = {name for pkg, name, _ in NAMES if pkg == package}
    added, removed = sorted(found - PUBLIC_API[package]), sorted(PUBLIC_API[package] - found)
    assert not added, (
        f"{package} exports {added}, not in PUBLIC_API: make it private (``_name`` or unexported) or pin it"
    )
    assert not removed, f"{package} no longer exports {removed}: unpin it in PUBLIC_API (and the API pages)"


def _reexports(module: types.ModuleType) -> set[str]:
    """The names a module's source binds with ``from x import y as y`` (or ``import x.y as y``)."""
    names = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):  # also under an ``if`` (the pytest fixtures)
        if isinstance(node, ast.ImportFrom | ast.Import):
            for alias in node.names:
                if alias.asname is not None and alias.asname == alias.name.rpartition(".")[2]:
                    names.add(alias.asname)
    return names


@pytest.mark.parametrize("package", PUBLIC_PACKAGES)
def test_public_names_are_explicit_reexports(package: str) -> None:
    """A public name is bound by ``from ._x import Name as Name``, not defined or imported in passing."""
    module = importlib.import_module(package)
    stray = sorted(name for pkg, name, _ in NAMES if pkg == package and name not in _reexports(module))
    assert not stray, f"{package} binds {stray} without an explicit ``from ._x import Name as Name`` re-export"


@pytest.mark.parametrize("package", PUBLIC_PACKAGES)
def test_no_private_module_leaks_under_a_public_name(package: str) -> None:
    module = importlib.import_module(package)
    leaked = sorted(
        f"{name} = {value.__name__}"
        for name, value in vars(module).items()
        if isinstance(value, types.ModuleType)
        and not name.startswith("_")
        and value.__name__.startswith("trio_harness")
        and value.__name__ not in PUBLIC_MODULES
    )
    assert not leaked, f"{package} exposes private modules under public names: {leaked}"


def _dunder_all_modules() -> set[str]:
    """The modules of the package whose source assigns ``__all__`` at top level."""
    root = Path(__file__).resolve().parent.parent / "trio_harness"
    found = set()
    for path in root.rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            if any(isinstance(target, ast.Name) and target.id == "__all__" for target in targets):
                parts = ("trio_harness", *path.relative_to(root).with_suffix("").parts)
                found.add(".".join(parts).removesuffix(".__init__"))
    return found


def test_no_module_defines_dunder_all() -> None:
    """One policy, trio's: the re-exports are the public names, so no module keeps an ``__all__`` to drift."""
    with_all = _dunder_all_modules()
    assert with_all - ALL_ALLOWLIST == set(), f"modules with __all__: {sorted(with_all - ALL_ALLOWLIST)}"
    assert with_all >= ALL_ALLOWLIST, (
        f"no __all__ any more: remove {sorted(ALL_ALLOWLIST - with_all)} from ALL_ALLOWLIST"
    )


# ---------------------------------------------------------------- objects only the runtime builds


@pytest.mark.parametrize(
    ("cls", "way"),
    [
        (trio_harness.Scope, "open_scope() or Scope.open_child()"),
        (trio_harness.Harness, "open_harness()"),
        (trio_harness.AgentHandle, "harness.agents.create() or resume()"),
        (trio_harness.agents.ReactAgent, "harness.agents.create() or resume()"),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
def test_runtime_objects_refuse_direct_construction(cls: type, way: str) -> None:
    public = f"{indexed_package(cls)}.{cls.__qualname__}"
    with pytest.raises(
        TypeError, match=rf"^{re.escape(public)} has no public constructor; get one from {re.escape(way)}$"
    ):
        cls()
    with pytest.raises(TypeError, match="no public constructor"):
        cls(name="x", parent=None, teardown_timeout=1.0)  # arguments change nothing
